"""Core benchmark on MiniLM: quality, interleaved speedup, reformat share and build time of
five policies, plus layer-wise ranking time and peak memory.

    .venv/bin/python bench/bench_core.py [--iterations 200]

Prints a markdown table (recorded in docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.measure.runs import build_and_measure  # noqa: E402
from core.project import open_project  # noqa: E402
from core.quant.policy import uniform_policy  # noqa: E402
from core.sensitivity import rank_layers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args()
    import onnxruntime as ort

    p = open_project("sample:minilm", target="onnxruntime")
    base = p.default_policy()
    ffn_down = {l.name: "fp16" for l in p.layers if l.name.endswith("/output/dense/MatMul")}
    policies = [
        ("FP32", uniform_policy(p.model, p.layers, "fp32")),
        ("all-FP16", uniform_policy(p.model, p.layers, "fp16")),
        ("default (INT8 + FP16 LN/Softmax/embeddings)", base),
        ("default + 6 FFN-down FP16", base.with_layers(ffn_down)),
        ("all-eligible INT8 (rest FP32)", uniform_policy(p.model, p.layers, "int8").with_calibration(base.calibration)),
    ]
    print(f"MiniLM-L6 sample, batch 1 × seq {p.input_shapes['input_ids'][1]}, {p.eval_data.num_samples} held-out "
          f"sentences; ORT {ort.__version__} CPU, {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
          f"{args.iterations} interleaved pairs\n")
    print("| policy | cosine_mean | cosine_min | top-5 overlap | speedup vs FP32 | median ms | reformat % | build s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, pol in policies:
        r = build_and_measure(p, pol, iterations=args.iterations)
        q = r.quality
        print(f"| {name} | {q.cosine_mean:.4f} | {q.cosine_min:.4f} | {q.knn5_overlap:.3f} | {r.latency.speedup:.2f}× "
              f"| {r.latency.median_ms:.2f} | {r.reformat.pct:.1f} | {r.build_seconds:.1f} |", flush=True)
    t0 = time.perf_counter()
    ranking = rank_layers(p, max_samples=16)
    rank_s = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    top = ranking.table[ranking.table.eligible].head(6).name.tolist()
    print(f"\nlayer-wise ranking (Polygraphy, 16 samples): {rank_s:.1f} s; peak RSS of this process {peak_gb:.2f} GB")
    print("top-6 eligible by cumulative cosine drop: " + ", ".join(top))
    env = {**os.environ}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "core", "build", "sample:minilm", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    cli_s = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    print(f"`python -m core build sample:minilm --json` (sample and calibration cached): {cli_s:.1f} s wall, "
          f"calibration cache hit: {doc['calibration']['cache_hit']}")


if __name__ == "__main__":
    main()
