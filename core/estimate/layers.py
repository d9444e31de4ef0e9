"""Engine layers read from a real trtexec layer-info report (``--exportLayerInfo`` built with
``--profilingVerbosity=detailed``), as the :class:`~core.estimate.engine.EngineLayer` records the
cost model prices.

What is read from each layer:

* ``LayerType`` → the layer class (:func:`layer_class`): convolution/GEMM (``CaskConvolution``,
  ``CudaDepthwiseConvolution``, ``FusedConvActConvolution``, ``CaskGemm…``), pooling (``CaskPooling``,
  ``TiledPooling``, ``CudaPooling``), elementwise/activation, reformat/copy, softmax/normalization,
  fused transformer blocks (Myelin / ForeignNode), other (NoOp and the rest). TensorRT 8.2 ran the
  Q/DQ nodes of an explicit-precision network as ``Scale`` layers (``ParameterType: Scale``, named
  after the ``QuantizeLinear``/``DequantizeLinear`` node, a float input and an INT8 output or the
  reverse); 8.4 and later show the same conversion as a ``Reformat``. Such a ``Scale`` layer is a
  reformat here (:func:`is_qdq_scale`), priced as one, its precision that of what it converts to;
* ``Inputs``/``Outputs``: dims and ``Format/Datatype`` → :class:`Tensor` (storage type, and the
  channel vectorisation or padding of the format: ``Thirty-two wide channel vectorized`` → 32,
  ``Channel major FP16 format where channel % 8 == 0`` → 8, linear → 1);
* the math precision (:func:`math_precision`) from the tactic name (``…tf32…`` → ``tf32``,
  ``i8i8``/``i8f16``/``i8f32``/``i8816``/``int8x4`` → ``int8``, ``f16f16``/``h16816``/``hmma`` →
  ``fp16``, ``scudnn``/``sgemm`` → ``fp32``), else the weights' type (``CudaDepthwiseConvolution``
  and ``FusedConvActConvolution`` name no tactic: their ``Int8``/``Half``/``Float`` weights say it),
  else the first input's datatype (for a reformat: the output's);
* convolution parameters (``Kernel``/``ConvKernel``, ``Stride``, padding, ``OutMaps``, ``Groups``,
  ``Weights``/``Bias`` counts and types). For a fused ``ConvActPool`` layer the convolution's own
  output size (before the pooling) is kept in ``attrs["conv_out"]``.

Reformat detection is :mod:`core.backends.reports`'s (:func:`core.backends.reports.is_reformat_layer`): ``LayerType ==
"Reformat"``, a ``Reformatting CopyNode`` that is not a ``NoOp``, or a TensorRT 8.2 Q/DQ ``Scale``
layer; NoOp layers run no kernel."""
from __future__ import annotations

import math
import re

from core.backends.reports import (COPY_NODE, GRAPH_FLAG, PROFILE_FLAG, EngineReport, datatype, is_qdq_scale,
                                   is_reformat_layer, layer_records, load_engine_report, onnx_names, read_json)
from core.errors import MixprecError
from core.estimate.engine import EngineLayer, Tensor

_DTYPES = {"FP32": "fp32", "FP16": "fp16", "BF16": "bf16", "INT8": "int8", "UINT8": "int8", "FP8": "fp8",
           "INT32": "int32", "INT64": "int64", "BOOL": "bool", "INT4": "int8", "FP4": "fp8"}
_WEIGHT_TYPES = {"float": "fp32", "half": "fp16", "int8": "int8", "bfloat16": "bf16", "fp8": "fp8",
                 "int32": "int32"}
