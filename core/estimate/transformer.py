"""Transformer engines: the cost of the transformer classes (``transformer``: the GEMMs of a transformer
block with their fused epilogues; ``attention``: fused multi-head attention) fitted on NVIDIA's
published TensorRT BERT latencies, and validated on the rows that are not fitted.

* Fitting data: ``shared/fixtures/trt-bert-published/bert-base-a100-t4.json`` only (BERT-base, seq 128
  and 384, batch 1–128, FP16 and INT8, on an A100-40GB and a T4).
* Validation data (never fitted): ``bench/data/trt-bert-heldout.json`` (A30, L40S, V100, and BERT-Large
  on every GPU), extracted from the same README by ``bench/extract_bert_heldout.py``.

How a published row becomes an estimate: the BERT network (``BertModel(BertConfig())`` for BERT-base,
hidden 1024 / 24 layers / 16 heads for BERT-Large, exported as mixprec's samples are) is compiled with the
policy that matches how NVIDIA built the engine — FP16: every layer FP16; INT8: every MatMul INT8 (Q/DQ on
both operands, attention included) and everything else FP16 (``--int8 --fp16``) — at the row's batch and
sequence; :mod:`core.estimate.fusion` predicts the engine; :mod:`core.estimate.cost` prices it. The
published figure is GPU time per inference (CUDA events), which the sum of per-layer estimates models.

Only the transformer classes' parameters are fitted here (their compute and memory efficiencies, a
per-kernel overhead, and their FP16 tensor-core factor relative to INT8); the pointwise, normalization
and reformat classes keep the CNN fit (:data:`core.estimate.cost.FITTED`)."""
from __future__ import annotations

import datetime
import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from core.errors import MixprecError
from core.estimate.cost import CostParams, layer_ms
from core.estimate.engine import EngineLayer
from core.estimate.fit import nelder_mead
from core.estimate.fusion import predicted, static_net
from core.estimate.gpus import gpu as gpu_entry
from core.estimate.predict import data_files, placeholder_calibration
from core.estimate.transformer_fit import FIT_FILE
from core.quant.compile import compile_policy
from core.quant.policy import default_policy, uniform_policy
from core.workspace import atomic_write_bytes

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT.parent / "shared" / "fixtures" / "trt-bert-published" / "bert-base-a100-t4.json"
HELD_OUT = ROOT / "bench" / "data" / "trt-bert-heldout.json"
TRANSFORMER_CLASSES = ("transformer", "attention", "transformer_norm")
# the fitted parameters: (field, key)
FREE = (("compute_eff", "transformer"), ("memory_eff", "transformer"), ("overhead_us", "transformer"),
        ("compute_eff", "attention"), ("memory_eff", "attention"), ("overhead_us", "attention"),
        ("memory_eff", "transformer_norm"), ("overhead_us", "transformer_norm"),
        ("math_eff", "transformer.fp16"), ("math_eff", "attention.fp16"), ("gemm_tile", None), ("clock_alpha", None),
        ("transformer_knee", None))
_BOUNDS = {"compute_eff": (0.02, 1.0), "memory_eff": (0.02, 1.0), "overhead_us": (0.05, 50.0),
           "math_eff": (0.2, 3.0), "gemm_tile": (16.0, 512.0), "clock_alpha": (0.001, 1.0),
           "transformer_knee": (1.0, 60.0)}
