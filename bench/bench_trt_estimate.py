"""TensorRT latency without a GPU (issues 12, 19): the engine cost model against real engines.

    .venv/bin/python bench/bench_trt_estimate.py [--reports ../shared/fixtures/trt-engine-reports]
        [--write-validation] [--print-fit] [--engines-only]

Engine level: on each of the nine fixture engines — five A100 ResNet-18 at batch 32 (fp32, fp16 and
three INT8 placements; ``--reports``) and four TITAN RTX MobileNetV2 QAT at batch 1 (TensorRT 8.2
and 8.4; the sibling folder ``trt-engine-reports-more``) — the estimated vs measured per-layer sum
(what a trtexec profile measures) and the per-layer median |relative error|, with

* the shipped fit (``core.estimate.cost.FITTED``): ONE parameter set fitted jointly on all nine
  engines, each priced on its own GPU (in-sample);
* the same fit made again here (it must give the shipped numbers);
* leave-one-engine-out: fitted on the other eight engines, scored on the one left out;
* leave-one-gpu-out: fitted on the other GPU's engines only, scored on this GPU's (the TITAN RTX
  from the A100 ResNet-18 alone, and the reverse: how the fit transfers through the GPU table).

Targets: every engine within 15 % in-sample and 25 % leave-one-engine-out; per-layer median ≤ 30 %
(the batch-1 MobileNetV2 engines' included). Leave-one-gpu-out has no target; it is reported.
``--write-validation`` writes these rows to ``core/estimate/cnn_validation.json``
(``core.estimate.fit.validation_rows``). The policy-level part (a ResNet-18 built in code, four
policies, on the A100, T4 and H100) is appended as ``policy_level()``."""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.estimate import cost, fit  # noqa: E402
from core.estimate.gpus import gpu  # noqa: E402
from core.workspace import atomic_write_json  # noqa: E402

REPORTS = ROOT.parent / "shared" / "fixtures" / "trt-engine-reports"
TOTAL_TARGET, LOO_TARGET, MEDIAN_TARGET = 0.15, 0.25, 0.30
COMMAND = "python bench/bench_trt_estimate.py --write-validation"


