"""How well the search's latency model (core.search.latency) predicts real builds.

    .venv/bin/python bench/bench_latency_model.py [--model minilm] [--policies 12] [--seed 0]

Fits the model once (profiles of the all-FP16, all-INT8 and FP32 builds), then builds and
times real policies — random INT8 subsets of every size, plus contiguous vs island pairs of
equal MACs — with interleaved FP32 timing. Prints, per policy, the estimated and measured
speedup over FP32, and at the end the Spearman rank correlation and the mean absolute error.
The search only needs the *order* of candidates to be right, so the rank correlation is the
number that matters."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.measure.runs import build_and_measure  # noqa: E402
from core.project import open_project  # noqa: E402
from core.quant.calibration import calibrate  # noqa: E402
from core.search import latency_model  # noqa: E402


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--policies", type=int, default=12, help="random policies (plus the island/contiguous pairs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    p = open_project(f"sample:{args.model}", target="onnxruntime")
    base = p.default_policy()
    t0 = time.perf_counter()
    calib = calibrate(p.model, p.calib_data, base.calibration, p.ws)
    lat = latency_model(p, base, calib)
    print(f"latency model fitted in {time.perf_counter() - t0:.1f} s: FP32 {lat.fp32_total_ms:.2f} ms, all-FP16 "
          f"{lat.wall.fp16_total_ms:.2f} ms, all-INT8 {lat.wall.int8_total_ms:.2f} ms (wall-clock); "
          f"{len(lat.edges)} edges; Q {lat.wall.q_ms_per_element * 1e6:.2f} ns/element, "
          f"Cast {lat.wall.cast_ms_per_element * 1e6:.2f} ns/element")
    eligible = [l.name for l in p.layers if l.eligible]
    rng = np.random.default_rng(args.seed)
    sets = []
    for k in np.linspace(0, len(eligible), args.policies).round().astype(int):
        sets.append((f"random {k}/{len(eligible)}", set(rng.choice(eligible, size=k, replace=False))))
    for e in lat.edges[:2]:  # a contiguous pair vs the consumer alone (island) vs the producer alone
        sets += [(f"pair {e.producer.split('/')[2]}", {e.producer, e.consumer}),
                 (f"island {e.consumer.split('/')[-2]}", {e.consumer}), (f"island {e.producer.split('/')[-1]}", {e.producer})]
    rows = []
    print(f"{'policy':<22} {'INT8':>5} {'bnd':>4} {'est ×':>7} {'meas ×':>7} {'est rf%':>8} {'meas rf%':>9}")
    for name, int8 in sets:
        pol = base.with_layers({n: ("int8" if n in int8 else "fp16") for n in eligible})
        run = build_and_measure(p, pol, backend="onnxruntime", label=f"latency-model {name}", iterations=60)
        est_ms, est_rf = lat.estimate(int8)
        est_speedup = lat.fp32_total_ms / est_ms
        rows.append((est_speedup, run.latency.speedup))
        print(f"{name:<22} {len(int8):>5} {lat.boundaries(int8):>4} {est_speedup:>7.2f} {run.latency.speedup:>7.2f} "
              f"{est_rf:>8.1f} {run.reformat.pct:>9.1f}")
    est, meas = np.array(rows).T
    print(f"\nSpearman rank correlation (estimated vs measured speedup): {spearman(est, meas):.3f}")
    print(f"mean absolute error of the speedup: {np.mean(np.abs(est - meas)):.3f} "
          f"({100 * np.mean(np.abs(est - meas) / meas):.1f} %)")


if __name__ == "__main__":
    main()
