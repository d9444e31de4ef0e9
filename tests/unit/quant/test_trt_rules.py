"""TensorRT's explicit-quantization rules (core/quant/trt_rules.py), checked on what the compiler really
writes for the ``trt`` target: every bundled sample and the real-model classes (NHWC convs behind
Transposes, Gemm with transB 0/1, ConvTranspose, opset 11 through normalisation, Constant weights),
each under the default, an all-INT8 and a mixed policy. Hand-made models that break each rule show
that the checker names it."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.project import open_project
from core.quant.calibration import calibrate, calibrate_policy
from core.quant.compile import compile_policy
from core.quant.policy import uniform_policy
from core.quant.trt_rules import RULES, assert_trt_rules, check_explicit_quantization
from core.workspace import Workspace

RNG = np.random.default_rng(11)


def _policies(project):
    """default, all-INT8, and mixed (every other INT8-eligible layer and every third other layer fp16)."""
    default = project.default_policy()
    eligible = [l.name for l in project.layers if l.eligible and l.subgraph is None]
    others = [l.name for l in project.layers if not l.eligible and l.subgraph is None]
    mixed = default.with_layers({**{n: "fp16" for n in eligible[1::2]}, **{n: "fp16" for n in others[::3]}})
    return {"default": default, "int8": uniform_policy(project.model, project.layers, "int8"), "mixed": mixed}


def _compile_all(project, **kw):
    """{policy name: compiled trt proto}; one calibration shared by the three policies."""
    calib = calibrate(project.model, project.calib_data, project.default_policy().calibration, project.ws)
    out = {}
    for name, pol in _policies(project).items():
        assert "int8" in pol.layers.values(), name
        out[name] = compile_policy(project.model, pol, calib, target="trt", **kw).proto
    return out


def _assert_clean(protos):
    found = {name: [str(v) for v in check_explicit_quantization(p)] for name, p in protos.items()}
    assert all(not v for v in found.values()), found
    for p in protos.values():
        assert_trt_rules(p)  # does not raise


# --- the bundled samples ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["minilm", "tiny_cnn", "tiny_transformer"])
def test_samples_follow_the_rules(name, request):
    project = request.getfixturevalue(name)
    protos = _compile_all(project)
    _assert_clean(protos)
    counts = {k: sum(n.op_type == "QuantizeLinear" for n in p.graph.node) for k, p in protos.items()}
    assert all(c > 0 for c in counts.values()), counts  # the rules were really exercised
    assert sum(n.op_type == "Cast" for n in protos["mixed"].graph.node) > 0


def test_int8_outputs_follow_the_rules(tiny_cnn, tiny_transformer):
    """The analysis option that also quantizes INT8 layers' outputs keeps Q/DQ pairs."""
    _assert_clean(_compile_all(tiny_cnn, int8_outputs=True))
    _assert_clean(_compile_all(tiny_transformer, int8_outputs=True))


# --- the real-model classes, built in code ----------------------------------------------------------

def _t(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, x_shape, y_shape, inits=(), opset=17, ir=8):
    g = helper.make_graph(nodes, "g", [_vi("x", x_shape)], [_vi("y", y_shape)], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def _nhwc_conv():
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="to_nchw", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2_dw", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c2"], ["ct"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["ct", "wm"], ["y"], name="head")]
    return _model(nodes, ["N", 8, 8, 3], ["N", 8, 8, 5],
                  [_t("w1", 4, 3, 3, 3), _t("b1", 4), _t("w2", 4, 1, 3, 3), _t("wm", 4, 5)]), (8, 8, 3)


def _gemms():
    nodes = [helper.make_node("Gemm", ["x", "g1", "gb1"], ["h"], name="fc_transB1", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "g2"], ["y"], name="fc_transB0", transB=0, alpha=0.5)]
    return _model(nodes, ["N", 6], ["N", 3], [_t("g1", 5, 6), _t("gb1", 5), _t("g2", 5, 3)]), (6,)


def _conv_transpose():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["y"], name="deconv", strides=[2, 2])]
    return _model(nodes, ["N", 3, 8, 8], ["N", 2, 16, 16],
                  [_t("w1", 4, 3, 3, 3), _t("wt", 4, 2, 2, 2), _t("bt", 2)]), (3, 8, 8)


