"""The policy-level predictor: the TensorRT engine a policy would build on a GPU, and its estimated
time, without TensorRT or a GPU.

:func:`predict` compiles the policy for the ``trt`` target (``core.quant.compile.compile_policy``: exactly
the Q/DQ and Cast placement TensorRT gets), simulates TensorRT's fusions, precisions and reformats on
that graph (:mod:`core.estimate.fusion`) and prices every predicted engine layer with the cost model
(:func:`core.estimate.cost.layer_breakdown`, fitted on the fixture engines (A100, TITAN RTX) or on the user's own
engine). The result is labelled as an estimate everywhere: its GPU and its basis travel with it.

The total is the **sum of per-layer times**, what a trtexec profile's per-layer times sum to (the
quantity the fixtures measure), not end-to-end latency. Every prediction carries its uncertainty band
(:func:`core.estimate.validation.band`: the validation errors of its layer families on its basis — the
held-out engines of this GPU where the fit saw it, else the GPUs of its architecture the fit did not see;
"unvalidated" where there is no case)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from core.errors import MixprecError
from core.estimate.cost import CALIBRATION_BASIS, FITTED, CostParams, basis_detail, layer_breakdown
from core.estimate.engine import EngineLayer
from core.estimate.fusion import predicted, static_net
from core.estimate.gpus import GPU, gpu as gpu_entry
from core.estimate.validation import Band, band_of
from core.model.load import LoadedModel
from core.quant.calibration import CalibrationResult
from core.quant.compile import CompiledModel, compile_policy
from core.quant.policy import Policy
from core.records import check_format, frame_from_json, frame_to_json

PREDICTION_COLUMNS = ["engine_layer", "onnx_nodes", "precision", "est_ms", "is_reformat", "layer_class"]
LABEL = "estimate"
WHAT = ("estimated TensorRT engine time: the sum of predicted per-layer times, as a trtexec profile sums them "
        "(not end-to-end latency)")
STRUCTURE_ONLY = "structure-only"  # the calibration key of placeholder ranges (structure needs no real ranges)


def placeholder_calibration(model: LoadedModel, policy: Policy) -> CalibrationResult:
    """Unit ranges for every tensor: the engine's structure depends on where Q/DQ sit, not on their
    scales, so a prediction needs no calibration data. Smoothed MatMuls get unit channel statistics."""
    names = {i.name for i in model.proto.graph.input}
    names.update(t for n in model.proto.graph.node for t in (*n.input, *n.output) if t)
    inits = {i.name: i for i in model.proto.graph.initializer}
    channels = {}
    smoothed = dict(policy.smoothing)
    for n in model.proto.graph.node:
        if n.name in smoothed and len(n.input) > 1 and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            channels[n.input[0]] = np.ones(int(inits[n.input[1]].dims[0]), dtype=np.float32)
    return CalibrationResult({t: (-1.0, 1.0) for t in names}, policy.calibration, STRUCTURE_ONLY, False, 0.0,
                             Path("."), channels)


def data_files(compiled: CompiledModel) -> dict[str, Path]:
    """Location -> file of each external data file a compiled model references: the model's own
    (``weights.sources``, read where :class:`~core.model.external.ExternalWeights` reads them) and the new
    weights' file the compiler wrote (its Spill). Empty for a model with its weights in the graph."""
    files: dict[str, Path] = {}
    if compiled.weights is not None:
        files.update({loc: compiled.weights.read_path(loc) for loc in compiled.weights.sources})
    if compiled.spill is not None:
        files[compiled.spill.location] = compiled.spill.path
    return files


