"""Fitting the cost model's parameters (:class:`~core.estimate.cost.CostParams`) on real trtexec
engine reports (layer info + profile pairs), jointly over all the reports given, of one GPU or of
several (each :class:`Sample` carries its GPU and is priced on it): one set of efficiencies per
layer class, a tensor-core factor per math precision (FP16's and TF32's are fitted when the reports
hold such tensor-core convolutions; INT8 is the reference), the k-step latency of a convolution
tile, never a constant per model, per engine or per GPU.

* :func:`fit` — the joint fit on the nine fixture engines (:data:`FIXTURE_SETS`: five A100
  ResNet-18 at batch 32, four TITAN RTX MobileNetV2 QAT at batch 1; what
  :data:`~core.estimate.cost.FITTED` holds) or on any reports;
* :func:`leave_one_out` — fit on all reports but one, score the one left out (does it transfer to
  another engine?); :func:`leave_one_gpu_out` — fit on the other GPUs' reports only, score a GPU
  the fit never saw (does it transfer through the GPU table?);
* :func:`validation_rows` — every fixture engine in-sample, leave-one-engine-out and
  leave-one-gpu-out, as rows of :mod:`core.estimate.validation` (read from ``cnn_validation.json``,
  which ``bench/bench_trt_estimate.py --write-validation`` writes);
* :func:`calibrate` — §4: refit on a user's own engine(s) from their GPU, starting from the
  shipped fit; it prices the layer classes its engines have data for (the others keep the shipped
  fit) and is labelled with them and its held-out error ("calibrated on 35 layers of a100-resnet-qat
  on the NVIDIA A100 80GB SXM: convolution (21 layers), …; held-out median error 6 % (5-fold over the
  engine's layers)"). It is refused on a report of another model and on a GPU the report cannot be of.

The loss is, per report, the mean of a smooth |log(estimate / measured)| over its layers that run a
kernel (robust, as the per-layer median target is), averaged over the reports (each counts once,
whatever its layer count), plus the squared log error of each report's total (the per-layer sum a
trtexec profile measures), plus a weak pull towards the starting values so that parameters the data
hardly determine stay where they were. It is minimised in log space by a Nelder–Mead search (numpy
only); the per-layer quantities that do not depend on the parameters are computed once per fit
(:func:`~core.estimate.cost.memoized`)."""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from core.backends.reports import ReportDevice, engine_device, kernel_capability, match_nodes
from core.errors import MixprecError
from core.estimate.cost import (CALIBRATION_BASIS, FITTED, FIXTURE_BASIS, PRIOR, CostParams, input_channels, is_conv,
                                is_simt, layer_ms, linear_float_output, memoized)
from core.estimate.engine import LAYER_CLASSES, EngineLayer, calibration_class
from core.estimate.gpus import FIXTURE_GPU, GPU, gpu as gpu_entry
from core.estimate.layers import measured_layers
from core.records import check_format

# the fixture engines (folder under ../shared/fixtures, GPU, model, report names)
A100_NAMES = ("a100-resnet-fp32", "a100-resnet-fp16", "a100-resnet-qat", "a100-resnet-qat-residual",
              "a100-resnet-qat-residual-qgap")
TITAN_NAMES = ("titanrtx-mobilenetv2-qat-trt82", "titanrtx-mobilenetv2-qat-trt84",
               "titanrtx-mobilenetv2res-qat-trt82", "titanrtx-mobilenetv2res-qat-trt84")
FIXTURE_SETS = (("trt-engine-reports", "a100", "resnet18", A100_NAMES),
                ("trt-engine-reports-more", "titanrtx", "mobilenetv2", TITAN_NAMES))
FIXTURE_NAMES = A100_NAMES + TITAN_NAMES
# classes without layers in the data take the fitted value of a sibling class
TIED = {"elementwise": "reformat", "softmax_norm": "reformat", "other": "reformat",
        "transformer": "conv_gemm"}