def _table(rows: list[dict], title: str, total_target: float | None = TOTAL_TARGET) -> bool:
    print(f"\n### {title}\n")
    print("| engine | GPU | layers | measured ms | estimated ms | total error | per-layer median abs error | targets |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for r in rows:
        met = total_target is None or (abs(r["total_err"]) <= total_target and r["median_abs_err"] <= MEDIAN_TARGET)
        ok &= met
        print(f"| {r['engine']} | {r['gpu']} | {r['layers']} | {r['measured_ms']:.3f} | {r['estimated_ms']:.3f} | "
              f"{r['total_err'] * 100:+.1f} % | {r['median_abs_err'] * 100:.1f} % | "
              f"{'—' if total_target is None else 'met' if met else 'NOT met'} |")
    return ok


def _params_line(p: cost.CostParams) -> str:
    keys = ("conv_gemm", "pooling", "reformat")
    return ("compute_eff " + ", ".join(f"{k} {p.compute_eff[k]:.3f}" for k in keys[:1])
            + "; math_eff " + ", ".join(f"{m} {v:.3f}" for m, v in p.math_eff.items() if "." not in m)
            + f"; simt_eff {p.simt_eff:.3f}; lowc_channels {p.lowc_channels:.2f}; knee p {p.knee:.2f}; "
            f"int8_linear_out {p.int8_linear_out:.3f}; step_us {p.step_us:.3f}; memory_eff "
            + ", ".join(f"{k} {p.memory_eff[k]:.3f}" for k in keys)
            + "; overhead_us " + ", ".join(f"{k} {p.overhead_us[k]:.2f}" for k in keys))


def engine_level(reports: Path = REPORTS, write_validation: bool = False) -> bool:
    """Section 1: the nine fixture engines. True when every target is met."""
    print("## Engine level: the nine fixture engines (A100 ResNet-18 batch 32, TITAN RTX MobileNetV2 batch 1)\n")
    samples = fit.fixture_samples(reports)
    for key in dict.fromkeys(s.gpu for s in samples):
        g = gpu(key)
        print(f"GPU {g.name}: {g.sm_count} SMs, FP32 {g.fp32_tflops}, TF32 {g.tf32_tflops}, FP16 {g.fp16_tflops} "
              f"TFLOPS, INT8 {g.int8_tops} TOPS, {g.bandwidth_gbs:.0f} GB/s (dense)")
    shipped = fit.evaluate(cost.FITTED, samples)
    ok = _table(shipped, "Shipped fit (core.estimate.cost.FITTED), in-sample: all nine engines")
    print(f"\nshipped parameters: {_params_line(cost.FITTED)}")
    t0 = time.perf_counter()
    refit = fit.fit(samples)
    took = time.perf_counter() - t0
    again = fit.evaluate(refit, samples)
    ok &= _table(again, f"Fitted again here ({took:.1f} s)")
    same = all(abs(a["estimated_ms"] / b["estimated_ms"] - 1) <= 0.01 for a, b in zip(again, shipped))
    print(f"\nrefitted parameters: {_params_line(refit)}\nthe refit gives the shipped estimates within 1 %: "
          f"{'yes' if same else 'NO (update FITTED: --print-fit)'}")
    ok &= same
    t0 = time.perf_counter()
    loo = fit.leave_one_out(samples)
    ok &= _table(loo, f"Leave-one-engine-out: fitted on the other eight engines ({time.perf_counter() - t0:.0f} s)",
                 LOO_TARGET)
    t0 = time.perf_counter()
    logo = fit.leave_one_gpu_out(samples)
    _table(logo, f"Leave-one-gpu-out: fitted on the other GPU's engines only ({time.perf_counter() - t0:.0f} s); "
                 "no target", None)
    print(f"\nengine level: targets (total within {TOTAL_TARGET:.0%} in-sample and {LOO_TARGET:.0%} "
          f"leave-one-engine-out, per-layer median ≤ {MEDIAN_TARGET:.0%}) {'met' if ok else 'NOT met'} on every engine")
    if write_validation:
        rows = (fit.as_rows(samples, shipped, "in-sample") + fit.as_rows(samples, loo, "leave-one-engine-out")
                + fit.as_rows(samples, logo, "leave-one-gpu-out"))
        date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        atomic_write_json(fit.VALIDATION_FILE, fit.validation_document(rows, cost.FITTED, COMMAND, date))
        print(f"\nwrote {len(rows)} validation rows to {fit.VALIDATION_FILE.relative_to(ROOT)}")
    return ok


def print_fitted_literal(reports: Path = REPORTS) -> None:
    """The refitted parameters as the JSON that ``cost.FITTED`` holds (to update it)."""
    params = fit.fit(fit.fixture_samples(reports))

    def rounded(v):
        if isinstance(v, float):
            return float(f"{v:.4g}")
        return {k: rounded(x) for k, x in v.items()} if isinstance(v, dict) else v

    print(json.dumps({k: rounded(v) for k, v in params.to_json().items()}, indent=4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=Path, default=REPORTS, help="folder of the A100 fixture reports")
    ap.add_argument("--print-fit", action="store_true", help="print the refitted parameters as JSON and stop")
    ap.add_argument("--write-validation", action="store_true",
                    help="write the engines' validation rows to core/estimate/cnn_validation.json")
    ap.add_argument("--engines-only", action="store_true", help="the engine level only (no policy level)")
    args = ap.parse_args(argv)
    if args.print_fit:
        print_fitted_literal(args.reports)
        return 0
    ok = engine_level(args.reports, args.write_validation)
    for section in (() if args.engines_only else (globals().get("policy_level"),)):  # the policy-level part
        if section is not None:
            ok = section() is not False and ok
    return 0 if ok else 1


# ---------------------------------------------------------------------------- policy level (H4)

POLICY_TARGET = 0.20
# the four policies, each against the real engine it is compared with (its profile's sum)
POLICIES = (("all FP32", "fp32", "a100-resnet-fp32"),
            ("all FP16", "fp16", "a100-resnet-fp16"),
            ("INT8 convolutions, residual Adds and everything else FP16", "int8-conv", "a100-resnet-qat"),
            ("INT8 convolutions and residual-Add inputs, everything else FP16", "int8-conv-residual",
             "a100-resnet-qat-residual"))
MEASURED_ORDER = ("fp32", "int8-conv", "fp16", "int8-conv-residual")


def resnet_policies(model, layers) -> dict:
    """The four policies on mixprec's ResNet-18, plus mixprec's default (INT8 convolutions, residual
    Adds and pooling by pattern, network default FP16), compared with the qat-residual-qgap engine."""
    from core.quant.policy import default_policy, uniform_policy

    fp16 = uniform_policy(model, layers, "fp16")
    return {"fp32": uniform_policy(model, layers, "fp32"), "fp16": fp16,
            "int8-conv": fp16.with_layers({l.name: "int8" for l in layers if l.op_type in ("Conv", "Gemm")}),
            "int8-conv-residual": fp16.with_layers({l.name: "int8" for l in layers
                                                    if l.op_type in ("Conv", "Gemm", "Add")}),
            "default": default_policy(model, layers, "fp16")}


def policy_level(reports: Path = REPORTS) -> bool:
    """Section 2 and 3: ResNet-18 built in code (tests.fixtures.nets), batch 32, the four policies predicted from
    the compiled trt ONNX and priced on the A100 (against the real engines), then on the T4 and H100
    (no ground truth). True when every A100 total is within 20 % and the order is the measured one."""
    from core.estimate.predict import predict
    from core.model.inventory import build_inventory
    from core.model.load import model_from_bytes
    from tests.fixtures.nets import resnet18_onnx
    from core.backends.reports import load_engine_report

    print("\n## Policy level: ResNet-18 built in code (tests.fixtures.nets), batch 32 x 3 x 224 x 224\n")
    t0 = time.perf_counter()
    data = resnet18_onnx(batch=32)
    model = model_from_bytes(data, ROOT / "resnet18.onnx", name="resnet18")
    shapes = {"input": (32, 3, 224, 224)}
    layers = build_inventory(model, None, shapes)
    policies = resnet_policies(model, layers)
    print(f"model exported and inventoried in {time.perf_counter() - t0:.1f} s; each policy compiled for the "
          "trt target, the engine predicted (core.estimate.fusion) and priced with the shipped fit")
    real = {f: load_engine_report(reports / f"{f}.graph.json", reports / f"{f}.profile.json")
            for f in [f for _, _, f in POLICIES] + ["a100-resnet-qat-residual-qgap"]}
    rows = [(label, key, fixture) for label, key, fixture in POLICIES]
    rows.append(("mixprec default (INT8 convs, residual Adds and pooling by pattern; FP16 rest)", "default",
                 "a100-resnet-qat-residual-qgap"))
    est, took = {g: {} for g in ("a100", "t4", "h100")}, []
    print("\n### A100: estimated vs the real engines (sum of per-layer times)\n")
    print("| policy | measured engine | estimated (predict) | error | predicted reformats (share) | target |")
    print("|---|---|---|---|---|---|")
    ok = True
    for label, key, fixture in rows:
        t1 = time.perf_counter()
        for g in est:
            est[g][key] = predict(model, policies[key], shapes, g)
        took.append((time.perf_counter() - t1) / len(est))
        r, m = est["a100"][key], real[fixture]
        err = r.total_ms / m.total_ms - 1
        met = abs(err) <= POLICY_TARGET
        if key != "default":
            ok &= met
        print(f"| {label} | {m.total_ms:.3f} ms, {m.reformat.count} reformats ({fixture}) | {r.total_ms:.3f} ms | "
              f"{err * 100:+.1f} % | {r.reformat_count} ({r.reformat_pct:.1f} %) | "
              f"{('met' if met else 'NOT met') if key != 'default' else 'reference'} |")
    print(f"\none prediction (compile + fusion + pricing) takes {min(took):.2f}–{max(took):.2f} s here")
    order = sorted(MEASURED_ORDER, key=lambda k: -est["a100"][k].total_ms)
    order_ok = tuple(order) == MEASURED_ORDER
    print(f"\nmeasured order: {' > '.join(MEASURED_ORDER)}; estimated order: {' > '.join(order)} "
          f"({'right' if order_ok else 'WRONG'})")
    print("\n### The same policies on the T4 and the H100 (no ground truth; the A100 fit through the GPU table)\n")
    print("| policy | T4 ms | T4 reformat share | H100 ms | H100 reformat share | A100 ms |")
    print("|---|---|---|---|---|---|")
    for label, key, _ in rows:
        t4, h100 = est["t4"][key], est["h100"][key]
        print(f"| {label} | {t4.total_ms:.3f} | {t4.reformat_pct:.1f} % | {h100.total_ms:.3f} | "
              f"{h100.reformat_pct:.1f} % | {est['a100'][key].total_ms:.3f} |")
    ok &= order_ok
    print(f"\npolicy level: totals within {POLICY_TARGET:.0%} and the order "
          f"{'met' if ok else 'NOT met'}")
    return ok

if __name__ == "__main__":
    sys.exit(main())
