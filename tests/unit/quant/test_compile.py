"""Compiler: exact FP32, FP16 numerics, TensorRT's explicit-quantization format, ORT encoding."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from core.errors import MixprecError
from core.measure.metrics import cosine_rows
from core.quant.calibration import calibrate
from core.quant.compile import compile_policy
from core.quant.policy import uniform_policy
from tests.fixtures.models import run_model


def _outputs(project, policy, target="ort", n=16):
    calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws) \
        if "int8" in policy.layers.values() else None
    compiled = compile_policy(project.model, policy, calib, target=target)
    feeds = project.eval_data.batches(1)[:n]
    return run_model(project.model.proto, feeds), run_model(compiled.proto, feeds), compiled


@pytest.mark.parametrize("name", ["minilm", "tiny_cnn", "tiny_transformer"])
def test_all_fp32_is_exact(name, request):
    project = request.getfixturevalue(name)
    ref, out, compiled = _outputs(project, uniform_policy(project.model, project.layers, "fp32"))
    assert np.max(np.abs(ref - out)) <= 1e-5
    original = sum(n.op_type in ("Cast", "QuantizeLinear", "DequantizeLinear") for n in project.model.nodes)
    assert compiled.conversion_nodes == original  # nothing added


def test_all_fp16_minilm(minilm):
    ref, out, compiled = _outputs(minilm, uniform_policy(minilm.model, minilm.layers, "fp16"))
    cos = cosine_rows(ref.astype(np.float64), out.astype(np.float64))
    assert cos.mean() >= 0.999
    assert np.max(np.abs(ref - out)) > 0  # the fp16 rounding really happens
    assert compiled.op_counts["Cast"] > 0


def test_trt_target_is_explicit_quantization(tiny_cnn):
    pol = tiny_cnn.default_policy().with_layers({"/conv3/Conv": "fp16"})
    calib = calibrate(tiny_cnn.model, tiny_cnn.calib_data, pol.calibration, tiny_cnn.ws)
    proto = compile_policy(tiny_cnn.model, pol, calib, target="trt").proto
    onnx.checker.check_model(proto, full_check=True)
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    nodes = {n.name: n for n in proto.graph.node}
    q = nodes["/conv1/Conv/x0/QuantizeLinear"]
    assert inits[q.input[2]].dtype == np.int8 and inits[q.input[2]] == 0  # symmetric int8, zero point 0
    dq_w = nodes["/conv1/Conv/w1/DequantizeLinear"]
    w_q, w_scale = inits[dq_w.input[0]], inits[dq_w.input[1]]
    assert w_q.dtype == np.int8 and w_scale.shape == (8,)  # per output channel
    assert next(a.i for a in dq_w.attribute if a.name == "axis") == 0
    assert np.abs(w_q).max() == 127
    w = numpy_helper.to_array(next(i for i in tiny_cnn.model.proto.graph.initializer
                                   if i.name == dq_w.input[0].replace("__int8", "")))
    assert np.allclose(w_q * w_scale[:, None, None, None], w, atol=w_scale.max() / 2 + 1e-7)
    conv3 = nodes["/conv3/Conv"]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.value_info}
    assert inits[conv3.input[1]].dtype == np.float16  # fp16 weights
    assert any(n.op_type == "Cast" and n.output[0] == conv3.input[0] for n in proto.graph.node)
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert types.get(conv3.output[0], onnx.TensorProto.FLOAT16) == onnx.TensorProto.FLOAT16


def test_ort_target_uses_uint8_128_and_matches_int8_grid(tiny_cnn):
    pol = tiny_cnn.default_policy()
    calib = calibrate(tiny_cnn.model, tiny_cnn.calib_data, pol.calibration, tiny_cnn.ws)
    ort_p = compile_policy(tiny_cnn.model, pol, calib, target="ort").proto
    trt_p = compile_policy(tiny_cnn.model, pol, calib, target="trt").proto
    zp = next(numpy_helper.to_array(i) for i in ort_p.graph.initializer if i.name == "/conv1/Conv/x0_zero_point")
    assert zp.dtype == np.uint8 and int(zp) == 128
    feeds = tiny_cnn.eval_data.batches(1)[:8]
    a, b = run_model(ort_p, feeds), run_model(trt_p, feeds)
    assert np.max(np.abs(a - b)) < 1e-4  # same grid: uint8 zp 128 == int8 zp 0


def test_int8_requires_calibration_range(tiny_cnn):
    pol = tiny_cnn.default_policy()
    with pytest.raises(MixprecError, match="no calibration was given"):
        compile_policy(tiny_cnn.model, pol, None)


def test_policy_for_other_model_refused(tiny_cnn, tiny_transformer):
    with pytest.raises(MixprecError, match="made for another model"):
        compile_policy(tiny_cnn.model, tiny_transformer.default_policy())


def test_trt_target_runs_and_is_close(minilm):
    ref, out, compiled = _outputs(minilm, minilm.default_policy(), target="trt", n=8)
    assert cosine_rows(ref.astype(np.float64), out.astype(np.float64)).mean() > 0.95
    # one QuantizeLinear per quantized tensor: 48 MatMuls have 60 activation inputs, and Q, K and V
    # of each of the 6 layers read the same LayerNorm output (60 - 6 * 2 = 48)
    assert compiled.op_counts["QuantizeLinear"] == 48
    assert compiled.op_counts["DequantizeLinear"] == 60 + 36  # one per activation input, one per weight (36 MatMuls)
    proto = compiled.proto
    q_of_ln = [n for n in proto.graph.node if n.op_type == "QuantizeLinear" and "layer.0/attention/self/query" in n.name]
    consumers = [n.name for n in proto.graph.node if q_of_ln[0].output[0] in n.input]
    assert sorted(consumers) == sorted(f"/encoder/layer.0/attention/self/{k}/MatMul/x0/DequantizeLinear"
                                       for k in ("query", "key", "value"))


def _probe_native_fp16(op):
    """Profile a one-node float16 model: ORT names the casts it inserts InsertedPrecisionFreeCast_*."""
    import json

    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper

    shape = [1, 8, 16]
    extra = {"LayerNormalization": [np.ones(16, np.float16), np.zeros(16, np.float16)],
             "MatMul": [np.ones((16, 16), np.float16)], "Add": [np.ones(16, np.float16)],
             "Mul": [np.ones(16, np.float16)], "Div": [np.full(16, 2, np.float16)]}.get(op, [])
    inits = [numpy_helper.from_array(a, f"c{i}") for i, a in enumerate(extra)]
    attrs = {"axis": -1} if op in ("LayerNormalization", "Softmax") else {}
    node = helper.make_node(op, ["x", *[i.name for i in inits]], ["y"], name="n", **attrs)
    x_type, feed = T.FLOAT16, np.ones(shape, np.float16)
    if op == "Gather":  # a float16 table indexed by int64 ids (an embedding)
        inits = [numpy_helper.from_array(np.ones((32, 16), np.float16), "table")]
        node = helper.make_node("Gather", ["table", "x"], ["y"], name="n")
        x_type, feed = T.INT64, np.ones((1, 8), np.int64)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, None)],
                          [helper.make_tensor_value_info("y", T.FLOAT16, None)], inits)
    so = ort.SessionOptions()
    so.enable_profiling, so.log_severity_level = True, 3
    s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                             so, providers=["CPUExecutionProvider"])
    s.run(None, {"x": feed})
    events = json.loads(open(s.end_profiling()).read())
    return not any("InsertedPrecisionFreeCast" in e.get("name", "") for e in events)


@pytest.mark.parametrize("op", ["LayerNormalization", "Softmax", "MatMul", "Add", "Mul", "Div", "Erf", "Relu", "Gather"])
def test_ort_fp16_kernel_table(op, tmp_path, monkeypatch):
    from core.quant.compile import ORT_CPU_FP16_KERNELS

    monkeypatch.chdir(tmp_path)  # the profiler writes its trace to the working folder
    assert _probe_native_fp16(op) == (op in ORT_CPU_FP16_KERNELS), (
        f"ORT's CPU float16 support for {op} changed: update ORT_CPU_FP16_KERNELS in core/quant/compile.py")


def test_ort_target_runs_layernorm_in_real_fp16(tiny_transformer):
    proto = compile_policy(tiny_transformer.model, uniform_policy(tiny_transformer.model, tiny_transformer.layers,
                                                                  "fp16")).proto
    ln = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    inits = {i.name: i.data_type for i in proto.graph.initializer}
    assert inits[ln.input[1]] == onnx.TensorProto.FLOAT16  # typed: native kernel
    mm = next(n for n in proto.graph.node if n.op_type == "MatMul")
    assert any(n.op_type == "Cast" and n.output[0] == mm.input[0] for n in proto.graph.node)  # simulated


def test_smoothing_moves_scale_into_weights(tiny_transformer):
    from core.quant.calibration import calibrate_policy

    layer = "/ffn/up/MatMul"
    base = tiny_transformer.default_policy()
    pol = base.with_smoothing({layer: 0.75})
    calib = calibrate_policy(tiny_transformer.model, tiny_transformer.calib_data, pol, tiny_transformer.layers,
                             tiny_transformer.ws)
    x = next(l for l in tiny_transformer.layers if l.name == layer).inputs[0]
    assert calib.channels[x].shape == (32,) and (calib.channels[x] > 0).all()
    proto = compile_policy(tiny_transformer.model, pol, calib).proto
    nodes = {n.name: n for n in proto.graph.node}
    mul = nodes[f"{layer}/smooth/Mul"]
    assert nodes[f"{layer}/x0/QuantizeLinear"].input[0] == mul.output[0]
    feeds = tiny_transformer.eval_data.batches(1)[:8]
    ref = run_model(tiny_transformer.model.proto, feeds)
    smoothed = run_model(proto, feeds)
    assert cosine_rows(ref.astype(np.float64), smoothed.astype(np.float64)).min() > 0.999
    with pytest.raises(MixprecError, match="per-channel statistics"):
        compile_policy(tiny_transformer.model, pol, calibrate(tiny_transformer.model, tiny_transformer.calib_data,
                                                              pol.calibration, tiny_transformer.ws))


def test_int8_outputs_option_quantizes_layer_outputs(tiny_cnn):
    """The analysis option behind bench/bench_int8_outputs.py: Q/DQ after every INT8 layer's
    output (int8 zero point 0 for TensorRT), the graph's outputs keeping their names."""
    from core.quant.calibration import calibrate

    pol = tiny_cnn.default_policy()
    calib = calibrate(tiny_cnn.model, tiny_cnn.calib_data, pol.calibration, tiny_cnn.ws)
    plain = compile_policy(tiny_cnn.model, pol, calib, target="trt")
    out = compile_policy(tiny_cnn.model, pol, calib, target="trt", int8_outputs=True)
    n_int8 = sum(p == "int8" for p in pol.layers.values())
    assert out.op_counts["QuantizeLinear"] == plain.op_counts["QuantizeLinear"] + n_int8
    nodes = {n.name: n for n in out.proto.graph.node}
    q = nodes["/conv1/Conv/y/QuantizeLinear"]
    assert q.input[0] == nodes["/conv1/Conv"].output[0]
    zp = next(i for i in out.proto.graph.initializer if i.name == "/conv1/Conv/y_zero_point")
    assert zp.data_type == onnx.TensorProto.INT8
    assert [o.name for o in out.proto.graph.output] == [o.name for o in tiny_cnn.model.proto.graph.output]