def predict_engine(model: LoadedModel, policy: Policy, input_shapes: dict[str, tuple[int, ...]],
                   calib: CalibrationResult | None = None) -> tuple[list[EngineLayer], list[str]]:
    """The engine layers TensorRT would build for ``policy`` (no times), and notes on what the
    prediction leaves out (:func:`core.estimate.fusion.unmodelled`). The prediction reads shapes and
    types only: weights kept in external data files (``core.model.external``) are never read by it (the
    compiler reads those it converts, one at a time)."""
    calib = calib if calib is not None else placeholder_calibration(model, policy)
    try:
        compiled = compile_policy(model, policy, calib, target="trt", structure_only=True)
    except FileNotFoundError as e:  # a data file of a model kept external was removed after loading
        raise MixprecError(f"a data file of {model.name} is missing ({e.filename or e})",
                           "put the model's data files back beside it, then load the model again") from e
    return predicted(static_net(compiled.proto, input_shapes or {}, data_files(compiled)))


def _source_nodes(layer: EngineLayer, source: set[str]) -> list[str]:
    """The layer's nodes of the user's model (the compiled model's own Q/DQ/Cast nodes for a reformat)."""
    own = [n for n in layer.onnx_nodes if n in source]
    return own or list(layer.onnx_nodes)


def price(layers: list[EngineLayer], gpu: GPU, params: CostParams, tf32: bool = True,
          source: set[str] | None = None) -> pd.DataFrame:
    """PREDICTION_COLUMNS of priced engine layers (``precision``: the math the cost model ran it in)."""
    rows = []
    for layer in layers:
        b = layer_breakdown(layer, gpu, params, tf32)
        precision = b["math"] or layer.precision
        rows.append((layer.name, _source_nodes(layer, source or set()), precision, float(b["ms"]),
                     bool(layer.is_reformat), layer.layer_class))
    return pd.DataFrame(rows, columns=PREDICTION_COLUMNS)


@dataclass
class Prediction:
    """A predicted engine and its estimated time on one GPU (:meth:`to_json` / :meth:`from_json`)."""

    KIND: ClassVar[str] = "trt_estimate"
    FORMAT_VERSION: ClassVar[int] = 2  # 2: the band; documents of format 1 get theirs when read

    layers: pd.DataFrame            # PREDICTION_COLUMNS, one row per predicted engine layer
    total_ms: float
    gpu: str                        # the GPU table's key (a100, t4, …)
    gpu_name: str
    basis: str                      # cost.FIXTURE_BASIS, or "your calibration" when it prices a layer of this engine
    basis_detail: str               # which classes a calibration prices (from what), which the shipped fit prices
    tf32: bool = True
    model_name: str = ""
    policy_sha256: str = ""
    notes: list = field(default_factory=list)  # what the prediction leaves out or prices by bytes only
    engine: list = field(default_factory=list, repr=False)  # the EngineLayer records (not stored)
    band: Band | None = None        # the likely range of total_ms (core.estimate.validation)

    label: ClassVar[str] = LABEL

    @property
    def low_ms(self) -> float:
        return self.band.low_ms if self.band is not None else math.nan

    @property
    def high_ms(self) -> float:
        return self.band.high_ms if self.band is not None else math.nan

    @property
    def band_status(self) -> str:
        """validated / in-sample / unvalidated ("" without a band)."""
        return self.band.status if self.band is not None else ""

    def estimate_text(self) -> str:
        """The total with its band: "0.860 ms, likely 0.785–0.942 ms" (or "…, unvalidated on Hopper GPUs: …")."""
        return self.band.text(self.total_ms) if self.band is not None else f"{self.total_ms:.3f} ms"

    @property
    def reformat_count(self) -> int:
        return int(self.layers.is_reformat.sum())

    @property
    def reformat_ms(self) -> float:
        return float(self.layers.est_ms[self.layers.is_reformat].sum())

    @property
    def reformat_pct(self) -> float:
        """Reformat time as a share of the estimated per-layer sum, %."""
        return 100.0 * self.reformat_ms / self.total_ms if self.total_ms > 0 else math.nan

    def caption(self) -> str:
        """One line that says what the number is: an estimate, on which GPU, on what basis."""
        band = f"band: {self.band.basis}; " if self.band is not None else ""
        return (f"estimated TensorRT time on {self.gpu_name}: {self.estimate_text()}; sum of per-layer estimates ("
                f"{self.reformat_count} reformats, {self.reformat_pct:.1f} %; {band}basis: {self.basis_detail}"
                f"{'' if self.tf32 else '; FP32 without TF32'}{''.join(f'; {n}' for n in self.notes)})")

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "label": LABEL, "what": WHAT,
                "gpu": {"key": self.gpu, "name": self.gpu_name}, "basis": self.basis,
                "basis_detail": self.basis_detail, "tf32": self.tf32, "model": self.model_name,
                "policy_sha256": self.policy_sha256, "total_ms": self.total_ms, "estimate_text": self.estimate_text(),
                "band": self.band.to_json() if self.band is not None else None, "notes": list(self.notes),
                "reformats": {"count": self.reformat_count, "ms": self.reformat_ms, "pct": self.reformat_pct},
                "layers": frame_to_json(self.layers)}

    @classmethod
    def from_json(cls, doc: dict) -> "Prediction":
        """A stored prediction; one of format 1 (before the band) gets its band from its layers and its
        GPU's architecture, with today's validation data."""
        old = isinstance(doc, dict) and doc.get("format_version") == 1
        doc = check_format(doc, cls.KIND, 1 if old else cls.FORMAT_VERSION, "TensorRT estimate")
        layers = frame_from_json(doc["layers"], PREDICTION_COLUMNS, "estimate layers")
        total = float(doc["total_ms"])
        if old or doc.get("band") is None:
            try:
                arch = gpu_entry(str(doc["gpu"]["key"])).arch
            except MixprecError:  # a GPU no longer (or never) in the table: no case can vouch for it
                arch = "unknown"
            band = band_of(layers, total, arch, gpu=str(doc["gpu"]["key"]))
        else:
            band = Band.from_json(doc["band"])
        return cls(layers, total, str(doc["gpu"]["key"]), str(doc["gpu"]["name"]), str(doc["basis"]),
                   str(doc["basis_detail"]), bool(doc.get("tf32", True)), str(doc.get("model", "")),
                   str(doc.get("policy_sha256", "")), [str(n) for n in doc.get("notes", [])], band=band)