def _opset11():
    """Opset 11 (Softmax's 2-D semantics, Unsqueeze axes as attribute): normalisation upgrades it to 13."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["gp"], name="gap"),
             helper.make_node("Flatten", ["gp"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="fc", transB=1),
             helper.make_node("Softmax", ["g"], ["s"], name="softmax", axis=1),
             helper.make_node("Unsqueeze", ["s"], ["u"], name="unsq", axes=[1]),
             helper.make_node("MatMul", ["u", "wm"], ["y"], name="proj")]
    return _model(nodes, ["N", 3, 8, 8], ["N", 1, 4],
                  [_t("w1", 4, 3, 3, 3), _t("b1", 4), _t("wg", 6, 4), _t("bg", 6), _t("wm", 6, 4)],
                  opset=11, ir=6), (3, 8, 8)


def _constant_weights():
    """Weights from Constant nodes (one through a Transpose, one through a Cast from float16)."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g0 = RNG.standard_normal((6, 4)).astype(np.float32)
    m16 = RNG.standard_normal((6, 5)).astype(np.float16)
    nodes = [helper.make_node("Constant", [], ["cw"], name="const_cw", value=numpy_helper.from_array(w)),
             helper.make_node("Constant", [], ["g0"], name="const_g0", value=numpy_helper.from_array(g0)),
             helper.make_node("Transpose", ["g0"], ["gw"], name="transpose_g0", perm=[1, 0]),
             helper.make_node("Constant", [], ["m16"], name="const_m16", value=numpy_helper.from_array(m16)),
             helper.make_node("Cast", ["m16"], ["mw"], name="cast_m16", to=TensorProto.FLOAT),
             helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["gp"], name="gap"),
             helper.make_node("Flatten", ["gp"], ["fl"], name="flat"),
             helper.make_node("Gemm", ["fl", "gw"], ["gm"], name="fc_plain"),
             helper.make_node("MatMul", ["gm", "mw"], ["y"], name="proj")]
    return _model(nodes, ["N", 3, 8, 8], ["N", 5]), (3, 8, 8)


def _project(builder, tmp_path):
    model, shape = builder()
    path = tmp_path / f"{builder.__name__.strip('_')}.onnx"
    onnx.save(model, path)
    data = tmp_path / "data.npz"
    np.savez(data, x=RNG.standard_normal((16, *shape)).astype(np.float32))
    return open_project(str(path), data=str(data), ws=Workspace(tmp_path / "ws"))


@pytest.mark.parametrize("builder", [_nhwc_conv, _gemms, _conv_transpose, _opset11, _constant_weights])
def test_real_model_classes_follow_the_rules(builder, tmp_path):
    project = _project(builder, tmp_path)
    protos = _compile_all(project)
    _assert_clean(protos)
    axes = {}  # per-channel weights: the axis each MAC layer's weight DequantizeLinear uses
    g = protos["int8"].graph
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.name.endswith("/w1/DequantizeLinear"):
            axes[n.name.split("/w1/")[0]] = next((a.i for a in n.attribute if a.name == "axis"), None)
    assert axes, "no per-channel weights: the checker saw nothing"
    expected = {"conv1": 0, "conv2_dw": 0, "head": 1, "fc_transB1": 0, "fc_transB0": 1, "conv": 0, "deconv": 1,
                "fc": 0, "fc_plain": 1, "proj": 1}
    assert axes == {k: expected[k] for k in axes}
    assert all(o.version >= 13 for o in protos["int8"].opset_import if o.domain in ("", "ai.onnx"))


def _tied_weights():
    """One initializer used by a Gemm with transB=1 (output channels on axis 0), a MatMul (axis 1)
    and, as the left operand, a MatMul (per tensor)."""
    nodes = [helper.make_node("Gemm", ["x", "W"], ["a"], name="fc_tied", transB=1),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W"], ["b"], name="mm_tied"),
             helper.make_node("MatMul", ["W", "b"], ["y"], name="mm_left")]
    return _model(nodes, [6, 6], [6, 6], [_t("W", 6, 6)]), (6,)


def _dequantized(proto, dq):
    arr = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    q, scale = arr[dq.input[0]].astype(np.float32), arr[dq.input[1]]
    axis = next((a.i for a in dq.attribute if a.name == "axis"), None)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
    return q * scale, float(scale.max())


