"""Decoder-LLM patterns in an ONNX graph, and the default precisions they get (issue 14 §2).

* **embedding** -- a ``Gather`` on a float ``[vocab, hidden]`` table indexed by an integer input:
  FP16 (the inventory already gives every float-table Gather ``embedding``/FP16; :func:`embedding_tables`
  finds the vocabulary sizes).
* **LM head** -- the ``MatMul``/``Gemm`` with a constant weight that projects to the vocabulary
  (its weight is an embedding table (tied) or its width is the largest table's row count; in a model
  without an embedding, its output is a rank-3 ``[batch, seq, N]`` output named like ``logits``) and whose output reaches a graph output through data-movement ops
  only. Default FP16, reason ``lm head``; it stays INT8-eligible so ranking and search can still
  try it (it is 10-30 % of a small decoder's weights).
* **RMSNorm** -- ``RMSNormalization`` / ``SimplifiedLayerNormalization`` /
  ``SkipSimplifiedLayerNormalization``, and the decomposed form torch exports:
  ``Pow(x, 2) → ReduceMean → Add(eps) → Sqrt → Div(1, ·)`` (or ``Reciprocal``) ``→ Mul(x, ·)``,
  or ``Sqrt → Div(x, ·)``, then ``Mul(weight, ·)`` (``Cast`` nodes in between are skipped). A
  ``Pow`` whose input comes from a ``Sub`` is LayerNorm's variance, not RMSNorm's. FP16 like LayerNorm.
* **rotary angles** -- the float nodes between an integer→float ``Cast`` (of position ids or a
  ``Range``) and the ``Cos``/``Sin`` of rotary embeddings (``Mul``/``MatMul`` by the inverse
  frequencies, ``Concat``), Cos and Sin included: FP32, not INT8-eligible. FP16 holds integers
  exactly only up to 2048, so position × frequency would lose the angle at longer positions; an
  INT8 ``inv_freq @ positions`` MatMul (older transformers exports) would break every position.

Softmax is FP16 by the inventory's general rule. :func:`llm_roles` gives the role of every node
(keyed by its first output tensor, so unnamed nodes work too); ``core.model.inventory`` consults it.
Imports nothing of mixprec but ``core.model.graph`` (its :class:`~core.model.graph.GraphIndex`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from core.model.graph import GraphIndex, attr

FLOAT_ELEM = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
INT_ELEM = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
            onnx.TensorProto.UINT8, onnx.TensorProto.BOOL)
PASS_THROUGH = ("Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose")
RMSNORM_OPS = ("RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
LM_HEAD, RMSNORM, ROTARY = "lm head", "rmsnorm", "rotary"
ROTARY_REASON = ("rotary position angles stay FP32: FP16 holds integers exactly only up to 2048, "
                 "so position × frequency would lose the angle")


@dataclass(frozen=True)
class LlmRole:
    kind: str        # LM_HEAD / RMSNORM / ROTARY
    precision: str   # the default precision
    eligible: bool   # INT8-eligible (searched, ranked)
    reason: str = ""  # why a MAC layer is not INT8-eligible


def _index(proto: onnx.ModelProto | GraphIndex) -> GraphIndex:
    return proto if isinstance(proto, GraphIndex) else GraphIndex(proto)


def _value(g: GraphIndex, name: str) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's output (None otherwise)."""
    if name in g.inits:
        return numpy_helper.to_array(g.inits[name])
    n = g.producer.get(name)
    if n is not None and n.op_type == "Constant":
        t = attr(n, "value")
        return numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else None
    return None


def _through(g: GraphIndex, name: str, ops=("Cast",)) -> str:
    """Follow ``name`` back through producers of type ``ops`` to where it comes from."""
    while (n := g.producer.get(name)) is not None and n.op_type in ops and n.input:
        name = n.input[0]
    return name


def _only_reader(g: GraphIndex, name: str, op: str, skip=("Cast",)) -> onnx.NodeProto | None:
    """The single reader of ``name`` of type ``op`` (past ``skip`` ops); None otherwise."""
    readers = g.consumers.get(name, [])
    while len(readers) == 1 and readers[0].op_type in skip:
        readers = g.consumers.get(readers[0].output[0], [])
    return readers[0] if len(readers) == 1 and readers[0].op_type == op else None


