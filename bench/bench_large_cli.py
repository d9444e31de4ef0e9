"""Issue 21 §2: memory at every step of a user's session on the Qwen2-0.5B-shaped decoder, each step the CLI
command a user runs (generated data, every default), in a fresh workspace:

    .venv/bin/python bench/bench_large.py --out /tmp/q05 --stages export      # the model (2.52 GB), once
    .venv/bin/python bench/bench_large_cli.py --model /tmp/q05/model.onnx [--steps inspect,build,...]

Each step runs under ``/usr/bin/time -v`` (its "Maximum resident set size": the peak RSS of the command's
process, or of the largest child it waited for) while this script samples, every 0.5 s, the VmHWM of every
process of the command's tree (the trial workers are children of a forkserver, which ``time`` does not see)
and the sum of their PSS (the memory the whole tree holds: a page several processes map, such as the
switchable model's data file, counts once). It prints one markdown row per step for docs/benchmarks.md, with the
ratios to the model's size on disk (graph + external data).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_large import process_tree  # noqa: E402
STEPS = {
    "inspect": ["inspect"],
    "build": ["build"],
    "rank": ["rank"],
    "isolated": ["sensitivity", "--mode", "isolated"],
    "search": ["search", "--budget", "cosine_mean>=0.99"],
}


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "Pss":  # shared pages divided among the processes that map them
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


class Sampler:
    """The highest VmHWM of any process of the tree under ``pid``, and the highest sum of their PSS (what
    the tree holds in memory: a page that several processes map counts once in all)."""

    def __init__(self, pid: int):
        self.pid, self.hwm, self.hwm_pid_cmd, self.rss_sum, self._stop = pid, {}, {}, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.5):
            total = 0
            for p in process_tree(self.pid):
                s = _status(p)
                total += s.get("Pss", 0)
                if s.get("VmHWM", 0) > self.hwm.get(p, 0):
                    self.hwm[p] = s["VmHWM"]
                    try:
                        self.hwm_pid_cmd[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode()
                    except OSError:
                        pass
            self.rss_sum = max(self.rss_sum, total)

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_step(step: str, model: Path, ws: Path) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "core", *STEPS[step][:1], str(model), *STEPS[step][1:]]
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        s = Sampler(p.pid)
        p.wait()
        s.stop()
        err.seek(0)
        text = err.read()
        out.seek(0)
        stdout = out.read()
    wall = time.perf_counter() - t0
    maxrss = next((int(l.split()[-1]) * 1024 for l in text.splitlines() if "Maximum resident set size" in l), 0)
    workers = sorted((v for k, v in s.hwm.items() if "forkserver" in s.hwm_pid_cmd.get(k, "")), reverse=True)
    last = [l for l in stdout.strip().splitlines() if l.strip()][-3:]
    return {"step": step, "rc": p.returncode, "wall_s": wall, "time_v_max_rss": maxrss,
            "largest_process": max(s.hwm.values(), default=0), "worker_hwm": workers[:1],
            "tree_rss_sum": s.rss_sum, "last_lines": last,
            "error": text.strip().splitlines()[-1] if p.returncode else ""}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=Path("/tmp/q05/model.onnx"))
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--ws", type=Path, help="workspace (default: a fresh one beside the model)")
    args = ap.parse_args()
    model = args.model
    size = model.stat().st_size + sum(f.stat().st_size for f in model.parent.glob(model.name + ".data"))
    ws = args.ws or model.parent / f"ws-cli-{time.strftime('%H%M%S')}"
    gib = 1 << 30
    print(f"model {model} ({size / 1e9:.2f} GB = {size / gib:.2f} GiB; 2.5x = {2.5 * size / gib:.2f} GiB), "
          f"workspace {ws}")
    print("| step | seconds | peak RSS, `time -v` (GiB) | largest process (GiB, × model) | trial worker (GiB) "
          "| all processes, PSS (GiB, × model) |")
    print("|---|---|---|---|---|---|")
    for step in args.steps.split(","):
        r = run_step(step, model, ws)
        big = r["largest_process"]
        worker = f"{r['worker_hwm'][0] / gib:.2f}" if r["worker_hwm"] else "–"
        row = (f"| {step} | {r['wall_s']:.1f} | {r['time_v_max_rss'] / gib:.2f} | {big / gib:.2f} ({big / size:.2f}×) "
               f"| {worker} | {r['tree_rss_sum'] / gib:.2f} ({r['tree_rss_sum'] / size:.2f}×) |")
        print(row + (f" rc={r['rc']}: {r['error']}" if r["rc"] else ""), flush=True)
        print(json.dumps(r), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
