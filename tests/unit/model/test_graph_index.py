"""core.model.graph.GraphIndex (issue 20 §5): the one index of producers, consumers, constants,
topological order and constant reachability that llm, placement, normalize, trt_rules and the fusion
read. Small hand-made graphs; a model whose weights stay in an external data file is indexed without
that file."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.model.graph import SHAPE_READERS, Folding, GraphIndex, kahn_order

F = TensorProto.FLOAT


def _model(nodes, inputs=("x",), outputs=("y",), inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, F, [2, 3]) for i in inputs],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _w(name, shape=(3, 3)):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _const(out, value=None, **attrs):
    if value is not None:
        attrs["value"] = numpy_helper.from_array(np.asarray(value, np.float32), "v")
    return helper.make_node("Constant", [], [out], name=f"const_{out}", **attrs)


def test_producers_and_consumers_per_input_slot():
    m = _model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                helper.make_node("Mul", ["a", "a"], ["sq"], name="sq"),          # reads ``a`` twice
                helper.make_node("Add", ["sq", "a"], ["y"], name="add"),
                helper.make_node("Shape", ["a"], ["s"], name="shape")])
    g = GraphIndex(m)
    assert [n.name for n in g.nodes] == ["relu", "sq", "add", "shape"]
    assert g.producer_id == {"a": 0, "sq": 1, "y": 2, "s": 3}
    assert g.producer["a"].name == "relu" and "x" not in g.producer  # a graph input has no producer
    assert g.consumer_ids["a"] == [1, 1, 2, 3] and [n.name for n in g.consumers["a"]] == ["sq", "sq", "add", "shape"]
    assert "Shape" in SHAPE_READERS and g.data_consumer_ids["a"] == [1, 1, 2] and "s" not in g.consumer_ids
    assert list(g.inputs) == ["x"] and list(g.outputs) == ["y"]
    assert g.single_consumer("sq") and not g.single_consumer("a") and not g.single_consumer("y")  # y: a graph output
    assert GraphIndex(m.graph).producer_id == g.producer_id  # a GraphProto works as well as a ModelProto


def test_data_consumers_are_the_consumers_without_shape_readers():
    m = _model([helper.make_node("Relu", ["x"], ["y"])])
    g = GraphIndex(m)
    assert g.data_consumer_ids is g.consumer_ids  # no Shape/Size: the same map, not a copy


def test_constants_initializers_and_constant_nodes():
    m = _model([_const("c", [[2.0] * 3] * 2), _const("f", value_float=1.5),
                helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "w"], ["b"]),
                helper.make_node("Sub", ["b", "f"], ["y"])], inits=[_w("w", (2, 3))])
    g = GraphIndex(m)
    assert g.consts == {"w", "c", "f"}                   # every Constant output, whatever its attribute
    assert set(g.const_tensors) == {"w", "c"}            # those that carry a tensor (value_float does not)
    assert g.const_dims("w") == (2, 3) and g.const_dims("c") == (2, 3)
    assert g.const_dims("f") is None and g.const_dims("a") is None
    add = g.producer["a"]
    assert g.activations(add) == [0] and g.activations(g.producer["y"]) == [0]


def test_order_keeps_a_sorted_graph_and_sorts_one_given_out_of_order():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"), helper.make_node("Neg", ["x"], ["b"], name="B"),
             helper.make_node("Add", ["a", "b"], ["c"], name="C"), helper.make_node("Abs", ["c"], ["y"], name="D")]
    assert GraphIndex(_model(nodes)).order == [0, 1, 2, 3]
    shuffled = [nodes[3], nodes[2], nodes[1], nodes[0]]  # D, C, B, A: every reader before its writer
    g = GraphIndex(_model(shuffled))
    names = [g.nodes[k].name for k in g.order]
    assert names == ["B", "A", "C", "D"]  # ties (A and B both ready) in graph order: B comes first there
    for pos, k in enumerate(g.order):
        assert all(g.order.index(g.producer_id[t]) < pos for t in g.nodes[k].input if t in g.producer_id)


def test_kahn_order_ties_by_key_and_cycles_last():
    assert kahn_order([set(), set(), {0, 1}]) == [0, 1, 2]
    assert kahn_order([set(), set(), {0, 1}], key=lambda i: -i) == [1, 0, 2]
    assert kahn_order([{1}, {0}, set(), {2}]) == [2, 3, 0, 1]  # 0 and 1 wait on each other: last, by index
    assert kahn_order([{0}]) == [0]  # a node reading its own output is no dependency


def test_folding_reaches_what_only_constants_feed_in_topological_order():
    nodes = [helper.make_node("Add", ["x", "wt"], ["y"], name="use"),         # the reader first (out of order)
             helper.make_node("Transpose", ["wc"], ["wt"], name="t"),
             helper.make_node("Cast", ["c"], ["wc"], name="cast", to=F),
             _const("c", np.ones((3, 3))),
             helper.make_node("RandomNormal", [], ["r"], name="rand", shape=[3]),
             helper.make_node("Mul", ["w", "w"], ["ww"], name="ww")]
    g = GraphIndex(_model(nodes, outputs=("y", "r", "ww"), inits=[_w("w")]))
    fold = g.folding()
    assert isinstance(fold, Folding)
    assert [g.nodes[k].name for k in fold.nodes] == ["const_c", "cast", "t", "rand", "ww"]
    assert fold.tensors == {"w", "c", "wc", "wt", "r", "ww"} and "y" not in fold.tensors
    no_random = g.folding(lambda n: n.op_type != "RandomNormal")
    assert "r" not in no_random.tensors and "wt" in no_random.tensors
    assert g.folding() is fold  # kept per predicate


def _if_model():
    """``y = If(cond) then Relu(a) else Neg(a)``: ``a`` is read inside both branches (outer scope)."""
    then = helper.make_graph([helper.make_node("Relu", ["a"], ["t"], name="in_then")], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="in_else")], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other),
             helper.make_node("Abs", ["x"], ["a"], name="abs")]  # the If first: it reads ``a`` from its bodies
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2]), cond],
                          [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraph_reads_count_in_scoped_consumers_and_in_the_order():
    g = GraphIndex(_if_model())
    assert "a" not in g.consumer_ids  # main-graph readers only
    # in the If's attribute order (helper.make_node sorts them by name: else_branch, then_branch)
    assert [(n.name, i) for n, i in g.scoped_consumers["a"]] == [("in_else", 0), ("in_then", 0)]
    assert [(n.name, i) for n, i in g.scoped_consumers["cond"]] == [("if", 0)]
    assert [g.nodes[k].name for k in g.order] == ["abs", "if"]  # the If waits for ``a``
    assert [g.nodes[k].name for k in g.folding().nodes] == []


def test_an_external_data_model_is_indexed_without_its_data_file(tmp_path, monkeypatch):
    """Weights in an external file (models over 2 GB): the index reads names, dims and types only.
    The data file is deleted before the index is built, and value readers fail if anything calls them."""
    nodes = [_const("c", [1.0, 2.0, 3.0]), helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "c"], ["a"], name="add"),
             helper.make_node("Gemm", ["a", "w2"], ["y"], name="gemm", transB=1)]
    m = _model(nodes, inits=[_w("w", (3, 64)), _w("w2", (16, 64))])
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.data", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    (tmp_path / "model.data").unlink()

    def refuse(*a, **k):
        raise AssertionError("a tensor's values were read")

    monkeypatch.setattr(numpy_helper, "to_array", refuse)
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_tensor", refuse)
    g = GraphIndex(proto)
    for view in ("producer", "consumers", "data_consumer_ids", "scoped_consumers", "consts", "const_tensors", "order"):
        getattr(g, view)
    assert g.const_dims("w") == (3, 64) and g.const_dims("w2") == (16, 64)
    assert g.folding().tensors >= {"w", "w2", "c"} and "m" not in g.folding().tensors
    assert g.activations(g.producer["y"]) == [0] and g.producer_id["y"] == 3
    for t in proto.graph.initializer:  # still unread: external, without values
        assert t.data_location == TensorProto.EXTERNAL and not t.raw_data


@pytest.mark.parametrize("op", sorted(SHAPE_READERS))
def test_shape_readers_are_consumers_but_not_data_consumers(op):
    g = GraphIndex(_model([helper.make_node(op, ["x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])],
                          outputs=("y", "s")))
    assert g.consumer_ids["x"] == [0, 1] and g.data_consumer_ids["x"] == [1]