def _output_rank(g: GraphIndex, name: str) -> int | None:
    vi = g.outputs.get(name)
    return len(vi.type.tensor_type.shape.dim) if vi is not None and vi.type.tensor_type.HasField("shape") else None


def _scalar(g: GraphIndex, name: str) -> float | None:
    v = _value(g, name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def embedding_tables(proto: onnx.ModelProto | GraphIndex) -> dict[str, int]:
    """Float initializers that a Gather indexes by rows (token embedding tables) -> row count."""
    g = _index(proto)
    return {n.input[0]: int(g.inits[n.input[0]].dims[0]) for n in g.nodes
            if n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in g.inits
            and len(g.inits[n.input[0]].dims) == 2 and g.inits[n.input[0]].data_type in FLOAT_ELEM
            and attr(n, "axis", 0) == 0}


def _reaches_output(g: GraphIndex, tensor: str) -> bool:
    """Whether ``tensor`` is a graph output, or becomes one through data-movement ops only."""
    seen = set()
    while tensor not in g.outputs:
        readers = g.consumers.get(tensor, [])
        if len(readers) != 1 or readers[0].op_type not in PASS_THROUGH or tensor in seen:
            return False
        seen.add(tensor)
        tensor = readers[0].output[0]
    return True


def _weight_widths(g: GraphIndex, node: onnx.NodeProto) -> tuple[set[int], str | None]:
    """(possible output widths, the initializer behind the weight) of a MatMul/Gemm with a constant weight."""
    src = _through(g, node.input[1], PASS_THROUGH + ("DequantizeLinear",))
    if src not in g.inits or len(g.inits[src].dims) != 2:
        return set(), None
    dims = [int(d) for d in g.inits[src].dims]
    if src != node.input[1]:  # through a Transpose (tied embeddings) or a Cast: either axis may be the width
        return set(dims), src
    if node.op_type == "Gemm":
        return {dims[0] if attr(node, "transB", 0) else dims[1]}, src
    return {dims[1]}, src


def lm_heads(proto: onnx.ModelProto | GraphIndex) -> set[str]:
    """First output tensors of the LM-head projections (module docstring)."""
    g = _index(proto)
    tables = embedding_tables(g)
    vocab = {max(tables.values())} if tables else set()  # the token table; not position / token-type tables
    heads = set()
    for n in g.nodes:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2 or not n.output or not _reaches_output(g, n.output[0]):
            continue
        widths, src = _weight_widths(g, n)
        if src is None:
            continue
        names = _output_names(g, n.output[0])
        named = any("logit" in o.lower() for o in names) and _output_rank(g, names[-1]) == 3
        if src in tables or (widths & vocab) or (not vocab and named):
            heads.add(n.output[0])
    return heads


def _output_names(g: GraphIndex, tensor: str) -> list[str]:
    names = [tensor]
    while tensor not in g.outputs and len(g.consumers.get(tensor, [])) == 1:
        tensor = g.consumers[tensor][0].output[0]
        names.append(tensor)
    return names


def _rms_tail(g: GraphIndex, sqrt: onnx.NodeProto, x: str) -> list[onnx.NodeProto] | None:
    """The nodes after ``Sqrt`` that normalise ``x``: Div(1, s)/Reciprocal → Mul(x, ·), or Div(x, s)."""
    out = []
    for reader in g.consumers.get(sqrt.output[0], []):
        if reader.op_type == "Reciprocal" or (reader.op_type == "Div" and reader.input[1] == sqrt.output[0]
                                              and _scalar(g, reader.input[0]) == 1.0):
            mul = _only_reader(g, reader.output[0], "Mul", skip=())
            if mul is None or _through(g, next(i for i in mul.input if i != reader.output[0])) != x:
                return None
            out += [reader, mul]
        elif reader.op_type == "Div" and reader.input[1] == sqrt.output[0] and _through(g, reader.input[0]) == x:
            out.append(reader)
        else:
            return None
    return out or None


def _decomposed_rmsnorm(g: GraphIndex, pow_: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes of one decomposed RMSNorm starting at ``Pow(x, 2)``, or None."""
    if _scalar(g, pow_.input[1]) != 2.0:
        return None
    x = _through(g, pow_.input[0])
    src = g.producer.get(x)
    if src is not None and src.op_type == "Sub":  # LayerNorm's centred variance
        return None
    mean = _only_reader(g, pow_.output[0], "ReduceMean", skip=())
    add = mean and _only_reader(g, mean.output[0], "Add", skip=())
    if add is None or not any(i in g.consts for i in add.input):
        return None
    sqrt = _only_reader(g, add.output[0], "Sqrt", skip=())
    tail = sqrt and _rms_tail(g, sqrt, x)
    if not tail:
        return None
    nodes = [pow_, mean, add, sqrt, *tail]
    scale = _only_reader(g, tail[-1].output[0], "Mul")
    if scale is not None and any(_through(g, i) in g.consts for i in scale.input):
        nodes.append(scale)
    return nodes


def rmsnorm_nodes(proto: onnx.ModelProto | GraphIndex) -> set[str]:
    """First output tensors of every RMSNorm node, fused ops and decomposed patterns."""
    g = _index(proto)
    found = {n.output[0] for n in g.nodes if n.op_type in RMSNORM_OPS and n.output}
    for n in g.nodes:
        if n.op_type == "Pow" and len(n.input) == 2:
            found.update(m.output[0] for m in _decomposed_rmsnorm(g, n) or [])
    return found


def _int_to_float(g: GraphIndex, node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """A Cast from an integer tensor (position ids, a Range) to float. Without a known type the
    Cast's input is followed back through data-movement ops to an integer graph input or a Range."""
    if node.op_type != "Cast" or attr(node, "to") not in FLOAT_ELEM:
        return False
    if node.input[0] in types:
        return types[node.input[0]] in INT_ELEM
    src = _through(g, node.input[0], PASS_THROUGH[1:] + ("Expand",))
    origin = g.producer.get(src)
    vi = g.inputs.get(src)
    return (vi is not None and vi.type.tensor_type.elem_type in INT_ELEM) or (
        origin is not None and origin.op_type == "Range")


def rotary_nodes(proto: onnx.ModelProto | GraphIndex, types: dict[str, int] | None = None) -> set[str]:
    """First output tensors of the rotary-angle nodes (module docstring): Cos/Sin whose input,
    followed back through float ops, starts at an integer→float Cast; every node on that path."""
    g, types = _index(proto), types or {}
    found: set[str] = set()
    for trig in (n for n in g.nodes if n.op_type in ("Cos", "Sin")):
        path, frontier, ok, seen = [trig], [trig.input[0]], False, set()
        while frontier and len(path) < 64:
            t = frontier.pop()
            node = g.producer.get(t)
            if t in seen or node is None or t in g.consts:
                continue
            seen.add(t)
            if _int_to_float(g, node, types):
                ok = True
                continue
            if node.op_type in ("Mul", "MatMul", "Concat", "Transpose", "Reshape", "Unsqueeze", "Expand", "Cast"):
                path.append(node)
                frontier += [i for i in node.input if i]
        if ok:
            found.update(n.output[0] for n in path)
    return found


def llm_roles(proto: onnx.ModelProto, types: dict[str, int] | None = None) -> dict[str, LlmRole]:
    """The LLM role of every node that has one, keyed by its first output tensor (an empty dict
    for models without these patterns). ``types``: element type per tensor (shape inference)."""
    g = GraphIndex(proto)  # one index for the three patterns
    roles = {t: LlmRole(ROTARY, "fp32", False, ROTARY_REASON) for t in rotary_nodes(g, types)}
    roles.update({t: LlmRole(RMSNORM, "fp16", False) for t in rmsnorm_nodes(g)})
    roles.update({t: LlmRole(LM_HEAD, "fp16", True) for t in lm_heads(g)})
    return roles


def vocab_size(proto: onnx.ModelProto) -> int | None:
    """The vocabulary: the row count of the largest embedding table; None without one."""
    tables = embedding_tables(proto)
    return max(tables.values()) if tables else None


def is_decoder(proto: onnx.ModelProto) -> bool:
    """Whether the graph ends in an LM head (vocabulary logits)."""
    return bool(lm_heads(proto))
