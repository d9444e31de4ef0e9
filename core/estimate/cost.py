"""The engine-layer cost model: FLOPs and bytes of one TensorRT engine layer, and its time on a
GPU of the table (:mod:`core.estimate.gpus`), roofline style::

    compute_ms = flops / (peak(precision, math) · compute_eff[class] · math_eff[math] · channel_factor)
    memory_ms  = bytes / (bandwidth · memory_eff[class])
    layer_ms   = (compute_ms^p + memory_ms^p)^(1/p) + overhead_us[class] / 1000

  ``p`` (``knee``) is fitted: p → ∞ is the pure roofline's max(compute, memory); a finite p
  rounds the corner where a layer is neither clearly compute- nor memory-bound (both partly
  overlap in real kernels).

* ``peak`` is the GPU's dense peak for the layer's math: tensor cores at TF32 / FP16 / INT8, or the
  CUDA cores (``simt``: FP32 SIMT kernels such as ``…scudnn…``, INT8 ``…int8x4…`` DP4A kernels,
  taken as 4 INT8 multiply-adds per FP32 FMA slot, ``…_simt`` kernels, INT8 kernels of sm ≤ 7.0,
  TensorRT's ``CudaDepthwiseConvolution``) with ``simt_eff`` in place of ``compute_eff``. DP4A
  takes its 4 multiply-adds along the channels: a convolution with C < 4 channels per group fills
  C of the 4 lanes (a depthwise convolution's one). An FP32 layer uses TF32 tensor cores on
  Ampere and later, as trtexec's FP32 engines do (``tf32=True``, the default); ``tf32=False`` is
  ``--noTF32``. A layer whose precision
  is plain ``fp32`` and whose tactic is unknown (a predicted layer) costs what the faster of the
  TF32 and the SIMT kernel costs, as TensorRT times both and keeps the faster.
* ``math_eff`` is a per-math-precision factor on the tensor-core efficiency of the convolution/GEMM
  and transformer classes (the classes whose compute runs on tensor cores): ``int8`` is the
  reference (1) and ``tf32`` is tied to it; ``fp16`` is fitted on its own, as TensorRT's FP16
  kernels reach a different share of their peak than its INT8 and TF32 ones (on the A100 fixtures
  the FP16 engine's convolutions run closer to peak: one shared efficiency overestimated that
  engine by 7 % and put all-FP16 behind INT8-without-residual, against the measured order).
* ``channel_factor`` = min(1, C / ``lowc_channels``) for tensor-core convolutions with few input
  channels per group C (a network's first 3-channel convolution): tensor-core tiles are
  ``lowc_channels`` deep along C, so with C = 3 most of each tile is padding. A reformat of a
  tensor with C < ``lowc_channels`` (the network input's NCHW → channel-vectorized copy) gets the
  same factor on its memory efficiency: each pixel's few channels make short, scattered writes.
* ``int8_linear_out``: INT8 tensor-core kernels compute in channel-interleaved tiles
  (``vect_c_32``); one that writes a *linear* float output (``…i8f32…nchw`` into an FP32 layer)
  runs its epilogue as a transposing, strided store — its compute efficiency gets this factor.
* **Tensor-core convolutions as tiles** (``model`` 2; :func:`_tiled_compute_ms`): the implicit
  GEMM (M = N·P·Q output pixels, N = output channels per group, K = C/groups·R·S) is cut into
  Mt × Nt output tiles (the tile the tactic names, ``tilesize64x32x64`` / ``…cudnn_128x128``; for a
  predicted layer the fastest of :data:`TILES`: TensorRT times its tactics), dealt to the GPU's
  SMs; the busiest SM computes ``ceil(tiles / SMs)`` full tiles one after another, padding
  included (wave and tile quantization: at batch 1 a 7×7 layer is one or two tiles and keeps one
  or two of the 72 SMs busy; a depthwise convolution is C tiles of one output channel each). Each
  tile reduces over K in k-steps of 64 bytes (the tactic's ``x64`` / ``x32``), and each k-step
  takes at least ``step_us / stages``: the latency of its loads, hidden ``stages`` deep by the
  kernel's pipeline (the tactic's ``stage4`` / ``stages_64x3``; for a predicted layer 3 on GPUs
  with asynchronous copies, Ampere on, else 1: every TITAN RTX tactic is ``stage1``). The
  compute time is the larger of that throughput and that latency chain.
* **Kernels the CUDA cores run** (``model`` 2, :func:`math_options`): a predicted INT8/FP16
  convolution may also run on CUDA cores (TensorRT's depthwise and DP4A kernels); it costs what
  the faster kernel costs, so a depthwise convolution (one channel per group: tensor-core tiles
  1/64 full) prices as the memory-bound CUDA-core kernel TensorRT runs.
* ``overhead_us`` is a layer's fixed cost, per class: the kernel launch and the work of a kernel
  that does not scale with its size, as a per-layer profile measures it (at batch 1 most layers
  are little more than this). It is given at a :data:`REFERENCE_BOOST_MHZ` boost clock and runs in
  GPU cycles: on a GPU it is ``overhead_us · REFERENCE_BOOST_MHZ / boost clock``
  (:func:`overhead_scale`; the A100's 1410 MHz pays 1.06×, the TITAN RTX's 1770 MHz 0.85×).
* ``bytes`` counts every input and output tensor once (padded to its format's channel vector) plus
  the weights and bias: an engine layer reads its inputs from and writes its outputs to memory.
* NoOp layers run no kernel: 0 ms.

A predicted layer (:mod:`core.estimate.predict`) is priced from what it sets: ``layer_class``
(:func:`core.estimate.layers.layer_class` of its type), ``precision`` (``fp32`` lets TF32 apply),
input/output dims, ``dtype`` and channel ``vector`` (INT8 convolutions read and write 32-wide
vectorized tensors, FP16 ones 8-aligned channel-major; a linear float output of an INT8 convolution
is priced with ``int8_linear_out``), ``kernel``, ``out_maps``, ``groups``, ``weights`` and
``weights_dtype``, ``attrs["conv_out"]`` for a convolution fused with a pooling, and no tactic.

The parameters (:class:`CostParams`) are fitted on real engine reports (:mod:`core.estimate.fit`);
:data:`FITTED` holds the one parameter set the estimate ships with, fitted jointly on the nine
fixture engines (five A100 ResNet-18 at batch 32, four TITAN RTX MobileNetV2 QAT at batch 1), its
transformer classes on published BERT latencies. Documents are priced as they were fitted: those
written before the tile model (``model`` 1) without the tiles, the k-step latency, DP4A's channel
lanes and the CUDA-core option of predicted convolutions; those before the clock-scaled launch cost
(``model`` 2: a calibration stored by a user) with the fixed cost of the CNN classes as it stands
(only the transformer classes' scales with the boost clock)."""
from __future__ import annotations

