"""Layer inventory: every node that does floating-point work, with its parameters, MACs,
INT8 eligibility and default precision.

MACs come from shape inference at the resolved input shapes (onnx's, with data propagation;
ONNX Runtime's symbolic shape inference where onnx leaves a MAC-bearing node's shapes open,
e.g. behind com.microsoft ops). Nodes inside If/Loop/Scan bodies are listed with
subgraph-qualified names (``"<parent node>/<attr>/<node>"``); they are never INT8-eligible and
stay FP32 (the compiler leaves subgraphs untouched). Their MACs count one execution of the body.

Besides the MAC layers, residual Adds, pooling and float Concats are *placement* layers
(``Layer.placement``, see ``core.model.placement``): TensorRT can run them inside an INT8 region. Their
default precision follows the pattern around them, with the reason in ``default_reason``; those
whose default is INT8 are INT8-eligible like a MAC layer (ranked, searched), the others can be set
INT8 by hand (:func:`can_be_int8`)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

import numpy as np
import onnx
import pandas as pd

from core.errors import MixprecError
from core.model.graph import all_graphs, attr
from core.model.llm import ROTARY, llm_roles
from core.model.load import FLOAT_TYPES, LoadedModel
from core.model.placement import (NOT_SEARCHED, PLACEMENT_OPS, PlacementGraph, candidate_kind, placement_defaults,
                                  transformer_marks)
from core.model.shapes import model_batch, resolve_input_shapes, with_static_shapes

INT8_ELIGIBLE = ("MatMul", "Gemm", "Conv", "ConvTranspose")
# Ops that do multiply-accumulates; only INT8_ELIGIBLE ones can be INT8, the rest still count in
# the denominator of the INT8 share of MACs.
MAC_OPS = INT8_ELIGIBLE + ("Einsum", "Attention", "MultiHeadAttention", "LSTM", "GRU", "RNN")
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
CONTROL_FLOW = ("If", "Loop", "Scan")
PRECISIONS = ("fp32", "fp16", "int8")
# Ops that move or reinterpret data but do no arithmetic: they are not layers of their own.
NON_COMPUTE = {
    "Cast", "CastLike", "Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Reshape",
    "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "Pad", "QuantizeLinear", "DequantizeLinear",
    "NonZero", "Range", "Equal", "Less", "Greater", "Not", "And", "Or", "Where", *CONTROL_FLOW,
}
LAYERNORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization")

INVENTORY_COLUMNS = [
    "name", "op_type", "params", "macs", "eligible", "placement", "default_precision", "default_reason",
    "reason", "subgraph", "inputs", "outputs",
]


@dataclass(frozen=True)
class Layer:
    name: str
    op_type: str
    params: int
    macs: int
    eligible: bool
    default_precision: str  # "fp16" / "int8" / "fp32" / "default" (the policy's network default)
    default_reason: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    subgraph: str | None = None  # "<parent node>/<attr>" for a node inside an If/Loop/Scan body
    reason: str = ""  # why a layer that does MACs (or a placement layer) is not INT8-eligible
    placement: str = ""  # "add" / "pooling" / "concat": an op TensorRT can run INT8 inside a quantized region


def can_be_int8(layer: Layer) -> bool:
    """Whether a policy may set the layer INT8: an INT8-eligible layer, or a placement layer
    (residual Add, pooling, Concat) outside control flow, whatever its default."""
    return layer.subgraph is None and (layer.eligible or bool(layer.placement))


# --- shapes -----------------------------------------------------------------------------

def _shape_map(proto: onnx.ModelProto, batch: int) -> dict[str, tuple[int, ...]]:
    """Concrete shapes after inference, in the graph and its subgraphs; a leading dim that
    inference could not resolve (e.g. behind a Reshape) is the batch."""
    shapes = {}
    for g in all_graphs(proto.graph):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if not vi.type.tensor_type.HasField("shape"):
                continue
            dims = vi.type.tensor_type.shape.dim
            vals = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (batch if i == 0 else None)
                    for i, d in enumerate(dims)]
            if None not in vals and vi.name not in shapes:
                shapes[vi.name] = tuple(vals)
        for init in g.initializer:
            shapes[init.name] = tuple(init.dims)
        for node in g.node:  # Constant nodes (weights not yet folded into initializers)
            if node.op_type == "Constant" and node.output:
                t = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
                if t is not None:
                    shapes.setdefault(node.output[0], tuple(t.dims))
    return shapes


def _static_proto(model: LoadedModel, input_shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """The model with concrete input dims and re-inferred shapes: with data propagation, else
    without it (data propagation fails on some graphs), else the symbolic shapes of the load."""
    proto = with_static_shapes(model, input_shapes)
    if proto is not model.proto or not input_shapes:
        return proto
    m = onnx.ModelProto()
    m.CopyFrom(model.proto)
    del m.graph.value_info[:]
    for inp in m.graph.input:
        for d, v in zip(inp.type.tensor_type.shape.dim, input_shapes.get(inp.name, ())):
            d.Clear()
            d.dim_value = int(v)
    try:
        return onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - keep the symbolic shapes
        return model.proto


def _ort_shapes(proto: onnx.ModelProto, batch: int) -> dict[str, tuple[int, ...]]:
    """Shapes from ONNX Runtime's symbolic shape inference, which knows com.microsoft ops and
    carries Loop state shapes into the body; {} when it fails. (Imported here: it loads sympy.)"""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return _shape_map(SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True), batch)
    except Exception:  # noqa: BLE001 - a fallback only
        return {}


def _needs(node: onnx.NodeProto) -> list[str]:
    """The tensors whose shapes the MAC count of ``node`` needs."""
    if node.op_type in ("LSTM", "GRU", "RNN"):
        return list(node.input[:3])
    if node.op_type in ("Attention", "MultiHeadAttention"):
        return [t for t in node.input[:3] if t]
    return [t for t in (*node.input[:2], *node.output[:1]) if t]


def _inferred(model: LoadedModel, input_shapes: dict[str, tuple[int, ...]]):
    """(the re-inferred model, the concrete shape of every tensor it resolves) at these input shapes."""
    batch = model_batch(model, input_shapes)
    proto = _static_proto(model, input_shapes)
    shapes = _shape_map(proto, batch)
    mac_nodes = [n for g in all_graphs(proto.graph) for n in g.node if n.op_type in MAC_OPS]
    if any(t not in shapes for n in mac_nodes for t in _needs(n)):
        shapes = {**_ort_shapes(proto, batch), **shapes}
    return proto, shapes


def tensor_shapes(model: LoadedModel, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every tensor whose shape inference resolves, for these input shapes."""
    return _inferred(model, input_shapes)[1]


