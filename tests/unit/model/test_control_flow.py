"""Compute inside If/Loop subgraphs (issue 10): the inventory lists those layers with
subgraph-qualified names and keeps them FP32 with the reason shown; the compiler leaves them
untouched and builds the rest; ranking and sensitivity refuse with a specific message when
nothing is INT8-eligible outside control flow, and rank the main graph otherwise."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.measure.runs import build_and_measure
from core.project import open_project
from core.quant.calibration import calibrate
from core.quant.compile import compile_policy
from core.quant.policy import policy_from_dict, uniform_policy
from core.sensitivity import rank_layers, sensitivity
from core.workspace import Workspace

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _if_model(head: bool, pre: bool = False) -> onnx.ModelProto:
    """x[N,8] (→ MatMul ``pre``) → If(sum(x) > 0: MatMul W1 + Relu | MatMul W2) → [N,4] (→ Gemm
    ``head`` → [N,3]). The branches read x (or pre's output) from the outer scope."""
    xin = "xp" if pre else "x"
    then_g = helper.make_graph(
        [helper.make_node("MatMul", [xin, "W1"], ["t_mm"], name="then_mm"),
         helper.make_node("Relu", ["t_mm"], ["t_out"], name="then_relu")],
        "then", [], [helper.make_tensor_value_info("t_out", F, ["N", 4])])
    else_g = helper.make_graph(
        [helper.make_node("MatMul", [xin, "W2"], ["e_out"], name="else_mm")],
        "else", [], [helper.make_tensor_value_info("e_out", F, ["N", 4])])
    nodes = [helper.make_node("MatMul", ["x", "Wp"], ["xp"], name="pre")] if pre else []
    nodes += [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["branch"], name="choose", then_branch=then_g, else_branch=else_g)]
    inits = [_w("W1", 8, 4), _w("W2", 8, 4), numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    inits += [_w("Wp", 8, 8)] if pre else []
    out = "branch"
    if head:
        nodes.append(helper.make_node("Gemm", ["branch", "Wh", "bh"], ["y"], name="head"))
        inits += [_w("Wh", 4, 3), _w("bh", 3)]
        out = "y"
    g = helper.make_graph(nodes, "if_model", [helper.make_tensor_value_info("x", F, ["N", 8])],
                          [helper.make_tensor_value_info(out, F, ["N", 3 if head else 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _loop_model(stem: bool) -> onnx.ModelProto:
    """x[N,8] (→ stem MatMul with ``stem``) → Loop 3×: h = tanh(h·W) → [N,8]."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["mm"], name="step_mm"),
         helper.make_node("Tanh", ["mm"], ["h_out"], name="step_tanh"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="keep_going")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, ["N", 8])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", F, ["N", 8])])
    nodes, h0 = [], "x"
    inits = [_w("W", 8, 8), numpy_helper.from_array(np.array(3, np.int64), "M"),
             numpy_helper.from_array(np.array(True), "cond")]
    if stem:
        nodes.append(helper.make_node("MatMul", ["x", "Ws"], ["h0"], name="stem"))
        inits.append(_w("Ws", 8, 8))
        h0 = "h0"
    nodes.append(helper.make_node("Loop", ["M", "cond", h0], ["y"], name="loop_0", body=body))
    g = helper.make_graph(nodes, "loop_model", [helper.make_tensor_value_info("x", F, ["N", 8])],
                          [helper.make_tensor_value_info("y", F, ["N", 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _project(tmp_path, proto, name):
    onnx.checker.check_model(proto)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(proto.SerializeToString())
    return open_project(str(path), ws=Workspace(tmp_path / "ws"))


def _run(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def test_inventory_lists_loop_body_layers(tmp_path):
    p = _project(tmp_path, _loop_model(stem=False), "loop")
    by = {l.name: l for l in p.layers}
    assert set(by) == {"loop_0/body/step_mm", "loop_0/body/step_tanh"}
    mm = by["loop_0/body/step_mm"]
    assert mm.subgraph == "loop_0/body" and not mm.eligible and mm.default_precision == "fp32"
    assert mm.reason == "inside control flow (Loop body): kept FP32"
    assert mm.macs == p.input_shapes["x"][0] * 8 * 8  # one execution of the body
    inv = p.inventory()
    assert {"reason", "subgraph"} <= set(inv.columns)
    assert (inv.reason == "inside control flow (Loop body): kept FP32").all()
    assert set(p.default_policy().layers.values()) == {"fp32"}


def test_inventory_lists_if_branch_layers(tmp_path):
    p = _project(tmp_path, _if_model(head=True), "if")
    by = {l.name: l for l in p.layers}
    assert by["choose/then_branch/then_mm"].subgraph == "choose/then_branch"
    assert by["choose/else_branch/else_mm"].reason == "inside control flow (If else_branch): kept FP32"
    assert by["head"].eligible and by["head"].subgraph is None and by["head"].reason == ""
    assert sum(l.eligible for l in p.layers) == 1


@pytest.mark.parametrize("make", [lambda: _if_model(head=False), lambda: _loop_model(stem=True)])
def test_fp32_and_default_builds_reproduce_outputs(tmp_path, make):
    proto = make()
    p = _project(tmp_path, proto, "cf")
    feeds = p.eval_data.batches(1)[:4]
    ref = _run(proto, feeds)
    compiled = compile_policy(p.model, uniform_policy(p.model, p.layers, "fp32"))
    out = _run(compiled.proto, feeds)
    assert np.max(np.abs(ref - out)) <= 1e-5 * max(1.0, float(np.abs(ref).max()))
    r = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=3, profile_iterations=1)
    assert r.quality.cosine_mean > 0.99


@pytest.mark.parametrize("make", [lambda: _loop_model(stem=True), lambda: _if_model(head=True, pre=True)])
def test_fp16_and_int8_around_control_flow_compile(tmp_path, make):
    """The main graph's layers change precision; the subgraphs stay float32 (outer-scope tensors
    they read get float32 versions) and the model still type-checks and runs."""
    p = _project(tmp_path, make(), "cf")
    feeds = p.eval_data.batches(1)[:4]
    ref = _run(p.model.proto, feeds)
    inside = {l.name for l in p.layers if l.subgraph}
    bodies = sorted(n.op_type for n in p.model.proto.graph.node for a in n.attribute for n in a.g.node)
    for target in ("ort", "trt"):
        pol = uniform_policy(p.model, p.layers, "fp16")
        assert inside and all(pol.layers[n] == "fp32" for n in inside)
        compiled = compile_policy(p.model, pol, target=target)
        onnx.shape_inference.infer_shapes(compiled.proto, strict_mode=True)  # types agree, subgraphs included
        cf = [n for n in compiled.proto.graph.node if n.op_type in ("If", "Loop")]
        assert sorted(n.op_type for n in cf for a in n.attribute for n in a.g.node) == bodies  # untouched
        if target == "ort":
            assert np.max(np.abs(ref - _run(compiled.proto, feeds))) < 2e-2
    pol = uniform_policy(p.model, p.layers, "int8")
    assert {n for n, v in pol.layers.items() if v == "int8"} == {l.name for l in p.layers if l.eligible} != set()
    calib = calibrate(p.model, p.calib_data, pol.calibration, p.ws)
    out = _run(compile_policy(p.model, pol, calib).proto, feeds)
    assert np.max(np.abs(ref - out)) < 0.1 * max(1.0, float(np.abs(ref).max()))


def test_policy_for_subgraph_layers_must_be_fp32(tmp_path):
    p = _project(tmp_path, _loop_model(stem=True), "loop_stem")
    doc = p.default_policy().to_dict()
    doc["layers"]["loop_0/body/step_mm"] = "fp32"
    assert policy_from_dict(doc, p.model, p.layers).layers["loop_0/body/step_mm"] == "fp32"
    for prec in ("fp16", "int8"):
        doc["layers"]["loop_0/body/step_mm"] = prec
        with pytest.raises(MixprecError) as e:
            policy_from_dict(doc, p.model, p.layers)
        assert f"loop_0/body/step_mm: {prec} is not possible, the layer is inside control flow (Loop body)" in str(e.value)


def test_rank_refuses_when_nothing_is_eligible_outside_control_flow(tmp_path):
    p = _project(tmp_path, _loop_model(stem=False), "loop")
    for call in (lambda: rank_layers(p), lambda: sensitivity(p)):
        with pytest.raises(MixprecError) as e:
            call()
        assert "has no INT8-eligible layer outside control flow" in e.value.what and e.value.fix


def test_rank_works_on_the_main_graph(tmp_path):
    p = _project(tmp_path, _if_model(head=True), "if")
    table = rank_layers(p, max_samples=4).table.set_index("name")
    assert set(table.index) == {"sum", "head"}  # the main graph's layers; the branches are not marked
    assert table.at["head", "eligible"] and table.at["head", "precision"] == "int8" and table.at["head", "cosine"] > 0.9
