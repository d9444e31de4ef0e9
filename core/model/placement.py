"""INT8 placement beyond the MAC layers: which Add, pooling and Concat nodes TensorRT can run inside
an INT8 region, their default precision by pattern, the input of a residual Add that TensorRT fuses
into its producer, and the precision boundaries a policy creates between neighbouring layers.

TensorRT's explicit-quantization guide ("Q/DQ Layer Placement Recommendations") places Q/DQ so that
whole blocks run in INT8. The real A100 engines in ``shared/fixtures/trt-engine-reports`` show it on
ResNet: with the residual Add's *skip* input quantized (``a100-resnet-qat-residual``), every
``Conv + Add + Relu`` becomes one INT8 convolution whose output is already INT8 for the next block
(0.731 ms, 3 reformats); without it (``a100-resnet-qat``) the Add's output is float and a
QuantizeLinear reformat runs before every block (1.096 ms, 12 reformats, slower than FP16's 1.017 ms).
With Q/DQ on the GlobalAveragePool input too (``…-qgap``) the pooling runs INT8 (0.673 ms, 1 reformat).

Placement ops (``PLACEMENT_OPS``):

* ``add``      an Add of two float activations of one shape (a residual; a bias Add with a constant
               is not one). INT8: Q/DQ on every input except the one TensorRT fuses the Add into
               (:func:`fused_input`: the output of a Conv/ConvTranspose/Gemm/MatMul, through a
               BatchNormalization, read by this Add only), so ``Conv + Add + Relu`` fuses.
* ``pooling``  MaxPool (without Indices), AveragePool, GlobalAveragePool, GlobalMaxPool. INT8: Q/DQ
               on the input; the output is quantized by its INT8 consumers, as for any layer.
* ``concat``   a Concat of float activations. INT8: Q/DQ on every input with one shared scale (the
               largest input range): TensorRT concatenates INT8 tensors only when their scales agree.

Reshape, Transpose, Flatten, Squeeze, Unsqueeze and Identity are pass-through: they are not layers,
follow their input's precision, and TensorRT moves Q/DQ across them, so a Q placed after a Flatten
fuses into the INT8 layer before it.

Defaults (:func:`placement_defaults`), each with its reason in the inventory:

* a residual Add whose inputs all come from INT8-default Convs (through BN/Relu/pooling/other
  residual Adds) -> INT8;
* a residual Add in a transformer block (a MatMul, LayerNorm, Softmax or embedding among its
  producers, or a LayerNorm after it) -> float (network default): on the MiniLM sample NVIDIA
  ModelOpt 0.47's PTQ, which quantizes residual-Add inputs, gives cosine 0.869, 0.977 without its
  residual-Add Q/DQ, and mixprec's default 0.981 (issue 11);
* pooling or Concat fed only by INT8 convs and read only by INT8 layers -> INT8;
* otherwise the network default (a Concat of FP16 layers: FP16, it follows its inputs).

A placement layer with an INT8 default is INT8-eligible (ranked, searched, switchable); one with a
float default can be set INT8 by hand (a placement choice), and the ranking and search leave it at
its policy value. Imports nothing of mixprec but the ONNX graph helpers (their
:class:`~core.model.graph.GraphIndex`).
"""
from __future__ import annotations

import onnx
import pandas as pd

from core.model.graph import GraphIndex

PLACEMENT_OPS = {"Add": "add", "MaxPool": "pooling", "AveragePool": "pooling", "GlobalAveragePool": "pooling",
                 "GlobalMaxPool": "pooling", "Concat": "concat"}
PASS_THROUGH = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# pointwise ops TensorRT fuses into the epilogue of the conv/GEMM before them (Conv + BN + Relu ...)
EPILOGUE = frozenset({"Relu", "Clip", "LeakyRelu", "BatchNormalization", "Sigmoid", "Tanh", "HardSigmoid",
                      "HardSwish", "Elu", "Selu", "Softplus", "PRelu"})