def test_tied_weights_dequantize_to_the_original(tmp_path):
    """Semantics, not structure: every weight DequantizeLinear gives back its layer's own weight
    (within half a quantization step), also when layers quantize one weight along different axes."""
    model, shape = _tied_weights()
    onnx.save(model, tmp_path / "tied.onnx")
    np.savez(tmp_path / "data.npz", x=RNG.standard_normal((16, *shape)).astype(np.float32))
    project = open_project(str(tmp_path / "tied.onnx"), data=str(tmp_path / "data.npz"), ws=Workspace(tmp_path / "ws"))
    protos = _compile_all(project)
    _assert_clean(protos)
    w = numpy_helper.to_array(model.graph.initializer[0])
    proto = protos["int8"]
    checked = 0
    for dq in (n for n in proto.graph.node if n.op_type == "DequantizeLinear" and "/w" in n.name):
        deq, step = _dequantized(proto, dq)
        assert np.abs(deq - w).max() <= step / 2 + 1e-6, dq.name
        checked += 1
    assert checked == 3


def test_tied_smoothed_weights_are_per_layer(tmp_path):
    """Two smoothed INT8 MatMuls sharing one weight: each layer's dequantized weight, unsmoothed by
    its own scale, gives back the shared weight (they used to share one smoothed copy)."""
    k = numpy_helper.from_array(np.array([10, 1, 1, 1, 1, 0.1], np.float32), "k")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
             helper.make_node("Mul", ["a", "k"], ["r"], name="spread"),
             helper.make_node("MatMul", ["r", "W"], ["y"], name="mm2")]
    model = _model(nodes, ["N", 6], ["N", 6], [_t("W", 6, 6), k])
    onnx.save(model, tmp_path / "tied.onnx")
    np.savez(tmp_path / "data.npz", x=RNG.standard_normal((32, 6)).astype(np.float32))
    project = open_project(str(tmp_path / "tied.onnx"), data=str(tmp_path / "data.npz"), ws=Workspace(tmp_path / "ws"))
    pol = uniform_policy(project.model, project.layers, "int8").with_smoothing({"mm1": 0.5, "mm2": 0.5})
    proto = compile_policy(project.model, pol, calibrate_policy(project.model, project.calib_data, pol, project.layers,
                                                                project.ws), target="trt").proto
    assert check_explicit_quantization(proto) == []
    w = numpy_helper.to_array(model.graph.initializer[0])
    arr = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    nodes = {n.name: n for n in proto.graph.node}
    for layer in ("mm1", "mm2"):
        deq, step = _dequantized(proto, nodes[f"{layer}/w1/DequantizeLinear"])
        s = 1.0 / arr[f"{layer}/smooth_inv_scale"]
        assert np.abs(deq / s[:, None] - w).max() <= (step / 2 + 1e-6) / s.min(), layer