_VECTOR_WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16, "thirty-two": 32, "sixty-four": 64}
# tactic-name tokens → math precision, most specific first (an INT8 conv with an FP16 output is
# ``i8f16_i8i32``: the math is int8)
_TACTIC_PRECISION = (
    (re.compile(r"i8i8|i8f16|i8f32|i8816|int8|imma|_i8_"), "int8"),
    (re.compile(r"tf32"), "tf32"),
    (re.compile(r"bf16"), "bf16"),
    (re.compile(r"e4m3|fp8"), "fp8"),
    (re.compile(r"f16f16|h16816|h1688|h884|hmma|fp16"), "fp16"),
    (re.compile(r"scudnn|sgemm|f32f32_f32f32|fp32"), "fp32"),
)
_CLASSES = (
    (re.compile(r"conv|gemm|matrixmultiply|fullyconnected|deconv|cublas|cudnn", re.I), "conv_gemm"),
    (re.compile(r"pool|reduce", re.I), "pooling"),
    (re.compile(r"reformat|copy|cast|quantize|slice|concat|shuffle|gather|padding|resize", re.I), "reformat"),
    (re.compile(r"softmax|norm", re.I), "softmax_norm"),
    (re.compile(r"myelin|foreign|mha|attention|transformer", re.I), "transformer"),
    (re.compile(r"elementwise|pointwise|activation|scale|unary|select|signal", re.I), "elementwise"),
)


def tensor(raw: dict) -> Tensor:
    """A layer-info ``Inputs``/``Outputs`` entry as a :class:`Tensor`."""
    fmt = str(raw.get("Format/Datatype", ""))
    dims = tuple(int(d) for d in raw.get("Dimensions") or () if isinstance(d, (int, float)) and d >= 0)
    return Tensor(name=str(raw.get("Name", "")), dims=dims, dtype=_DTYPES.get(datatype(fmt), "fp32"),
                  vector=format_vector(fmt))


def format_vector(fmt: str) -> int:
    """Channel vectorisation/padding of a ``Format/Datatype`` string (1 for linear formats)."""
    low = fmt.lower()
    m = re.match(r"([a-z-]+) wide channel vectorized", low)
    if m and m.group(1) in _VECTOR_WORDS:
        return _VECTOR_WORDS[m.group(1)]
    m = re.search(r"channel % (\d+) == 0", low)
    return int(m.group(1)) if m else 1


def layer_class(layer_type: str, name: str = "", raw: dict | None = None) -> str:
    """The cost-model class of a TensorRT ``LayerType`` (see :data:`~core.estimate.engine.LAYER_CLASSES`);
    ``raw``, the layer-info record, tells a TensorRT 8.2 Q/DQ ``Scale`` layer (a reformat) from a
    plain scale."""
    if layer_type == "NoOp":
        return "other"
    if layer_type == "Reformat" or COPY_NODE.match(name) or (raw is not None and is_qdq_scale(raw)):
        return "reformat"
    for pattern, cls in _CLASSES:
        if pattern.search(layer_type):
            return cls
    return "other"


def math_precision(raw: dict, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]) -> str:
    """The precision a layer computes in: from its tactic name, its weights' type, else its data."""
    tactic = str(raw.get("TacticName") or "").lower()
    for pattern, precision in _TACTIC_PRECISION:
        if pattern.search(tactic):
            return precision
    weights = raw.get("Weights") or raw.get("ConvWeights")
    if isinstance(weights, dict) and str(weights.get("Type", "")).lower() in _WEIGHT_TYPES:
        return _WEIGHT_TYPES[str(weights["Type"]).lower()]
    if (str(raw.get("LayerType")) == "Reformat" or is_qdq_scale(raw)) and outputs:
        return outputs[0].dtype
    source = inputs or outputs
    return source[0].dtype if source else "fp32"