# --- MACs -------------------------------------------------------------------------------

def _prod(dims) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _rnn_macs(node, ins) -> int:
    """Per time step: gates × (input_size + hidden_size) × hidden_size, per direction and sample.
    W: [directions, gates·hidden, input], R: [directions, gates·hidden, hidden]."""
    x, w, r = ins[0], ins[1], ins[2]
    seq, batch = (x[1], x[0]) if attr(node, "layout", 0) else (x[0], x[1])
    return int(seq) * int(batch) * int(w[0]) * int(w[1]) * (int(w[2]) + int(r[2]))


def _labels(term: str, rank: int) -> list[str]:
    """Index labels of one Einsum operand; ellipsis dims are labelled from the right (broadcast)."""
    if "..." not in term:
        return list(term)
    pre, post = term.split("...")
    n = rank - len(pre) - len(post)
    return list(pre) + [f"...{n - j}" for j in range(n)] + list(post)


def _einsum_macs(node, ins) -> int:
    """The naive contraction cost: the product of all distinct index sizes (0 for one operand)."""
    eq = attr(node, "equation", b"")
    terms = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "").split("->")[0].split(",")
    if len(terms) < 2 or len(terms) != len(ins) or any(s is None for s in ins):
        return 0
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, ins):
        for label, d in zip(_labels(term, len(shape)), shape):
            sizes[label] = max(sizes.get(label, 1), int(d))
    return _prod(sizes.values())


def _attention_macs(node, ins, outs) -> int:
    """QKᵀ and attention·V (ai.onnx Attention; ONNX Runtime's fused com.microsoft attention ops are refused on
    load, core.model.ms_ops)."""
    q, k, v = ins[0], ins[1], ins[2]  # ai.onnx Attention / MultiHeadAttention
    if len(q) == 4:  # [B, heads, S, head]
        b, heads, s_q, hq = (int(d) for d in q)
        present = outs[1] if len(outs) > 1 and outs[1] else None
        s_kv = int(present[2]) if present else int(k[2])
        return b * heads * s_q * s_kv * (hq + int(v[3]))
    b, s_q, d_q = int(q[0]), int(q[1]), int(q[2])  # Q [B, S, hidden]; K/V [B, S_kv, hidden] or [B, heads, S_kv, head]
    q_heads = int(attr(node, "q_num_heads", 0) or attr(node, "num_heads", 1) or 1)
    kv_heads = int(attr(node, "kv_num_heads", 0) or q_heads)
    s_kv = int(k[2]) if len(k) == 4 else int(k[1])
    v_per_head = int(v[-1]) if len(v) == 4 else int(v[-1]) // kv_heads
    return b * s_q * s_kv * (d_q + v_per_head * q_heads)


