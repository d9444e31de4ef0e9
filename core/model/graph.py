"""Small helpers over ONNX graphs that several modules need: subgraphs of If/Loop/Scan, every
node of a graph and its subgraphs, a node's attribute, the default-domain opset. Imports nothing
of mixprec."""
from __future__ import annotations

import onnx
from onnx import helper


def subgraphs(node: onnx.NodeProto):
    """The graphs in a node's attributes (If branches, Loop/Scan bodies)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def all_graphs(graph: onnx.GraphProto):
    """The graph and every subgraph in it, depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)


def all_nodes(graph: onnx.GraphProto):
    """Every node of the graph and of its subgraphs, depth first."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of a node's attribute, or ``default``."""
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def default_opset(proto: onnx.ModelProto) -> int:
    """The model's opset of the default (ai.onnx) domain; 0 when it has none."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def with_input_dims(proto: onnx.ModelProto, dims: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` whose inputs named in ``dims`` have those concrete dims, with no stored
    intermediate shapes and open output dims: ready for shape inference at these input shapes."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    del m.graph.value_info[:]
    for inp in m.graph.input:
        if inp.name in dims:
            for d, v in zip(inp.type.tensor_type.shape.dim, dims[inp.name]):
                d.Clear()
                d.dim_value = int(v)
    for out in m.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    return m


LIGHT_FROM = 1 << 16  # initializers of at least this many bytes are left out of a weightless copy


def _copy_fields(src, dst, skip: str) -> None:
    """Copy every set field of message ``src`` but ``skip`` into ``dst`` (of the same type)."""
    for f, v in src.ListFields():
        if f.name == skip:
            continue
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED
        if repeated:
            getattr(dst, f.name).extend(v)
        elif f.type == f.TYPE_MESSAGE:
            getattr(dst, f.name).CopyFrom(v)
        else:
            setattr(dst, f.name, v)


def without_weights(model: onnx.ModelProto, keep: set[str] = frozenset(), below: int = LIGHT_FROM,
                    left_out=None) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of ``model`` without its main-graph initializers of ``below`` bytes or more (except those
    in ``keep``), or those ``left_out(tensor)`` says: each is a typed graph input instead, which is all
    shape inference needs of it. For analyses that would otherwise copy every weight (onnx's C++ side
    serializes and parses the model). Returns the copy and the names of the inputs that stand for
    left-out initializers."""
    left_out = left_out or (lambda t: t.name not in keep and t.ByteSize() >= below)
    twin, g = onnx.ModelProto(), model.graph
    _copy_fields(model, twin, "graph")
    _copy_fields(g, twin.graph, "initializer")
    have, added = {i.name for i in g.input}, set()
    for t in g.initializer:
        if not left_out(t):
            twin.graph.initializer.append(t)
        elif t.name not in have:
            twin.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            added.add(t.name)
    return twin, added