import contextlib
import functools
import math
import re
import threading
from dataclasses import dataclass, field, replace

from core.errors import MixprecError
from core.estimate.engine import DTYPE_BYTES, LAYER_CLASSES, EngineLayer, Tensor, calibration_class, class_list
from core.estimate.gpus import FIXTURE_GPU, GPU, gpu as gpu_entry
from core.records import check_format

PARAMS_KIND = "mixprec.cost_params"
PARAMS_VERSION = 1
FIXTURE_BASIS = "fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)"
CALIBRATION_BASIS = "your calibration"
# CUDA-core (not tensor-core) kernels: FP32 SIMT, INT8 DP4A (``int8x4``, ``icudnn``), kernels named
# ``…_simt``, and INT8 kernels of architectures without INT8 tensor cores (sm5x/sm6x/sm70: the
# ``sm70_xmma_fprop_conv1x1_i8f32…_simt`` of the TITAN RTX engines' classifier)
_SIMT_TACTIC = re.compile(r"scudnn|sgemm|int8x4|icudnn|_f32f32_f32f32_|_simt|^sm(5\d|6\d|70)_\w*(i8|int8)")
_DEPTHWISE_TYPE = re.compile(r"depthwise", re.I)
# the tile a tensor-core convolution kernel names: xmma ``tilesize128x64x64_stage4`` (M × N × K:
# output pixels × output channels × reduction step), cuDNN ``h16816cudnn_256x64``, ``i8816cudnn_int8_128x128``
_XMMA_TILE = re.compile(r"tilesize(\d+)x(\d+)x(\d+)")
_CUDNN_TILE = re.compile(r"(?:cudnn|int8x4)_(?:int8_)?(\d+)x(\d+)_")
_STAGES = re.compile(r"_stages?_?(?:\d+x)?(\d+)")
# the tiles (M × N: output pixels × output channels) of TensorRT's implicit-GEMM convolution kernels
# (the A100 fixtures' tactics run 64×32…256×128, the TITAN RTX ones 32×32…64×128): a layer whose
# tactic names none may take any (see :func:`conv_tile`)
TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64),
         (32, 32))
K_STEP_BYTES = 64           # the reduction depth of one k-step of a tile, in bytes of the input type
# GPUs whose SMs copy global → shared memory asynchronously (Ampere's cp.async and later): their
# convolution kernels pipeline several k-steps (``stage3``…``stage6`` in the A100 tactics); Turing's
# xmma kernels are single-stage (``stage1`` in every TITAN RTX tactic)
PIPELINED_ARCHS = ("ampere", "ada", "hopper", "blackwell")
PIPELINED_STAGES = 3
CURRENT_MODEL = 3  # 2: tiles and CUDA-core convolutions; 3: every class's fixed cost scales with 1 / boost clock
CLOCKED_OVERHEAD_MODEL = 3
_ACC32_TACTIC = re.compile(r"f16f16f32|f16f16_f16f32|f16f16_f32")
TF32_CHANNEL_ALIGN = 4
# the math precisions with their own tensor-core factor (math_eff); others map onto these
MATH_KEYS = ("tf32", "fp16", "int8")
_MATH_OF = {"bf16": "fp16", "fp8": "int8"}
_TENSOR_CORE_CLASSES = ("conv_gemm", "transformer", "attention")


_NAN = math.nan  # one object: parameters read back compare equal to those written (nan is nan)


def _unit_math() -> dict[str, float]:
    return {m: 1.0 for m in MATH_KEYS}
_CONV_TYPES = re.compile(r"conv|gemm|matrixmultiply|fullyconnected", re.I)