def test_fp16_graph_output_read_inside_the_graph(tmp_path):
    """An FP16 layer's output that is also a graph output (MiniLM-L3's last LayerNorm): the graph
    output is cast back to float32, and the layers inside keep reading the float16 tensor. They used
    to read the float32 output: an FP16 MatMul then met float16 weights with a float32 input (ONNX
    Runtime refused the model) and the FP32 consumer got a float32 → float32 Cast."""
    inits = [numpy_helper.from_array(np.ones(6, np.float32), "g"),
             numpy_helper.from_array(np.zeros(6, np.float32), "b"), _t("W", 6, 6), _t("W2", 6, 6)]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "W"], ["z"], name="mm16"),
             helper.make_node("MatMul", ["ln", "W2"], ["z2"], name="mm32")]
    graph = helper.make_graph(nodes, "g", [_vi("x", ["N", 6])], [_vi(n, ["N", 6]) for n in ("ln", "z", "z2")], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    np.savez(tmp_path / "data.npz", x=RNG.standard_normal((16, 6)).astype(np.float32))
    project = open_project(str(tmp_path / "m.onnx"), data=str(tmp_path / "data.npz"), ws=Workspace(tmp_path / "ws"))
    for pol in (uniform_policy(project.model, project.layers, "fp16").with_layers({"mm32": "fp32"}),
                project.default_policy().with_layers({"mm16": "fp16"})):
        calib = calibrate(project.model, project.calib_data, pol.calibration, project.ws) \
            if "int8" in pol.layers.values() else None
        proto = compile_policy(project.model, pol, calib, target="trt").proto
        assert check_explicit_quantization(proto) == []
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = ort.InferenceSession(project.model.proto.SerializeToString(), providers=["CPUExecutionProvider"])
        feed = project.eval_data.batches(1)[0]
        for got, want in zip(sess.run(None, feed), ref.run(None, feed)):
            assert got.dtype == np.float32 and np.abs(got - want).max() < 0.05 * max(1.0, np.abs(want).max())


def test_opset11_is_upgraded_before_compiling(tmp_path):
    project = _project(_opset11, tmp_path)
    assert project.model.original_opset == 11 and project.model.opset == 13


REAL_MODEL_SHAPES = {"ppocr-cls": {"x": (1, 3, 48, 192)}, "ppocr-det": {"x": (1, 3, 640, 640)},
                     "ppocr-rec": {"x": (1, 3, 48, 320)}, "nudenet-320n": {"images": (1, 3, 320, 320)}}  # bench's hints
REAL_MODELS = Path(os.environ.get("MIXPREC_BENCH_CACHE", Path.home() / ".cache" / "mixprec-bench-models")) / "models"


@pytest.mark.skipif(not os.environ.get("MIXPREC_TRT_RULES_REAL"),
                    reason="set MIXPREC_TRT_RULES_REAL=1 to check bench/bench_models.py's cached real models (~1 min)")
@pytest.mark.parametrize("path", sorted(REAL_MODELS.glob("*.onnx")) if REAL_MODELS.is_dir() else [],
                         ids=lambda p: p.stem)
def test_real_model_set_follows_the_rules(path, tmp_path):
    """The real-model set (fetched by bench/bench_models.py --fetch-only), on the bench's data where
    it has some (data/<name>.npz in its cache), else generated data; shapes as the bench gives them."""
    data = REAL_MODELS.parent / "data" / f"{path.stem}.npz"
    try:
        project = open_project(str(path), data=str(data) if data.exists() else None, ws=Workspace(tmp_path / "ws"),
                               shapes=REAL_MODEL_SHAPES.get(path.stem))
    except MixprecError as e:  # already quantized, or inputs mixprec cannot invent: not this test's subject
        pytest.skip(str(e)[:120])
    if not any(l.eligible for l in project.layers):
        pytest.skip("no INT8-eligible layer")
    _assert_clean(_compile_all(project))


# --- negative: hand-made Q/DQ models that break one rule each ---------------------------------------

def _arr(name, values, dtype):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _qdq(op="Conv", *, opset=13, x_scale=0.1, x_zp=(0, np.int8), w_axis=None, w_scale=None, w_zp=None,
         transB=0, extra_nodes=(), extra_inits=(), dq_x_scale=None, outputs=("y",)):
    """x → Q → DQ → op(·, DQ(int8 W, per-channel)) → y: valid unless an argument breaks a rule."""
    w_shape = {"Conv": (4, 3, 3, 3), "ConvTranspose": (3, 2, 2, 2), "MatMul": (8, 5),
               "Gemm": (5, 8) if transB else (8, 5)}[op]
    good_axis = {"Conv": 0, "ConvTranspose": 1, "MatMul": 1, "Gemm": 0 if transB else 1}[op]
    axis = good_axis if w_axis is None else w_axis
    n_ch = w_shape[good_axis] if w_scale is None else len(w_scale)
    x_shape = [1, 3, 8, 8] if op.startswith("Conv") else [2, 8]
    inits = [_arr("x_scale", x_scale, np.float32), _arr("dq_x_scale", x_scale if dq_x_scale is None else dq_x_scale,
                                                        np.float32),
             _arr("w_q", RNG.integers(-127, 128, w_shape), np.int8),
             _arr("w_scale", w_scale if w_scale is not None else np.full(n_ch, 0.01), np.float32),
             _arr("w_zp", w_zp if w_zp is not None else np.zeros(n_ch), np.int8), *extra_inits]
    q_in = ["x", "x_scale"]
    if x_zp is not None:
        inits.append(_arr("x_zp", x_zp[0], x_zp[1]))
        q_in.append("x_zp")
    dq_in = ["xq", "dq_x_scale", *q_in[2:]]
    attrs = {"transB": transB} if op == "Gemm" else {}
    nodes = [helper.make_node("QuantizeLinear", q_in, ["xq"], name="x/Q"),
             helper.make_node("DequantizeLinear", dq_in, ["xd"], name="x/DQ"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wd"], name="w/DQ", axis=axis),
             helper.make_node(op, ["xd", "wd"], ["y"], name="layer", **attrs), *extra_nodes]
    g = helper.make_graph(nodes, "g", [_vi("x", x_shape)], [_vi(o, None) for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _rules(proto) -> set[str]:
    return {v.rule for v in check_explicit_quantization(proto)}


@pytest.mark.parametrize("op,transB", [("Conv", 0), ("ConvTranspose", 0), ("MatMul", 0), ("Gemm", 0), ("Gemm", 1)])
def test_valid_hand_made_models_pass(op, transB):
    assert check_explicit_quantization(_qdq(op, transB=transB)) == []


BROKEN = {
    "opset": [dict(opset=11)],
    "zero-point": [dict(x_zp=(3, np.int8)), dict(x_zp=(128, np.uint8)), dict(x_zp=None),
                   dict(w_zp=[0, 0, 1, 0])],
    "scale": [dict(x_scale=0.0), dict(x_scale=-0.1), dict(x_scale=np.inf), dict(x_scale=np.nan),
              dict(w_scale=[0.01, 0.0, 0.01, 0.01])],
    "per-channel-axis": [dict(w_axis=1, w_scale=[0.01] * 3, w_zp=[0] * 3),  # Conv along input channels
                         dict(op="ConvTranspose", w_axis=0, w_scale=[0.01] * 3, w_zp=[0] * 3),
                         dict(op="MatMul", w_axis=0, w_scale=[0.01] * 8, w_zp=[0] * 8),  # along K
                         dict(op="Gemm", transB=1, w_axis=1, w_scale=[0.01] * 8, w_zp=[0] * 8),
                         dict(op="Gemm", transB=0, w_axis=0, w_scale=[0.01] * 8, w_zp=[0] * 8)],
    "scale-length": [dict(w_scale=[0.01] * 3, w_zp=[0] * 3)],
    "q-dq-pair": [dict(dq_x_scale=0.2), dict(outputs=("y", "xq")),
                  dict(extra_nodes=[helper.make_node("Cast", ["xq"], ["xq32"], name="int8_consumer",
                                                     to=TensorProto.FLOAT)], outputs=("y", "xq32"))],
}


@pytest.mark.parametrize("rule,kwargs", [(r, k) for r, ks in BROKEN.items() for k in ks])
def test_broken_model_names_the_rule(rule, kwargs):
    assert rule in _rules(_qdq(**kwargs))


def _graph_model(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_per_channel_activation_quantization_is_refused():
    zp, sc = _arr("zp", [0, 0, 0], np.int8), _arr("sc", [0.1, 0.1, 0.1], np.float32)
    m = _graph_model([helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"], name="Q", axis=1),
                      helper.make_node("DequantizeLinear", ["q", "sc", "zp"], ["y"], name="DQ", axis=1)],
                     [_vi("x", [1, 3, 4, 4])], [_vi("y", None)], [zp, sc])
    assert "per-channel-axis" in _rules(m)


def test_dq_of_an_activation_not_from_a_quantize_is_refused():
    """A DequantizeLinear must read a QuantizeLinear or an int8 constant (here: an int8 graph input)."""
    m = _graph_model([helper.make_node("DequantizeLinear", ["x8", "sc", "zp"], ["y"], name="DQ")],
                     [_vi("x8", [2, 4], TensorProto.INT8)], [_vi("y", None)],
                     [_arr("sc", 0.1, np.float32), _arr("zp", 0, np.int8)])
    assert _rules(m) == {"dq-source"}


def test_scale_must_be_a_float32_constant():
    scale_input = _graph_model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="Q"),
                                helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="DQ")],
                               [_vi("x", [2, 4]), _vi("s", [])], [_vi("y", None)], [_arr("zp", 0, np.int8)])
    assert "scale" in _rules(scale_input)
    fp16_scale = _graph_model([helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["y"], name="DQ")],
                              [], [_vi("y", None)], [_arr("w", [[1, 2]], np.int8), _arr("s", 0.1, np.float16),
                                                     _arr("zp", 0, np.int8)])
    assert "scale" in _rules(fp16_scale)