_TOTAL_WEIGHT = 4.0
_PRIOR_WEIGHT = 0.02
_BOUNDS = {"compute_eff": (0.02, 1.5), "memory_eff": (0.02, 3.0), "overhead_us": (0.05, 50.0),
           "simt_eff": (0.05, 1.5), "lowc_channels": (1.0, 64.0), "knee": (1.0, 60.0),
           "int8_linear_out": (0.05, 2.0), "math_eff": (0.2, 3.0), "step_us": (0.01, 5.0)}
# the math precisions whose tensor-core factor is fitted when the data has such layers (int8 is the
# reference, 1; tf32 stays tied to it)
FITTED_MATH = ("fp16", "tf32")
_DICT_FIELDS = ("compute_eff", "memory_eff", "overhead_us", "math_eff")
MIN_CALIBRATION_LAYERS = 5
_MATH_PRECISIONS = {"fp16": ("fp16", "bf16"), "tf32": ("tf32",), "int8": ("int8", "fp8")}


@dataclass(frozen=True, eq=False)
class Sample:
    """One engine report: its layers and each one's measured time (ms)."""

    name: str
    layers: tuple[EngineLayer, ...]
    times: tuple[float, ...]
    gpu: str = FIXTURE_GPU          # the GPU the engine was built and profiled on (a table key)

    @property
    def total_ms(self) -> float:
        return float(sum(self.times))

    def timed(self) -> list[int]:
        """Indices of the layers that ran a kernel (not NoOp) with a positive measured time."""
        return [i for i, (l, t) in enumerate(zip(self.layers, self.times)) if l.layer_type != "NoOp" and t > 0]


def sample(graph, profile, name: str | None = None, gpu: str = FIXTURE_GPU) -> Sample:
    layers, times = measured_layers(graph, profile)
    if name is None:
        name = Path(str(graph)).name.removesuffix(".json").removesuffix(".graph") if isinstance(
            graph, (str, Path)) else "engine"
    return Sample(name=name, layers=tuple(layers), times=tuple(times), gpu=gpu_entry(gpu).key)


def _set_samples(folder: Path, gpu: str, names: Sequence[str]) -> list[Sample]:
    missing = [n for n in names if not (folder / f"{n}.graph.json").is_file()]
    if missing:
        raise MixprecError(f"The fixture reports {', '.join(missing)} are not in {folder}",
                           "pass the folder holding the trtexec reports *.graph.json / *.profile.json")
    return [sample(folder / f"{n}.graph.json", folder / f"{n}.profile.json", n, gpu) for n in names]


def fixture_samples(folder: str | Path) -> list[Sample]:
    """The nine fixture engines: the five A100 ResNet-18 reports of ``folder``
    (``../shared/fixtures/trt-engine-reports``) and the four TITAN RTX MobileNetV2 ones of its
    sibling ``trt-engine-reports-more`` (or of ``folder`` itself when they are there), each
    :class:`Sample` carrying its GPU."""
    folder = Path(folder)
    out = []
    for sub, gpu, _, names in FIXTURE_SETS:
        here = folder if (folder / f"{names[0]}.graph.json").is_file() else folder.parent / sub
        out += _set_samples(here, gpu, names)
    return out


# ---------------------------------------------------------------------------- parameters as a vector

def _free(samples: Sequence[Sample], start: CostParams | None = None) -> list[tuple[str, str | None]]:
    """The parameters the data can determine: per class present, and the shared ones in use."""
    layers = [s.layers[i] for s in samples for i in s.timed()]
    classes = [c for c in LAYER_CLASSES if any(l.layer_class == c for l in layers)]
    free: list[tuple[str, str | None]] = [("knee", None)]
    for c in classes:
        free += [("memory_eff", c), ("overhead_us", c)]
        if c in ("conv_gemm", "transformer") and any(not is_simt(l, l.precision) for l in layers
                                                    if l.layer_class == c):
            free.append(("compute_eff", c))
    if any(l.layer_class == "conv_gemm" and is_simt(l, l.precision) for l in layers):
        free.append(("simt_eff", None))
    if any(is_conv(l) and input_channels(l) < 8 or l.is_reformat for l in layers):
        free.append(("lowc_channels", None))
    if any(is_conv(l) and l.precision == "int8" and not is_simt(l, "int8") and linear_float_output(l)
           for l in layers):
        free.append(("int8_linear_out", None))
    tensor_core = [l for l in layers if l.layer_class in ("conv_gemm", "transformer") and is_conv(l)
                   and not is_simt(l, l.precision)]
    free += [("math_eff", m) for m in FITTED_MATH if any(l.precision in _MATH_PRECISIONS[m] for l in tensor_core)]
    if tensor_core and (start is None or start.model >= 2):
        free.append(("step_us", None))
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