FUSING_MACS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
CONVS = frozenset({"Conv", "ConvTranspose"})
LAYERNORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"})
# non-layer ops a tensor's data passes through unchanged in kind (for neighbours and boundaries)
DATA_MOVEMENT = PASS_THROUGH | {"Cast", "CastLike", "Split", "Slice", "Expand", "Tile", "Pad", "Gather",
                                "GatherElements", "GatherND", "Concat"}
FLOAT_ELEMS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})

RESIDUAL_INT8 = "residual add after INT8 convs: TensorRT fuses Conv+Add+Relu into one INT8 conv (skip input quantized)"
TRANSFORMER_RESIDUAL = ("transformer residual: quantizing it costs quality (MiniLM with ModelOpt's residual-Add "
                        "Q/DQ: cosine 0.869; without them 0.977; mixprec's default 0.981)")
ADD_OTHER = "add outside an INT8 conv region: network default"
POOL_INT8 = "pooling between INT8 layers: TensorRT runs it in INT8 (Q/DQ on its input)"
POOL_OTHER = "pooling outside an INT8 region: network default"
CONCAT_INT8 = "concat inside an INT8 region: one shared scale on all inputs, TensorRT concatenates in INT8"
CONCAT_FP16 = "concat of FP16 layers: follows its inputs"
CONCAT_OTHER = "concat outside an INT8 region: network default"
NOT_SEARCHED = "placement choice: INT8 only when set by hand (float by default), not ranked or searched"

BOUNDARY_COLUMNS = ["layer", "neighbour", "direction", "neighbour_precision", "tensor", "reason"]


# the graph index the placement functions read (inventory and compile build it under this name)
PlacementGraph = GraphIndex


def candidate_kind(node: onnx.NodeProto, g: GraphIndex, types: dict[str, int],
                   shapes: dict[str, tuple[int, ...]] | None = None) -> str:
    """The placement kind of a main-graph node ("add", "pooling", "concat"), or "" when it is none.
    Without ``shapes`` an Add of two activations counts whatever their shapes (a superset)."""
    kind = PLACEMENT_OPS.get(node.op_type, "")
    if not kind or node.domain not in ("", "ai.onnx"):
        return ""
    acts = g.activations(node)
    if not acts or any(types.get(node.input[i], onnx.TensorProto.FLOAT) not in FLOAT_ELEMS for i in acts):
        return ""
    if kind == "add":
        if len(acts) != 2 or len(node.input) != 2:
            return ""
        a, b = ((shapes or {}).get(node.input[i]) for i in acts)
        return kind if a is None or b is None or tuple(a) == tuple(b) else ""
    if kind == "pooling":
        return kind if 0 in acts and not (len(node.output) > 1 and node.output[1]) else ""
    return kind if len(acts) == len([t for t in node.input if t]) else ""  # concat: activations only


def placement_tensors(proto: onnx.ModelProto, types: dict[str, int]) -> set[str]:
    """Inputs and outputs of every (structural) placement candidate: what calibration must cover."""
    g = GraphIndex(proto)
    out = set()
    for n in g.nodes:
        if candidate_kind(n, g, types):
            out |= {n.input[i] for i in g.activations(n)} | {o for o in n.output[:1] if o}
    return out


def fused_input(node: onnx.NodeProto, g: GraphIndex) -> int | None:
    """The input of a residual Add that TensorRT fuses the Add into: the first one produced by a
    Conv/ConvTranspose/Gemm/MatMul (directly, or through a BatchNormalization or Cast) whose output
    only this Add reads. None when there is none: then every input is quantized."""
    for i in g.activations(node):
        t = node.input[i]
        src = g.producer.get(t)
        while src is not None and src.op_type in ("BatchNormalization", "Cast") and g.single_consumer(t):
            t = src.input[0]
            src = g.producer.get(t)
        if src is not None and src.op_type in FUSING_MACS and g.single_consumer(t) \
                and g.single_consumer(node.input[i]):
            return i
    return None


# --- defaults by pattern -----------------------------------------------------------------------

