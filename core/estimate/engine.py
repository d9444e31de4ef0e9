"""The engine-layer record the cost model prices: what one TensorRT engine layer holds in
trtexec's ``--exportLayerInfo`` (``--profilingVerbosity=detailed``), read from a real report
(:func:`core.estimate.layers.from_layer_info`) or predicted from an ONNX model and a policy
(:mod:`core.estimate.predict`)."""
from __future__ import annotations

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
