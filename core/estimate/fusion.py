"""The engine TensorRT would build from an explicit-precision ONNX (Q/DQ for INT8, Cast and
float16 tensors for FP16: mixprec's ``trt``-target compile), as a list of
:class:`~core.estimate.engine.EngineLayer` records for the cost model.

What is simulated, each rule read off the real A100 engines in ``../shared/fixtures/trt-engine-reports``
(ResNet-18 at batch 32 in fp32, fp16 and three INT8 placements) and TensorRT's explicit-quantization
guide:

* **Constants fold.** Weight DequantizeLinear (int8 initializers), Constant nodes and anything computed
  from constants only run at build time; shape arithmetic (int64 tensors) costs nothing.
* **Convolution/GEMM fusion.** A Conv/ConvTranspose/Gemm/MatMul absorbs the DequantizeLinear of its
  activation input (INT8 math), then, as long as its output has one consumer: Casts (an INT8 kernel
  writes int8, fp16 or fp32: ``i8i8``/``i8f16``/``i8f32`` tactics; an fp16/fp32 kernel writes its own
  type only), pointwise ops with constant operands (bias, BatchNormalization as a scale, Mul by a
  constant), activations, **one residual Add** (Conv/Gemm only: ``Conv_5 + Add_6 + Relu_7``), and a
  closing QuantizeLinear (INT8 output) when the layer computes in INT8 and its residual, if any, is
  quantized too (with a float residual the layer writes float and the QuantizeLinear after it is a
  reformat: the qat fixture's ``QuantizeLinear_40``). The QuantizeLinear may sit behind Casts,
  reshapes and Transposes (attention heads): TensorRT moves it back across them. Of an Add fed by two
  convolutions the later one in topological order takes it (``Conv_16 + Add_17 + Relu_18`` is the
  downsample). The residual is read in the output's type: a quantized residual (DQ) fuses when the
  output is INT8, else its DequantizeLinear runs as a separate reformat (``DequantizeLinear_291`` of
  the qat-residual engine).
* **ConvActPool.** An INT8 convolution followed by a MaxPool whose result is only quantized again
  takes the pooling in (``conv1.weight + QuantizeLinear_7 + Conv_9 + MaxPool_12``): TensorRT moves the
  QuantizeLinear back across the max (they commute).
* **Pooling** runs in INT8 when its input is dequantized and its output only quantized again (through
  Casts and reshapes), else in its input's float type: the type its producer really writes, FP32 for the
  linear output of an INT8 convolution, converted by a reformat after the pool (:meth:`_Fuser.fp32_from_int8`;
  the qat fixture's ``MaxPool_12``).
* **Pointwise regions** (elementwise ops, reductions, Softmax, LayerNormalization and its
  decomposed ReduceMean…Sqrt…Div form) fuse into one layer wherever a node reads only tensors of the
  region or the region's inputs. A QuantizeLinear that is the only reader of the region's output
  fuses into it (int8 output); with all inputs dequantized too, the region computes in INT8.
* **Conversions** left over (QuantizeLinear, DequantizeLinear, Cast chains between layers) are one
  Reformat layer each chain, from the first type to the last; a chain that ends where it began is
  removed.
* **Formats.** INT8 convolutions read and write 32-wide channel-vectorised tensors (int8, or fp16 for
  an ``i8f16`` output; fp32 outputs are linear); fp16 convolutions channel-major (``% 8``); fp32/tf32
  ones channel-major except a first layer of ≤ 4 input channels (linear); float pooling does not read
  the 32-wide format; graph inputs and outputs are linear. A tensor whose format its consumer cannot
  read gets a format reformat, unless its spatial size is 1 (the formats then coincide: TensorRT
  reports those copies as ``NoOp``). A layer that can write several formats writes the one most of its
  consumers read.

* **Transformer engines** (TensorRT's Myelin backend; sources in docs/tensorrt.md "Transformer engines"):
  in a graph with an attention (two activation×activation MatMuls joined by a Softmax), each attention
  is one fused kernel (:meth:`_Fuser.attention`; INT8 only under TensorRT's INT8 MHA conditions, else
  left unfused), Q/K/V projections reading one tensor are one GEMM (:meth:`_Fuser.horizontal`), GEMM
  epilogues take in bias and decomposed activations (GELU), a residual Add + LayerNorm (or embedding
  lookups + Add + LayerNorm) is one normalization kernel that also writes the quantized copy its
  readers need (:meth:`_Fuser.quantized_outputs`), and no reformat sits inside.

What it does not simulate: tactic choice beyond these formats, multi-stream overlap, FP8 attention limits.

No weight value is read: the cost model needs FLOPs and bytes, which shapes, types and attributes
give (a weight's dims from its initializer's metadata). A model whose weights stay in external data
files (``core.model.external``, models over 2 GB) is predicted from its graph; only the few small external
tensors shape inference may need (under :data:`SMALL_VALUE` bytes: a Reshape's shape) are read, one
at a time (:func:`inference_twin`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from core.errors import MixprecError
from core.estimate.engine import EngineLayer, Tensor
from core.estimate.layers import layer_class
from core.model.external import INLINE_BELOW, location, read_tensor
from core.model.graph import GraphIndex, attr, kahn_order, with_input_dims, without_weights
from core.quant.compile import SHAPE_ONLY

ANCHORS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
RESIDUAL_ANCHORS = frozenset({"Conv", "ConvTranspose", "Gemm"})
POOLING = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"})
POINTWISE = frozenset({
    "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus",
    "Softsign", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Mish", "Celu", "Floor",
    "Ceil", "Round", "Sin", "Cos", "ThresholdedRelu", "PRelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    "Sum", "Mean", "BatchNormalization", "Where", "Not", "Equal", "Less", "Greater", "And", "Or"})
NORM = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
                  "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                  "ReduceSumSquare", "ReduceLogSumExp", "LpNormalization", "SimplifiedLayerNormalization",
                  "SkipLayerNormalization"})
SHUFFLE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Concat"})  # no kernel of their own
PASS_THROUGH = ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")  # Q moves across these
CONVERT = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "CastLike"})
CONV_TYPES = {"Conv": "CaskConvolution", "ConvTranspose": "CaskDeconvolution", "Gemm": "CaskConvolution",
              "MatMul": "CaskGemmMatrixMultiply"}
COPY_TYPES = {"Transpose": "Shuffle", "Slice": "Slice", "Split": "Slice", "Gather": "Gather",
              "GatherElements": "Gather", "GatherND": "Gather", "Pad": "Padding", "Resize": "Resize",
              "Expand": "Slice", "Tile": "Slice", "DepthToSpace": "Shuffle", "SpaceToDepth": "Shuffle"}
_ELEM = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16",
         onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "int8", onnx.TensorProto.DOUBLE: "fp32",
         onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.BOOL: "bool"}
DATA_TYPES = ("fp32", "fp16", "bf16", "int8")
# between the two matmuls of an attention: scale, mask, Casts, Softmax, the probabilities' Q/DQ
SCORE_OPS = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Softmax", "QuantizeLinear", "DequantizeLinear",
                       "Max", "Min", "Clip"})
# TensorRT's INT8 fused-MHA conditions (developer guide, as quoted in TensorRT issues #2981 and #4167)
INT8_MHA_HEADS = (16, 32, 64)
INT8_MHA_MAX_KEYS = 512
LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast"})
HEAD_SPLIT = LAYOUT | {"Split", "Slice"}  # a fused QKV GEMM's output split into Q, K, V: strided views
# data-movement ops a transformer engine fuses into its pointwise kernels (views and permutations)
MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split",
                      "Concat", "Expand", "Tile", "Neg"})
SHUFFLE_FREE = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})  # no kernel even alone
REGION_WINDOW = 64  # nodes ahead that a pointwise region looks at for members
# formats (channel layouts of 4-D activations) and the vectorisation they report
FORMAT_VECTOR = {"linear": 1, "hwc": 4, "hwc4": 4, "hwc8": 8, "c32": 32, "c4": 4}


@dataclass
class Group:
    """One predicted engine layer before formats: its ONNX nodes and what it reads and writes."""

    kind: str                      # conv / pool / pointwise / shuffle / copy / convert / other
    nodes: list[int]
    inputs: list[str]              # activation tensors read (int8 ones: a QuantizeLinear's output)
    outputs: list[str]
    precision: str = "fp32"        # math precision
    anchor: int | None = None      # the conv/GEMM or pooling node
    pool: int | None = None        # a MaxPool fused into an INT8 convolution
    residual: str | None = None    # the residual input of a fused Add
    weight_dtype: str = ""
    elided: bool = False           # a conversion chain that ends in its own type: removed
    formats_in: list[str] = field(default_factory=list)
    formats_out: list[str] = field(default_factory=list)
    layer_class: str = ""          # the cost-model class when not the kind's own ("transformer" GEMMs)
    attrs: dict = field(default_factory=dict)  # attention: its FLOPs and score dims


def _builds_constant(node: onnx.NodeProto) -> bool:
    """TensorRT folds a node whose inputs are all constants (a Constant has none); a node without inputs
    but a Constant is computed at run time."""
    return node.op_type == "Constant" or bool(node.input)


class Net:
    """The ONNX graph with what the fusion reads: its :class:`~core.model.graph.GraphIndex` (producer and
    data consumers of each tensor by node index, the tensors that are constants at build time), dtypes
    and static shapes."""

    def __init__(self, proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]):
        self.index = GraphIndex(proto)
        self.nodes = self.index.nodes
        self.shapes, self.dtypes = shapes, dtypes
        self.graph_inputs = list(self.index.inputs)
        self.graph_outputs = self.index.outputs  # by name, in graph order
        self.inits = self.index.inits
        self.producer = self.index.producer_id
        # a Shape/Size reads a tensor's shape, not its data (folded at build time): no consumer
        self.consumers = self.index.data_consumer_ids
        self.consts = self.index.folding(_builds_constant).tensors  # what only constants feed is a constant

    def op(self, k: int) -> str:
        return self.nodes[k].op_type

    def live(self, tensor: str) -> bool:
        """An activation: computed at run time, of a data type (not shape arithmetic)."""
        return bool(tensor) and tensor not in self.consts and self.dtypes.get(tensor, "fp32") in DATA_TYPES

    def live_inputs(self, k: int) -> list[str]:
        return [t for t in self.nodes[k].input if self.live(t)]

    def sole_consumer(self, tensor: str) -> int | None:
        cons = self.consumers.get(tensor, [])
        return cons[0] if len(cons) == 1 and tensor not in self.graph_outputs else None

    def dtype(self, tensor: str) -> str:
        return self.dtypes.get(tensor, "fp32")

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.shapes.get(tensor, ())

    def const_dims(self, tensor: str) -> tuple[int, ...] | None:
        """The dims of a constant (an initializer, an int8 weight behind its DequantizeLinear, a
        Constant node's tensor), read from its metadata: no value is read, so a weight in an external
        data file stays there. None when ``tensor`` is no such constant."""
        k = self.producer.get(tensor)
        if tensor not in self.inits and k is not None and self.op(k) == "DequantizeLinear":  # an int8 weight
            return self.const_dims(self.nodes[k].input[0])
        return self.index.const_dims(tensor)

    def weight_dtype(self, tensor: str) -> str:
        k = self.producer.get(tensor)
        if k is not None and self.op(k) == "DequantizeLinear":
            return "int8"
        return self.dtype(tensor)


# --------------------------------------------------------------------------- fusion

def _dq_source(net: Net, tensor: str, consumer: int) -> list[int] | None:
    """The DequantizeLinear (and Casts after it) that feed ``tensor`` to ``consumer`` alone, or None."""
    chain, t = [], tensor
    while True:
        k = net.producer.get(t)
        if k is None or net.sole_consumer(t) != (chain[-1] if chain else consumer):
            return None
        if net.op(k) == "Cast":
            chain.append(k)
            t = net.nodes[k].input[0]
            continue
        if net.op(k) == "DequantizeLinear" and net.live(net.nodes[k].input[0]):
            return [k] + chain[::-1]
        return None


def _to_quantize(net: Net, tensor: str, through=("Cast",)) -> list[int] | None:
    """The nodes from ``tensor`` to a QuantizeLinear that is its only reader (through Casts and
    ``through`` ops, each the only reader of the one before), or None."""
    chain, t = [], tensor
    while True:
        k = net.sole_consumer(t)
        if k is None:
            return None
        chain.append(k)
        if net.op(k) == "QuantizeLinear":
            return chain
        if net.op(k) not in through:
            return None
        t = net.nodes[k].output[0]


def _anchor_of(net: Net, tensor: str) -> int | None:
    """The convolution whose epilogue (Casts, constant pointwise ops, activations) produces ``tensor``
    with one reader at each step, or None."""
    t = tensor
    while True:
        k = net.producer.get(t)
        if k is None:
            return None
        if net.op(k) in RESIDUAL_ANCHORS or (net.op(k) == "MatMul" and len(net.nodes[k].input) > 1
                                            and net.nodes[k].input[1] in net.consts):
            return k
        if net.op(k) == "Cast" or (net.op(k) in POINTWISE and len(net.live_inputs(k)) == 1):
            t = net.live_inputs(k)[0] if net.live_inputs(k) else None
            if t is None or net.sole_consumer(t) != k:
                return None
            continue
        return None


def residual_owners(net: Net) -> dict[int, int]:
    """Add node -> the convolution it fuses into: of the inputs produced by a convolution's epilogue,
    the later convolution in topological order (the fp32 fixture fuses the downsample's Add)."""
    owners = {}
    for k, n in enumerate(net.nodes):
        if n.op_type not in ("Add", "Sum"):
            continue
        ins = net.live_inputs(k)
        if len(ins) != 2 or ins[0] == ins[1] or net.shape(ins[0]) != net.shape(ins[1]) or not net.shape(ins[0]):
            continue
        anchors = [a for a in (_anchor_of(net, t) for t in ins) if a is not None]
        if anchors:
            owners[k] = max(anchors)
    return owners


class _Fuser:
    def __init__(self, net: Net):
        self.net = net
        self.claimed: set[int] = set()
        self.owners = residual_owners(net)
        self.groups: list[Group] = []

    def claim(self, ks):
        self.claimed.update(ks)

    def run(self) -> list[Group]:
        net = self.net
        self.attention_seen = False  # an attention pattern, fused or not, makes this a transformer engine
        self.groups.extend(self.attention_blocks())
        self.transformer = self.attention_seen
        for k, n in enumerate(net.nodes):
            if k in self.claimed or not any(net.live(o) for o in n.output) and n.op_type not in ANCHORS:
                continue
            op = n.op_type
            if op in CONVERT:
                continue  # conversions left over become reformats (after every layer took its own)
            if op in ANCHORS and net.live_inputs(k):
                self.groups.append(self.conv(k))
            elif op in POOLING and net.live_inputs(k):
                self.groups.append(self.pool(k))
            elif self.transformer and self.embedding(k):
                continue  # taken in by the pointwise region that reads it (below, if none does)
            elif op in POINTWISE or op in NORM or (self.transformer and op in MOVEMENT - SHUFFLE_FREE):
                self.groups.append(self.region(k))
            elif op in SHUFFLE:
                self.claim([k])
                self.groups.append(Group("shuffle", [k], net.live_inputs(k), [o for o in n.output if net.live(o)],
                                         net.dtype(n.output[0])))
            elif net.live_inputs(k):
                self.claim([k])
                kind = "copy" if op in COPY_TYPES else "other"
                self.groups.append(Group(kind, [k], net.live_inputs(k), [o for o in n.output if net.live(o)],
                                         net.dtype(n.output[0])))
        if self.transformer:
            self.groups = self.horizontal(self.groups)
        for k, n in enumerate(net.nodes):  # embedding lookups no region took in
            if k not in self.claimed and self.transformer and self.embedding(k):
                self.claim([k])
                self.groups.append(Group("copy", [k], [], [o for o in n.output if net.live(o)], net.dtype(n.output[0])))
        self.groups.extend(self.conversions())
        return topological(self.groups)

    # --- transformer blocks (TensorRT's Myelin backend) ----------------------------------
    def horizontal(self, groups: list[Group]) -> list[Group]:
        """Transformer GEMMs that read the same tensor in the same precision (the Q, K and V projections) as
        one GEMM with their output columns side by side (Myelin's horizontal fusion: one kernel, one launch)."""
        net, out, by_input = self.net, [], {}
        for g in groups:
            if g.kind == "conv" and g.layer_class == "transformer" and g.residual is None and g.inputs \
                    and net.op(g.anchor) == "MatMul":
                key = (g.inputs[0], g.precision)
                if key in by_input:
                    first = by_input[key]
                    first.nodes += g.nodes
                    first.outputs += g.outputs
                    first.attrs.setdefault("anchors", [first.anchor]).append(g.anchor)
                    continue
                by_input[key] = g
            out.append(g)
        return out

    def embedding(self, k: int) -> bool:
        """A Gather of a constant table by run-time indices (a token/position embedding lookup)."""
        n = self.net.nodes[k]
        return n.op_type == "Gather" and bool(n.input) and n.input[0] in self.net.consts \
            and any(self.net.live(o) for o in n.output)

    def attention_blocks(self) -> list[Group]:
        """Every multi-head attention of the graph as one fused attention layer (:meth:`attention`)."""
        out = []
        for k, n in enumerate(self.net.nodes):
            if n.op_type == "MatMul" and k not in self.claimed and len(self.net.live_inputs(k)) == 2:
                g = self.attention(k)
                if g is not None:
                    out.append(g)
        return out

    def attention(self, k1: int) -> Group | None:
        """Q·Kᵀ → (scale, mask, Casts, Softmax, Q/DQ) → ·V as one fused attention kernel, as TensorRT's
        transformer backend (Myelin) builds it from an explicit-precision ONNX: no [B, H, S, S] score tensor
        is written; the operands' DequantizeLinear fuse in (INT8 math when every operand of both matmuls
        is quantized); the layout ops around it (Reshape/Transpose of the heads) are free; a
        QuantizeLinear after the context (across those layout ops) fuses in as an INT8 output."""
        net = self.net
        chain, masks, softmax, cur = [], [], None, net.nodes[k1].output[0]
        while True:
            c = net.sole_consumer(cur)
            if c is None or c in self.claimed:
                return None
            op = net.op(c)
            if op == "MatMul":
                break
            if op not in SCORE_OPS or (op == "Softmax" and softmax is not None):
                return None
            softmax = c if op == "Softmax" else softmax
            masks += [t for t in net.live_inputs(c) if t != cur and t not in masks]
            chain.append(c)
            cur = net.nodes[c].output[0]
        k2 = c
        if softmax is None or net.nodes[k2].input[0] != cur or len(net.live_inputs(k2)) != 2:
            return None
        nodes, inputs, quantized = [k1], [], []
        for t, reader in ((net.nodes[k1].input[0], k1), (net.nodes[k1].input[1], k1), (net.nodes[k2].input[1], k2)):
            dq = _dq_source(net, t, reader)
            if dq is not None:
                nodes += dq
                inputs.append(net.nodes[dq[0]].input[0])
            else:
                layout = self.layout_before(t, reader)
                nodes += layout
                inputs.append(net.nodes[layout[0]].input[0] if layout else t)
            quantized.append(dq is not None)
        probs_q = any(net.op(c) == "DequantizeLinear" for c in chain)
        out = net.nodes[k2].output[0]
        to_q = _to_quantize(net, out, through=PASS_THROUGH + ("Transpose",))
        scores = net.shape(net.nodes[k1].output[0])
        head = _last(net.shape(net.nodes[k1].input[0]))  # Q's head size (the reduction of Q·Kᵀ)
        self.attention_seen = True
        if any(quantized) or probs_q:
            # INT8 MHA fusion needs Q/DQ before both matmuls, after Softmax and after the context, a head
            # size of 16/32/64 and at most 512 keys; otherwise TensorRT runs INT8 GEMM, Softmax, INT8 GEMM
            # unfused (TensorRT issues #2981, #3714): no attention layer here either
            if not (all(quantized) and probs_q and to_q is not None and head in INT8_MHA_HEADS
                    and scores and scores[-1] <= INT8_MHA_MAX_KEYS):
                return None
        int8 = all(quantized) and probs_q
        float_in = [net.dtype(t) for t, q in zip(inputs, quantized) if not q]
        precision = "int8" if int8 else ("fp16" if "fp16" in float_in or not float_in else float_in[0])
        nodes += chain + [k2]
        inside = {o for k in nodes for o in net.nodes[k].output}
        reads = []
        for t in inputs:  # a head split inside the kernel (a fused QKV's Split): it reads the whole tensor once
            while t in inside and net.live_inputs(net.producer[t]):
                t = net.live_inputs(net.producer[t])[0]
            if t not in reads:
                reads.append(t)
        g = Group("attention", nodes, reads + masks, [], precision, anchor=k1)
        tail = to_q if int8 else self.layout_after(out)
        g.nodes += tail
        g.outputs = [net.nodes[tail[-1]].output[0] if tail else out]
        g.attrs = {"flops": 2.0 * _count(scores) * (head + _last(net.shape(net.nodes[k2].output[0]))),
                   "scores": tuple(scores), "softmax": net.nodes[softmax].name}
        self.claim(g.nodes)
        return g

    def layout_before(self, tensor: str, reader: int) -> list[int]:
        """The Reshape/Transpose/Cast nodes that produce ``tensor`` for ``reader`` alone (a chain, first
        node first): folded into the attention kernel's strided loads."""
        chain, t, want = [], tensor, reader
        while (k := self.net.producer.get(t)) is not None and k not in self.claimed \
                and self.net.op(k) in HEAD_SPLIT and self.net.sole_consumer(t) == want and self.net.live_inputs(k):
            chain.append(k)
            t, want = self.net.live_inputs(k)[0], k
        return chain[::-1]

    def layout_after(self, tensor: str) -> list[int]:
        """The Transpose/Reshape chain that only reads ``tensor`` (the heads merged back): written directly."""
        chain, t = [], tensor
        while (c := self.net.sole_consumer(t)) is not None and c not in self.claimed and self.net.op(c) in LAYOUT:
            chain.append(c)
            t = self.net.nodes[c].output[0]
        return chain

    def pointwise_closure(self, cur: str) -> tuple[list[int], str] | None:
        """The pointwise nodes that read only ``cur`` and each other (a decomposed GELU: Div, Erf, Add, Mul,
        Mul), when they read all of ``cur``'s readers and leave exactly one tensor: (members, that tensor)."""
        net = self.net
        start = net.producer.get(cur)
        if start is None or cur in net.graph_outputs:
            return None
        members, produced = [], {cur}
        for c in range(start + 1, min(len(net.nodes), start + REGION_WINDOW)):
            if c in self.claimed or not (net.op(c) in POINTWISE or net.op(c) == "Cast"):
                continue
            ins = net.live_inputs(c)
            if ins and all(t in produced for t in ins):
                members.append(c)
                produced.update(net.nodes[c].output)
        if not members or any(r not in members for r in net.consumers.get(cur, [])):
            return None
        leaving = [t for m in members for t in net.nodes[m].output if net.live(t) and (
            t in net.graph_outputs or any(r not in members for r in net.consumers.get(t, [])))]
        return (members, leaving[0]) if len(leaving) == 1 else None

    def broadcast(self, tensor: str, reader: int) -> bool:
        """``tensor`` is a broadcast operand of ``reader``: fewer elements than the node's output."""
        net = self.net
        out = net.nodes[reader].output[0]
        return bool(net.shape(tensor)) and bool(net.shape(out)) and _count(net.shape(tensor)) < _count(net.shape(out))

    def quantized_outputs(self, g: Group):
        """Transformer kernels (GEMMs, LayerNorm, residual, embedding regions) write each QuantizeLinear or
        Cast reading one of their outputs (a Q also behind Casts and reshapes) as one more output of the
        same kernel (Myelin fuses the quantize/convert into the kernel); an output all of whose readers
        were such is not written."""
        net, outs = self.net, []
        for t in g.outputs:
            keep, quantized = t in net.graph_outputs, []
            for c in net.consumers.get(t, []):
                if c in g.nodes:
                    continue
                chain = None
                if c not in self.claimed and net.op(c) == "QuantizeLinear":
                    chain = [c]
                elif c not in self.claimed and net.op(c) in PASS_THROUGH:  # Casts and reshapes: Q moves across
                    q = _to_quantize(net, net.nodes[c].output[0], through=PASS_THROUGH)
                    chain = [c] + q if q is not None and not self.claimed.intersection(q) else None
                    if chain is None and net.op(c) == "Cast":  # the kernel writes the cast copy too
                        chain = [c]
                if chain is None:
                    keep = True
                    continue
                g.nodes += chain
                self.claim(chain)
                quantized.append(net.nodes[chain[-1]].output[0])
            outs += ([t] if keep else []) + quantized
        g.outputs = outs

    def embeddings_into(self, members: list[int], external: list[str]) -> None:
        """Embedding lookups (and the Casts after them) that feed a transformer region: taken in."""
        net = self.net
        for t in list(external):
            chain, cur = [], t
            while (k := net.producer.get(cur)) is not None and k not in self.claimed and net.op(k) == "Cast" \
                    and net.sole_consumer(cur) is not None:
                chain.append(k)
                cur = net.nodes[k].input[0]
            k = net.producer.get(cur)
            if k is not None and k not in self.claimed and self.embedding(k) and (chain or net.sole_consumer(cur) is not None):
                members += [k] + chain[::-1]
                external.remove(t)

    # --- convolution / GEMM ------------------------------------------------------------
    def conv(self, k: int) -> Group:
        net, n = self.net, self.net.nodes[k]
        nodes, inputs, int8 = [k], [], False
        for t in net.live_inputs(k):
            dq = _dq_source(net, t, k)
            if dq is not None:
                nodes += dq
                inputs.append(net.nodes[dq[0]].input[0])
                int8 = True
            else:
                inputs.append(t)
        w = n.input[1] if len(n.input) > 1 else ""
        g = Group("conv", nodes, inputs, [], "int8" if int8 else net.dtype(inputs[0]), anchor=k,
                  weight_dtype=net.weight_dtype(w) if w in net.consts else "",
                  layer_class="transformer" if self.transformer and n.op_type in ("MatMul", "Gemm") else "")
        out = self.epilogue(g, n.output[0])
        g.outputs = [out]
        self.claim(g.nodes)
        if g.layer_class == "transformer":
            self.quantized_outputs(g)
        return g

    def epilogue(self, g: Group, cur: str) -> str:
        """Grow ``g`` over the nodes TensorRT fuses after a convolution; its output tensor."""
        net, int8 = self.net, g.precision == "int8"
        own_type = net.dtype(cur)
        while True:
            c = net.sole_consumer(cur)
            if c is None and self.transformer:  # a decomposed activation (GELU) reading the output twice
                closure = self.pointwise_closure(cur)
                if closure is None:
                    break
                g.nodes += closure[0]
                self.claim(closure[0])
                cur = closure[1]
                continue
            if c is None or c in self.claimed:
                break
            op, node = net.op(c), net.nodes[c]
            to_q = _to_quantize(net, cur, through=PASS_THROUGH + ("Transpose",))
            if to_q is not None:  # (Casts →) QuantizeLinear: an INT8 output, or a reformat after the layer
                if not int8 or self.float_residual(g):
                    break
                g.nodes += to_q
                cur = net.nodes[to_q[-1]].output[0]
                self.maybe_pool(g, cur)
                return self.residual(g, g.outputs[0] if g.outputs else cur)
            if op == "Cast" and (int8 or net.dtype(node.output[0]) == own_type or self.transformer):
                pass
            elif self.transformer and op in LAYOUT:
                pass  # Myelin writes the GEMM's output in the layout its reader wants
            elif op in POINTWISE and net.live_inputs(c) == [cur]:
                pass  # activation, bias, scale
            elif op in ("Add", "Sum") and g.residual is None and self.owners.get(c) == g.anchor \
                    and not (self.transformer and net.op(g.anchor) == "MatMul"):
                # (Myelin takes a transformer's residual Add into the LayerNorm kernel that follows it)
                g.residual = next(t for t in net.live_inputs(c) if t != cur)
            elif op == "MaxPool" and int8 and g.pool is None and g.residual is None \
                    and _to_quantize(net, node.output[0]) is not None:
                g.pool = c
            else:
                break
            g.nodes.append(c)
            cur = node.output[0]
        return self.residual(g, cur)

    def float_residual(self, g: Group) -> bool:
        """A fused Add whose residual is not quantized: the layer writes float (TensorRT keeps the
        QuantizeLinear after it as a reformat, the qat fixture's ``QuantizeLinear_40``)."""
        if g.residual is None:
            return False
        add = next(c for c in g.nodes if self.net.op(c) in ("Add", "Sum"))
        return _dq_source(self.net, g.residual, add) is None

    def maybe_pool(self, g: Group, q_out: str):
        """ConvActPool across Q→DQ: an INT8 conv's quantized output read only by DQ→MaxPool→Q."""
        net = self.net
        dq = net.sole_consumer(q_out)
        if dq is None or net.op(dq) != "DequantizeLinear" or g.pool is not None or g.residual is not None:
            return
        mp = net.sole_consumer(net.nodes[dq].output[0])
        if mp is None or net.op(mp) != "MaxPool":
            return
        tail = _to_quantize(net, net.nodes[mp].output[0])
        if tail is None:
            return
        g.pool = mp
        g.nodes += [dq, mp] + tail
        g.outputs = [net.nodes[tail[-1]].output[0]]

    def residual(self, g: Group, out: str) -> str:
        """The residual input: int8 (its DQ absorbed) when the output is int8, else read as is."""
        if g.residual is None:
            return out
        add = next(c for c in g.nodes if self.net.op(c) in ("Add", "Sum"))
        dq = _dq_source(self.net, g.residual, add)
        if dq is not None and self.net.dtype(out) == "int8":
            g.nodes += dq
            g.residual = self.net.nodes[dq[0]].input[0]
        g.inputs.append(g.residual)
        return out

    # --- pooling ----------------------------------------------------------------------
    def pool(self, k: int) -> Group:
        net = self.net
        t = net.live_inputs(k)[0]
        dq = _dq_source(net, t, k)
        tail = _to_quantize(net, net.nodes[k].output[0], through=PASS_THROUGH) if dq else None
        if dq is not None and tail is not None:
            g = Group("pool", dq + [k] + tail, [net.nodes[dq[0]].input[0]], [net.nodes[tail[-1]].output[0]],
                      "int8", anchor=k)
        else:
            g = Group("pool", [k], [t], [net.nodes[k].output[0]], net.dtype(t), anchor=k)
            self.fp32_from_int8(g, k)
        self.claim(g.nodes)
        return g

    def fp32_from_int8(self, g: Group, k: int) -> None:
        """A float pooling reading the *linear* FP16 output of an INT8 convolution (the DP4A kernel of a
        <= 4-channel first layer) reads FP32 and runs in FP32, and a reformat after it converts its output
        to the type its readers read: TensorRT's INT8 kernels write a linear float output in FP32 only (all
        13 such layers of the fixture engines: ``ampere_fp32_icudnn_int8x4``, ``volta_fp32_icudnn_int8x4``,
        ``…i8f32…``; their 26 FP16 outputs are 32-wide vectors), a pool runs in the type it reads, and the
        conversion goes on the smaller tensor, after it (the qat fixture: ``Conv_9`` writes FP32,
        ``MaxPool_12`` runs FP32, then ``Reformatting CopyNode for Output Tensor 0 to MaxPool_12`` FP32 → FP16,
        read by the QuantizeLinear and the residual Add). Only where the pool is that output's one reader."""
        net = self.net
        t, out = g.inputs[0], g.outputs[0]
        conv = next((x for x in self.groups if t in x.outputs), None)
        if (conv is None or conv.kind != "conv" or conv.precision != "int8" or net.dtype(t) != "fp16"
                or net.sole_consumer(t) != k or written(net, conv)[0] != "linear"):
            return
        wide = f"{out}/fp32"  # the pool's own FP32 output, before the reformat
        net.dtypes[t] = net.dtypes[wide] = "fp32"
        net.shapes[wide] = net.shape(out)
        g.precision, g.outputs = "fp32", [wide]
        self.groups.append(Group("convert", [], [wide], [out], net.dtype(out), anchor=k, attrs={  # no ONNX node
            "name": f"Reformatting CopyNode for Output Tensor 0 to {net.nodes[k].name}"}))

    # --- pointwise regions -----------------------------------------------------------
    def region(self, k: int) -> Group:
        """A pointwise region from node ``k``: the later pointwise/normalization nodes (and Casts) that read
        only its tensors and its inputs. In a transformer engine (Myelin) also the movement ops between them
        (Reshape, Transpose, Slice, Concat, Expand … : a rotary embedding is one kernel) and small broadcast
        operands (a cos/sin table, a mask, a bias computed at run time)."""
        net = self.net
        members, produced = [k], set(net.nodes[k].output)
        external = list(net.live_inputs(k))
        for c in range(k + 1, min(len(net.nodes), k + REGION_WINDOW)):
            op = net.op(c)
            if c in self.claimed or not (op in POINTWISE or op in NORM or op == "Cast"
                                         or (self.transformer and op in MOVEMENT)):
                continue
            ins = net.live_inputs(c)
            if not ins or not any(t in produced for t in ins):
                continue
            extra = [t for t in ins if t not in produced and t not in external]
            if extra and not (self.transformer and all(self.broadcast(t, c) for t in extra)):
                continue
            external += extra
            members.append(c)
            produced.update(net.nodes[c].output)
        if self.transformer:
            self.embeddings_into(members, external)
        outs = [t for m in members for t in net.nodes[m].output if net.live(t) and (
            t in net.graph_outputs or any(c not in members for c in net.consumers.get(t, [])))]
        g = Group("pointwise", members, external, outs, net.dtype(outs[0]) if outs else "fp32", anchor=k,
                  layer_class="transformer_norm" if self.transformer else "")
        self.claim(members)
        self.quantized_region(g)
        if self.transformer and g.precision != "int8":
            self.quantized_outputs(g)
        return g

    def quantized_region(self, g: Group):
        """A region whose one output is only quantized writes int8 (the QuantizeLinear fuses into the
        pointwise kernel); with every input dequantized too (DQs absorbed) it computes in INT8."""
        net = self.net
        tail = _to_quantize(net, g.outputs[0]) if len(g.outputs) == 1 else None
        if tail is None:
            return
        g.nodes += tail
        g.outputs = [net.nodes[tail[-1]].output[0]]
        readers = [next(c for c in net.consumers[t] if c in g.nodes) for t in g.inputs]
        dqs = [_dq_source(net, t, r) for t, r in zip(g.inputs, readers)]
        if dqs and all(d is not None for d in dqs):
            g.nodes += [k for d in dqs for k in d]
            g.inputs = [net.nodes[d[0]].input[0] for d in dqs]
            g.precision = "int8"
        self.claim(g.nodes)

    # --- conversions --------------------------------------------------------------------
    def conversions(self) -> list[Group]:
        """Each chain of conversion nodes no layer took: one reformat from its first type to its last."""
        net, out = self.net, []
        for k, n in enumerate(net.nodes):
            if k in self.claimed or n.op_type not in CONVERT or not net.live(n.input[0] if n.input else ""):
                continue
            chain = [k]
            while (c := net.sole_consumer(net.nodes[chain[-1]].output[0])) is not None and c not in self.claimed \
                    and net.op(c) in CONVERT:
                chain.append(c)
            self.claim(chain)
            src, dst = n.input[0], net.nodes[chain[-1]].output[0]
            quantizes = any(net.op(c) == "QuantizeLinear" for c in chain)
            out.append(Group("convert", chain, [src], [dst], net.dtype(dst),
                             elided=net.dtype(src) == net.dtype(dst) and not quantizes))
        return out


def _first(g: Group) -> int:
    """The group's first ONNX node (a reformat TensorRT adds of its own, with none: its anchor's)."""
    return min(g.nodes) if g.nodes else int(g.anchor or 0)


def topological(groups: list[Group]) -> list[Group]:
    """The groups in an order where each comes after the groups whose outputs it reads (ties: the
    group whose first node comes first)."""
    made = {t: gi for gi, g in enumerate(groups) for t in g.outputs}
    deps = [{made[t] for t in g.inputs if t in made} for g in groups]
    return [groups[gi] for gi in kahn_order(deps, key=lambda gi: _first(groups[gi]))]


UNMODELLED = {"If": "control flow", "Loop": "control flow", "Scan": "control flow", "LSTM": "recurrent",
              "GRU": "recurrent", "RNN": "recurrent"}


def unmodelled(net: Net, groups: list[Group]) -> list[str]:
    """What the estimate leaves out or prices by its bytes only: control flow (If/Loop/Scan: not
    predicted), recurrent layers and ops of no known class (priced as memory copies)."""
    notes: dict[str, list[str]] = defaultdict(list)
    covered = {k for g in groups for k in g.nodes}
    for k, n in enumerate(net.nodes):
        kind = UNMODELLED.get(n.op_type)
        if kind == "control flow" or (kind is None and n.op_type not in ANCHORS | POOLING | POINTWISE | NORM | SHUFFLE
                                      | CONVERT and n.op_type not in COPY_TYPES and k in covered):
            notes[kind or "unknown"].append(n.op_type)
        elif kind == "recurrent":
            notes[kind].append(n.op_type)
    what = {"control flow": "not in the estimate (TensorRT's conditionals and loops are not predicted)",
            "recurrent": "priced by the bytes they move only", "unknown": "priced by the bytes they move only"}
    return [f"{len(ops)} {kind} node(s) ({', '.join(sorted(set(ops)))}): {what[kind]}" for kind, ops in notes.items()]


def fuse(net: Net) -> list[Group]:
    """The predicted engine layers of ``net`` (before formats), in topological order."""
    return _Fuser(net).run()


# --------------------------------------------------------------------------- formats

def _spatial_one(shape: tuple[int, ...]) -> bool:
    return len(shape) < 4 or int(np.prod(shape[2:], dtype=np.int64)) == 1


def _in_channels(net: Net, g: Group) -> int:
    shape = net.shape(g.inputs[0]) if g.inputs else ()
    return int(shape[1]) if len(shape) >= 2 else 0


def accepted(net: Net, g: Group, i: int) -> tuple[str, ...] | None:
    """The formats layer ``g`` reads its input ``i`` in (None: any). A fused residual is read in the
    layer's output format. Transformer GEMMs and attention read row-major (linear) tensors."""
    if g.layer_class == "transformer":
        return ("linear",)
    if g.kind == "attention":
        return None
    if g.kind == "conv":
        if g.residual is not None and i == len(g.inputs) - 1:
            return written(net, g)[:1]
        small = _in_channels(net, g) <= 4
        if g.precision == "int8":
            return ("c4", "linear") if small else ("c32",)
        if g.precision == "fp16":
            return ("hwc4",) if small else ("hwc8",)
        return ("linear",) if small else ("hwc",)
    if g.kind == "pool":
        return ("c32",) if g.precision == "int8" else ("linear", "hwc", "hwc8", "c4")
    if g.kind == "shuffle" and g.inputs and not _spatial_one(net.shape(g.inputs[0])) \
            and net.op(g.nodes[0]) != "Concat":
        return ("linear",)
    return None


def written(net: Net, g: Group, fmt_in: str | None = None) -> tuple[str, ...]:
    """The formats layer ``g`` can write, preferred first: an INT8 convolution writes int8 and fp16
    32-wide vectorised (``i8i8``/``i8f16`` tactics), fp32 linear (``i8f32``); a reformat writes what
    its readers read; other layers write their input's format."""
    if g.layer_class == "transformer" or g.kind == "attention":
        return ("linear",)
    if g.kind == "conv":
        small = _in_channels(net, g) <= 4
        out_type = net.dtype(g.outputs[0])
        if g.precision == "int8":
            if out_type == "int8":
                return ("c32",)
            return ("linear",) if small or out_type == "fp32" else ("c32",)
        if g.precision == "fp16":
            return ("hwc8",)
        return ("linear",) if small else ("hwc",)
    if g.kind == "convert":
        return ("linear", "c32", "hwc8", "hwc", "hwc4", "c4")
    return (fmt_in or "linear",)


def _vote(net: Net, readers: dict, tensor: str, options: tuple[str, ...]) -> str:
    """Of ``options``, the format most readers of ``tensor`` read (ties: the first)."""
    if len(options) == 1:
        return options[0]
    score = {f: 100 if f == "linear" and tensor in net.graph_outputs else 0 for f in options}
    for g, i in readers.get(tensor, []):
        acc = accepted(net, g, i)
        for f in options:
            score[f] += 1 if acc is None or f in acc else 0
    return max(options, key=lambda f: (score[f], -options.index(f)))


@dataclass
class FormatReformat:
    """A format change TensorRT inserts before ``reader`` (input ``index``): ``tensor`` from one layout
    to another of the same type."""

    tensor: str
    src: str
    dst: str
    reader: int  # index of the reading group (-1: the network output)
    index: int


def assign_formats(net: Net, groups: list[Group]) -> list[FormatReformat]:
    """Formats of every layer's inputs and outputs, and the format reformats between them (one per
    tensor and target format, shared by the readers that need it)."""
    readers: dict[str, list] = defaultdict(list)
    for g in groups:
        for i, t in enumerate(g.inputs):
            readers[t].append((g, i))
    fmt = {t: "linear" for t in net.graph_inputs}
    copies: dict[tuple[str, str], FormatReformat] = {}
    for gi, g in enumerate(groups):
        g.formats_in = []
        concat = g.kind == "shuffle" and net.op(g.nodes[0]) == "Concat"
        for i, t in enumerate(g.inputs):
            have, acc = fmt.get(t, "linear"), accepted(net, g, i)
            if concat:  # any format, the same for every input
                acc = (g.formats_in[0],) if i else None
            need = have if acc is None or have in acc else acc[0]
            if need != have and not _spatial_one(net.shape(t)):
                copies.setdefault((t, need), FormatReformat(t, have, need, gi, i))
            g.formats_in.append(need)
        opts = written(net, g, g.formats_in[0] if g.formats_in else None)
        g.formats_out = [_vote(net, readers, o, opts) for o in g.outputs]
        fmt.update(zip(g.outputs, g.formats_out))
    for t in net.graph_outputs:  # outputs are bound linear
        have = fmt.get(t, "linear")
        if have != "linear" and not _spatial_one(net.shape(t)):
            copies.setdefault((t, "linear"), FormatReformat(t, have, "linear", -1, 0))
    return list(copies.values())


# --------------------------------------------------------------------------- engine layers

def _tensor(net: Net, name: str, fmt: str = "linear", dims: tuple[int, ...] | None = None) -> Tensor:
    dims = tuple(int(d) for d in (net.shape(name) if dims is None else dims))
    vec = FORMAT_VECTOR.get(fmt, 1) if len(dims) >= 4 else 1
    return Tensor(name, dims, net.dtype(name), vec)


def _names(net: Net, g: Group) -> tuple[str, ...]:
    return tuple(net.nodes[k].name for k in sorted(g.nodes))


def _as_rows(t: Tensor) -> Tensor:
    """A [..., K] tensor as [rows, K, 1, 1] (rows: the product of the leading dims)."""
    rows = int(np.prod(t.dims[:-1], dtype=np.int64)) if len(t.dims) > 1 else 1
    return Tensor(t.name, (rows, int(t.dims[-1]), 1, 1), t.dtype, t.vector)


def _last(dims: tuple[int, ...]) -> int:
    return int(dims[-1]) if dims else 1


def _count(dims: tuple[int, ...] | None) -> int:
    return 0 if dims is None else int(np.prod(dims, dtype=np.int64))


def _conv_layer(net: Net, g: Group) -> EngineLayer:
    n = net.nodes[g.anchor]
    w = net.const_dims(n.input[1]) if len(n.input) > 1 else None  # weight and bias: dims only, never values
    b = net.const_dims(n.input[2]) if len(n.input) > 2 and n.input[2] else None
    ins = [_tensor(net, t, f) for t, f in zip(g.inputs, g.formats_in)]
    outs = [_tensor(net, t, f) for t, f in zip(g.outputs, g.formats_out)]
    precision = g.precision  # fp32: the cost model runs it on TF32 tensor cores where it may (trtexec's default)
    attrs = {"stride": tuple(attr(n, "strides", ()) or ()), "predicted": True}
    kernel, groups, out_maps = (), int(attr(n, "group", 1) or 1), 0
    if n.op_type in ("Conv", "ConvTranspose") and w is not None:
        kernel = tuple(int(d) for d in w[2:])
        out_maps = int(w[0] if n.op_type == "Conv" else w[1] * groups)
        own = tuple(int(d) for d in net.shape(n.output[0]))
        if g.pool is None and outs and own and tuple(outs[0].dims) != own and _count(outs[0].dims) == _count(own):
            # an epilogue reshaped it (a ViT's patch embedding): priced at its own output
            attrs["conv_out"] = own[2:]
            outs[0] = Tensor(outs[0].name, own, outs[0].dtype, outs[0].vector)
    elif n.op_type == "Gemm" and w is not None:  # TensorRT runs it as a 1x1 convolution
        out_maps = int(w[0] if attr(n, "transB", 0) else w[-1])
        kernel = (1, 1)
        ins = [Tensor(t.name, t.dims + (1, 1) if len(t.dims) == 2 else t.dims, t.dtype, t.vector) for t in ins]
        rows = ins[0].dims[0] if ins and ins[0].dims else 1
        # the output as rows x N (an epilogue may have reshaped it back to [batch, seq, N])
        outs = [Tensor(t.name, (rows, max(1, t.elements // max(1, rows)), 1, 1), t.dtype, t.vector) for t in outs]
    elif n.op_type == "MatMul" and ins and outs and ins[0].dims and outs[0].dims:
        # as TensorRT's GEMM cost reads: rows × K into rows × N, a 1x1 convolution over the rows; the GEMMs
        # of a horizontal fusion (Q, K, V) side by side: N the sum of theirs
        anchors = g.attrs.get("anchors") or [g.anchor]
        ws = [net.const_dims(net.nodes[a].input[1]) for a in anchors]
        ins[0] = _as_rows(ins[0])
        rows = ins[0].dims[0]
        if all(d is not None and len(d) == 2 for d in ws):
            out_maps = sum(int(d[-1]) for d in ws)
            if len(anchors) > 1:
                w = (int(ws[0][0]), out_maps)
                bs = [net.const_dims(net.nodes[a].input[2]) if len(net.nodes[a].input) > 2 else None for a in anchors]
                b = (sum(_count(d) for d in bs),) if any(bs) else b
        else:
            out_maps = int(net.shape(n.output[0])[-1]) if net.shape(n.output[0]) else int(outs[0].dims[-1])
        kernel = (1, 1)
        outs = [Tensor(t.name, (rows, max(1, t.elements // max(1, rows)), 1, 1), t.dtype, t.vector) for t in outs]
    layer_type = CONV_TYPES[n.op_type]
    if g.pool is not None:
        layer_type = "ConvActPool"
        attrs["conv_out"] = tuple(int(d) for d in net.shape(n.output[0])[2:])
        attrs["pooling"] = "MAX"
    if g.residual is not None:
        attrs["residual"] = g.residual
    return EngineLayer(" + ".join(_names(net, g)), layer_type, g.layer_class or "conv_gemm", precision, tuple(ins), tuple(outs),
                       kernel, groups, out_maps, _count(w), g.weight_dtype if w is not None else "", _count(b),
                       _names(net, g), False, attrs)


def _attention_layer(net: Net, g: Group) -> EngineLayer:
    """A fused multi-head attention: reads Q, K, V (and the mask), writes the context; its FLOPs are
    those of both batched matmuls (``attrs["flops"]``), its bytes those of the tensors it reads and writes."""
    ins = tuple(_tensor(net, t) for t in g.inputs)
    outs = tuple(_tensor(net, t) for t in g.outputs)
    names = _names(net, g)
    return EngineLayer(" + ".join(names), "MultiHeadAttention", "attention", g.precision, ins, outs,
                       onnx_nodes=names, attrs={"predicted": True, **g.attrs})


def _pool_layer(net: Net, g: Group) -> EngineLayer:
    n = net.nodes[g.anchor]
    ins = tuple(_tensor(net, t, f) for t, f in zip(g.inputs, g.formats_in))
    outs = tuple(_tensor(net, t, f) for t, f in zip(g.outputs, g.formats_out))
    if n.op_type.startswith("Global"):
        kernel = tuple(int(d) for d in net.shape(g.inputs[0])[2:])
    else:
        kernel = tuple(int(d) for d in attr(n, "kernel_shape", ()) or ())
    kind = "MAX" if "Max" in n.op_type else "AVERAGE"
    layer_type = "CudaPooling" if g.precision == "int8" else "CaskPooling"
    return EngineLayer(" + ".join(_names(net, g)), layer_type, "pooling", g.precision, ins, outs, kernel,
                       onnx_nodes=_names(net, g),
                       attrs={"pooling": kind, "stride": tuple(attr(n, "strides", ()) or ()), "predicted": True})


def _layer_type(net: Net, g: Group) -> str:
    ops = {net.op(k) for k in g.nodes}
    if g.kind == "pointwise":
        if ops & {"Softmax", "LogSoftmax"}:
            return "Softmax"
        if ops & NORM:
            return "Normalization" if ops & {"Sqrt", "Div", "LayerNormalization", "Pow"} else "Reduce"
        return "PointWiseV2"
    if g.kind == "copy":
        return COPY_TYPES.get(net.op(g.nodes[0]), net.op(g.nodes[0]))
    return net.op(g.nodes[0])


def _plain_layer(net: Net, g: Group) -> EngineLayer:
    ins = tuple(_tensor(net, t, f) for t, f in zip(g.inputs, g.formats_in or ["linear"] * len(g.inputs)))
    outs = tuple(_tensor(net, t, f) for t, f in zip(g.outputs, g.formats_out or ["linear"] * len(g.outputs)))
    names = _names(net, g)
    if g.kind == "shuffle" or g.elided:
        return EngineLayer(" + ".join(names), "NoOp", "other", g.precision, ins, outs, onnx_nodes=names,
                           attrs={"predicted": True})
    if g.kind == "convert":
        return EngineLayer(g.attrs.get("name") or names[0], "Reformat", "reformat", net.dtype(g.outputs[0]), ins,
                           outs, onnx_nodes=names, is_reformat=True, attrs={"predicted": True, "chain": names})
    layer_type = _layer_type(net, g)
    cls = layer_class(layer_type, names[0])
    if g.kind == "pointwise" and cls == "other":
        cls = "elementwise"
    cls = g.layer_class or cls  # the pointwise/normalization kernels of a transformer engine
    return EngineLayer(" + ".join(names), layer_type, cls, g.precision, ins, outs, onnx_nodes=names,
                       attrs={"predicted": True})


def _format_layer(net: Net, r: FormatReformat, layers: list[EngineLayer]) -> EngineLayer:
    reader = "the network output" if r.reader < 0 else layers[r.reader].name
    src, dst = _tensor(net, r.tensor, r.src), _tensor(net, r.tensor, r.dst)
    name = f"Reformatting CopyNode for Input Tensor {r.index} to {reader}"
    return EngineLayer(name, "Reformat", "reformat", src.dtype, (src,), (dst,), is_reformat=True,
                       attrs={"predicted": True, "formats": (r.src, r.dst)})


def predicted(net: Net) -> tuple[list[EngineLayer], list[str]]:
    """The predicted engine of ``net`` and the notes on what it leaves out (:func:`unmodelled`)."""
    groups = fuse(net)
    return engine_layers(net, groups), unmodelled(net, groups)


def engine_layers(net: Net, groups: list[Group] | None = None) -> list[EngineLayer]:
    """The predicted engine: fused layers, conversion reformats and format reformats (each format
    reformat placed right before the layer that needs it)."""
    groups = fuse(net) if groups is None else groups
    copies = assign_formats(net, groups)
    layers = []
    for g in groups:
        if g.kind == "conv":
            layers.append(_conv_layer(net, g))
        elif g.kind == "attention":
            layers.append(_attention_layer(net, g))
        elif g.kind == "pool":
            layers.append(_pool_layer(net, g))
        else:
            layers.append(_plain_layer(net, g))
    before: dict[int, list[EngineLayer]] = defaultdict(list)
    for r in copies:
        before[r.reader if r.reader >= 0 else len(groups)].append(_format_layer(net, r, layers))
    out = []
    for i, layer in enumerate(layers):
        out.extend(before.get(i, []))
        out.append(layer)
    out.extend(before.get(len(groups), []))
    return out


# --------------------------------------------------------------------------- from a model

# external tensors under this many bytes are read for shape inference (what it may need: a Reshape's
# shape, Resize scales); larger ones (weights) never are: their type and dims are all the predictor needs
SMALL_VALUE = INLINE_BELOW
_READABLE = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                       onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                       onnx.TensorProto.UINT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
                       onnx.TensorProto.BOOL})


def _small_value(t: onnx.TensorProto, files: dict[str, Path]) -> onnx.TensorProto | None:
    """External tensor ``t`` with its values read in when it is under SMALL_VALUE bytes (of a type numpy
    maps), read alone from its data file (``files``: location -> file); None for a larger one."""
    if t.data_type not in _READABLE:
        return None
    nbytes = int(np.prod(tuple(t.dims), dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    if nbytes >= SMALL_VALUE:
        return None
    loc = location(t)
    path = files.get(loc)
    if path is None or not Path(path).is_file():
        raise MixprecError(f"the data file {loc!r} of the model's tensor {t.name!r} is missing"
                           + (f" ({path})" if path is not None else ""),
                           "put the model's data files back beside it, then load the model again")
    try:
        return numpy_helper.from_array(np.array(read_tensor(t, Path(path))), t.name)
    except OSError as e:
        raise MixprecError(f"the data file {loc!r} of the model's tensor {t.name!r} cannot be read ({e})",
                           "check the model's data files (present, readable), then load the model again") from e


def inference_twin(m: onnx.ModelProto, files: dict[str, Path]) -> onnx.ModelProto:
    """``m`` ready for shape inference without reading its weights: each external initializer of the
    main graph under SMALL_VALUE bytes read in (:func:`_small_value`), each larger one a graph input of
    its type and dims (``core.model.graph.without_weights``); the ShapeOnly weights of a structure-only
    compile (``core.quant.compile.SHAPE_ONLY``) are never read. ``m`` itself when it has no external data."""
    if not any(uses_external_data(t) for t in m.graph.initializer):
        return m
    small: dict[str, onnx.TensorProto] = {}

    def left_out(t: onnx.TensorProto) -> bool:
        if not uses_external_data(t):
            return False
        if location(t) == SHAPE_ONLY:
            return True
        value = _small_value(t, files)
        if value is not None:
            small[t.name] = value
        return value is None

    twin, _ = without_weights(m, left_out=left_out)
    for t in twin.graph.initializer:
        if t.name in small:
            t.CopyFrom(small[t.name])
    return twin


def static_net(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]],
               files: dict[str, Path] | None = None) -> Net:
    """A :class:`Net` of ``proto`` with its inputs at ``input_shapes`` and every tensor's shape and type
    inferred (a MixprecError when inference fails). Weights in external data files are not read: their
    dims and types are in the graph; the few small external tensors shape inference may need are read
    from ``files`` (location -> file; see :func:`inference_twin`)."""
    m = with_input_dims(proto, input_shapes)
    twin = inference_twin(m, files or {})
    try:
        inferred = onnx.shape_inference.infer_shapes(twin, data_prop=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types
        raise MixprecError(f"shape inference failed on the compiled model ({str(e).splitlines()[0][:200]})",
                           "give every dynamic input dimension a value (--shape / --dim)") from e
    if twin is m:  # no external data: the inferred model is the model (no second copy of its weights kept)
        m = inferred
    del twin
    shapes, dtypes = {}, {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        dtypes[vi.name] = _ELEM.get(tt.elem_type, "other")
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for init in m.graph.initializer:
        dtypes[init.name] = _ELEM.get(init.data_type, "other")
        shapes[init.name] = tuple(init.dims)
    return Net(m, shapes, dtypes)
