"""Fitting the cost model's parameters (:class:`~core.estimate.cost.CostParams`) on real trtexec
engine reports (layer info + profile pairs), jointly over all the reports given: one set of
efficiencies per layer class and a tensor-core factor per math precision (FP16's is fitted when the
reports hold FP16 tensor-core convolutions; INT8 is the reference and TF32 is tied to it), never a
constant per model or per engine.

* :func:`fit` — the fit on the five A100 ResNet-18 fixture engines (what :data:`~core.estimate.cost.FITTED`
  holds) or on any reports of one GPU;
* :func:`leave_one_out` — fit on all reports but one, score the one left out (does it transfer?);
* :func:`calibrate` — §4: refit on a user's own engine(s) from their GPU, starting from the
  shipped fit, labelled "calibrated on N layers of your engine, median error X %".

The loss is the mean of a smooth |log(estimate / measured)| over the layers that run a kernel
(robust, as the per-layer median target is), plus the squared log error of each report's total
(the per-layer sum a trtexec profile measures), plus a weak pull towards the starting values so
that parameters the data hardly determine stay where they were. It is minimised in log space by
a Nelder–Mead search (numpy only)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import MixprecError
from .cost import (CALIBRATION_BASIS, FITTED, FIXTURE_BASIS, PRIOR, CostParams, input_channels, is_conv,
                   layer_ms, linear_float_output, _is_simt)
from .engine import LAYER_CLASSES, EngineLayer
from .gpus import FIXTURE_GPU, gpu as gpu_entry
from .layers import measured_layers

FIXTURE_NAMES = ("a100-resnet-fp32", "a100-resnet-fp16", "a100-resnet-qat", "a100-resnet-qat-residual",
                 "a100-resnet-qat-residual-qgap")
# classes without layers in the data take the fitted value of a sibling class
TIED = {"elementwise": "reformat", "softmax_norm": "reformat", "other": "reformat",
        "transformer": "conv_gemm"}
_TOTAL_WEIGHT = 4.0
_PRIOR_WEIGHT = 0.02
_BOUNDS = {"compute_eff": (0.02, 1.5), "memory_eff": (0.02, 3.0), "overhead_us": (0.05, 50.0),
           "simt_eff": (0.05, 1.5), "lowc_channels": (1.0, 64.0), "knee": (1.0, 60.0),
           "int8_linear_out": (0.05, 2.0), "math_eff": (0.2, 3.0)}
# the math precisions whose tensor-core factor is fitted when the data has such layers (int8 is the
# reference, 1; tf32 stays tied to it)
FITTED_MATH = ("fp16",)
_DICT_FIELDS = ("compute_eff", "memory_eff", "overhead_us", "math_eff")
MIN_CALIBRATION_LAYERS = 5
_MATH_PRECISIONS = {"fp16": ("fp16", "bf16"), "tf32": ("tf32",), "int8": ("int8", "fp8")}


@dataclass(frozen=True, eq=False)
class Sample:
    """One engine report: its layers and each one's measured time (ms)."""

    name: str
    layers: tuple[EngineLayer, ...]
    times: tuple[float, ...]

    @property
    def total_ms(self) -> float:
        return float(sum(self.times))

    def timed(self) -> list[int]:
        """Indices of the layers that ran a kernel (not NoOp) with a positive measured time."""
        return [i for i, (l, t) in enumerate(zip(self.layers, self.times)) if l.layer_type != "NoOp" and t > 0]


def sample(graph, profile, name: str | None = None) -> Sample:
    layers, times = measured_layers(graph, profile)
    if name is None:
        name = Path(str(graph)).name.removesuffix(".json").removesuffix(".graph") if isinstance(
            graph, (str, Path)) else "engine"
    return Sample(name=name, layers=tuple(layers), times=tuple(times))