def tie_unfitted(params: CostParams, free, keep: Iterable[str] = ()) -> CostParams:
    """Classes the data had no layer of take their sibling's fitted values (:data:`TIED`), unless
    the starting parameters had them fitted already (``keep``: ``"compute_eff[transformer]"`` … of
    the shipped fit, whose transformer classes rest on published BERT latencies)."""
    fitted = {cls for fld, cls in free if cls and fld != "math_eff"}
    keep = set(keep)
    changes = {f: dict(getattr(params, f)) for f in ("compute_eff", "memory_eff", "overhead_us")}
    for cls, sibling in TIED.items():
        if cls not in fitted and sibling in fitted:
            for f in changes:
                if f"{f}[{cls}]" not in keep:
                    changes[f][cls] = changes[f][sibling]
    return replace(params, **changes)


# ---------------------------------------------------------------------------- loss and search

def _gpu_of(s: Sample, gpu=None) -> GPU:
    """The GPU a sample is priced on: ``gpu`` when given (a calibration's), else its own."""
    return gpu_entry(gpu if gpu is not None else s.gpu)


def _loss(params: CostParams, samples: Sequence[Sample], gpu, start: np.ndarray, x: np.ndarray) -> float:
    per_layer, totals = [], []
    for s in samples:
        g = _gpu_of(s, gpu)
        est = [layer_ms(l, g, params) for l in s.layers]
        r = np.asarray([math.log(max(est[i], 1e-9) / s.times[i]) for i in s.timed()])
        if len(r):
            per_layer.append(float(np.mean(np.sqrt(r * r + 0.0025))))
        totals.append(math.log(max(sum(est), 1e-9) / s.total_ms))
    return float(np.mean(per_layer) + _TOTAL_WEIGHT * np.mean(np.square(totals))
                 + _PRIOR_WEIGHT * np.mean(np.square(x - start)))


def nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 1500, tol: float = 1e-7) -> np.ndarray:
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
    with memoized():
        return _search_memo(samples, gpu, start, restarts)


def _search_memo(samples: Sequence[Sample], gpu, start: CostParams, restarts: int) -> CostParams:
    free = _free(samples, start)
    x0 = np.log([_get(start, k) for k in free])

    def f(x):
        return _loss(_with(start, free, np.exp(x)), samples, gpu, x0, x)

    x = x0
    for r in range(restarts):
        x = nelder_mead(f, x, step=0.4 / (r + 1))
    params = tie_unfitted(_with(start, free, np.exp(x)), free, start.fitted)
    names = tuple(f"{fld}[{c}]" if c else fld for fld, c in free)
    return replace(params, fitted=names + tuple(n for n in start.fitted if n not in names))


# ---------------------------------------------------------------------------- public API

def errors(params: CostParams, s: Sample, gpu=None) -> tuple[float, float, list[float]]:
    """(estimated total ms, total relative error, per-layer relative errors) of one report, priced
    on ``gpu`` or, when None, on the sample's own GPU."""
    g = _gpu_of(s, gpu)
    est = [layer_ms(l, g, params) for l in s.layers]
    rel = [est[i] / s.times[i] - 1 for i in s.timed()]
    total = float(sum(est))
    return total, total / s.total_ms - 1, rel