@dataclass(frozen=True)
class CostParams:
    """Efficiencies and overheads of the cost model, per layer class (see the module docstring)."""

    compute_eff: dict[str, float]
    memory_eff: dict[str, float]
    overhead_us: dict[str, float]
    simt_eff: float = 0.6
    lowc_channels: float = 8.0
    knee: float = 4.0                   # p of the soft roofline (p → ∞: max(compute, memory))
    int8_linear_out: float = 1.0        # INT8 tensor-core math writing a linear float output
    step_us: float = 0.0                # latency of one unpipelined k-step of a convolution tile (µs)
    model: int = CURRENT_MODEL          # 1: before tiles/waves and CUDA-core convs; 2: before clocked overheads
    math_eff: dict[str, float] = field(default_factory=_unit_math)  # tensor-core factor per math precision
    gemm_tile: float = 0.0              # transformer GEMM/attention output tile edge (0: no wave term)
    clock_alpha: float = 1.0            # sustained clock = base + alpha·(boost − base) (1: the boost clock)
    transformer_knee: float = 0.0       # the soft roofline's p for the transformer classes (0: knee)
    gpu: str = FIXTURE_GPU              # the GPU the parameters were fitted on
    basis: str = FIXTURE_BASIS          # FIXTURE_BASIS or "your calibration"
    n_layers: int = 0                   # layers the fit used
    median_err: float = math.nan        # per-layer median |relative error| of the fit on its own data (in-sample)
    fitted_on: tuple[str, ...] = ()     # the reports fitted on
    fitted: tuple[str, ...] = ()        # the parameter names the data determined (others are priors)
    # the classes of engine.CALIBRATION_CLASSES these parameters price, with the timed layers of each the fit
    # saw: a calibration's (every other layer is priced by the shipped fit, FITTED). None: every class (the
    # shipped fit, hand-made parameters); {}: none (a calibration stored before calibrations recorded them)
    classes: dict[str, int] | None = None
    held_out_err: float = math.nan      # per-layer median |relative error| on layers / engines the fit did not see
    held_out: str = ""                  # how they were held out ("5-fold over the engine's layers", …)
    class_err: dict[str, float] = field(default_factory=dict)  # held-out median |error| per class

    def to_json(self) -> dict:
        return {"kind": PARAMS_KIND, "format_version": PARAMS_VERSION,
                "compute_eff": dict(self.compute_eff), "memory_eff": dict(self.memory_eff),
                "overhead_us": dict(self.overhead_us), "simt_eff": self.simt_eff,
                "lowc_channels": self.lowc_channels, "knee": self.knee,
                "int8_linear_out": self.int8_linear_out, "step_us": self.step_us, "model": self.model,
                "math_eff": dict(self.math_eff),
                "gemm_tile": self.gemm_tile, "clock_alpha": self.clock_alpha,
                "transformer_knee": self.transformer_knee, "gpu": self.gpu, "basis": self.basis,
                "n_layers": self.n_layers,
                "median_err": None if math.isnan(self.median_err) else self.median_err,
                "fitted_on": list(self.fitted_on), "fitted": list(self.fitted),
                "classes": None if self.classes is None else dict(self.classes),
                "held_out_err": None if math.isnan(self.held_out_err) else self.held_out_err,
                "held_out": self.held_out, "class_err": dict(self.class_err)}

    @classmethod
    def from_json(cls, doc: dict) -> CostParams:
        doc = check_format(doc, PARAMS_KIND, PARAMS_VERSION, "cost-model parameters")
        per_class = {k: {c: float(v) for c, v in dict(doc[k]).items()}
                     for k in ("compute_eff", "memory_eff", "overhead_us")}
        err = doc.get("median_err")
        # documents written before math_eff existed were fitted with one efficiency for every math
        math = {**_unit_math(), **{m: float(v) for m, v in dict(doc.get("math_eff") or {}).items()}}
        if "classes" in doc:
            classes = None if doc["classes"] is None else {str(c): int(n) for c, n in dict(doc["classes"]).items()}
        else:  # written before calibrations recorded their classes: a calibration's scope is unknown
            classes = {} if doc.get("basis") == CALIBRATION_BASIS else None
        held = doc.get("held_out_err")
        return cls(**per_class, math_eff=math, simt_eff=float(doc["simt_eff"]), lowc_channels=float(doc["lowc_channels"]),
                   knee=float(doc["knee"]), int8_linear_out=float(doc["int8_linear_out"]),
                   # documents written before the tile model priced without it (model 1, no k-step latency)
                   step_us=float(doc.get("step_us", 0.0)), model=int(doc.get("model", 1)),
                   gemm_tile=float(doc.get("gemm_tile", 0.0)), clock_alpha=float(doc.get("clock_alpha", 1.0)),
                   transformer_knee=float(doc.get("transformer_knee", 0.0)),
                   gpu=str(doc["gpu"]), basis=str(doc["basis"]), n_layers=int(doc.get("n_layers", 0)),
                   median_err=_NAN if err is None else float(err),
                   fitted_on=tuple(doc.get("fitted_on", ())), fitted=tuple(doc.get("fitted", ())),
                   classes=classes, held_out_err=_NAN if held is None else float(held),
                   held_out=str(doc.get("held_out") or ""),
                   class_err={str(c): float(v) for c, v in dict(doc.get("class_err") or {}).items()})

    def applies_to(self, layer: EngineLayer) -> bool:
        """True when these parameters price ``layer``: every layer, or a layer of a class they were
        calibrated on (:data:`~core.estimate.engine.CALIBRATION_CLASSES`)."""
        return self.classes is None or calibration_class(layer) in self.classes

    def pricing(self, layer: EngineLayer) -> CostParams:
        """The parameters that price ``layer``: these, or the shipped fit for a layer of a class a
        calibration has no data for."""
        return self if self.applies_to(layer) else FITTED

    def label(self) -> str:
        """What the estimate rests on, for the UI/CLI/export labels: for a calibration, its engines, GPU,
        classes and held-out error (never its in-sample error alone)."""
        if self.basis == CALIBRATION_BASIS:
            if self.classes is None:  # parameters made by hand: every class, no held-out error known
                err = "" if math.isnan(self.median_err) else f", median error {self.median_err * 100:.0f} % in-sample"
                return f"calibrated on {self.n_layers} layers of your engine{err}"
            if not self.classes:
                return ("a calibration stored before calibrations recorded the layer classes they saw: not applied "
                        "(import its engine report and calibrate again)")
            err = (f"held-out median error {self.held_out_err * 100:.0f} % ({self.held_out})"
                   if not math.isnan(self.held_out_err) else "no held-out error (too few layers)")
            engines = ", ".join(self.fitted_on) or "your engine"
            return (f"calibrated on {self.n_layers} layers of {engines} on the {_gpu_name(self.gpu)}: "
                    f"{class_list(self.classes)}; {err}")
        return f"{self.basis}: {self.n_layers} layers of {len(self.fitted_on)} reports"

    def with_values(self, **changes) -> CostParams:
        return replace(self, **changes)


