"""Fit and validate the estimator's transformer classes on NVIDIA's published TensorRT BERT latencies
(issue 19 §2).

    .venv/bin/python bench/bench_bert_estimate.py [--fit] [--models bert-base,bert-large] [--out /tmp/mixprec-bert-est]

* Exports BERT-base (``BertModel(BertConfig())``) and BERT-Large (hidden 1024, 24 layers, 16 heads,
  intermediate 4096), random weights, no download, as ``bench/bench_bert.py`` does, into ``--out`` (once).
* Predicts each engine (:func:`core.estimate.transformer.bert_engines`) at every (seq, batch) of the
  published rows: FP16 every layer; INT8 every MatMul INT8 and the rest FP16. Engines are cached in
  ``--out/engines-MODEL-HASH.pkl`` (HASH: the estimator's source, so a code change predicts again).
* ``--fit``: fits the transformer classes on ``shared/fixtures/trt-bert-published/bert-base-a100-t4.json``
  ONLY and prints the values for ``core.estimate.transformer_fit.TRANSFORMER_FIT``.
* Always: scores the shipped fit on the fitting rows (in-sample) and on ``bench/data/trt-bert-heldout.json``
  (held out: other GPUs, BERT-Large), prints a table, and writes ``--out/rows.json`` (validation rows).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from core.estimate import transformer as tr  # noqa: E402


def export(model: str, out: Path) -> Path:
    path = out / model / "model.onnx"
    if path.is_file():
        return path
    from tests.fixtures.nets import bert_onnx
    from core.workspace import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, bert_onnx(model))
    return path


def source_hash() -> str:
    h = hashlib.sha256()
    for p in ("core/estimate/fusion.py", "core/quant/compile.py", "core/quant/policy.py", "core/model/placement.py",
              "core/model/inventory.py"):
        h.update((ROOT / p).read_bytes())
    return h.hexdigest()[:12]


def engines(model: str, out: Path, shapes: list[tuple[int, int]]) -> dict:
    cache = out / f"engines-{model}-{source_hash()}.pkl"
    if cache.is_file():
        have = pickle.loads(cache.read_bytes())
        if all((p, s, b) in have for p in ("fp16", "int8") for s, b in shapes):
            return have
    from core.model.inventory import build_inventory
    from core.model.load import load_model
    from core.workspace import Workspace

    ws = Workspace(out / "ws")
    m = load_model(str(export(model, out)), ws)
    layers = build_inventory(m, None, {i.name: (1, 128) for i in m.proto.graph.input})
    t0 = time.perf_counter()
    eng = tr.bert_engines(m, layers, shapes)
    print(f"predicted {len(eng)} {model} engines in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cache.write_bytes(pickle.dumps(eng))
    return eng


def cases_of(rows: list[dict], out: Path, base) -> list:
    cases = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        eng = engines(model, out, sorted({(r["seq"], r["batch"]) for r in mine}))
        cases += [tr.Case(r, eng[(r["precision"], r["seq"], r["batch"])], base) for r in mine]
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/mixprec-bert-est"))
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--loo", action="store_true", help="also leave-one-GPU-out fits of the transformer classes")
    ap.add_argument("--models", default="bert-base,bert-large")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from core.estimate.cost import FITTED

    fit_rows = tr.read_rows(tr.PUBLISHED)
    held = [r for r in tr.read_rows(tr.HELD_OUT) if r["model"] in args.models.split(",")]
    fit_cases = cases_of(fit_rows, args.out, FITTED)
    params = FITTED
    if args.fit:
        t0 = time.perf_counter()
        params = tr.fit_transformer(fit_cases, FITTED)
        print(f"fit in {time.perf_counter() - t0:.1f} s:", json.dumps(tr.fitted_values(params), indent=1))
        doc = tr.save_fit(params, fit_cases, "python bench/bench_bert_estimate.py --fit")
        print(f"wrote {tr.FIT_FILE}: median |err| {doc['median_abs_err']:.3f}, max {doc['max_abs_err']:.3f}")
    rows = [{**r, "split": "fit (in-sample)"} for r in tr.score(fit_cases, params)]
    known = []
    for r in held:
        try:
            tr.gpu_entry(r["gpu"])
            known.append(r)
        except Exception as e:  # noqa: BLE001 - a GPU not in the table yet
            print(f"skipped {r['gpu']}: {e}", file=sys.stderr)
    held_cases = cases_of(known, args.out, FITTED)
    rows += [{**r, "split": "held-out published"} for r in tr.score(held_cases, params)]
    if args.loo:  # leave one GPU out: fit the transformer classes on the other GPU's rows, score this one's
        for g in sorted({c.row["gpu"] for c in fit_cases}):
            others = [c for c in fit_cases if c.row["gpu"] != g]
            p = tr.fit_transformer(others, params, restarts=2)
            rows += [{**r, "split": "leave-one-gpu-out"} for r in tr.score([c for c in fit_cases if c.row["gpu"] == g], p)]
    if set(args.models.split(",")) >= {"bert-base", "bert-large"}:
        cmd = "python bench/bench_bert_estimate.py" + (" --fit" if args.fit else "") + (" --loo" if args.loo else "")
        tr.save_validation([tr.case_row(r, r["split"] if r["split"] != "fit (in-sample)" else "in-sample")
                            for r in rows], cmd)
        print(f"wrote {tr.VALIDATION_FILE}", file=sys.stderr)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(f"{'split':16} {'gpu':10} {'model':10} {'seq':>4} {'batch':>5} {'prec':5} {'meas':>8} {'est':>8} {'err':>7}")
    for r in rows:
        print(f"{r['split']:16} {r['gpu']:10} {r['model']:10} {r['seq']:4} {r['batch']:5} {r['precision']:5} "
              f"{r['measured_ms']:8.3f} {r['estimated_ms']:8.3f} {r['rel_err'] * 100:+6.1f}%")


if __name__ == "__main__":
    main()