def _origins(g: GraphIndex, tensors, int8_convs: set[str], float_marks: set[str]) -> set[str]:
    """Kinds of layers the tensors come from, walking back through pass-through, epilogue, pooling,
    bias/residual Add and Concat nodes: "int8-conv", "transformer", "input" or "other"."""
    out, stack, seen = set(), list(tensors), set()
    while stack:
        t = stack.pop()
        if t in seen or t in g.consts:
            continue
        seen.add(t)
        node = g.producer.get(t)
        if node is None:
            out.add("input")
        elif node.name in float_marks or node.op_type in LAYERNORMS or node.op_type in ("Softmax", "MatMul"):
            out.add("transformer")
        elif node.op_type in CONVS:
            out.add("int8-conv" if node.name in int8_convs else "other")
        elif node.op_type in PASS_THROUGH | EPILOGUE | {"Cast", "Add", "Concat"} or PLACEMENT_OPS.get(node.op_type):
            stack.extend(node.input[i] for i in g.activations(node)[: None if node.op_type in ("Add", "Concat") else 1])
        else:
            out.add("other")
    return out


def _readers(g: GraphIndex, tensor: str) -> list[onnx.NodeProto | None]:
    """The layers that read ``tensor`` through pass-through and epilogue nodes (None: a graph output)."""
    out, stack, seen = [], [tensor], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in g.outputs:
            out.append(None)
        for c in g.consumers.get(t, []):
            if c.op_type in PASS_THROUGH | EPILOGUE | {"Cast"}:
                stack.extend(o for o in c.output[:1] if o)
            else:
                out.append(c)
    return out


def placement_defaults(proto: onnx.ModelProto, kinds: dict[str, str], defaults: dict[str, str],
                       float_marks: set[str]) -> dict[str, tuple[str, str]]:
    """(default precision, reason) of each placement layer, by pattern (module docstring).
    ``kinds``: node name -> placement kind; ``defaults``: node name -> default precision of every
    other layer; ``float_marks``: nodes that mark a transformer block (LayerNorm patterns, embeddings)."""
    g = GraphIndex(proto)
    by_name = {n.name: n for n in g.nodes if n.name in kinds}
    int8_convs = {n.name for n in g.nodes if n.op_type in CONVS and defaults.get(n.name) == "int8"}
    out: dict[str, tuple[str, str]] = {}
    for name, node in by_name.items():
        if kinds[name] != "add":
            continue
        origins = _origins(g, [node.input[i] for i in g.activations(node)], int8_convs, float_marks)
        after_ln = any(r is not None and (r.op_type in LAYERNORMS or r.name in float_marks)
                       for r in _readers(g, node.output[0]))
        if "transformer" in origins or after_ln:
            out[name] = ("default", TRANSFORMER_RESIDUAL)
        else:
            out[name] = ("int8", RESIDUAL_INT8) if origins == {"int8-conv"} else ("default", ADD_OTHER)
    region = {n for n, node in by_name.items() if kinds[n] != "add" and _origins(
        g, [node.input[i] for i in g.activations(node)], int8_convs, float_marks) == {"int8-conv"}}
    int8 = {n for n, d in defaults.items() if d == "int8"} | {n for n, (d, _) in out.items() if d == "int8"}
    changed = True
    while changed:  # a pooling/Concat stays INT8 when every reader is INT8 (those still in the region too)
        changed = False
        for n in sorted(region):
            if any(r is None or r.name not in int8 | region for r in _readers(g, by_name[n].output[0])):
                region.discard(n)
                changed = True
    for name, node in by_name.items():
        if kinds[name] == "pooling":
            out[name] = ("int8", POOL_INT8) if name in region else ("default", POOL_OTHER)
        elif kinds[name] == "concat":
            feeders = [_feeder(g, node.input[i]) for i in g.activations(node)]
            fp16 = feeders and all(f is not None and defaults.get(f.name) == "fp16" for f in feeders)
            out[name] = ("int8", CONCAT_INT8) if name in region else (
                ("fp16", CONCAT_FP16) if fp16 else ("default", CONCAT_OTHER))
    return out


