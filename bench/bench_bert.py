"""BERT-base isolated sensitivity benchmark (issue 14: "BERT-base-sized isolated sensitivity <= 60 s").

    .venv/bin/python bench/bench_bert.py [--out /tmp/mixprec-bert-base] [--runs cold,warm] [--workers 2]

* ``export`` (once; skipped when ``--out`` has the files): ``transformers.BertModel(BertConfig())`` --
  hidden 768, 12 layers, 12 heads, intermediate 3072, vocabulary 30522, 110 M parameters, seeded random
  weights (``torch.manual_seed(0)``), no download -- with the masked mean pooling and L2 normalisation
  of the ``minilm`` sample (the pooler dropped, so the model has exactly 96 MatMuls: 12 layers x (Q, K,
  V, attention scores, context, output, FFN up, FFN down)), exported with the sample's exporter
  (``core.model.samples.export_minilm``: TorchScript, opset 17, dynamic batch and sequence) into
  ``--out/model.onnx``, checked against torch (max abs diff <= 1e-4).
* Data: the ``minilm`` sample's docstring sentences tokenized with its WordPiece tokenizer (the
  bert-base-uncased vocabulary, 30522 tokens; ``core.model.samples.split_corpus`` / ``tokenize_sentences``):
  ``calib.npz`` 32 sentences, ``eval.npz`` 16 sentences, each right-padded to its set's longest
  sentence (<= 64 tokens). These are the counts mixprec generates for a model given without data
  (``core.project.CALIB_GENERATED, EVAL_GENERATED = 32, 16``), so isolated sensitivity's default
  evaluation set -- the dev half of the evaluation data (``split_eval``) -- is 8 sequences.
  ``--generated`` runs the CLI without ``--data/--eval`` instead (mixprec's own generated data: 32 + 16
  sequences of 64 random tokens, masks of ones: dev half 8 x 64 tokens).
* Each run is ``python -m core sensitivity MODEL --mode isolated --json --workers W`` in a child process
  (``--child-cli``: the CLI's ``main`` in that process, then its own peak RSS and its children's, the
  trial workers'), on a workspace in ``--out/ws``:

  - ``cold``: a new, empty workspace (calibration, FP32 reference outputs, switchable model compiled);
  - ``warm``: the same workspace with only the cached sensitivity table removed (calibration,
    reference outputs and the switchable model reused from the cold run);
  - ``calib``: the same workspace with the table and the switchable model removed (calibration and
    reference outputs cached, the switchable model compiled again).

Prints one markdown row per run: seconds (the child's wall clock, start-up included), the
``seconds`` sensitivity reports, peak RSS of the CLI process (its own ``ru_maxrss``) and of the
largest trial worker (``VmHWM`` polled from /proc every 0.2 s: a spawned worker's ``ru_maxrss``
would report its parent's size at the fork), CPU seconds of the CLI process and of each worker, the
1-minute load average before and after (the machine is shared: above ~1 the wall clock is not this
code's alone, the CPU seconds are), trials, where they ran, and a sha256 of the table's (name,
cosine, delta) rows, so runs of two code versions can be checked for identical numbers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.model.samples import (export_minilm, run_minilm_module, sentence_embedding, split_corpus,  # noqa: E402
                                tokenize_sentences)
from core.workspace import Workspace, atomic_save_npz, atomic_write_bytes  # noqa: E402

CALIB_SENTENCES, EVAL_SENTENCES, MAX_TOKENS = 32, 16, 64
RUNS = ("cold", "warm", "calib")


def bert_base_module(seed: int = 0):
    """``BertModel(BertConfig())`` with seeded random weights, mean-pooled and L2-normalised as the
    minilm sample (``core.model.samples.sentence_embedding``), children registered on the wrapper."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    bert = BertModel(BertConfig(attn_implementation="eager"), add_pooling_layer=False).eval()

    return sentence_embedding(bert)


def export(out: Path) -> dict:
    import onnx

    t0 = time.perf_counter()
    calib_s, eval_s = split_corpus(CALIB_SENTENCES, EVAL_SENTENCES)
    calib, eval_ = tokenize_sentences(calib_s, MAX_TOKENS), tokenize_sentences(eval_s, MAX_TOKENS)
    module = bert_base_module()
    model = export_minilm(module, calib)
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    diff = float(np.abs(sess.run(None, eval_)[0] - run_minilm_module(module, eval_)).max())
    if diff > 1e-4:
        raise SystemExit(f"the exported BERT differs from torch by {diff:.2e}")
    atomic_write_bytes(out / "model.onnx", model)
    atomic_save_npz(out / "calib.npz", calib)
    atomic_save_npz(out / "eval.npz", eval_)
    proto = onnx.load_from_string(model)
    return {"export_s": time.perf_counter() - t0, "parameters": sum(p.numel() for p in module.parameters()),
            "matmuls": sum(n.op_type == "MatMul" for n in proto.graph.node), "model_bytes": len(model),
            "calib": list(calib["input_ids"].shape), "eval": list(eval_["input_ids"].shape), "torch_diff": diff}


def child_cli(argv: list[str]) -> None:
    """``python -m core ARGV`` in this process; then one JSON line on stderr with this process's peak
    RSS and CPU seconds (its own, not its workers')."""
    from core.cli.commands import main

    rc = main(argv)
    me = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"rc": rc, "cli_peak_rss": me.ru_maxrss * 1024, "cli_cpu_s": me.ru_utime + me.ru_stime}
    print("BENCH " + json.dumps(doc), file=sys.stderr)
    sys.exit(rc)