def _gpu_name(key: str) -> str:
    try:
        return gpu_entry(key).name
    except MixprecError:  # a GPU saved in a workspace (not in the table): its key
        return key


def basis_detail(params: CostParams, layers) -> str:
    """The basis line of an estimate of ``layers`` (engine layers) priced with ``params``: for a
    calibration, the classes of these layers it prices (with its engines, GPU and held-out error) and
    those the shipped fit prices."""
    if params.classes is None:
        return params.label()
    present: dict[str, int] = {}
    for layer in layers:
        if layer.layer_type != "NoOp":
            c = calibration_class(layer)
            present[c] = present.get(c, 0) + 1
    mine = {c: n for c, n in present.items() if c in params.classes}
    shipped = {c: n for c, n in present.items() if c not in params.classes}
    parts = []
    if mine:
        parts.append(f"your calibration for {class_list(mine)} ({params.label()})")
    if shipped:
        every = "" if mine else "every layer class of this model, "
        parts.append(f"the shipped fit for {every}{class_list(shipped)} ({FITTED.label()})")
    if not mine and params.classes:
        parts.append(f"your calibration covers {class_list(params.classes, with_counts=False)} only ({params.label()})")
    elif not mine:
        parts.append(params.label())
    return "; ".join(parts) or FITTED.label()


def _per_class(value: float) -> dict[str, float]:
    return {c: value for c in LAYER_CLASSES}


# Priors: where a fit has no layer of a class, these stand (see fit.TIED for what is tied to what).
PRIOR = CostParams(compute_eff=_per_class(0.4), memory_eff=_per_class(0.6), overhead_us=_per_class(3.0),
                   step_us=0.3, basis="prior (not fitted)")


# ---------------------------------------------------------------------------- FLOPs and bytes

_MEMO = threading.local()


@contextlib.contextmanager
def memoized():
    """Within this block (this thread only), the per-layer quantities that do not depend on the
    parameters (FLOPs, bytes, tiles, kernel options) are computed once per layer object: a fit prices
    the same layers thousands of times. Each memo entry holds its layer, so no id is reused."""
    outer = getattr(_MEMO, "table", None)
    _MEMO.table = {} if outer is None else outer
    try:
        yield
    finally:
        _MEMO.table = outer


def _memo(fn):
    @functools.wraps(fn)
    def wrapper(layer, *args):
        table = getattr(_MEMO, "table", None)
        if table is None:
            return fn(layer, *args)
        key = (fn.__name__, id(layer), *[a.key if isinstance(a, GPU) else a for a in args])
        hit = table.get(key)
        if hit is None:
            hit = table[key] = (layer, fn(layer, *args))
        return hit[1]
    return wrapper


def _channels(t: Tensor) -> int:
    return t.dims[1] if len(t.dims) >= 2 else (t.dims[0] if t.dims else 1)


@_memo
def padded_bytes(t: Tensor) -> float:
    """Bytes of a tensor in memory: the channel axis (axis 1) padded to the format's vector."""
    c = _channels(t)
    if t.vector <= 1 or c <= 0:
        return float(t.bytes)
    return t.bytes * (math.ceil(c / t.vector) * t.vector) / c


@_memo
def is_conv(layer: EngineLayer) -> bool:
    return layer.layer_class == "conv_gemm" and bool(_CONV_TYPES.search(layer.layer_type) or layer.out_maps)