def fixture_samples(folder: str | Path) -> list[Sample]:
    """The five A100 fixture reports of ``folder`` (``../shared/fixtures/trt-engine-reports``)."""
    folder = Path(folder)
    missing = [n for n in FIXTURE_NAMES if not (folder / f"{n}.graph.json").is_file()]
    if missing:
        raise MixprecError(f"The fixture reports {', '.join(missing)} are not in {folder}",
                           "pass the folder holding the trtexec reports *.graph.json / *.profile.json")
    return [sample(folder / f"{n}.graph.json", folder / f"{n}.profile.json", n) for n in FIXTURE_NAMES]


# ---------------------------------------------------------------------------- parameters as a vector

def _free(samples: Sequence[Sample]) -> list[tuple[str, str | None]]:
    """The parameters the data can determine: per class present, and the shared ones in use."""
    layers = [s.layers[i] for s in samples for i in s.timed()]
    classes = [c for c in LAYER_CLASSES if any(l.layer_class == c for l in layers)]
    free: list[tuple[str, str | None]] = [("knee", None)]
    for c in classes:
        free += [("memory_eff", c), ("overhead_us", c)]
        if c in ("conv_gemm", "transformer") and any(not _is_simt(l, l.precision) for l in layers
                                                    if l.layer_class == c):
            free.append(("compute_eff", c))
    if any(l.layer_class == "conv_gemm" and _is_simt(l, l.precision) for l in layers):
        free.append(("simt_eff", None))
    if any(is_conv(l) and input_channels(l) < 8 or l.is_reformat for l in layers):
        free.append(("lowc_channels", None))
    if any(is_conv(l) and l.precision == "int8" and not _is_simt(l, "int8") and linear_float_output(l)
           for l in layers):
        free.append(("int8_linear_out", None))
    tensor_core = [l for l in layers if l.layer_class in ("conv_gemm", "transformer") and is_conv(l)
                   and not _is_simt(l, l.precision)]
    free += [("math_eff", m) for m in FITTED_MATH if any(l.precision in _MATH_PRECISIONS[m] for l in tensor_core)]
    return free


def _get(params: CostParams, key: tuple[str, str | None]) -> float:
    field, cls = key
    value = getattr(params, field)
    return value[cls] if cls is not None else value


def _with(params: CostParams, free, values) -> CostParams:
    changes: dict = {f: dict(getattr(params, f)) for f in _DICT_FIELDS}
    for (field, cls), v in zip(free, values):
        lo, hi = _BOUNDS[field]
        v = float(min(max(v, lo), hi))
        if cls is None:
            changes[field] = v
        else:
            changes[field][cls] = v
    return replace(params, **changes)


def tie_unfitted(params: CostParams, free) -> CostParams:
    """Classes the data had no layer of take their sibling's fitted values (:data:`TIED`)."""
    fitted = {cls for fld, cls in free if cls and fld != "math_eff"}
    changes = {f: dict(getattr(params, f)) for f in ("compute_eff", "memory_eff", "overhead_us")}
    for cls, sibling in TIED.items():
        if cls not in fitted and sibling in fitted:
            for f in changes:
                changes[f][cls] = changes[f][sibling]
    return replace(params, **changes)


# ---------------------------------------------------------------------------- loss and search

def _loss(params: CostParams, samples: Sequence[Sample], gpu, start: np.ndarray, x: np.ndarray) -> float:
    per_layer, totals = [], []
    for s in samples:
        est = [layer_ms(l, gpu, params) for l in s.layers]
        per_layer += [math.log(max(est[i], 1e-9) / s.times[i]) for i in s.timed()]
        totals.append(math.log(max(sum(est), 1e-9) / s.total_ms))
    r = np.asarray(per_layer)
    return float(np.mean(np.sqrt(r * r + 0.0025)) + _TOTAL_WEIGHT * np.mean(np.square(totals))
                 + _PRIOR_WEIGHT * np.mean(np.square(x - start)))