TICK = os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    """The pids of ``root``'s descendants (from /proc's parent links)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parent.items() if pp == pid]
        found += kids
        todo += kids
    return found


class WorkerWatch(threading.Thread):
    """Polls the CLI child's descendants (the trial workers) every ``interval`` s: each one's peak RSS
    (VmHWM: the peak of its own address space, set fresh at exec) and CPU seconds (utime + stime)."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval, self.seen, self.stop = pid, interval, {}, threading.Event()

    def run(self):
        while not self.stop.is_set():
            for p in [self.pid, *_descendants(self.pid)]:
                try:
                    status = Path(f"/proc/{p}/status").read_text()
                    fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                hwm = next((int(l.split()[1]) * 1024 for l in status.splitlines() if l.startswith("VmHWM:")), 0)
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                old = self.seen.get(p, (0, 0.0))
                self.seen[p] = (max(old[0], hwm), max(old[1], cpu))
            self.stop.wait(self.interval)

    def workers(self) -> list[tuple[int, float]]:
        """(peak RSS, CPU s) of the descendants that ran over a second of CPU (the trial workers)."""
        return [v for p, v in self.seen.items() if v[1] >= 1.0 and p != self.pid]


def _prepare(ws: Path, run: str) -> None:
    if run == "cold":
        shutil.rmtree(ws, ignore_errors=True)
        return
    for p in Workspace(ws).rankings.glob("*.json"):  # the stored sensitivity tables: measured again
        if json.loads(p.read_text()).get("kind") == "sensitivity":
            p.unlink()
    if run == "calib":
        for p in ws.glob("search/*/switch-*"):
            p.unlink()


def table_digest(layers: list[dict]) -> str:
    rows = sorted((r["name"], repr(r["cosine"]), repr(r["delta"])) for r in layers)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]


def run_cli(out: Path, run: str, args) -> dict:
    ws = out / "ws"
    _prepare(ws, run)
    cli = ["sensitivity", str(out / "model.onnx"), "--mode", "isolated", "--json", "--workers", str(args.workers)]
    if not args.generated:
        cli += ["--data", str(out / "calib.npz"), "--eval", str(out / "eval.npz")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MIXPREC_WORKSPACE": str(ws)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, __file__, "--child-cli", *cli], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    watch = WorkerWatch(p.pid)
    watch.start()
    stdout, stderr = p.communicate()
    wall = time.perf_counter() - t0
    watch.stop.set()
    watch.join()
    peaks = next((json.loads(l[6:]) for l in stderr.splitlines() if l.startswith("BENCH ")), {})
    if p.returncode != 0:
        return {"run": run, "error": (stderr.strip().splitlines() or ["failed"])[-1]}
    doc = json.loads(stdout)
    if args.save:
        (out / f"table-{run}.json").write_text(json.dumps(doc["layers"]))
    workers = watch.workers()
    return {"run": run, "wall_s": wall, "sensitivity_s": doc["seconds"], "cache_hit": doc["cache_hit"],
            "trials": len(doc["layers"]) + 1, "trials_on": doc["trials_on"], "baseline": doc["baseline_cosine"],
            "digest": table_digest(doc["layers"]), "load_before": load, "load_after": os.getloadavg()[0],
            "workers_peak_rss": max((w[0] for w in workers), default=0), "cli_hwm": watch.seen.get(p.pid, (0, 0))[0],
            "workers_cpu_s": [round(w[1], 1) for w in workers], **peaks}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/mixprec-bert-base"))
    ap.add_argument("--runs", default="cold,warm", help="comma-separated: cold, warm, calib")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--generated", action="store_true", help="no --data/--eval: mixprec's generated data")
    ap.add_argument("--save", action="store_true", help="write each run's table to --out/table-RUN.json")
    ap.add_argument("--child-cli", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_cli is not None:
        child_cli(args.child_cli)
    runs = [r for r in args.runs.split(",") if r]
    if any(r not in RUNS for r in runs):
        ap.error(f"--runs: each of {', '.join(RUNS)}")
    out = args.out
    if not all((out / f).is_file() for f in ("model.onnx", "calib.npz", "eval.npz")):
        print("export:", json.dumps(export(out)))
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; model in {out}; "
          f"data: {'generated' if args.generated else 'calib.npz + eval.npz'}; code: {ROOT}\n")
    print("| run | seconds (CLI child) | sensitivity s | CLI peak RSS (GiB; polled VmHWM) | worker peak RSS (GiB) | "
          "CLI CPU s | worker CPU s | load (1 min) | trials | trials on | baseline cosine | table sha |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        r = run_cli(out, run, args)
        if "error" in r:
            print(f"| {run} | failed | | | | | | | | | | {r['error']} |")
            continue
        print(f"| {run} | {r['wall_s']:.1f} | {r['sensitivity_s']:.1f}{' (cached)' if r['cache_hit'] else ''} | "
              f"{r['cli_peak_rss'] / 2**30:.2f} ({r['cli_hwm'] / 2**30:.2f}) | {r['workers_peak_rss'] / 2**30:.2f} | "
              f"{r['cli_cpu_s']:.1f} | "
              f"{' + '.join(map(str, r['workers_cpu_s']))} | {r['load_before']:.1f}-{r['load_after']:.1f} | "
              f"{r['trials']} | {r['trials_on']} | {r['baseline']:.6f} | {r['digest']} |", flush=True)

if __name__ == "__main__":
    main()