def evaluate(params: CostParams, samples: Iterable[Sample], gpu=None) -> list[dict]:
    """Per report: measured and estimated per-layer sums, total error, per-layer median |error|
    (each priced on its own GPU unless ``gpu`` is given)."""
    rows = []
    for s in samples:
        total, err, rel = errors(params, s, gpu)
        rows.append({"engine": s.name, "gpu": _gpu_of(s, gpu).key, "layers": len(rel), "measured_ms": s.total_ms,
                     "estimated_ms": total,
                     "total_err": err, "median_abs_err": float(np.median(np.abs(rel))) if rel else math.nan})
    return rows


def _summary(params: CostParams, samples: Sequence[Sample], gpu, basis: str) -> CostParams:
    rel = [e for s in samples for e in errors(params, s, gpu)[2]]
    keys = list(dict.fromkeys(_gpu_of(s, gpu).key for s in samples))
    return replace(params, gpu="+".join(keys), basis=basis, n_layers=len(rel),
                   median_err=float(np.median(np.abs(rel))) if rel else math.nan,
                   fitted_on=tuple(s.name for s in samples))


def fit(samples: Sequence[Sample], gpu=None, start: CostParams | None = None,
        basis: str = FIXTURE_BASIS) -> CostParams:
    """One parameter set fitted jointly on ``samples``, engine reports of one GPU or of several:
    each is priced on its own GPU (:attr:`Sample.gpu`), or on ``gpu`` when given."""
    if not samples:
        raise MixprecError("No engine report to fit the cost model on",
                           "pass at least one trtexec layer-info + profile pair")
    g = None if gpu is None else gpu_entry(gpu)
    params = _search(samples, g, start or PRIOR)
    return _summary(params, samples, g, basis)


def leave_one_out(samples: Sequence[Sample], gpu=None, start: CostParams | None = None) -> list[dict]:
    """For each report: fit on the others, then score it (:func:`evaluate` columns + ``held_out``)."""
    rows = []
    for i, held in enumerate(samples):
        params = fit([s for j, s in enumerate(samples) if j != i], gpu, start)
        rows += [{**r, "held_out": True} for r in evaluate(params, [held], gpu)]
    return rows


def leave_one_gpu_out(samples: Sequence[Sample], start: CostParams | None = None) -> list[dict]:
    """For each GPU of ``samples``: fit on the other GPUs' reports only, then score that GPU's
    (:func:`evaluate` columns + ``held_out``): how the fit transfers to a GPU it never saw, through
    the GPU table alone."""
    rows = []
    for key in dict.fromkeys(s.gpu for s in samples):
        rest = [s for s in samples if s.gpu != key]
        if not rest:
            continue
        params = fit(rest, None, start)
        rows += [{**r, "held_out": True} for r in evaluate(params, [s for s in samples if s.gpu == key])]
    return rows


# the GPU architectures' compute capabilities (lowest, highest), to check a GPU against what a report says
ARCH_CAPABILITY = {"volta": ((7, 0), (7, 2)), "turing": ((7, 5), (7, 5)), "ampere": ((8, 0), (8, 7)),
                   "ada": ((8, 9), (8, 9)), "hopper": ((9, 0), (9, 0)), "blackwell": ((10, 0), (12, 1))}
MIN_CLASS_LAYERS = 2   # a class with fewer timed layers in the calibration's engines keeps the shipped fit
HELD_OUT_FOLDS = 5     # one engine: its layers in this many interleaved folds, each fitted without it