def _ints(value) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _conv_out(raw: dict, inputs: tuple[Tensor, ...], prefix: str) -> tuple[int, ...]:
    """Spatial size of a convolution's own output (before a fused pooling)."""
    kernel, stride = _ints(raw.get(f"{prefix}Kernel")), _ints(raw.get(f"{prefix}Stride"))
    pre, post = _ints(raw.get(f"{prefix}PrePadding")), _ints(raw.get(f"{prefix}PostPadding"))
    dilation = _ints(raw.get(f"{prefix}Dilation")) or (1,) * len(kernel)
    if not inputs or not kernel or len(inputs[0].dims) < 2 + len(kernel):
        return ()
    spatial = inputs[0].dims[-len(kernel):]
    out = []
    for i, size in enumerate(spatial):
        s = stride[i] if i < len(stride) else 1
        pad = (pre[i] if i < len(pre) else 0) + (post[i] if i < len(post) else 0)
        out.append((size + pad - dilation[i] * (kernel[i] - 1) - 1) // s + 1)
    return tuple(out)


def _count(raw: dict, *keys: str) -> tuple[int, str]:
    for key in keys:
        v = raw.get(key)
        if isinstance(v, dict) and isinstance(v.get("Count"), (int, float)):
            return int(v["Count"]), _WEIGHT_TYPES.get(str(v.get("Type", "")).lower(), "fp32")
    return 0, ""


def engine_layer(raw: dict) -> EngineLayer:
    """One layer-info record as an :class:`EngineLayer`."""
    name, layer_type = str(raw["Name"]), str(raw.get("LayerType", ""))
    inputs = tuple(tensor(t) for t in raw.get("Inputs") or [] if isinstance(t, dict))
    outputs = tuple(tensor(t) for t in raw.get("Outputs") or [] if isinstance(t, dict))
    prefix = "Conv" if "ConvKernel" in raw else ""
    kernel = _ints(raw.get(f"{prefix}Kernel") or raw.get("WindowSize"))
    weights, weights_dtype = _count(raw, "Weights", "ConvWeights")
    bias, _ = _count(raw, "Bias", "ConvBias")
    nodes, qdq = onnx_names(name, raw.get("Metadata"))
    is_reformat = is_reformat_layer(raw)
    attrs = {"tactic": str(raw.get("TacticName") or ""), "origin": str(raw.get("Origin", "")),
             "stride": _ints(raw.get(f"{prefix}Stride")), "qdq_nodes": tuple(qdq)}
    if prefix or "Kernel" in raw:
        attrs["conv_out"] = _conv_out(raw, inputs, prefix)
    if "PoolingType" in raw or "PoolingPoolingType" in raw:
        attrs["pooling"] = str(raw.get("PoolingType") or raw.get("PoolingPoolingType"))
    return EngineLayer(
        name=name, layer_type=layer_type, layer_class=layer_class(layer_type, name, raw),
        precision=math_precision(raw, inputs, outputs), inputs=inputs, outputs=outputs, kernel=kernel,
        groups=int(raw.get(f"{prefix}Groups") or 1), out_maps=int(raw.get(f"{prefix}OutMaps") or 0),
        weights=weights, weights_dtype=weights_dtype, bias=bias, onnx_nodes=tuple(nodes),
        is_reformat=is_reformat, attrs=attrs)


def from_layer_info(graph) -> list[EngineLayer]:
    """The engine layers of a trtexec layer-info report: a path, bytes or the parsed JSON.

    An :class:`~core.backends.reports.EngineReport` keeps no dims or convolution parameters, so it is not
    enough: pass the layer-info file it was read from."""
    if isinstance(graph, EngineReport):
        raise MixprecError(f"The engine report {graph.name!r} keeps no tensor dims or convolution "
                           "parameters, which the cost model needs",
                           f"pass the layer-info JSON itself (the file written by trtexec {GRAPH_FLAG})")
    raw_layers, _ = layer_records(read_json(graph, "layer info", GRAPH_FLAG))
    return [engine_layer(raw) for raw in raw_layers]


def measured_layers(graph, profile) -> tuple[list[EngineLayer], list[float]]:
    """The engine layers of a layer-info report and each one's measured time (the profile's
    ``averageMs``), matched by name as :func:`core.backends.reports.load_engine_report` matches them."""
    if profile is None:
        raise MixprecError("A profile is needed to calibrate the cost model",
                           f"pass the file written by trtexec {PROFILE_FLAG}=FILE from the same run")
    graph_doc = read_json(graph, "layer info", GRAPH_FLAG)
    report = load_engine_report(graph_doc, profile)
    layers = from_layer_info(graph_doc)
    times = [float(t) for t in report.layers["time_ms"]]
    if len(times) != len(layers) or any(math.isnan(t) for t in times):
        raise MixprecError("The profile does not time every layer of the layer info",
                           "export the layer info and the profile from the same trtexec run")
    return layers, times