_START = {"gemm_tile": 128.0, "clock_alpha": 0.3, "transformer_knee": 4.0}
FIT_BASIS = "published TensorRT BERT-base latencies (A100-40GB, T4)"


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a published-latency file: gpu, model, seq, batch, precision, avg_ms (checked)."""
    path = Path(path)
    if not path.is_file():
        raise MixprecError(f"the published-latency file {path} is missing",
                           "put the shared fixtures beside the checkout (../shared/fixtures)")
    rows = json.loads(path.read_text())
    need = ("gpu", "model", "seq", "batch", "precision", "avg_ms")
    bad = [r for r in rows if any(k not in r for k in need) or not float(r["avg_ms"]) > 0]
    if bad:
        raise MixprecError(f"{len(bad)} rows of {path.name} lack {', '.join(need)} or a positive avg_ms",
                           "regenerate the file (bench/extract_bert_heldout.py)")
    return rows


def _key(layer: EngineLayer) -> tuple:
    """What prices a layer (its name aside): identical blocks price once."""
    ts = lambda ts_: tuple((t.dims, t.dtype, t.vector) for t in ts_)  # noqa: E731
    return (layer.layer_type, layer.layer_class, layer.precision, ts(layer.inputs), ts(layer.outputs), layer.kernel,
            layer.groups, layer.out_maps, layer.weights, layer.weights_dtype, layer.bias, layer.is_reformat,
            layer.attrs.get("flops"), layer.attrs.get("tactic", ""))


class Case:
    """One published row with its predicted engine: the transformer layers (deduplicated, with counts),
    re-priced for each parameter set, and the time of the other layers (fixed: the CNN fit)."""

    def __init__(self, row: dict, engine: list[EngineLayer], base: CostParams):
        self.row, self.gpu = row, gpu_entry(row["gpu"])
        counts = Counter()
        first: dict[tuple, EngineLayer] = {}
        fixed = 0.0
        for layer in engine:
            if layer.layer_class in TRANSFORMER_CLASSES:
                k = _key(layer)
                counts[k] += 1
                first.setdefault(k, layer)
            else:
                fixed += layer_ms(layer, self.gpu, base)
        self.layers = [(first[k], n) for k, n in counts.items()]
        self.fixed_ms = fixed
        self.measured_ms = float(row["avg_ms"])

    def estimate(self, params: CostParams) -> float:
        return self.fixed_ms + sum(n * layer_ms(layer, self.gpu, params) for layer, n in self.layers)


def _get(params: CostParams, key) -> float:
    field, name = key
    if name is None:
        value = float(getattr(params, field))
        return value if value > 0 and not (field == "clock_alpha" and value >= 1.0) else _START[field]
    d = getattr(params, field)
    return float(d.get(name, d.get(name.split(".")[-1], 1.0) if field == "math_eff" else d.get(name, 0.5)))


def _with(params: CostParams, values) -> CostParams:
    changes = {f: dict(getattr(params, f)) for f in ("compute_eff", "memory_eff", "overhead_us", "math_eff")}
    for (field, name), v in zip(FREE, values):
        lo, hi = _BOUNDS[field]
        if name is None:
            changes[field] = float(min(max(v, lo), hi))
        else:
            changes[field][name] = float(min(max(v, lo), hi))
    return replace(params, **changes)


def fit_transformer(cases: list[Case], start: CostParams, restarts: int = 3) -> CostParams:
    """The transformer classes' parameters minimising the mean squared log error of the cases' totals."""
    x0 = np.log([_get(start, k) for k in FREE])

    def loss(x):
        p = _with(start, np.exp(x))
        r = [math.log(c.estimate(p) / c.measured_ms) for c in cases]
        return float(np.mean(np.square(r)) + 0.002 * np.mean(np.square(x - x0)))

    x = x0
    for r in range(restarts):
        x = nelder_mead(loss, x, step=0.4 / (r + 1), iters=2000)
    return _with(start, np.exp(x))


def fitted_values(params: CostParams) -> dict:
    """The fitted transformer parameters as a plain dict (what :data:`TRANSFORMER_FIT` holds)."""
    return {f"{field}[{name}]" if name else field: round(_get(params, (field, name)), 4) for field, name in FREE}


def score(cases: list[Case], params: CostParams) -> list[dict]:
    rows = []
    for c in cases:
        est = c.estimate(params)
        rows.append({**{k: c.row[k] for k in ("gpu", "model", "seq", "batch", "precision")},
                     "measured_ms": c.measured_ms, "estimated_ms": est, "rel_err": est / c.measured_ms - 1})
    return rows


def bert_policies(model, layers) -> dict:
    """The policies matching NVIDIA's BERT engines: ``fp16`` every layer FP16; ``int8`` every MatMul INT8
    (attention's too) and everything else FP16 (the default policy with the FP16 network default)."""
    return {"fp16": uniform_policy(model, layers, "fp16"), "int8": default_policy(model, layers, "fp16")}


def bert_engines(model, layers, shapes: list[tuple[int, int]], precisions=("fp16", "int8"), progress=None) -> dict:
    """``{(precision, seq, batch): predicted engine}`` of a BERT ONNX at each (seq, batch): each policy is
    compiled once (placeholder ranges: the structure needs no calibration), then the engine is predicted
    at every shape."""
    out = {}
    inputs = [i.name for i in model.proto.graph.input]
    for precision in precisions:
        policy = bert_policies(model, layers)[precision]
        compiled = compile_policy(model, policy, placeholder_calibration(model, policy), target="trt", structure_only=True)
        files = data_files(compiled)
        for seq, batch in shapes:
            engine, _ = predicted(static_net(compiled.proto, {i: (batch, seq) for i in inputs}, files))
            out[(precision, seq, batch)] = engine
            if progress:
                progress(precision, seq, batch)
    return out


FIT_KIND = "mixprec.transformer_fit"


def save_fit(params: CostParams, cases: list[Case], command: str, path: Path = FIT_FILE) -> dict:
    """Write the fitted transformer parameters (and their in-sample errors) to ``path``."""
    rel = [c.estimate(params) / c.measured_ms - 1 for c in cases]
    doc = {"kind": FIT_KIND, "format_version": 1, "values": fitted_values(params), "fitted_on": FIT_BASIS,
           "rows": len(cases), "median_abs_err": float(np.median(np.abs(rel))), "max_abs_err": float(np.max(np.abs(rel))),
           "command": command, "date": datetime.date.today().isoformat()}
    atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())
    return doc


VALIDATION_FILE = Path(__file__).with_name("transformer_validation.json")
VALIDATION_KIND = "mixprec.transformer_validation"


def case_row(row: dict, split: str) -> dict:
    """A scored published row in the validation schema (``core.estimate.validation``)."""
    g = gpu_entry(row["gpu"])
    return {"case": f"{row['model']} {row['precision']} seq {row['seq']} batch {row['batch']} on {row['gpu']}",
            "source": "NVIDIA published TensorRT BERT latency", "gpu": g.key, "arch": g.arch, "model": row["model"],
            "precision": row["precision"], "batch": int(row["batch"]), "seq": int(row["seq"]),
            "held_out": split != "in-sample", "split": split, "measured_ms": float(row["measured_ms"]),
            "estimated_ms": float(row["estimated_ms"]), "rel_err": float(row["rel_err"]), "median_layer_err": None,
            "family": "transformer"}


def save_validation(rows: list[dict], command: str, path: Path = VALIDATION_FILE) -> None:
    doc = {"kind": VALIDATION_KIND, "format_version": 1, "command": command,
           "date": datetime.date.today().isoformat(), "rows": rows}
    atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())


def validation_rows(path: Path = VALIDATION_FILE) -> list[dict]:
    """The transformer validation cases (in-sample fit rows, leave-one-GPU-out rows, held-out published rows),
    as ``bench/bench_bert_estimate.py`` last scored them (it needs BERT exports, so it is not recomputed
    here); [] when the file is absent or unreadable."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("kind") != VALIDATION_KIND:
        return []
    return list(doc.get("rows") or [])
