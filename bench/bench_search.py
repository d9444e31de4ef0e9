"""Search benchmark: hand-made fallback policies vs the latency-aware search, on MiniLM and
the tiny CNN, with the same held-out data and interleaved timing for every row.

    .venv/bin/python bench/bench_search.py [--models minilm,tiny-cnn] [--k 11]

Rows: (a) ORT quantize_static with default settings, (b) MatMul-only INT8, (c) the default
policy, (d) default + top-k of the cumulative Polygraphy ranking in FP16, (e) the same with the
isolated ranking, (f) the search, (g) the search with smoothing."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.measure.runs import build_and_measure  # noqa: E402
from core.project import open_project  # noqa: E402
from core.quant.policy import uniform_policy  # noqa: E402
from core.search import SearchConfig, search  # noqa: E402
from core.sensitivity import rank_layers, sensitivity, split_eval  # noqa: E402

BUDGETS = {"minilm": "cosine_mean>=0.995", "tiny-cnn": "cosine_mean>=0.9995", "tiny-transformer": "cosine_mean>=0.9995"}


def ort_quantize_static(project):
    """ORT's quantize_static with default settings, and the policy that describes what it quantized."""
    from onnxruntime.quantization import quantize_static

    class Reader:
        def __init__(self):
            self.it = iter(project.calib_data.batches(1))

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "q.onnx"
        src.write_bytes(project.model.serialized())
        quantize_static(str(src), str(dst), Reader())
        data = dst.read_bytes()
    import onnx

    q = onnx.load_from_string(data)
    dq_out = {n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear"}
    int8 = {n.name for n in q.graph.node if any(i in dq_out for i in n.input)}
    base = uniform_policy(project.model, project.layers, "fp32")
    return data, base.with_layers({n: "int8" for n in base.layers if n in int8})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm,tiny-cnn")
    ap.add_argument("--k", type=int, default=11, help="fallback count for the hand-made top-k policies")
    ap.add_argument("--iterations", type=int, default=100)
    args = ap.parse_args()
    import onnxruntime as ort

    print(f"ORT {ort.__version__} CPU, {os.cpu_count()} cores; {args.iterations} interleaved timing pairs per row; "
          f"quality on the held-out half of each sample's evaluation set (never used for choosing)\n")
    for name in args.models.split(","):
        p = open_project(f"sample:{name}", target="onnxruntime")
        held = replace(p, eval_data=split_eval(p.eval_data)[1])
        base = p.default_policy()
        eligible = [l.name for l in p.layers if l.eligible]
        k = min(args.k, len(eligible) // 2)
        rows = []

        def measure(label, policy, seconds=0.0, onnx_bytes=None):
            r = build_and_measure(held, policy, backend="onnxruntime", label=label, iterations=args.iterations,
                                  onnx_bytes=onnx_bytes)
            rows.append((label, r, seconds))
            print(f"  measured {label}", file=sys.stderr, flush=True)

        t0 = time.perf_counter()
        data, desc = ort_quantize_static(p)
        measure("(a) ORT quantize_static, defaults", desc, time.perf_counter() - t0, data)
        measure("(b) MatMul/Gemm/Conv-only INT8", uniform_policy(p.model, p.layers, "int8")
                .with_calibration(base.calibration))
        measure("(c) default policy", base)
        t0 = time.perf_counter()
        cum = rank_layers(p, max_samples=16).table
        top_cum = cum[cum.eligible].head(k).name.tolist()
        measure(f"(d) default + top-{k} cumulative FP16", base.with_layers({n: "fp16" for n in top_cum}),
                time.perf_counter() - t0)
        t0 = time.perf_counter()
        iso = sensitivity(p, "isolated").table
        measure(f"(e) default + top-{k} isolated FP16", base.with_layers({n: "fp16" for n in iso.head(k).name}),
                time.perf_counter() - t0)
        for label, smooth in (("(f) search", False), ("(g) search + smoothing", True)):
            t0 = time.perf_counter()
            res = search(p, SearchConfig(BUDGETS[name], smooth=smooth, verify=False))
            secs = time.perf_counter() - t0
            sm = " (smoothing kept)" if res.policy.smoothing else (" (smoothing did not pay)" if smooth else "")
            measure(f"{label} {BUDGETS[name]}{sm}", res.policy, secs)
        print(f"### sample:{name} (batch 1 × {p.input_shapes[p.model.inputs[0].name][1:]}, "
              f"{held.eval_data.num_samples} held-out samples)\n")
        print("| policy | cosine_mean | top-5 overlap | top-1 agree | INT8 MAC share | speedup vs FP32 | reformat % "
              "| search/rank s |")
        print("|---|---|---|---|---|---|---|---|")
        for label, r, secs in rows:
            q = r.quality
            fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
            print(f"| {label} | {q.cosine_mean:.4f} | {fmt(q.knn5_overlap)} | {fmt(q.top1_agreement)} | "
                  f"{100 * r.int8_mac_fraction:.0f}% | {r.latency.speedup:.2f}× | {r.reformat.pct:.1f} | {secs:.0f} |")
        print(flush=True)


if __name__ == "__main__":
    main()