def test_qdq_on_integer_tensors_is_refused():
    sc, zp = _arr("sc", 0.1, np.float32), _arr("zp", 0, np.int8)
    q_of_int = _graph_model([helper.make_node("Cast", ["x"], ["xi"], name="to_int", to=TensorProto.INT32),
                             helper.make_node("QuantizeLinear", ["xi", "sc", "zp"], ["q"], name="Q"),
                             helper.make_node("DequantizeLinear", ["q", "sc", "zp"], ["y"], name="DQ")],
                            [_vi("x", [2, 4])], [_vi("y", None)], [sc, zp])
    assert "integer-tensor" in _rules(q_of_int)
    bias = _graph_model([helper.make_node("DequantizeLinear", ["b32", "sc", "zp32"], ["y"], name="bias/DQ")],
                        [], [_vi("y", None)], [_arr("b32", [1, 2, 3], np.int32), sc, _arr("zp32", 0, np.int32)])
    assert "integer-tensor" in _rules(bias)


def test_fp16_casts_only_at_float_boundaries():
    def cast_model(src_elem, to):
        return _graph_model([helper.make_node("Cast", ["x"], ["y"], name="boundary", to=to)],
                            [_vi("x", [2, 4], src_elem)], [_vi("y", None, to)])

    assert _rules(cast_model(TensorProto.INT64, TensorProto.FLOAT16)) == {"fp16-cast"}
    assert _rules(cast_model(TensorProto.BOOL, TensorProto.FLOAT16)) == {"fp16-cast"}
    assert _rules(cast_model(TensorProto.FLOAT, TensorProto.FLOAT)) == {"fp16-cast"}  # no-op "cast back"
    assert _rules(cast_model(TensorProto.FLOAT, TensorProto.FLOAT16)) == set()
    assert _rules(cast_model(TensorProto.FLOAT16, TensorProto.FLOAT)) == set()
    assert _rules(cast_model(TensorProto.INT64, TensorProto.FLOAT)) == set()  # the model's own mask cast
    assert _rules(cast_model(TensorProto.DOUBLE, TensorProto.FLOAT)) == set()