def _feeder(g: GraphIndex, tensor: str) -> onnx.NodeProto | None:
    """The node that produces ``tensor``, through pass-through nodes."""
    node = g.producer.get(tensor)
    while node is not None and node.op_type in PASS_THROUGH and node.input:
        node = g.producer.get(node.input[0])
    return node


# --- boundaries ------------------------------------------------------------------------------

def _effective(g: GraphIndex, layer_names: set[str], precision: dict[str, str]) -> dict[str, str]:
    """Each layer's precision as TensorRT runs it: an FP32 epilogue op (Relu, BN, Clip…) right after
    an INT8 layer, read by nothing else, is fused into it and runs INT8 with it."""
    eff = {}
    for n in g.nodes:
        if n.name not in layer_names:
            continue
        p = precision.get(n.name, "fp32")
        if p == "fp32" and n.op_type in EPILOGUE and n.input:
            src = _feeder(g, n.input[0])
            if src is not None and eff.get(src.name) == "int8" and all(g.single_consumer(o) for o in src.output[:1]):
                p = "int8"
        eff[n.name] = p
    return eff


def _neighbours(g: GraphIndex, tensor: str, layer_names: set[str], upstream: bool):
    """The layers next to ``tensor`` through non-layer data-movement nodes: its producing layer
    (``upstream``) or the layers reading it."""
    out, stack, seen = [], [tensor], set()
    while stack:
        t = stack.pop()
        if t in seen or t in g.consts:
            continue
        seen.add(t)
        nodes = [g.producer[t]] if upstream and t in g.producer else ([] if upstream else g.consumers.get(t, []))
        for n in nodes:
            if n.name in layer_names:
                out.append(n)
            elif n.op_type in DATA_MOVEMENT:
                stack.extend(n.input[:1] if upstream else n.output[:1])
    return out


def _why(mine: str, theirs: str, direction: str) -> str:
    src, dst = (theirs, mine) if direction == "in" else (mine, theirs)
    if dst == "int8":
        return f"{src.upper()} → INT8: a QuantizeLinear runs on its own (the {src.upper()} producer cannot write INT8)"
    if src == "int8":
        return (f"INT8 → {dst.upper()}: the INT8 region ends; the producer writes " +
                ("FP32 and a Cast makes it FP16" if dst == "fp16" else "FP32 instead of INT8"))
    return f"{src.upper()} → {dst.upper()}: a Cast (reformat) between FP16 and FP32"


def boundaries(model, layers, policy) -> pd.DataFrame:
    """Per layer, the neighbouring layers whose precision forces a boundary (``BOUNDARY_COLUMNS``):
    INT8 next to float, or FP16 next to FP32, as TensorRT would run the policy (FP32 Relu/BN/Clip
    after an INT8 layer are fused into it). ``direction`` "in": the neighbour produces an input of the
    layer; "out": it reads the layer's output. Main graph only; each boundary appears on both sides."""
    g = GraphIndex(model.proto)
    names = {l.name for l in layers if l.subgraph is None}
    eff = _effective(g, names, dict(policy.layers))
    rows = []
    for n in g.nodes:
        if n.name not in names:
            continue
        mine = eff[n.name]
        for direction, tensors in (("in", [n.input[i] for i in g.activations(n)]), ("out", [o for o in n.output if o])):
            for t in tensors:
                for other in _neighbours(g, t, names, upstream=direction == "in"):
                    theirs = eff[other.name]
                    if other.name != n.name and ((mine == "int8") != (theirs == "int8")
                                                 or {mine, theirs} == {"fp16", "fp32"}):
                        rows.append((n.name, other.name, direction, theirs, t, _why(mine, theirs, direction)))
    return pd.DataFrame(rows, columns=BOUNDARY_COLUMNS).drop_duplicates(ignore_index=True)


def transformer_marks(proto: onnx.ModelProto, ln_nodes: set[str], embeddings: set[str]) -> set[str]:
    """Nodes whose presence among a residual Add's producers marks a transformer block."""
    return set(ln_nodes) | set(embeddings) | {n.name for n in proto.graph.node if n.op_type in LAYERNORMS}