def _macs(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    ins = [shapes.get(i) if i else None for i in node.input]
    outs = [shapes.get(o) if o else None for o in node.output]
    out = outs[0] if outs else None
    op = node.op_type
    try:
        if op == "MatMul" and ins[0] and out:
            return _prod(out) * int(ins[0][-1])
        if op == "Gemm" and ins[0] and out:
            return _prod(out) * int(ins[0][0] if attr(node, "transA", 0) else ins[0][1])
        if op == "Conv" and ins[1] and out:  # W: [M, C/g, k...]
            return _prod(out) * _prod(ins[1][1:])
        if op == "ConvTranspose" and ins[0] and ins[1]:  # W: [C, M/g, k...]: each input pixel feeds M/g·k outputs
            return _prod(ins[0]) * _prod(ins[1][1:])
        if op in RNN_GATES and all(ins[:3]):
            return _rnn_macs(node, ins)
        if op == "Einsum":
            return _einsum_macs(node, ins)
        if op in ("Attention", "MultiHeadAttention") and all(ins[:3]):
            return _attention_macs(node, ins, outs)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        return 0
    return 0
def _decomposed_layernorm_nodes(proto: onnx.ModelProto) -> set[str]:
    """Nodes of the decomposed pattern ReduceMean→Sub→Pow→ReduceMean→Add→Sqrt→Div."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def prod(name, op):
        n = producer.get(name)
        return n if n is not None and n.op_type == op else None

    found: set[str] = set()
    for sqrt in (n for n in proto.graph.node if n.op_type == "Sqrt"):
        add = prod(sqrt.input[0], "Add")
        rm2 = add and (prod(add.input[0], "ReduceMean") or prod(add.input[1], "ReduceMean"))
        pow_ = rm2 and prod(rm2.input[0], "Pow")
        sub = pow_ and prod(pow_.input[0], "Sub")
        rm1 = sub and prod(sub.input[1], "ReduceMean")
        divs = [c for c in consumers.get(sqrt.output[0], []) if c.op_type == "Div"]
        if rm1 and divs:
            found.update(n.name for n in (rm1, sub, pow_, rm2, add, sqrt, *divs))
    return found


def _tensor_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor known to shape inference, in the graph and its subgraphs."""
    types = {}
    for g in all_graphs(proto.graph):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type"):
                types.setdefault(vi.name, vi.type.tensor_type.elem_type)
        for init in g.initializer:
            types.setdefault(init.name, init.data_type)
    return types


@dataclass
class _Scope:
    """What classifying the nodes of one graph needs; ``subgraph``/``where`` are None in the main graph."""
    shapes: dict[str, tuple[int, ...]]
    types: dict[str, int]
    inits: dict[str, onnx.TensorProto]
    ln_nodes: set[str]
    subgraph: str | None = None
    where: str | None = None  # e.g. "Loop body"
    llm: dict | None = None  # first output -> core.model.llm.LlmRole (LM head, RMSNorm, rotary angles)


def _defaults(node: onnx.NodeProto, scope: _Scope, embedding: bool) -> tuple[bool, str, str, str]:
    """(eligible, default precision, default reason, reason) of one compute node."""
    op = node.op_type
    if scope.subgraph is not None:
        return False, "fp32", "control flow", f"inside control flow ({scope.where}): kept FP32"
    reason = "" if op not in MAC_OPS or op in INT8_ELIGIBLE else (
        f"{op} is not INT8-eligible (only {', '.join(INT8_ELIGIBLE)} are); its MACs count as not INT8")
    if (role := (scope.llm or {}).get(node.output[0] if node.output else "")) is not None:
        return role.eligible, role.precision, role.kind, role.reason or reason
    if op in LAYERNORM_OPS or node.name in scope.ln_nodes:
        return False, "fp16", "layernorm", reason
    if op == "Softmax":
        return False, "fp16", "softmax", reason
    if embedding:
        return False, "fp16", "embedding", reason
    if op in INT8_ELIGIBLE:
        return True, "int8", "int8-eligible", reason
    return False, "default", "network default", reason


def _graph_layers(graph: onnx.GraphProto, scope: _Scope) -> list[Layer]:
    """The layers of one graph, then those of its subgraphs (names qualified by their parents)."""
    layers, seen = [], set()
    inits = {**scope.inits, **{i.name: i for i in graph.initializer}}
    for node in graph.node:
        name = node.name or (f"node_of_{node.output[0]}" if node.output else f"{node.op_type}_unnamed")
        base, k = name, 1
        while name in seen:
            name, k = f"{base}__{k}", k + 1
        seen.add(name)
        qual = name if scope.subgraph is None else f"{scope.subgraph}/{name}"
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                inner = _Scope(scope.shapes, scope.types, inits, set(), f"{qual}/{attr.name}",
                               f"{node.op_type} {attr.name}")
                layers.extend(_graph_layers(g, inner))
        float_io = [t for t in (*node.input, *node.output) if t and scope.types.get(t) in FLOAT_TYPES]
        embedding = (node.op_type == "Gather" and bool(node.input) and node.input[0] in inits
                     and inits[node.input[0]].data_type in FLOAT_TYPES)
        concat = (node.op_type == "Concat" and scope.subgraph is None and bool(node.input)  # float activations only
                  and all(i and i not in inits and scope.types.get(i) in FLOAT_TYPES for i in node.input))
        if not float_io or (node.op_type in NON_COMPUTE and not embedding and not concat):
            continue
        params = sum(_prod(inits[i].dims) for i in node.input if i in inits and inits[i].data_type in FLOAT_TYPES)
        eligible, default, default_reason, reason = _defaults(node, scope, embedding)
        layers.append(Layer(
            name=qual, op_type=node.op_type, params=params, macs=_macs(node, scope.shapes), eligible=eligible,
            default_precision=default, default_reason=default_reason, inputs=tuple(node.input),
            outputs=tuple(node.output), subgraph=scope.subgraph, reason=reason,
        ))
    return layers


def build_inventory(model: LoadedModel, data: dict | None = None,
                    input_shapes: dict[str, tuple[int, ...]] | None = None) -> list[Layer]:
    """Every compute layer of the model (main graph first at each node, then its subgraphs), with
    MACs at ``input_shapes`` (default: :func:`resolve_input_shapes` of the data)."""
    input_shapes = input_shapes or resolve_input_shapes(model, data)
    proto, shapes = _inferred(model, input_shapes)
    types = {**_tensor_types(proto), **model.tensor_types()}
    scope = _Scope(shapes, types, {}, _decomposed_layernorm_nodes(model.proto), llm=llm_roles(model.proto, types))
    return _with_placement(model.proto, _graph_layers(model.proto.graph, scope), scope)


def _with_placement(proto: onnx.ModelProto, layers: list[Layer], scope: _Scope) -> list[Layer]:
    """The layers with their placement kind and, for placement layers, the pattern's default
    (``core.model.placement.placement_defaults``): INT8-eligible when that default is INT8."""
    g = PlacementGraph(proto)
    node_of = {n.name: n for n in proto.graph.node}
    kinds = {}
    for l in layers:
        node = node_of.get(l.name)
        # only generic layers: not LayerNorm/Softmax/embedding/LLM roles (a rotary-angle Concat stays FP32, core.model.llm)
        if (l.subgraph is None and l.op_type in PLACEMENT_OPS and node is not None and tuple(node.output) == l.outputs
                and l.default_reason == "network default" and l.default_reason != ROTARY):
            kind = candidate_kind(node, g, scope.types, scope.shapes)
            if kind:
                kinds[l.name] = kind
    if not kinds:
        return layers
    defaults = {l.name: l.default_precision for l in layers if l.name not in kinds and l.subgraph is None}
    marks = transformer_marks(proto, scope.ln_nodes, {l.name for l in layers if l.default_reason == "embedding"})
    chosen = placement_defaults(proto, kinds, defaults, marks)
    return [replace(l, placement=kinds[l.name], eligible=chosen[l.name][0] == "int8", default_precision=chosen[l.name][0],
                    default_reason=chosen[l.name][1], reason="" if chosen[l.name][0] == "int8" else NOT_SEARCHED)
            if l.name in kinds else l for l in layers]


def main_graph_layers(layers: list[Layer]) -> list[Layer]:
    """The layers outside control flow (the ones the compiler and the ranking work on)."""
    return [l for l in layers if l.subgraph is None]


def require_eligible(model_name: str, layers: list[Layer], what: str) -> list[Layer]:
    """The INT8-eligible layers (all outside control flow); a MixprecError saying so when there are
    none, e.g. when all the compute is inside If/Loop/Scan bodies. ``what``: "rank", "search"…"""
    eligible = [l for l in layers if l.eligible]
    if eligible:
        return eligible
    inside = [l for l in layers if l.subgraph is not None]
    if inside:
        where = sorted({l.subgraph for l in inside})
        raise MixprecError(
            f"{model_name} has no INT8-eligible layer outside control flow: its {len(inside)} compute layer(s) "
            f"inside {', '.join(where[:3])}{' …' if len(where) > 3 else ''} stay FP32, so there is nothing to {what}",
            "build it with the default or the FP16 policy (control flow stays FP32), or export the model with "
            "its loops unrolled / branches resolved so its MatMul, Gemm and Conv layers sit in the main graph")
    raise MixprecError(f"{model_name} has no INT8-eligible layers ({', '.join(INT8_ELIGIBLE)}), "
                       f"so there is nothing to {what}", "build the FP16 policy instead")


def inventory_frame(layers: list[Layer]) -> pd.DataFrame:
    return pd.DataFrame([asdict(layer) for layer in layers], columns=INVENTORY_COLUMNS)
