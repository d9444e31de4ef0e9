"""A checker of TensorRT's explicit-quantization rules, for compiled ``trt``-target models.

It checks the semantics of the Q/DQ and FP16 encoding, not node names. Each rule names its source:

``opset``             the default-domain opset is ≥ 13: ONNX added DequantizeLinear's ``axis`` (needed
                      for per-channel weights) in opset 13 (TensorRT developer guide, "Explicit
                      Quantization → ONNX Support"; facts.md).
``zero-point``        every QuantizeLinear/DequantizeLinear has an int8 zero point that is all zeros.
                      TensorRT's quantization is symmetric (guide, "Working with Quantized Types");
                      onnx-tensorrt's ``QuantDequantLinearHelper`` rejects a non-zero zero point
                      ("TensorRT only supports symmetric quantization") and turns a uint8 one into
                      int8 (a different grid); an absent zero point makes QuantizeLinear uint8 (ONNX).
``scale``             the scale is a build-time constant, float32, finite and > 0, a scalar or 1-D, of
                      the zero point's shape (onnx-tensorrt: "Scale coefficients must all be positive",
                      "scale and zero point must have the same volume"; TensorRT operator reference,
                      Quantize: the scale "must be a build-time constant").
``per-channel-axis``  a per-channel (more than one scale) Q/DQ quantizes a constant weight, and every
                      consumer is a MAC weight input quantized along its output channels: Conv
                      ``W[M, C/g, k…]`` axis 0, ConvTranspose ``W[C, M/g, k…]`` axis 1, MatMul
                      ``B[…, K, N]`` axis rank-1, Gemm ``B`` axis 1 (``transB=0``, ``[K, N]``) or 0
                      (``transB=1``, ``[N, K]``). onnx-tensorrt: per-channel "assume[s] this is weight
                      quantization with dimensions KCRS (K is # output channels). Activations
                      quantization does not support per-axis quantization."
``scale-length``      a per-channel scale has as many entries as the data has along ``axis``
                      (onnx-tensorrt: "The number of scales is not equal to the number of output
                      channels").
``q-dq-pair``         every QuantizeLinear feeds only DequantizeLinear nodes (at least one, never a graph
                      output), each with the same scale and zero point: Q/DQ come in pairs, so that the
                      int8 tensor is an internal detail of a fused INT8 layer (guide, "Q/DQ Layer
                      Placement Recommendations").
``dq-source``         a DequantizeLinear reads either a QuantizeLinear (activations) or an int8
                      constant (pre-quantized weights: "When using pre-quantized weights, an
                      IDequantizeLayer is required between the weights and the linear operator").
``integer-tensor``    no Q/DQ on integer tensors: QuantizeLinear quantizes a float tensor (onnx-tensorrt
                      refuses UINT8 data), DequantizeLinear dequantizes an int8 one (int32 bias DQ has no
                      TensorRT equivalent).
``fp16-cast``         FP16 Casts only at float boundaries: a Cast to float16 reads a float32 (or
                      float64/bfloat16) tensor, never an integer or bool one; a Cast back to float32 reads
                      float16, never float32 (a no-op that means the compiler lost track of a type). Casts
                      from integer or float64 tensors to float32 are the model's own (e.g. an attention
                      mask), not precision boundaries.
``concat-scale``      a Concat with a dequantized input has only dequantized inputs, all with one scale and
                      zero point: TensorRT concatenates INT8 tensors in place only when their scales agree,
                      and requantizes (a reformat) otherwise (guide, "Q/DQ Layer Placement Recommendations":
                      Concat inputs share one scale).
``add-fusion``        an Add with a dequantized activation input has at most one float input, and that one is
                      the output of a Conv/ConvTranspose/Gemm/MatMul (directly, or through a BatchNormalization
                      or Cast) that only this Add reads: TensorRT fuses the Add into that producer
                      (``Conv + Add + Relu``, the skip input dequantized). Any other float input leaves the
                      Add outside the INT8 kernel, with reformats around it (facts.md; the A100 fixtures
                      ``a100-resnet-qat`` vs ``a100-resnet-qat-residual``).
``types``             the inputs that a node's ONNX schema binds to one type variable have one type (no
                      float32 activation meeting a float16 weight). TensorRT ≥ 10.12 builds this
                      file strongly typed, taking each tensor's type from the file (facts.md; guide,
                      "Strongly Typed Networks"), and ONNX Runtime refuses such a model.

Only the main graph is checked: the compiler never writes Q/DQ or Casts inside If/Loop/Scan bodies
(it reads their outer-scope tensors, which counts for ``q-dq-pair``).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from core.errors import MixprecError
from core.model.graph import GraphIndex, attr, default_opset
from core.model.normalize import MIN_OPSET
from core.model.placement import fused_input

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
FLOAT_ELEMS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
FP16_SOURCES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16}
RULES = ("opset", "zero-point", "scale", "per-channel-axis", "scale-length", "q-dq-pair", "dq-source",
         "integer-tensor", "fp16-cast", "concat-scale", "add-fusion", "types")


@dataclass(frozen=True)
class Violation:
    rule: str    # one of RULES
    node: str    # the offending node's name (or "<model>")
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.node}: {self.detail}"


class _Graph(GraphIndex):
    """The main graph's index (:class:`~core.model.graph.GraphIndex`: constants, producers, consumers with
    the reads from If/Loop/Scan bodies) with the element types and the constant values the rules read."""

    def __init__(self, proto: onnx.ModelProto):
        super().__init__(proto)
        self.types = _elem_types(proto)
        self.types.update({name: t.data_type for name, t in self.const_tensors.items()})

    def array(self, name: str) -> np.ndarray | None:
        t = self.const_tensors.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def shape(self, name: str) -> list[int] | None:
        dims = self.const_dims(name)
        return None if dims is None else list(dims)


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor onnx's shape inference can type (best effort)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # noqa: BLE001 - a malformed model is still checked, with fewer types
        inferred = proto
    g = inferred.graph
    return {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}


def _name(node: onnx.NodeProto) -> str:
    return node.name or f"<{node.op_type} → {node.output[0] if node.output else '?'}>"


# --- per-rule checks -----------------------------------------------------------------------------

def _check_params(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``zero-point`` and ``scale`` for one Q/DQ node."""
    out, name = [], _name(node)
    scale = g.array(node.input[1]) if len(node.input) > 1 else None
    if scale is None:
        out.append(Violation("scale", name, f"scale {node.input[1] if len(node.input) > 1 else '(none)'!r} "
                                            "is not a build-time constant (initializer or Constant)"))
    else:
        if scale.dtype != np.float32:
            out.append(Violation("scale", name, f"scale is {scale.dtype}, not float32"))
        vals = scale.astype(np.float64).ravel()
        if not (np.all(np.isfinite(vals)) and np.all(vals > 0)):
            bad = [float(v) for v in vals if not (math.isfinite(v) and v > 0)][:3]
            out.append(Violation("scale", name, f"scale coefficients must be finite and > 0, found {bad}"))
        if scale.ndim > 1:
            out.append(Violation("scale", name, f"scale has rank {scale.ndim} (scalar or 1-D expected)"))
    zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if zp_name is None:
        out.append(Violation("zero-point", name, "no zero point: QuantizeLinear then outputs uint8 (ONNX default); "
                                                 "give an int8 zero point of 0"))
        return out
    zp = g.array(zp_name)
    if zp is None:
        out.append(Violation("zero-point", name, f"zero point {zp_name!r} is not a constant"))
        return out
    if zp.dtype != np.int8:
        out.append(Violation("zero-point", name, f"zero point is {zp.dtype}, not int8"))
    if np.any(zp != 0):
        first = int(zp.ravel()[np.argmax(zp.ravel() != 0)])
        out.append(Violation("zero-point", name, f"zero point is not all zeros (e.g. {first})"))
    if scale is not None and zp.size != scale.size:
        out.append(Violation("scale", name, f"scale has {scale.size} entries, zero point {zp.size}"))
    return out


