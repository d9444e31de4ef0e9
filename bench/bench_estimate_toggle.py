"""An estimate after a toggle, on BERT-base with the model already loaded (issue 19 §7: "< 1 s").

    .venv/bin/python bench/bench_estimate_toggle.py [--out /tmp/mixprec-bert-base] [--toggles 10]
        [--shapes 32x128,1x128] [--gpu a100] [--modes service,inprocess] [--check]

* The model: ``--out/model.onnx``, the BERT-base-sized encoder of ``bench/bench_bert.py``
  (``BertModel(BertConfig())``, 110 M parameters, random weights, 435 MB), exported by its
  ``export`` when absent. Loaded once here (``core.model.load.load_model``; its inventory for the
  default policy).
* The policies: the default policy (every MatMul INT8, LayerNorm/Softmax/embeddings FP16), then
  ``--toggles`` edits as a user makes them on the Precision page, one after another: each sets one
  more INT8 MatMul to FP16 (MatMuls spread over the 12 layers), so every estimate is of a new policy.
* ``service``: the dashboard's path. One :class:`core.estimate.service.EstimateService` (the
  estimate child process the server starts), the default policy's estimate first (the child loads
  the model: the "first" column), then each toggle's: wall clock from ``submit`` to the result
  (pickled both ways), what the page waits for.
* ``inprocess``: :func:`core.estimate.predict.predict` in this process (the model loaded), and each
  stage of it timed on its own for the same policies: the structure-only compile
  (``compile_policy(..., structure_only=True)``), shape inference (``fusion.static_net``), the
  fusion (``fusion.predicted``), the pricing (``predict.price``).
* ``--check``: the default policy's and the first toggle's predictions against a full compile
  (weights quantized and converted, as before the structure-only compile): identical tables.

Prints one markdown row per (mode, shape): median and max seconds per toggle estimate, the first
estimate, the 1-minute load average before and after (the machine is shared: above ~1 the wall
clock is not this code's alone), and the median per stage for ``inprocess``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.estimate.cost import FITTED  # noqa: E402
from core.estimate.fusion import predicted, static_net  # noqa: E402
from core.estimate.gpus import gpu as gpu_entry  # noqa: E402
from core.estimate.predict import data_files, placeholder_calibration, predict, price  # noqa: E402
from core.estimate.service import EstimateService  # noqa: E402
from core.model.inventory import build_inventory  # noqa: E402
from core.model.load import load_model  # noqa: E402
from core.quant.compile import compile_policy  # noqa: E402
from core.quant.policy import default_policy  # noqa: E402
from core.workspace import Workspace  # noqa: E402

TARGET_S = 1.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def model_path(out: Path) -> Path:
    path = out / "model.onnx"
    if not path.is_file():
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_bert import export

        print(f"exporting BERT-base into {out} …", file=sys.stderr)
        export(out)
    return path


def toggled(policy, layers, n: int) -> list:
    """The default policy, then ``n`` policies each with one more INT8 MatMul set to FP16."""
    mm = [l.name for l in layers if l.op_type == "MatMul" and policy.layers.get(l.name) == "int8"]
    step = max(1, len(mm) // max(n, 1))
    out, cur = [policy], policy
    for name in (mm[::step] + mm)[:n]:
        cur = cur.with_layers({name: "fp16"})
        out.append(cur)
    return out


def stages(model, policy, shapes, gpu) -> dict[str, float]:
    """Seconds of each stage of predict() for ``policy`` (run on their own)."""
    t = [time.perf_counter()]
    calib = placeholder_calibration(model, policy)
    compiled = compile_policy(model, policy, calib, target="trt", structure_only=True)
    t.append(time.perf_counter())
    net = static_net(compiled.proto, shapes, data_files(compiled))
    t.append(time.perf_counter())
    layers, _ = predicted(net)
    t.append(time.perf_counter())
    price(layers, gpu_entry(gpu), FITTED, True, {n.name for n in model.proto.graph.node})
    t.append(time.perf_counter())
    return dict(zip(("compile", "shape inference", "fusion", "price"), (b - a for a, b in zip(t, t[1:]))))


def full_compile_table(model, policy, shapes, gpu):
    compiled = compile_policy(model, policy, placeholder_calibration(model, policy), target="trt")
    layers, _ = predicted(static_net(compiled.proto, shapes, data_files(compiled)))
    return price(layers, gpu_entry(gpu), FITTED, True, {n.name for n in model.proto.graph.node})


def shape_of(text: str, model) -> dict[str, tuple[int, ...]]:
    b, s = (int(v) for v in text.lower().split("x"))
    return {i.name: (b, s) for i in model.inputs}


def row(mode: str, shape: str, times: list[float], cpu: list[float], first: float | None,
        load: tuple[float, float], extra: str = "") -> str:
    med, mx = statistics.median(times), max(times)
    verdict = "yes" if mx < TARGET_S else ("median only" if med < TARGET_S else "no")
    return (f"| {mode} | {shape} | {len(times)} | {med:.2f} | {mx:.2f} | {statistics.median(cpu):.2f} | "
            f"{'' if first is None else f'{first:.1f}'} | {verdict} | {load[0]:.2f} → {load[1]:.2f} | {extra} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/mixprec-bert-base"))
    ap.add_argument("--toggles", type=int, default=10)
    ap.add_argument("--shapes", default="32x128,1x128", help="batch x sequence, comma-separated")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--modes", default="service,inprocess")
    ap.add_argument("--check", action="store_true", help="compare with a full compile's predictions")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")

    path = model_path(args.out)
    ws = Workspace(args.out / "ws-toggle")
    t0 = time.perf_counter()
    model = load_model(path, ws)
    load_s = time.perf_counter() - t0
    shapes_list = [(s, shape_of(s, model)) for s in args.shapes.split(",")]
    t0 = time.perf_counter()
    layers = build_inventory(model, None, shapes_list[0][1])
    inventory_s = time.perf_counter() - t0
    policies = toggled(default_policy(model, layers), layers, args.toggles)
    print(f"model {path} ({model.size_bytes / 1e6:.0f} MB, {len(model.proto.graph.node)} nodes): loaded in "
          f"{load_s:.1f} s, inventory {inventory_s:.1f} s; {len(policies) - 1} toggles after the default policy; "
          f"GPU {args.gpu}; {os.cpu_count()} CPUs", flush=True)
    print("\n| mode | batch x seq | toggles | median s | max s | median CPU s | first s | < 1 s | load avg | "
          "stages (median s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals: dict[tuple[str, str], list[float]] = {}
    for shape_text, shapes in shapes_list:
        if "inprocess" in modes:
            load = os.getloadavg()[0]
            times, cpu, per = [], [], []
            for pol in policies:
                t, c = time.perf_counter(), time.process_time()
                totals.setdefault(("inprocess", shape_text), []).append(predict(model, pol, shapes, args.gpu).total_ms)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                per.append(stages(model, pol, shapes, args.gpu))
            med = {k: statistics.median(p[k] for p in per[1:]) for k in per[0]}
            print(row("in process (predict)", shape_text, times[1:], cpu[1:], times[0], (load, os.getloadavg()[0]),
                      ", ".join(f"{k} {v:.3f}" for k, v in med.items())), flush=True)
        if "service" in modes:
            service = EstimateService(ws.root)
            try:
                load = os.getloadavg()[0]
                times, cpu = [], []
                for pol in policies:
                    t, c = time.perf_counter(), cpu_seconds(service._proc.pid) if service._proc else 0.0
                    pred = service.submit(model, pol, shapes, args.gpu, FITTED).result(timeout=600)
                    times.append(time.perf_counter() - t)
                    cpu.append(cpu_seconds(service._proc.pid) - c)  # the child's, while the page waits
                    totals.setdefault(("service", shape_text), []).append(pred.total_ms)
                print(row("service (EstimateService)", shape_text, times[1:], cpu[1:], times[0],
                          (load, os.getloadavg()[0]), "first: child start + model load"), flush=True)
            finally:
                service.close()
        if args.check:
            for pol in policies[:2]:
                got = predict(model, pol, shapes, args.gpu).layers
                if not got.equals(full_compile_table(model, pol, shapes, args.gpu)):
                    print(f"MISMATCH: {shape_text} policy {pol.sha256[:12]}: structure-only != full compile")
                    return 1
            print(f"check {shape_text}: default and first toggle identical to a full compile's predictions")
    for shape_text, _ in shapes_list:
        runs = [v for (m, s), v in totals.items() if s == shape_text]
        if len(runs) > 1 and any(r != runs[0] for r in runs):
            print(f"MISMATCH: {shape_text}: the service and in-process estimates differ")
            return 1
        if runs:
            print(f"{shape_text}: estimated {runs[0][0]:.3f} ms (default) … {runs[0][-1]:.3f} ms "
                  f"(after {len(runs[0]) - 1} toggles) on {args.gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