def test_mixed_float_types_at_one_node_are_refused():
    """A float32 activation meeting a float16 weight: a strongly typed build refuses it."""
    m = _graph_model([helper.make_node("MatMul", ["x", "w16"], ["y"], name="mm")], [_vi("x", [2, 4])],
                     [_vi("y", None)], [_arr("w16", np.ones((4, 3)), np.float16)])
    assert _rules(m) == {"types"}
    ok = _graph_model([helper.make_node("MatMul", ["x", "w32"], ["y"], name="mm")], [_vi("x", [2, 4])],
                      [_vi("y", None)], [_arr("w32", np.ones((4, 3)), np.float32)])
    assert _rules(ok) == set()


def _placement_qdq(op: str, *, scales=(0.1, 0.1), fused_from="Conv", shared_consumer=False):
    """Hand-made INT8 placement: two conv branches (each x → Q/DQ → Conv) meet at an Add or Concat,
    whose inputs are a dequantized tensor each (``scales``) — or, with ``fused_from``, the first one
    is a float output of that producer (Conv: fusable; Relu: not; ``shared_consumer``: the Conv
    output is read elsewhere too, so TensorRT cannot fuse the Add into it)."""
    inits = [_arr("sx", 0.1, np.float32), _arr("zp", 0, np.int8), _arr("w_q", RNG.integers(-127, 128, (3, 3, 1, 1)),
                                                                       np.int8),
             _arr("w_s", np.full(3, 0.01), np.float32), _arr("w_zp", np.zeros(3), np.int8),
             _arr("s0", scales[0], np.float32), _arr("s1", scales[1], np.float32)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zp"], ["xq"], name="x/Q"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zp"], ["xd"], name="x/DQ"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["wd"], name="w/DQ", axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c0"], name="conv0"),
             helper.make_node("Conv", ["xd", "wd"], ["c1"], name="conv1")]
    outputs = [_vi("y", None)]
    ins = []
    for i, c in enumerate(("c0", "c1")):
        if i == 0 and fused_from:
            if fused_from == "Relu":
                nodes.append(helper.make_node("Relu", [c], ["r0"], name="relu0"))
                c = "r0"
            ins.append(c)
            if shared_consumer:
                outputs.append(_vi(c, None))
            continue
        nodes += [helper.make_node("QuantizeLinear", [c, f"s{i}", "zp"], [f"{c}q"], name=f"{c}/Q"),
                  helper.make_node("DequantizeLinear", [f"{c}q", f"s{i}", "zp"], [f"{c}d"], name=f"{c}/DQ")]
        ins.append(f"{c}d")
    attrs = {"axis": 1} if op == "Concat" else {}
    nodes.append(helper.make_node(op, ins, ["y"], name="placed", **attrs))
    return _graph_model(nodes, [_vi("x", [1, 3, 4, 4])], outputs, inits)