def _nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 1500, tol: float = 1e-7) -> np.ndarray:
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _search(samples: Sequence[Sample], gpu, start: CostParams, restarts: int = 3) -> CostParams:
    free = _free(samples)
    x0 = np.log([_get(start, k) for k in free])

    def f(x):
        return _loss(_with(start, free, np.exp(x)), samples, gpu, x0, x)

    x = x0
    for r in range(restarts):
        x = _nelder_mead(f, x, step=0.4 / (r + 1))
    params = tie_unfitted(_with(start, free, np.exp(x)), free)
    return replace(params, fitted=tuple(f"{fld}[{c}]" if c else fld for fld, c in free))


# ---------------------------------------------------------------------------- public API

def errors(params: CostParams, s: Sample, gpu) -> tuple[float, float, list[float]]:
    """(estimated total ms, total relative error, per-layer relative errors) of one report."""
    est = [layer_ms(l, gpu, params) for l in s.layers]
    rel = [est[i] / s.times[i] - 1 for i in s.timed()]
    total = float(sum(est))
    return total, total / s.total_ms - 1, rel


def evaluate(params: CostParams, samples: Iterable[Sample], gpu=FIXTURE_GPU) -> list[dict]:
    """Per report: measured and estimated per-layer sums, total error, per-layer median |error|."""
    g = gpu_entry(gpu)
    rows = []
    for s in samples:
        total, err, rel = errors(params, s, g)
        rows.append({"engine": s.name, "layers": len(rel), "measured_ms": s.total_ms, "estimated_ms": total,
                     "total_err": err, "median_abs_err": float(np.median(np.abs(rel))) if rel else math.nan})
    return rows


def _summary(params: CostParams, samples: Sequence[Sample], gpu, basis: str) -> CostParams:
    rel = [e for s in samples for e in errors(params, s, gpu)[2]]
    return replace(params, gpu=gpu.key, basis=basis, n_layers=len(rel),
                   median_err=float(np.median(np.abs(rel))) if rel else math.nan,
                   fitted_on=tuple(s.name for s in samples))


def fit(samples: Sequence[Sample], gpu=FIXTURE_GPU, start: CostParams | None = None,
        basis: str = FIXTURE_BASIS) -> CostParams:
    """Parameters fitted jointly on ``samples`` (engine reports of one GPU)."""
    if not samples:
        raise MixprecError("No engine report to fit the cost model on",
                           "pass at least one trtexec layer-info + profile pair")
    g = gpu_entry(gpu)
    params = _search(samples, g, start or PRIOR)
    return _summary(params, samples, g, basis)


def leave_one_out(samples: Sequence[Sample], gpu=FIXTURE_GPU, start: CostParams | None = None) -> list[dict]:
    """For each report: fit on the others, then score it (:func:`evaluate` columns + ``held_out``)."""
    rows = []
    for i, held in enumerate(samples):
        params = fit([s for j, s in enumerate(samples) if j != i], gpu, start)
        rows += [{**r, "held_out": True} for r in evaluate(params, [held], gpu)]
    return rows


def calibrate(reports, gpu_name: str) -> CostParams:
    """§4: refit the efficiencies on engine(s) built on the user's GPU. ``reports`` is one
    ``(layer_info, profile)`` pair or a list of them (paths, bytes or parsed JSON) or of
    :class:`Sample`. Starts from the shipped fit; ``basis`` is "your calibration"."""
    pairs = [reports] if isinstance(reports, (tuple, Sample)) else list(reports)
    samples = [p if isinstance(p, Sample) else sample(p[0], p[1], f"engine {i + 1}") for i, p in enumerate(pairs)]
    timed = sum(len(s.timed()) for s in samples)
    if timed < MIN_CALIBRATION_LAYERS:
        raise MixprecError(f"The engine has {timed} timed layers, too few to calibrate on "
                           f"(at least {MIN_CALIBRATION_LAYERS})",
                           "import the layer info and profile of a larger engine built on this GPU")
    return fit(samples, gpu_name, start=FITTED, basis=CALIBRATION_BASIS)


def default_params() -> CostParams:
    """The shipped parameters: the fit on the five A100 fixture engines."""
    return FITTED
