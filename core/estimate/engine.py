"""The engine-layer record the cost model prices: what one TensorRT engine layer holds in
trtexec's ``--exportLayerInfo`` (``--profilingVerbosity=detailed``), read from a real report
(:func:`core.estimate.layers.from_layer_info`) or predicted from an ONNX model and a policy
(:mod:`core.estimate.predict`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1, "int32": 4, "int64": 8, "bool": 1}
# the layer classes whose efficiencies the cost model fits
LAYER_CLASSES = ("conv_gemm", "pooling", "elementwise", "reformat", "softmax_norm", "transformer", "attention",
                 "transformer_norm", "other")


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]
    dtype: str = "fp32"       # fp32 / fp16 / int8 / int32 / bool … (the storage type)
    vector: int = 1           # channel vectorisation of the format: 1 (linear), 2, 4, 8, 16, 32

    @property
    def elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) if self.dims else 1

    @property
    def bytes(self) -> int:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True)
class EngineLayer:
    name: str
    layer_type: str                    # TensorRT's LayerType: CaskConvolution, Reformat, TiledPooling, NoOp, …
    layer_class: str                   # one of LAYER_CLASSES
    precision: str                     # math precision: fp32 / tf32 / fp16 / int8
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    kernel: tuple[int, ...] = ()       # convolution / pooling window
    groups: int = 1
    out_maps: int = 0                  # convolution output channels / GEMM N
    weights: int = 0                   # weight count
    weights_dtype: str = ""
    bias: int = 0
    onnx_nodes: tuple[str, ...] = ()   # the ONNX nodes fused into this layer
    is_reformat: bool = False
    attrs: dict = field(default_factory=dict, compare=False, hash=False)  # anything else (tactic, pooling type…)


# --- the classes a calibration applies to (``core.estimate.fit.calibrate``) ------------------------
# The cost model's classes, with its convolution/GEMM class cut in two: a calibration on convolutions
# says nothing of MatMul/GEMM kernels (and the reverse), although both are priced by one set of
# efficiencies. A calibration prices the layers of the classes it has data for; every other layer keeps
# the shipped fit (``core.estimate.cost.CostParams.classes``).
CALIBRATION_CLASSES = ("conv", "gemm", "pooling", "elementwise", "reformat", "softmax_norm", "transformer",
                       "attention", "transformer_norm", "other")
CLASS_NAMES = {"conv": "convolution", "gemm": "MatMul/GEMM", "pooling": "pooling", "elementwise": "elementwise",
               "reformat": "reformat", "softmax_norm": "softmax/normalization",
               "transformer": "transformer MatMul/GEMM", "attention": "attention",
               "transformer_norm": "transformer normalization", "other": "other"}
_GEMM_TYPE = re.compile(r"matrixmultiply|fullyconnected|matmul", re.I)


def calibration_class(layer: EngineLayer) -> str:
    """The class of :data:`CALIBRATION_CLASSES` a layer belongs to: its ``layer_class``, with the
    convolution/GEMM class split by its TensorRT type (``CaskGemmMatrixMultiply``, ``MatrixMultiply``,
    ``FullyConnected``: a MatMul/GEMM; anything else, a 1x1 convolution included: a convolution)."""
    if layer.layer_class == "conv_gemm":
        return "gemm" if _GEMM_TYPE.search(layer.layer_type) else "conv"
    return layer.layer_class if layer.layer_class in CLASS_NAMES else "other"


def class_list(counts, with_counts: bool = True) -> str:
    """"convolution (21 layers), reformat (12)" of ``{class: count}`` (or of class names), in
    :data:`CALIBRATION_CLASSES` order."""
    items = counts.items() if hasattr(counts, "items") else ((c, 0) for c in counts)
    known = dict(items)
    order = [c for c in CALIBRATION_CLASSES if c in known] + [c for c in known if c not in CALIBRATION_CLASSES]
    parts = []
    for i, c in enumerate(order):
        name = CLASS_NAMES.get(c, c)
        if with_counts:
            n = int(known[c])
            name += f" ({n} layer{'s' if n != 1 else ''})" if i == 0 else f" ({n})"
        parts.append(name)
    return ", ".join(parts)