@_memo
def input_channels(layer: EngineLayer) -> int:
    """Input channels per group of a convolution/GEMM (the reduction depth per kernel tap)."""
    if not layer.inputs:
        return 0
    return max(1, _channels(layer.inputs[0]) // max(1, layer.groups))


def _conv_flops(layer: EngineLayer) -> float:
    out = layer.outputs[0].dims if layer.outputs else ()
    n = out[0] if out else 1
    k = layer.out_maps or (_channels(layer.outputs[0]) if layer.outputs else 0)
    spatial = tuple(layer.attrs.get("conv_out") or out[2:])
    taps = math.prod(layer.kernel) if layer.kernel else 1
    return 2.0 * n * k * math.prod(spatial) * input_channels(layer) * taps


@_memo
def flops(layer: EngineLayer) -> float:
    """Arithmetic operations of one engine layer (a multiply-add counts 2).

    convolution/GEMM: 2·N·K·P·Q·(C/groups)·R·S (P·Q the convolution's own output size);
    pooling: one per window element per output; elementwise: one per output element per input;
    softmax/normalization: 5 per element; reformat, NoOp and unknown layers: 0."""
    cls = layer.layer_class
    out = layer.outputs[0] if layer.outputs else None
    if layer.layer_type == "NoOp" or layer.is_reformat or out is None:
        return 0.0
    if cls == "conv_gemm":
        return _conv_flops(layer) if is_conv(layer) else 0.0
    if cls == "transformer":  # a GEMM of a transformer block (predicted: rows x K into rows x N)
        return _conv_flops(layer) if layer.out_maps else 0.0
    if cls == "attention":  # fused attention: both batched matmuls, no score tensor in memory
        return float(layer.attrs.get("flops", 0.0))
    if cls == "pooling":
        window = math.prod(layer.kernel) if layer.kernel else (
            layer.inputs[0].elements // max(1, out.elements) if layer.inputs else 1)
        return float(out.elements * window)
    if cls == "elementwise":
        return float(out.elements * max(1, len(layer.inputs)))
    if cls in ("softmax_norm", "transformer_norm"):
        return 5.0 * out.elements
    return 0.0


@_memo
def bytes_moved(layer: EngineLayer) -> float:
    """Bytes one engine layer reads and writes: every input and output tensor (padded to its
    channel vector) plus the weights and bias (bias in FP32); NoOp: 0."""
    if layer.layer_type == "NoOp":
        return 0.0
    total = sum(padded_bytes(t) for t in (*layer.inputs, *layer.outputs))
    if layer.weights:
        total += layer.weights * DTYPE_BYTES.get(layer.weights_dtype or layer.precision, 4)
    return float(total + 4 * layer.bias)


# ---------------------------------------------------------------------------- time

@_memo
def linear_float_output(layer: EngineLayer) -> bool:
    """A layer writing a float tensor in a linear (not channel-vectorized) format."""
    return bool(layer.outputs) and layer.outputs[0].dtype in ("fp32", "fp16", "bf16") and layer.outputs[0].vector <= 1


def is_simt(layer: EngineLayer, precision: str) -> bool:
    """The layer's math runs on the CUDA cores: FP32 math, a CUDA-core tactic, or TensorRT's
    depthwise convolution kernel (``CudaDepthwiseConvolution``: no tactic name, never tensor cores)."""
    tactic = str(layer.attrs.get("tactic", "")).lower()
    return precision == "fp32" or bool(_SIMT_TACTIC.search(tactic)) or bool(_DEPTHWISE_TYPE.search(layer.layer_type))


@_memo
def _gemm_shape(layer: EngineLayer) -> tuple[int, int, int, int]:
    """(M, N, K, groups) of a convolution as an implicit GEMM per group: M output pixels (N·P·Q),
    N output channels per group, K = C/groups·R·S the reduction."""
    out = layer.outputs[0].dims if layer.outputs else ()
    spatial = tuple(layer.attrs.get("conv_out") or out[2:])
    m = (out[0] if out else 1) * math.prod(spatial)
    groups = max(1, layer.groups)
    k_out = layer.out_maps or (_channels(layer.outputs[0]) if layer.outputs else 1)
    taps = math.prod(layer.kernel) if layer.kernel else 1
    return max(1, m), max(1, k_out // groups), max(1, input_channels(layer) * taps), groups


@_memo
def conv_tile(layer: EngineLayer, gpu: GPU, precision: str) -> tuple[tuple[int, int], ...]:
    """The (Mt, Nt) output tiles the tensor-core kernel of a convolution may use: the one its
    tactic names, else (a predicted layer, a kernel whose name gives none) every tile of
    :data:`TILES`: TensorRT times its tactics and keeps the fastest."""
    tactic = str(layer.attrs.get("tactic", "")).lower()
    m = _XMMA_TILE.search(tactic) or _CUDNN_TILE.search(tactic)
    return ((int(m.group(1)), int(m.group(2))),) if m else TILES


@_memo
def conv_steps(layer: EngineLayer, gpu: GPU, precision: str) -> tuple[int, int]:
    """(k-step depth in elements, pipeline stages) of a convolution's kernel: the tactic's
    (``tilesize…x…x64``, ``stage4`` / ``stages_64x3``), else a :data:`K_STEP_BYTES` step of the
    math type and :data:`PIPELINED_STAGES` on GPUs that copy asynchronously (one stage before)."""
    tactic = str(layer.attrs.get("tactic", "")).lower()
    m = _XMMA_TILE.search(tactic)
    kt = int(m.group(3)) if m else max(1, K_STEP_BYTES // DTYPE_BYTES.get(precision, 2))
    st = _STAGES.search(tactic)
    stages = int(st.group(1)) if st else PIPELINED_STAGES if gpu.arch in PIPELINED_ARCHS else 1
    return kt, stages


def _tiled_compute_ms(layer: EngineLayer, gpu: GPU, params: CostParams, precision: str, eff: float,
                      peak: float) -> float:
    """A tensor-core convolution as the tiles its kernel computes: each SM works through its share
    of the output tiles one after another (``ceil(tiles / SMs)`` on the busiest SM, each a full tile
    however much of it is padding: wave and tile quantization), and each tile reduces over K in
    k-steps of at least ``step_us / stages`` (the load latency the kernel's pipelining hides): the
    larger of that throughput and that latency chain, for the fastest tile (:func:`conv_tile`)."""
    k, steps, tiles = _tiling(layer, gpu, precision)
    chain = steps * params.step_us / 1e3
    rate = peak * 1e12 * max(eff, 1e-6) / max(1, gpu.sm_count)
    return min(per_sm * max(2.0 * area * k / rate * 1e3, chain) for per_sm, area in tiles)


@_memo
def _tiling(layer: EngineLayer, gpu: GPU, precision: str) -> tuple[int, float, tuple[tuple[int, int], ...]]:
    """(K, k-steps / stages, ((tiles on the busiest SM, tile area) per candidate tile))."""
    big, n, k, groups = _gemm_shape(layer)
    kt, stages = conv_steps(layer, gpu, precision)
    sms = max(1, gpu.sm_count)
    tiles = tuple((math.ceil(groups * math.ceil(big / mt) * math.ceil(n / nt) / sms), mt * nt)
                  for mt, nt in conv_tile(layer, gpu, precision))
    return k, math.ceil(k / kt) / max(1, stages), tiles


TRANSFORMER_CLASSES = ("transformer", "attention", "transformer_norm")


def clocks(gpu: GPU) -> tuple[float, float] | None:
    """(base, boost) clock in MHz of ``gpu`` as its table row or spec gives them (every table row has them;
    docs/tensorrt.md, "GPU table", "Clocks"), or None when the GPU gives none (then the boost clock is taken)."""
    base, boost = getattr(gpu, "base_clock_mhz", 0) or 0, getattr(gpu, "boost_clock_mhz", 0) or 0
    if base > 0 and boost > 0:
        return float(base), float(boost)
    return None


def sustained_clock(gpu: GPU, params: CostParams, load: float = 1.0) -> float:
    """The share of the datasheet peak (given at the boost clock) that tensor-core work gets at ``load`` (the
    share of the SMs busy): under full load the clock falls to base + alpha·(boost − base) (power-limited
    parts: a 70 W T4, base 585 and boost 1590 MHz, falls far), a lightly loaded GPU keeps its boost clock;
    in between, linearly. 1 when the clocks are unknown or alpha is 1."""
    c = clocks(gpu)
    if c is None or params.clock_alpha >= 1.0:
        return 1.0
    base, boost = c
    full = (base + params.clock_alpha * (boost - base)) / boost
    return 1.0 - (1.0 - full) * min(1.0, max(0.0, load))


REFERENCE_BOOST_MHZ = 1500.0  # every class's per-kernel overhead (overhead_us) is given at this boost clock


def overhead_scale(gpu: GPU, layer_class: str, model: int = CURRENT_MODEL) -> float:
    """A kernel's fixed cost (launch, ramp-up, tail, the work that does not scale with its size) runs in GPU
    cycles: it scales with REFERENCE_BOOST_MHZ / boost clock (an L40S at 2520 MHz pays 0.6x an A100's at
    1410). 1 for unknown clocks, and for the CNN classes of parameters fitted before the clock-scaled
    launch cost (``model`` < 3: a calibration stored by a user keeps the pricing it was fitted with)."""
    scaled = layer_class in TRANSFORMER_CLASSES or model >= CLOCKED_OVERHEAD_MODEL
    c = clocks(gpu) if scaled else None
    return REFERENCE_BOOST_MHZ / c[1] if c else 1.0


def wave_utilisation(layer: EngineLayer, gpu: GPU, params: CostParams) -> float:
    """The share of the GPU's SMs a transformer GEMM or attention kernel keeps busy: its output split into
    ``gemm_tile``-edged tiles (attention: one tile per ``gemm_tile`` query rows of each batch·head), run in
    waves of ``sm_count``; the last wave's idle SMs are lost. 1 without a tile size."""
    tile = params.gemm_tile
    if tile <= 0 or not layer.outputs:
        return 1.0
    if layer.layer_class == "attention":
        scores = tuple(layer.attrs.get("scores") or ())
        if len(scores) < 2:
            return 1.0
        tiles = math.prod(scores[:-2]) * math.ceil(scores[-2] / tile)
    else:
        rows = layer.outputs[0].dims[0] if layer.outputs[0].dims else 1
        tiles = math.ceil(rows / tile) * math.ceil(max(1, layer.out_maps) / tile)
    sms = max(1, gpu.sm_count)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def math_factor(params: CostParams, precision: str, layer_class: str = "") -> float:
    """The tensor-core efficiency factor of ``precision``'s math (``math_eff``; 1 when absent). A class
    may have its own (``math_eff["transformer.fp16"]``: the transformer GEMMs' FP16 kernels, fitted on
    the published BERT latencies, not on the CNN engines)."""
    m = _MATH_OF.get(precision, precision)
    own = params.math_eff.get(f"{layer_class}.{m}") if layer_class else None
    return float(own if own is not None else params.math_eff.get(m, 1.0))


def _compute_ms(layer: EngineLayer, gpu: GPU, params: CostParams, precision: str, simt: bool | None = None) -> float:
    ops = flops(layer)
    if ops <= 0:
        return 0.0
    tactic = str(layer.attrs.get("tactic", "")).lower()
    if simt is None:
        simt = is_simt(layer, precision)
    if simt:
        # INT8 on CUDA cores is DP4A: a 4-channel dot product per FP32 slot, so a convolution with
        # C < 4 channels per group fills C of its 4 lanes (a depthwise convolution's 1)
        lanes = 4.0 if params.model < 2 or not is_conv(layer) else float(min(4, input_channels(layer)))
        peak = gpu.fp32_tflops * (lanes if precision == "int8" else 1.0)
        eff = params.simt_eff
    else:
        peak = gpu.peak_tflops(precision, accumulate16=not _ACC32_TACTIC.search(tactic))
        eff = params.compute_eff.get(layer.layer_class, PRIOR.compute_eff["other"])
        if is_conv(layer) and params.lowc_channels > 0:
            eff *= min(1.0, input_channels(layer) / params.lowc_channels)
        if layer.layer_class in _TENSOR_CORE_CLASSES:
            eff *= math_factor(params, precision, layer.layer_class)
        if layer.layer_class in ("transformer", "attention"):
            util = wave_utilisation(layer, gpu, params)
            eff *= util * sustained_clock(gpu, params, util)
        if precision == "int8" and linear_float_output(layer) and layer.layer_class == "conv_gemm":
            eff *= params.int8_linear_out
        if params.model >= 2 and is_conv(layer):
            return _tiled_compute_ms(layer, gpu, params, precision, eff, peak)
    return ops / (peak * 1e12 * max(eff, 1e-6)) * 1e3


def _memory_ms(layer: EngineLayer, gpu: GPU, params: CostParams) -> float:
    eff = params.memory_eff.get(layer.layer_class, PRIOR.memory_eff["other"])
    if layer.is_reformat and params.lowc_channels > 0:
        narrow = [_channels(t) for t in (*layer.inputs, *layer.outputs) if len(t.dims) >= 4]
        if narrow:
            eff *= min(1.0, min(narrow) / params.lowc_channels)
    return bytes_moved(layer) / (gpu.bandwidth_gbs * 1e9 * max(eff, 1e-6)) * 1e3


def _soft_max(compute: float, memory: float, p: float) -> float:
    """(compute^p + memory^p)^(1/p): max(compute, memory) as p → ∞."""
    top = max(compute, memory)
    if top <= 0:
        return 0.0
    if p >= 60:
        return top
    return top * ((compute / top) ** p + (memory / top) ** p) ** (1.0 / p)


def math_precisions(layer: EngineLayer, gpu: GPU, tf32: bool = True) -> tuple[str, ...]:
    """The precisions TensorRT may run the layer's math in on ``gpu`` (it keeps the fastest):
    ``tf32`` for an FP32 layer on a GPU with TF32 when TF32 is allowed, and FP32 (SIMT).

    TF32 convolution kernels read channel-major FP32 with C % 4 == 0 (every TF32 tactic of the
    A100 fixture does); an FP32 convolution with other C (a 3-channel network input) runs a SIMT
    kernel, as the fixture's first convolution (``…scudnn…``) does."""
    p = layer.precision
    if p == "int8" and layer.layer_class in ("transformer", "attention") and gpu.int8_tops <= gpu.fp16_tflops:
        return ("int8", "fp16")  # no INT8 tensor cores (Volta): the FP16 GEMM after the dequantize is faster
    tf32_ok = tf32 and gpu.has_tf32
    if p == "tf32":
        return ("tf32",) if tf32_ok else ("fp32",)
    if p == "fp32" and tf32_ok and not layer.attrs.get("tactic"):
        if layer.layer_class in ("transformer", "attention") or (
                layer.layer_class == "conv_gemm" and input_channels(layer) % TF32_CHANNEL_ALIGN == 0):
            return ("tf32", "fp32")
    return (p,)


def math_options(layer: EngineLayer, gpu: GPU, params: CostParams, tf32: bool = True) -> tuple[tuple[str, bool], ...]:
    """(precision, on CUDA cores) of each kernel TensorRT may run the layer with (it keeps the
    fastest): :func:`math_precisions`, on tensor cores unless the tactic or the precision says CUDA
    cores; a predicted INT8/FP16 convolution (no tactic) may also run on the CUDA cores (INT8 DP4A
    ``int8x4`` kernels, TensorRT's depthwise kernel), which win where few channels per group leave
    the tensor-core tiles mostly empty (depthwise convolutions) or at batch 1."""
    options = [(p, is_simt(layer, p)) for p in math_precisions(layer, gpu, tf32)]
    if (params.model >= 2 and is_conv(layer) and not layer.attrs.get("tactic")
            and not _DEPTHWISE_TYPE.search(layer.layer_type)):
        options += [(p, True) for p, simt in options if not simt and p in ("int8", "fp16", "bf16")]
    return tuple(options)


def layer_breakdown(layer: EngineLayer, gpu: GPU | str, params: CostParams | None = None,
                    tf32: bool = True) -> dict:
    """``{ms, compute_ms, memory_ms, overhead_ms, bound, math, simt}`` of one layer (see :func:`layer_ms`)."""
    g, params = gpu_entry(gpu), (params or FITTED).pricing(layer)
    if layer.layer_type == "NoOp":
        return {"ms": 0.0, "compute_ms": 0.0, "memory_ms": 0.0, "overhead_ms": 0.0, "bound": "none", "math": "",
                "simt": False}
    memory = _memory_ms(layer, g, params)
    overhead = params.overhead_us.get(layer.layer_class, PRIOR.overhead_us["other"]) / 1e3 \
        * overhead_scale(g, layer.layer_class, params.model)
    options = []
    for p, simt in math_options(layer, g, params, tf32):
        compute = _compute_ms(layer, g, params, p, simt)
        knee = params.transformer_knee if params.transformer_knee > 0 and layer.layer_class in TRANSFORMER_CLASSES \
            else params.knee
        options.append((_soft_max(compute, memory, knee), compute, p, simt))
    best, compute, precision, simt = min(options)
    return {"ms": best + overhead, "compute_ms": compute, "memory_ms": memory, "overhead_ms": overhead,
            "bound": "compute" if compute >= memory else "memory", "math": precision, "simt": simt}


def layer_ms(layer: EngineLayer, gpu: GPU | str, params: CostParams | None = None, tf32: bool = True) -> float:
    """Estimated time of one engine layer on ``gpu`` (a :class:`GPU` or its name), in ms.
    ``params`` default to :data:`FITTED` (the fit on the fixture engines); ``tf32=False`` is
    trtexec's ``--noTF32``."""
    return layer_breakdown(layer, gpu, params, tf32)["ms"]


# One parameter set fitted jointly on the nine fixture engines: five A100 ResNet-18 (batch 32) and four
# TITAN RTX MobileNetV2 QAT (batch 1), each priced on its own GPU (bench/bench_trt_estimate.py
# --print-fit prints it; tests/unit/estimate/test_cost.py checks that fitting the fixtures again gives it).
FITTED = CostParams.from_json({
    "kind": "mixprec.cost_params",
    "format_version": 1,
    "compute_eff": {
        "conv_gemm": 0.6244,
        "pooling": 0.4,
        "elementwise": 0.4,
        "reformat": 0.4,
        "softmax_norm": 0.4,
        "transformer": 0.6244,
        "attention": 0.4,
        "transformer_norm": 0.4,
        "other": 0.4
    },
    "memory_eff": {
        "conv_gemm": 1.012,
        "pooling": 0.7305,
        "elementwise": 0.4615,
        "reformat": 0.4615,
        "softmax_norm": 0.4615,
        "transformer": 1.012,
        "attention": 0.6,
        "transformer_norm": 0.6,
        "other": 0.4615
    },
    "overhead_us": {
        "conv_gemm": 6.071,
        "pooling": 7.241,
        "elementwise": 6.013,
        "reformat": 6.013,
        "softmax_norm": 6.013,
        "transformer": 6.071,
        "attention": 3.0,
        "transformer_norm": 3.0,
        "other": 6.013
    },
    "simt_eff": 0.8459,
    "lowc_channels": 9.445,
    "knee": 1.128,
    "int8_linear_out": 0.3422,
    "step_us": 0.3127,
    "model": 3,
    "math_eff": {
        "tf32": 1.12,
        "fp16": 1.295,
        "int8": 1.0
    },
    "gemm_tile": 0.0,
    "clock_alpha": 1.0,
    "gpu": "a100+titanrtx",
    "basis": "fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)",
    "n_layers": 401,
    "median_err": 0.09182,
    "fitted_on": [
        "a100-resnet-fp32",
        "a100-resnet-fp16",
        "a100-resnet-qat",
        "a100-resnet-qat-residual",
        "a100-resnet-qat-residual-qgap",
        "titanrtx-mobilenetv2-qat-trt82",
        "titanrtx-mobilenetv2-qat-trt84",
        "titanrtx-mobilenetv2res-qat-trt82",
        "titanrtx-mobilenetv2res-qat-trt84"
    ],
    "fitted": [
        "knee",
        "memory_eff[conv_gemm]",
        "overhead_us[conv_gemm]",
        "compute_eff[conv_gemm]",
        "memory_eff[pooling]",
        "overhead_us[pooling]",
        "memory_eff[reformat]",
        "overhead_us[reformat]",
        "simt_eff",
        "lowc_channels",
        "int8_linear_out",
        "math_eff[fp16]",
        "math_eff[tf32]",
        "step_us"
    ]
})

# the transformer classes (transformer GEMMs, attention, transformer_norm) are fitted on NVIDIA's published
# BERT latencies, not on the CNN engines above (core.estimate.transformer; transformer_fit.json)
from core.estimate.transformer_fit import merged as _with_transformer_fit  # noqa: E402

FITTED = _with_transformer_fit(FITTED)
