"""Issue 14 §3 and §4 on this machine: the layer-wise comparison under a memory budget (chunked vs one
pass), and isolated sensitivity on the local process pool vs a local Ray instance with 1 and 2 CPUs.

    .venv/bin/python bench/bench_scale.py [--parts memory,ray] [--seq 256] [--samples 4]

Every measurement is one ``python -m core ... --json`` child process (its peak memory is its own),
in one temp workspace (the calibration and the switchable model are cached after a warm-up run; the
stored sensitivity tables are removed before each run, so each one measures its trials again).

* ``memory``: ``rank`` of MiniLM at ``--seq`` tokens (random token ids within the vocabulary; the
  sample's own sentences are 63 tokens) and of a conv chain with big activations (12 x 1x1 convs on
  4 x 512 x 512, ``tests/scale/test_comparison_memory.py``), each with ``--max-memory 64G`` (one pass)
  and smaller budgets: chunks, seconds, peak RSS of the comparison and what it added, the largest
  cosine difference to one pass.
* ``ray``: ``sensitivity sample:minilm --mode isolated`` with ``--workers 1/2`` (local processes)
  and ``--ray local --workers 1/2`` (a Ray instance started by the CLI with that many CPUs;
  its start-up is in the seconds)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.models import wide_model  # noqa: E402
from core.workspace import Workspace  # noqa: E402


def _cli(ws: Path, *args) -> tuple[dict, float]:
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws), "MIXPREC_RAY_ADDRESS": ""}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "core", *args, "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout), time.perf_counter() - t0


def _minilm_data(folder: Path, seq: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)

    def arrays(n):
        return {"input_ids": rng.integers(1000, 30000, (n, seq)).astype(np.int64),
                "attention_mask": np.ones((n, seq), np.int64), "token_type_ids": np.zeros((n, seq), np.int64)}
    np.savez(folder / "calib.npz", **arrays(16))
    np.savez(folder / "eval.npz", **arrays(8))
    return folder / "calib.npz", folder / "eval.npz"


def part_memory(ws: Path, tmp: Path, args) -> list[str]:
    (tmp / "minilm").mkdir(exist_ok=True)
    (tmp / "wide").mkdir(exist_ok=True)
    calib, evald = _minilm_data(tmp / "minilm", args.seq)
    wide = wide_model(tmp / "wide")
    cases = [("sample:minilm", calib, evald, ["64G", "768M", "512M"], f"MiniLM, 1 x {args.seq} tokens"),
             (str(wide), wide.with_name("calib.npz"), wide.with_name("eval.npz"), ["64G", "128M", "96M"],
              "conv chain, 4 x 512 x 512")]
    rows = ["| model | --max-memory | chunks | seconds | comparison peak RSS | added by the comparison | "
            "max abs cosine diff to one pass |", "|---|---|---|---|---|---|---|"]
    for model, c, e, budgets, label in cases:
        _cli(ws, "rank", model, "--data", str(c), "--eval", str(e), "--samples", "1")  # calibration cached
        one = None
        for b in budgets:
            doc, _ = _cli(ws, "rank", model, "--data", str(c), "--eval", str(e), "--samples", str(args.samples),
                          "--max-memory", b)
            cos = {r["name"]: r["cosine"] for r in doc["layers"]}
            one = one or cos
            diff = max(abs(cos[n] - one[n]) for n in one)
            m = doc["memory"]
            rows.append(f"| {label} | {b} | {m['chunks']} | {doc['seconds']:.1f} | {m['peak_bytes'] / 2**20:.0f} MiB "
                        f"| {m['added_bytes'] / 2**20:.0f} MiB | {diff:.1e} |")
            print(rows[-1], flush=True)
    return rows


def part_ray(ws: Path, tmp: Path, args) -> list[str]:
    _cli(ws, "sensitivity", "sample:minilm", "--workers", "2")  # calibration + switchable model cached
    rows = ["| trials on | --workers | trials | seconds (CLI process) | sensitivity seconds | trials_on |",
            "|---|---|---|---|---|---|"]
    for extra, label in (([], "local processes"), (["--ray", "local"], "Ray (local instance)")):
        for w in ("1", "2"):
            for f in Workspace(ws).rankings.glob("*.json"):  # the stored sensitivity tables: measured again
                if json.loads(f.read_text()).get("kind") == "sensitivity":
                    f.unlink()
            doc, wall = _cli(ws, "sensitivity", "sample:minilm", "--workers", w, *extra)
            rows.append(f"| {label} | {w} | {len(doc['layers']) + 1} | {wall:.1f} | {doc['seconds']:.1f} | "
                        f"{doc['trials_on']} |")
            print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="memory,ray")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        ws = Path(tmp) / "ws"
        out = []
        for part in args.parts.split(","):
            out += [""] + {"memory": part_memory, "ray": part_ray}[part](ws, Path(tmp), args)
    print("\n".join(out))


if __name__ == "__main__":
    main()