def test_placement_rules():
    """Residual Add: one float input, from a Conv read by the Add only; Concat: one shared scale."""
    assert _rules(_placement_qdq("Add")) == set()  # Conv + Add(skip dequantized): fuses
    assert _rules(_placement_qdq("Add", fused_from=None, scales=(0.1, 0.2))) == set()  # every input quantized
    assert _rules(_placement_qdq("Add", fused_from="Relu")) == {"add-fusion"}
    assert _rules(_placement_qdq("Add", shared_consumer=True)) == {"add-fusion"}
    assert _rules(_placement_qdq("Concat", fused_from=None)) == set()
    assert _rules(_placement_qdq("Concat", fused_from=None, scales=(0.1, 0.2))) == {"concat-scale"}
    assert _rules(_placement_qdq("Concat")) == {"concat-scale"}  # a float input next to a dequantized one


def test_placement_models_follow_the_rules(tmp_path):
    """ResNet-18 and a small CNN with every placement op (Concat, MaxPool, residual Add, GAP), under
    the default, all-INT8 and mixed policies: the INT8 placements are really compiled, and pass."""
    from tests.fixtures.nets import branchy_onnx, resnet18_onnx

    for name, data in (("branchy", branchy_onnx()), ("resnet18", resnet18_onnx(batch=2))):
        (tmp_path / f"{name}.onnx").write_bytes(data)
        project = open_project(str(tmp_path / f"{name}.onnx"), ws=Workspace(tmp_path / "ws"))
        protos = _compile_all(project)
        _assert_clean(protos)
        prod = {o: n.op_type for n in protos["default"].graph.node for o in n.output}
        placed = [n for n in protos["default"].graph.node if n.op_type in ("Add", "Concat", "MaxPool", "GlobalAveragePool")]
        assert placed and all("DequantizeLinear" in [prod.get(i) for i in n.input] for n in placed), name


def test_every_rule_has_a_failing_model():
    covered = set(BROKEN) | {"dq-source", "integer-tensor", "fp16-cast", "types", "concat-scale", "add-fusion"}
    assert covered == set(RULES)


def test_assert_trt_rules_lists_the_violations():
    with pytest.raises(MixprecError, match=r"breaks \d+ of TensorRT's explicit-quantization rules "
                                           r"\(.*zero-point.*\).*\[zero-point\] x/Q") as e:
        assert_trt_rules(_qdq(x_zp=(5, np.int8)))
    assert e.value.fix


def test_the_models_own_casts_are_not_precision_boundaries(tmp_path):
    """A user's no-op float Cast (PyTorch exports them) is the model's, not a boundary the
    compiler made: an all-FP32 and a default trt compile of such a model pass."""
    from onnx import helper as h

    from core.quant.policy import uniform_policy
    from core.project import open_project
    from core.workspace import Workspace

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [h.make_node("Cast", ["x"], ["xc"], name="own_cast", to=TensorProto.FLOAT),
             h.make_node("MatMul", ["xc", "w"], ["y"], name="mm")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w])
    path = tmp_path / "cast.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    p = open_project(path, ws=Workspace(tmp_path / "ws"))
    compile_policy(p.model, uniform_policy(p.model, p.layers, "fp32"), None, target="trt")
    pol = p.default_policy()
    compiled = compile_policy(p.model, pol, calibrate_policy(p.model, p.calib_data, pol, p.layers, p.ws), target="trt")
    assert check_explicit_quantization(compiled.proto, {"own_cast"}) == []
    assert [v.rule for v in check_explicit_quantization(compiled.proto)] == ["fp16-cast"]  # the check itself works