def test_an_fp16_embedding_is_stored_as_float16_on_the_ort_target(minilm, monkeypatch):
    """Issue 21 §2: ORT's CPU Gather has a float16 kernel, so an FP16 embedding table is stored as float16
    (not as a float16-rounded float32 copy: half the bytes) and the gathered rows are the same values."""
    import core.quant.compile as compile_mod

    policy = minilm.default_policy()  # embeddings FP16
    gathers = [l.name for l in minilm.layers if l.op_type == "Gather" and policy.layers.get(l.name) == "fp16"]
    assert gathers
    ref, out, compiled = _outputs(minilm, policy, n=4)
    inits = {i.name: i for i in compiled.proto.graph.initializer}
    node = next(n for n in compiled.proto.graph.node if n.name == gathers[0])
    assert inits[node.input[0]].data_type == onnx.TensorProto.FLOAT16
    monkeypatch.setattr(compile_mod, "ORT_CPU_FP16_KERNELS", frozenset({"LayerNormalization"}))
    _, simulated, before = _outputs(minilm, policy, n=4)  # the former encoding: a rounded float32 table
    node = next(n for n in before.proto.graph.node if n.name == gathers[0])
    assert {i.name: i for i in before.proto.graph.initializer}[node.input[0]].data_type == onnx.TensorProto.FLOAT
    np.testing.assert_array_equal(out, simulated)
