"""Small helpers over ONNX graphs that several modules need: subgraphs of If/Loop/Scan, every
node of a graph and its subgraphs, a node's attribute, the default-domain opset, and
:class:`GraphIndex`, the one index of a graph's producers, consumers, constants, topological order
and constant reachability (``core.model.llm``, ``core.model.placement``, ``core.model.normalize``,
``core.quant.trt_rules`` and ``core.estimate.fusion`` read it). Imports nothing of mixprec."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import onnx
from onnx import helper

SHAPE_READERS = frozenset({"Shape", "Size"})  # ops that read a tensor's shape, not its data


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


# --- the graph index -----------------------------------------------------------------------------

def kahn_order(deps: list[set[int]], key: Callable[[int], object] | None = None) -> list[int]:
    """The indices ``0 … len(deps)-1`` in an order where each comes after every index in its ``deps``
    (Kahn's algorithm); of the indices ready at once, the one of the smallest ``(key(i), i)`` first (no
    ``key``: the smallest index, so an order that already holds is kept). The members of a cycle, which
    a valid graph has none of, come last in index order."""
    key = key or (lambda i: i)
    readers: list[list[int]] = [[] for _ in deps]
    waiting = [0] * len(deps)
    for i, d in enumerate(deps):
        for j in d:
            if j != i:
                readers[j].append(i)
                waiting[i] += 1
    ready = [(key(i), i) for i, w in enumerate(waiting) if not w]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(i)
        for r in readers[i]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, (key(r), r))
    if len(out) != len(deps):
        done = set(out)
        out += [i for i in range(len(deps)) if i not in done]
    return out


@dataclass(frozen=True)
class Folding:
    """What is computable from constants alone (:meth:`GraphIndex.folding`)."""

    nodes: tuple[int, ...]   # the nodes that compute from constants only, in topological order
    tensors: frozenset[str]  # the initializers and those nodes' outputs


def _always(node: onnx.NodeProto) -> bool:
    return True


class GraphIndex:
    """Producers, consumers, constants, topological order and constant reachability of one graph's
    nodes (the main graph of a model by default), built in one pass over the nodes; the views that cost
    more (node maps, reads from inside If/Loop/Scan bodies, the order, constant folding) are built on
    first use and kept. Nodes are numbered by their position in the graph (``nodes[k]``).

    Reads names, dims and types only: an initializer's values, which a model over 2 GB keeps in external
    data files (``core.model.external``), are never read, so the index works on a model loaded without
    its external data. A tensor that several nodes write (not a valid graph) has the last as producer."""

    def __init__(self, graph: onnx.GraphProto | onnx.ModelProto):
        g = graph.graph if isinstance(graph, onnx.ModelProto) else graph
        self.graph = g
        self.nodes: list[onnx.NodeProto] = list(g.node)
        self.node_inputs: list[tuple[str, ...]] = []  # each node's inputs ("" for an omitted optional one)
        self.producer_id: dict[str, int] = {}         # tensor -> the node that writes it
        self.consumer_ids: dict[str, list[int]] = {}  # tensor -> the nodes that read it, once per input slot
        self._shape_readers: list[int] = []
        producer, consumers, read_early = self.producer_id, self.consumer_ids, set()
        for k, n in enumerate(self.nodes):
            ins = tuple(n.input)
            self.node_inputs.append(ins)
            for t in ins:
                if t:
                    readers = consumers.get(t)
                    if readers is not None:
                        readers.append(k)
                    else:
                        consumers[t] = [k]
                        if t not in producer:  # read before its writer (if any): the order is checked for free
                            read_early.add(t)
            for t in n.output:
                if t:
                    producer[t] = k
            if n.op_type in SHAPE_READERS:
                self._shape_readers.append(k)
        self._in_order = read_early.isdisjoint(producer)  # every read after its writer (subgraphs aside)
        self.inits: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
        self.inputs: dict[str, onnx.ValueInfoProto] = {v.name: v for v in g.input}
        self.outputs: dict[str, onnx.ValueInfoProto] = {v.name: v for v in g.output}
        self._foldings: dict[Callable, Folding] = {}

    # --- producers and consumers ---------------------------------------------------------------
    @cached_property
    def producer(self) -> dict[str, onnx.NodeProto]:
        """Tensor -> the node that writes it (graph inputs and initializers have none)."""
        return dict(zip(self.producer_id, map(self.nodes.__getitem__, self.producer_id.values())))

    @cached_property
    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        """Tensor -> the nodes of this graph that read it, once per input slot, in graph order."""
        node = self.nodes.__getitem__
        return {t: list(map(node, ks)) for t, ks in self.consumer_ids.items()}

    @cached_property
    def data_consumer_ids(self) -> dict[str, list[int]]:
        """:attr:`consumer_ids` without the readers of a tensor's shape only (``Shape``, ``Size``)."""
        if not self._shape_readers:
            return self.consumer_ids
        out = dict(self.consumer_ids)
        shape_only = set(self._shape_readers)
        for t in {t for k in self._shape_readers for t in self.node_inputs[k] if t}:
            data = [k for k in out[t] if k not in shape_only]
            if data:
                out[t] = data
            else:
                del out[t]
        return out

    @cached_property
    def scoped_consumers(self) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
        """Tensor -> (reading node, input slot), the nodes inside this graph's If/Loop/Scan bodies
        included (an outer-scope read is a read); each node's own reads, then its bodies'."""
        out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for n in self.nodes:
            for reader in (n, *(m for sub in subgraphs(n) for m in all_nodes(sub))):
                for i, t in enumerate(reader.input):
                    if t:
                        out.setdefault(t, []).append((reader, i))
        return out

    def single_consumer(self, tensor: str) -> bool:
        """``tensor`` is read by one node slot and is no graph output."""
        return len(self.consumer_ids.get(tensor, ())) == 1 and tensor not in self.outputs

    # --- constants ---------------------------------------------------------------------------
    @cached_property
    def consts(self) -> frozenset[str]:
        """The initializers and the outputs of ``Constant`` nodes."""
        return frozenset(self.inits) | {t for n in self.nodes if n.op_type == "Constant" for t in n.output if t}

    @cached_property
    def const_tensors(self) -> dict[str, onnx.TensorProto]:
        """The constants that carry a tensor: initializers and the ``value`` of ``Constant`` nodes (a
        ``value_float``/``value_ints``… Constant has none). The protos themselves: nothing is read."""
        out = dict(self.inits)
        for n in self.nodes:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        out[n.output[0]] = a.t
        return out

    def const_dims(self, tensor: str) -> tuple[int, ...] | None:
        """The dims of a constant tensor (:attr:`const_tensors`), from its metadata; None otherwise."""
        t = self.const_tensors.get(tensor)
        return None if t is None else tuple(int(d) for d in t.dims)

    def activations(self, node: onnx.NodeProto) -> list[int]:
        """Indices of the node's inputs that are not constants (:attr:`consts`)."""
        return [i for i, t in enumerate(node.input) if t and t not in self.consts]

    # --- order and reachability --------------------------------------------------------------
    @cached_property
    def order(self) -> list[int]:
        """The node indices in topological order (a node after the writers of what it reads, reads from
        inside its If/Loop/Scan bodies included): the graph's own order when it already is one,
        otherwise Kahn's order with ties in graph order."""
        deps = []
        for k, n in enumerate(self.nodes):
            inner = [t for sub in subgraphs(n) for m in all_nodes(sub) for t in m.input] if n.attribute else ()
            deps.append({self.producer_id[t] for t in (*self.node_inputs[k], *inner) if t in self.producer_id} - {k})
        if all(j < k for k, d in enumerate(deps) for j in d):
            return list(range(len(self.nodes)))
        return kahn_order(deps)

    def folding(self, may_fold: Callable[[onnx.NodeProto], bool] = _always) -> Folding:
        """The nodes computable from constants alone and the tensors they make: starting from the
        initializers, in topological order, every node ``may_fold`` allows whose non-empty inputs are
        all such tensors (a ``Constant``, with no inputs, is one). Kept per ``may_fold``."""
        if may_fold not in self._foldings:
            # only the nodes' own inputs count here, so the graph's order serves when they follow it
            order = range(len(self.nodes)) if self._in_order else self.order
            const, nodes = set(self.inits), []
            for k in order:
                if all(not t or t in const for t in self.node_inputs[k]) and may_fold(self.nodes[k]):
                    nodes.append(k)
                    const.update(t for t in self.nodes[k].output if t)
            self._foldings[may_fold] = Folding(tuple(nodes), frozenset(const))
        return self._foldings[may_fold]