def _cc(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def device_problem(device: ReportDevice | None, g: GPU, custom=None) -> str | None:
    """Why ``g`` cannot be the GPU an engine's reports say it was built on (:class:`ReportDevice`), or None:
    the reports name another GPU, state a compute capability ``g``'s architecture does not have, or run
    kernels built for a newer GPU than ``g``."""
    if device is None:
        return None
    if device.name:
        try:
            named = gpu_entry(device.name, custom)
        except MixprecError:
            named = None
        if named is not None and named.key != g.key:
            return f"the engine was built on the {device.name} ({device.source}), not on the {g.name}"
    lo, hi = ARCH_CAPABILITY.get(g.arch, ((0, 0), (99, 9)))
    if device.capability and not lo <= device.capability <= hi:
        return (f"the engine's GPU has compute capability {_cc(device.capability)} ({device.source}); the {g.name} is "
                f"{g.arch.capitalize()} ({_cc(lo)}{'' if lo == hi else '–' + _cc(hi)})")
    if device.min_capability and device.min_capability > hi:
        return (f"the engine runs kernels built for compute capability {_cc(device.min_capability)} or later "
                f"({device.kernel[:40]}…), which the {g.name} ({g.arch.capitalize()}, {_cc(hi)}) cannot run")
    return None


def gpus_for(device: ReportDevice | None, choices: dict[str, GPU], custom=None) -> list[str]:
    """The keys of ``choices`` that can be the GPU the reports say (:func:`device_problem` has none)."""
    return [k for k, g in choices.items() if device_problem(device, g, custom) is None]


def _sample_device(s: Sample) -> ReportDevice:
    least, kernel = kernel_capability(l.attrs.get("tactic", "") for l in s.layers)
    return ReportDevice(min_capability=least, kernel=kernel)


def _pair_name(graph, i: int) -> str:
    if isinstance(graph, (str, Path)):
        return Path(str(graph)).name.removesuffix(".json").removesuffix(".graph")
    return f"engine {i + 1}"


def _without(s: Sample, out: set[int]) -> Sample:
    keep = [i for i in range(len(s.layers)) if i not in out]
    return Sample(s.name, tuple(s.layers[i] for i in keep), tuple(s.times[i] for i in keep), s.gpu)


def held_out_errors(samples: Sequence[Sample], gpu, start: CostParams | None = None) -> tuple[list[tuple[str, float]], str]:
    """``(class, relative error)`` of every timed layer, each estimated by a fit that did not see it, and
    how they were held out: with several engines, leave-one-engine-out (each engine's layers by a fit on
    the others); with one, its timed layers in :data:`HELD_OUT_FOLDS` interleaved folds, each fold's
    layers by a fit on the rest of the engine."""
    start = start or FITTED
    g = gpu_entry(gpu) if gpu is not None else None
    out: list[tuple[str, float]] = []
    if len(samples) >= 2:
        for i, held in enumerate(samples):
            params = _search([s for j, s in enumerate(samples) if j != i], g, start)
            h = _gpu_of(held, g)
            out += [(calibration_class(held.layers[k]), layer_ms(held.layers[k], h, params) / held.times[k] - 1)
                    for k in held.timed()]
        return out, f"leave-one-engine-out over {len(samples)} engines"
    s = samples[0]
    timed = s.timed()
    folds = min(HELD_OUT_FOLDS, len(timed))
    h = _gpu_of(s, g)
    for f in range(folds):
        fold = timed[f::folds]
        params = _search([_without(s, set(fold))], g, start)
        out += [(calibration_class(s.layers[k]), layer_ms(s.layers[k], h, params) / s.times[k] - 1) for k in fold]
    return out, f"{folds}-fold over the engine's layers"


def calibrate(reports, gpu_name, names: Sequence[str] | None = None, model_nodes: Iterable[str] | None = None,
              model: str = "this model", device: ReportDevice | None = None, custom=None) -> CostParams:
    """§4: refit the efficiencies on engine(s) built on the user's GPU. ``reports`` is one
    ``(layer_info, profile)`` pair or a list of them (paths, bytes or parsed JSON) or of
    :class:`Sample`; ``names`` names them (default: their file names). Starts from the shipped fit;
    ``basis`` is "your calibration".

    The calibration prices the layer classes its engines have at least :data:`MIN_CLASS_LAYERS` timed
    layers of (``classes``); every other layer keeps the shipped fit. Its error is held out
    (:func:`held_out_errors`: ``held_out_err``, ``class_err``), never only in-sample.

    Refused (MixprecError) when ``model_nodes`` (the ONNX node names of the project's model,
    :func:`core.backends.reports.node_names`) are given and a report is not of that model
    (:class:`~core.backends.reports.ModelMatch`), and when the reports (``device``: what they say, e.g.
    read from a trtexec log; else what their own JSON and kernel names say) cannot be of ``gpu_name``."""
    pairs = [reports] if isinstance(reports, (tuple, Sample)) else list(reports)
    g = gpu_entry(gpu_name, custom)
    samples = []
    for i, p in enumerate(pairs):
        name = names[i] if names is not None and i < len(names) else None
        if isinstance(p, Sample):
            s = p if name is None else replace(p, name=name)
            dev = device or _sample_device(s)
        else:
            s = sample(p[0], p[1], name or _pair_name(p[0], i))
            dev = device or engine_device(p[0], p[1])
        problem = device_problem(dev, g, custom)
        if problem:
            raise MixprecError(f"Not calibrating the {g.name} on {s.name}: {problem}",
                               "pick the GPU the engine was built and profiled on (its trtexec log says it: "
                               "\"Selected Device\")")
        if model_nodes is not None:
            nodes = list(model_nodes)
            match = match_nodes(((l.name, l.onnx_nodes) for l in s.layers), nodes, model)
            if not match.enough:
                raise match.refusal(f"engine report {s.name}")
        samples.append(s)
    timed = sum(len(s.timed()) for s in samples)
    if timed < MIN_CALIBRATION_LAYERS:
        raise MixprecError(f"The engine has {timed} timed layers, too few to calibrate on "
                           f"(at least {MIN_CALIBRATION_LAYERS})",
                           "import the layer info and profile of a larger engine built on this GPU")
    counts: dict[str, int] = {}
    for s in samples:
        for i in s.timed():
            c = calibration_class(s.layers[i])
            counts[c] = counts.get(c, 0) + 1
    classes = {c: n for c, n in counts.items() if n >= MIN_CLASS_LAYERS}
    if not classes:
        raise MixprecError(f"No layer class has {MIN_CLASS_LAYERS} timed layers in the engine, too few to calibrate on",
                           "import the layer info and profile of a larger engine built on this GPU")
    params = fit(samples, g, start=FITTED, basis=CALIBRATION_BASIS)
    rel, how = held_out_errors(samples, g, FITTED)
    mine = [abs(e) for c, e in rel if c in classes]
    per_class = {c: float(np.median([abs(e) for k, e in rel if k == c])) for c in classes if any(k == c for k, _ in rel)}
    return replace(params, classes=classes, held_out=how, class_err=per_class,
                   held_out_err=float(np.median(mine)) if mine else math.nan)


# ---------------------------------------------------------------------------- validation rows

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
VALIDATION_FILE = Path(__file__).with_name("cnn_validation.json")
VALIDATION_KIND = "mixprec.cnn_validation"
VALIDATION_VERSION = 1
SPLITS = ("in-sample", "leave-one-engine-out", "leave-one-gpu-out")
_SOURCE = "trtexec fixture"
# the scalar parameters that price the CNN classes (the transformer classes' own are not in it)
_CNN_SCALARS = ("simt_eff", "lowc_channels", "knee", "int8_linear_out", "step_us", "model")
_CNN_CLASSES = ("conv_gemm", "pooling", "elementwise", "reformat", "softmax_norm", "other")


def cnn_signature(params: CostParams) -> dict:
    """The parameters that price the fixture engines' layers (CNN classes, plain math factors and
    the shared scalars), rounded: what the cached validation rows were computed with."""
    doc = params.to_json()
    sig = {f"{f}[{c}]": doc[f][c] for f in ("compute_eff", "memory_eff", "overhead_us") for c in _CNN_CLASSES
           if c in doc[f]}
    sig.update({f"math_eff[{m}]": v for m, v in doc["math_eff"].items() if "." not in m})
    sig.update({k: doc[k] for k in _CNN_SCALARS if k in doc})
    return {k: float(f"{float(v):.6g}") for k, v in sorted(sig.items())}


def _precision_of(name: str) -> str:
    words = name.split("-")
    return "fp32" if "fp32" in words else "fp16" if "fp16" in words else "int8" if "qat" in words else "mixed"


def _batch_of(s: Sample) -> int:
    return int(next((l.inputs[0].dims[0] for l in s.layers if l.inputs and l.inputs[0].dims), 1))


def as_rows(samples: Sequence[Sample], scored: Sequence[dict], split: str) -> list[dict]:
    """:func:`evaluate`-style results (``scored``) of ``samples`` as validation rows of ``split``."""
    models = {n: model for _, _, model, names in FIXTURE_SETS for n in names}
    by_name = {s.name: s for s in samples}
    out = []
    for r in scored:
        s = by_name[r["engine"]]
        g = gpu_entry(s.gpu)
        med = r["median_abs_err"]
        out.append({"case": s.name, "source": _SOURCE, "gpu": g.key, "arch": g.arch, "model": models.get(s.name, "cnn"),
                    "precision": _precision_of(s.name), "batch": _batch_of(s), "seq": None,
                    "held_out": split != "in-sample", "split": split, "measured_ms": float(r["measured_ms"]),
                    "estimated_ms": float(r["estimated_ms"]),
                    "rel_err": float(r["estimated_ms"] / r["measured_ms"] - 1),
                    "median_layer_err": None if math.isnan(med) else float(med), "family": "cnn"})
    return out


def compute_validation_rows(fixtures: str | Path | None = None, params: CostParams | None = None,
                            progress=None) -> list[dict]:
    """The validation rows of every fixture engine, computed (minutes: 9 + 2 fits): ``params``
    (default :data:`FITTED`) in-sample, a fit on the other engines (leave-one-engine-out) and one
    on the other GPU's engines (leave-one-gpu-out), each fitted as :data:`FITTED` was (from the
    prior). ``progress(text)`` is told what is being fitted."""
    folder = Path(fixtures) if fixtures is not None else FIXTURES
    samples = fixture_samples(folder / FIXTURE_SETS[0][0])
    tell = progress or (lambda text: None)
    rows = as_rows(samples, evaluate(params or FITTED, samples), "in-sample")
    tell(f"leave-one-engine-out: {len(samples)} fits")
    rows += as_rows(samples, leave_one_out(samples), "leave-one-engine-out")
    tell("leave-one-gpu-out: one fit per GPU")
    rows += as_rows(samples, leave_one_gpu_out(samples), "leave-one-gpu-out")
    return rows


def validation_document(rows: list[dict], params: CostParams | None = None, command: str = "",
                        date: str = "") -> dict:
    """The cached validation rows as the document ``cnn_validation.json`` holds."""
    return {"kind": VALIDATION_KIND, "format_version": VALIDATION_VERSION, "command": command, "date": date,
            "params": cnn_signature(params or FITTED), "rows": rows}


@functools.lru_cache(maxsize=4)
def _read_validation(path: str, mtime: float) -> dict:
    doc = check_format(json.loads(Path(path).read_text()), VALIDATION_KIND, VALIDATION_VERSION,
                       "CNN validation rows")
    return doc


def cached_validation(path: str | Path | None = None) -> dict | None:
    """The document of ``cnn_validation.json`` (or ``path``), None when absent or unreadable."""
    p = Path(path) if path is not None else VALIDATION_FILE
    try:
        return _read_validation(str(p), p.stat().st_mtime)
    except (OSError, ValueError, MixprecError):
        return None


def validation_rows(fixtures: str | Path | None = None) -> list[dict]:
    """Every fixture engine's validation rows: ``{case, source, gpu, arch, model, precision, batch,
    seq, held_out, split, measured_ms, estimated_ms, rel_err, median_layer_err, family}`` with
    ``split`` in-sample (the shipped fit), leave-one-engine-out and leave-one-gpu-out. Read from
    ``cnn_validation.json`` when it was computed with the shipped parameters (instant); else
    computed here (minutes) from the fixture reports under ``fixtures``."""
    doc = cached_validation()
    if doc is not None and doc.get("params") == cnn_signature(FITTED):
        return [dict(r) for r in doc["rows"]]
    return compute_validation_rows(fixtures)