def _expected_axis(consumer: onnx.NodeProto, idx: int, rank: int) -> int | None:
    """The output-channel axis of a MAC weight input (None: not a weight input)."""
    op = consumer.op_type
    if idx != 1:
        return None
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "MatMul" and rank >= 2:
        return rank - 1
    if op == "Gemm" and rank == 2:
        return 0 if attr(consumer, "transB", 0) else 1
    return None


def _weight_consumers(g: _Graph, node: onnx.NodeProto) -> list[tuple[onnx.NodeProto, int]]:
    """The nodes that read the dequantized weight: a DQ's consumers, or those of a Q's DQs."""
    if node.op_type == "DequantizeLinear":
        return g.scoped_consumers.get(node.output[0], [])
    return [c for dq, _ in g.scoped_consumers.get(node.output[0], []) if dq.op_type == "DequantizeLinear"
            for c in g.scoped_consumers.get(dq.output[0], [])]


def _check_axis(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``per-channel-axis`` and ``scale-length`` for one Q/DQ node."""
    scale = g.array(node.input[1]) if len(node.input) > 1 else None
    if scale is None or scale.size <= 1:
        return []
    name, data = _name(node), node.input[0]
    shape = g.shape(data)
    src = g.producer.get(data)
    if shape is None and src is not None and src.op_type == "QuantizeLinear":  # Q(weight) -> DQ
        shape = g.shape(src.input[0])
    if shape is None:
        return [Violation("per-channel-axis", name, f"per-channel ({scale.size} scales) on {data!r}, which is not a "
                                                    "constant weight; TensorRT quantizes activations per tensor only")]
    rank = len(shape)
    axis = attr(node, "axis", 1)
    axis = axis + rank if axis < 0 else axis
    out = []
    if not 0 <= axis < rank:
        return [Violation("per-channel-axis", name, f"axis {axis} out of range for a rank-{rank} weight")]
    if shape[axis] != scale.size:
        out.append(Violation("scale-length", name, f"{scale.size} scales for dimension {shape[axis]} "
                                                   f"(axis {axis} of weight shape {shape})"))
    consumers = _weight_consumers(g, node)
    if not consumers:
        out.append(Violation("per-channel-axis", name, "per-channel weight is consumed by no MAC layer"))
    for c, idx in consumers:
        want = _expected_axis(c, idx, rank)
        if want is None:
            out.append(Violation("per-channel-axis", name, f"per-channel weight feeds input {idx} of "
                                                           f"{c.op_type} {_name(c)}, not a Conv/ConvTranspose/"
                                                           "MatMul/Gemm weight input"))
        elif want != axis:
            out.append(Violation("per-channel-axis", name, f"axis {axis}, but the output channels of {c.op_type} "
                                                           f"{_name(c)} are axis {want} of weight shape {shape}"))
    return out


def _check_q(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``q-dq-pair`` and ``integer-tensor`` for one QuantizeLinear."""
    out, name, x = [], _name(node), node.input[0]
    t = g.types.get(x)
    if t is not None and t not in FLOAT_ELEMS:
        out.append(Violation("integer-tensor", name, f"quantizes {x!r} of type {TensorProto.DataType.Name(t)}, "
                                                     "not a float tensor"))
    y = node.output[0]
    consumers = g.scoped_consumers.get(y, [])
    if y in g.outputs:
        out.append(Violation("q-dq-pair", name, f"its int8 output {y!r} is a graph output"))
    if not consumers and y not in g.outputs:
        out.append(Violation("q-dq-pair", name, "its output feeds nothing (no DequantizeLinear pairs with it)"))
    for c, idx in consumers:
        if c.op_type != "DequantizeLinear" or idx != 0:
            out.append(Violation("q-dq-pair", name, f"its int8 output feeds {c.op_type} {_name(c)} (input {idx}), "
                                                    "not a DequantizeLinear"))
        elif not _same_params(g, node, c):
            out.append(Violation("q-dq-pair", name, f"DequantizeLinear {_name(c)} uses another scale/zero point"))
    return out


def _same_params(g: _Graph, q: onnx.NodeProto, dq: onnx.NodeProto) -> bool:
    for i in (1, 2):
        a = g.array(q.input[i]) if len(q.input) > i and q.input[i] else None
        b = g.array(dq.input[i]) if len(dq.input) > i and dq.input[i] else None
        if (a is None) != (b is None) or (a is not None and (a.shape != b.shape or not np.array_equal(a, b))):
            return False
    scale = g.array(q.input[1])
    return attr(q, "axis", 1) == attr(dq, "axis", 1) or scale is None or scale.size <= 1


def _check_dq(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``dq-source`` and ``integer-tensor`` for one DequantizeLinear."""
    name, x = _name(node), node.input[0]
    const = g.const_tensors.get(x)
    if const is not None:
        if const.data_type != TensorProto.INT8:
            return [Violation("integer-tensor", name, f"dequantizes constant {x!r} of type "
                                                      f"{TensorProto.DataType.Name(const.data_type)}, not int8")]
        return []
    src = g.producer.get(x)
    if src is None or src.op_type != "QuantizeLinear":
        what = f"{src.op_type} {_name(src)}" if src is not None else "a graph input"
        return [Violation("dq-source", name, f"reads {x!r} from {what}, not from a QuantizeLinear or an int8 constant")]
    return []


def _check_cast(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``fp16-cast`` for one Cast."""
    to, src = attr(node, "to"), g.types.get(node.input[0])
    if src is None or to not in (TensorProto.FLOAT16, TensorProto.FLOAT):
        return []
    src_name = TensorProto.DataType.Name(src)
    if to == TensorProto.FLOAT16 and src not in FP16_SOURCES:
        return [Violation("fp16-cast", _name(node), f"casts {node.input[0]!r} of type {src_name} to float16; "
                                                    "FP16 boundaries cast float32 tensors only")]
    if to == TensorProto.FLOAT and src == TensorProto.FLOAT:
        return [Violation("fp16-cast", _name(node), f"casts {node.input[0]!r}, already float32, to float32; a cast "
                                                    "back to float32 reads a float16 tensor")]
    return []


def _activation_dq(g: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The DequantizeLinear of an activation (fed by a QuantizeLinear) that produces ``tensor``, or None."""
    src = g.producer.get(tensor)
    if src is None or src.op_type != "DequantizeLinear":
        return None
    q = g.producer.get(src.input[0])
    return src if q is not None and q.op_type == "QuantizeLinear" else None


def _check_concat(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``concat-scale`` for one Concat."""
    ins = [t for t in node.input if t and t not in g.const_tensors]
    dqs = [_activation_dq(g, t) for t in ins]
    if not any(dqs):
        return []
    if not all(dqs):
        floats = [t for t, dq in zip(ins, dqs) if dq is None]
        return [Violation("concat-scale", _name(node), f"mixes dequantized and float inputs ({floats[0]!r} is float): "
                                                       "TensorRT cannot concatenate in INT8")]
    params = {(g.array(dq.input[1]).tobytes(), g.array(dq.input[2]).tobytes() if len(dq.input) > 2 and dq.input[2]
               else b"") for dq in dqs if g.array(dq.input[1]) is not None}
    if len(params) > 1:
        return [Violation("concat-scale", _name(node), f"its {len(dqs)} dequantized inputs use {len(params)} different "
                                                       "scales/zero points; TensorRT needs one shared scale")]
    return []


def _check_add(g: _Graph, node: onnx.NodeProto) -> list[Violation]:
    """``add-fusion`` for one Add."""
    acts = [i for i, t in enumerate(node.input) if t and t not in g.const_tensors]
    floats = [i for i in acts if _activation_dq(g, node.input[i]) is None]
    if len(floats) == len(acts):
        return []
    if len(floats) > 1:
        return [Violation("add-fusion", _name(node), f"{len(floats)} float inputs next to a dequantized one: TensorRT "
                                                     "fuses an INT8 Add into one producer only; quantize the others")]
    if floats and fused_input(node, g) != floats[0]:
        src = g.producer.get(node.input[floats[0]])
        what = f"{src.op_type} {_name(src)}" if src is not None else "a graph input"
        return [Violation("add-fusion", _name(node), f"its float input {node.input[floats[0]]!r} comes from {what}, "
                                                     "which TensorRT cannot fuse the Add into (a Conv/Gemm/MatMul "
                                                     "read only by this Add); quantize it too")]
    return []


def _check_types(g: _Graph, node: onnx.NodeProto, opset: int) -> list[Violation]:
    """``types`` for one node: the inputs its schema binds to one type variable share one type."""
    if node.domain not in ("", "ai.onnx"):
        return []
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return []
    params = list(schema.inputs)
    bound: dict[str, set[int]] = defaultdict(set)
    for i, name in enumerate(node.input):
        if name and params and name in g.types:
            p = params[min(i, len(params) - 1)]
            if not p.type_str.startswith("tensor("):
                bound[p.type_str].add(g.types[name])
    clash = {tv: ts for tv, ts in bound.items() if len(ts) > 1}
    if not clash:
        return []
    tv, ts = next(iter(clash.items()))
    names = sorted(TensorProto.DataType.Name(t) for t in ts)
    return [Violation("types", _name(node), f"inputs bound to type {tv} are {' and '.join(names)}: a strongly "
                                            "typed build (and ONNX Runtime) refuses mixed input types")]


# --- entry points --------------------------------------------------------------------------------

def check_explicit_quantization(proto: onnx.ModelProto, source_nodes=frozenset()) -> list[Violation]:
    """Every violation of TensorRT's explicit-quantization rules (module docstring) in ``proto``.
    ``source_nodes``: names of the user's own nodes; their Casts (e.g. a no-op float Cast that
    PyTorch exports) are the model's, not precision boundaries, and are not checked."""
    g = _Graph(proto)
    out: list[Violation] = []
    opset = default_opset(proto)
    if opset < MIN_OPSET:
        out.append(Violation("opset", "<model>", f"opset {opset}; TensorRT's per-channel DequantizeLinear (axis) "
                                                 f"needs opset ≥ {MIN_OPSET}"))
    for node in proto.graph.node:
        if node.op_type in QDQ_OPS and node.domain in ("", "ai.onnx"):
            out += _check_params(g, node) + _check_axis(g, node)
            out += _check_q(g, node) if node.op_type == "QuantizeLinear" else _check_dq(g, node)
        elif node.op_type == "Cast" and node.name not in source_nodes:
            out += _check_cast(g, node)
        elif node.op_type == "Concat" and node.domain in ("", "ai.onnx"):
            out += _check_concat(g, node)
        elif node.op_type == "Add" and node.domain in ("", "ai.onnx"):
            out += _check_add(g, node)
        out += _check_types(g, node, opset)
    return out


def assert_trt_rules(proto: onnx.ModelProto, what: str = "the compiled model", source_nodes=frozenset()) -> None:
    """Raise MixprecError listing every violation of TensorRT's explicit-quantization rules."""
    violations = check_explicit_quantization(proto, source_nodes)
    if violations:
        raise MixprecError(
            f"{what} breaks {len(violations)} of TensorRT's explicit-quantization rules "
            f"({', '.join(sorted({v.rule for v in violations}))})",
            "set the layers the details name to fp16 or fp32 in the policy and build again (an all-FP32 policy "
            "leaves the model's computation unchanged, so it always passes)",
            details=[str(v) for v in violations])