def predict(model: LoadedModel, policy: Policy, input_shapes: dict[str, tuple[int, ...]], gpu: str | GPU,
            params: CostParams | None = None, calib: CalibrationResult | None = None,
            tf32: bool = True) -> Prediction:
    """Predict the engine TensorRT builds for ``policy`` at ``input_shapes`` and estimate its time on
    ``gpu`` (a key of the GPU table or a product name). ``params``: the cost model's parameters (default
    the shipped fit on the fixture engines; pass a stored calibration for "your calibration"). ``calib``:
    activation ranges (optional: the structure does not depend on them). ``tf32=False`` is ``--noTF32``."""
    g = gpu_entry(gpu)
    params = params or FITTED
    if params.basis != FITTED.basis and params.gpu not in ("", g.key):
        raise MixprecError(f"the cost-model calibration given was made on {params.gpu}, not on {g.key}",
                           f"estimate for --gpu {params.gpu}, or calibrate on an engine built on the {g.name}")
    layers, notes = predict_engine(model, policy, input_shapes, calib)
    source = {n.name for n in model.proto.graph.node}
    table = price(layers, g, params, tf32, source)
    total = float(table.est_ms.sum())
    basis = params.basis
    if params.classes is not None:  # a calibration prices the layers of its classes only
        basis = CALIBRATION_BASIS if any(params.applies_to(l) for l in layers if l.layer_type != "NoOp") \
            else FITTED.basis
    return Prediction(table, total, g.key, g.name, basis, basis_detail(params, layers), tf32,
                      model.name, policy.sha256, notes, layers, band_of(table, total, g.arch, gpu=g.key))
