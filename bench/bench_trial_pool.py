"""Trial-pool start-up: the isolated ranking of a tiny sample, ``--repeat`` times in one process, with the
trial workers started by ``spawn`` (an interpreter and the imports per worker) or forked from the forkserver
that ``core.sensitivity.isolated.worker_context`` uses (the default). The stored table is removed before
each repeat, so every repeat runs its trials.

    .venv/bin/python bench/bench_trial_pool.py --start spawn
    .venv/bin/python bench/bench_trial_pool.py --start forkserver [--sample tiny-cnn] [--repeat 4] [--workers 2]

Prints one line per repeat (seconds) and the process's user CPU time with its children's."""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import core.sensitivity.isolated as isolated  # noqa: E402
from core.model.samples import materialize_sample  # noqa: E402
from core.project import open_project  # noqa: E402
from core.sensitivity import sensitivity  # noqa: E402
from core.workspace import Workspace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", choices=("spawn", "forkserver"), default="forkserver")
    ap.add_argument("--sample", default="tiny-cnn")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.start == "spawn":
        isolated.worker_context = lambda: mp.get_context("spawn")
    ws = Workspace(Path(tempfile.mkdtemp(prefix="mixprec-bench-pool-")))
    materialize_sample(args.sample, ws)
    p = open_project(f"sample:{args.sample}", ws=ws)
    for i in range(args.repeat):
        shutil.rmtree(ws.root / "rankings", ignore_errors=True)
        t0 = time.perf_counter()
        s = sensitivity(p, "isolated", workers=args.workers)
        print(f"{args.start} repeat {i}: {time.perf_counter() - t0:.2f} s ({len(s.table)} layers, cached: {s.cache_hit})")
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"user CPU: {own.ru_utime:.1f} s in this process, {kids.ru_utime:.1f} s in waited-for children "
          "(forkserver workers are the server's children: counted only when it exits)")
    shutil.rmtree(ws.root, ignore_errors=True)


if __name__ == "__main__":
    main()
