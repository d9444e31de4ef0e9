"""Normalisation on load (core/model/normalize.py): IR < 4 initializer inputs, opset < 13, constant-node
weights, already-quantized models. Every model is built in code; each loads with its steps recorded
(and still computes what the original computes) or fails with its own message."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import core.model.normalize as normalize
from core.cli.commands import main as cli_main
from core.errors import MixprecError
from core.measure.runs import build_and_measure
from core.model.load import load_model
from core.model.normalize import NormStep, quantized_ops
from core.project import open_project
from core.quant.calibration import calibrate_policy
from core.quant.compile import compile_policy
from core.quant.policy import uniform_policy
from core.workspace import Workspace
from tests.fixtures.models import run_model

RNG = np.random.default_rng(0)


def _t(name, *shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=13, ir=None, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    kw = {"ir_version": ir} if ir else {}
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets], **kw)


def _cnn(opset: int, ir: int | None = None, init_inputs: bool = False) -> onnx.ModelProto:
    """Conv-BN-Relu-Upsample/Resize-Conv-GAP-Flatten-Gemm at an old opset (Upsample before 10)."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    if opset < 10:
        up = [helper.make_node("Upsample", ["r1", "scales"], ["up"], name="up1", mode="nearest")]
        extra = [scales]
    else:
        roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
        up = [helper.make_node("Resize", ["r1", "roi", "scales"], ["up"], name="up1", mode="nearest",
                               coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
        extra = [roi, scales]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "mean", "var"], ["bn"], name="bn1"),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
        *up,
        helper.make_node("Conv", ["up", "w2"], ["c2"], name="conv2"),
        helper.make_node("GlobalAveragePool", ["c2"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="flat"),
        helper.make_node("Gemm", ["fl", "wg", "bg"], ["y"], name="fc", transB=1),
    ]
    inits = [_t("w1", 4, 3, 3, 3), _t("b1", 4), _t("s", 4, positive=True), _t("bb", 4), _t("mean", 4),
             _t("var", 4, positive=True), *extra, _t("w2", 5, 4, 3, 3), _t("wg", 6, 5), _t("bg", 6)]
    inputs = [_vi("x", ["N", 3, 8, 8])]
    if init_inputs:
        inputs += [_vi(i.name, list(i.dims)) for i in inits]
    return _model(nodes, inputs, [_vi("y", ["N", 6])], inits, opset=opset, ir=ir or 4)


def _mlp_opset11() -> onnx.ModelProto:
    """MatMul model with the attributes opset 13 moved to inputs, and Softmax-11's 2-D semantics."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Unsqueeze", ["m1"], ["u"], name="unsq", axes=[1]),
        helper.make_node("Squeeze", ["u"], ["sq"], name="sq", axes=[1]),
        helper.make_node("Split", ["sq"], ["s1", "s2"], name="split", axis=2, split=[4, 4]),
        helper.make_node("Softmax", ["s1"], ["sm"], name="softmax", axis=1),
        helper.make_node("ReduceSum", ["s2"], ["rs"], name="rsum", axes=[2], keepdims=1),
        helper.make_node("Mul", ["sm", "rs"], ["mu"], name="mul"),
        helper.make_node("MatMul", ["mu", "w2"], ["y"], name="mm2"),
    ]
    return _model(nodes, [_vi("x", ["N", 5, 6])], [_vi("y", ["N", 5, 3])], [_t("w1", 6, 8), _t("w2", 4, 3)],
                  opset=11, ir=6)


def _const_weights(as_constants: bool) -> onnx.ModelProto:
    """Conv and Gemm and MatMul whose weights come from Constant/ConstantOfShape nodes (and
    Transpose/Cast chains on them), or — the twin — the same weights as initializers. A Shape →
    ConstantOfShape → Add on an activation stays computed at run time."""
    rng = np.random.default_rng(7)  # the twins hold the same weights
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g0 = rng.standard_normal((6, 4)).astype(np.float32)  # [out, in], transposed for the Gemm
    m16 = rng.standard_normal((6, 5)).astype(np.float16)
    act = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["rshape"], name="rshape"),
        helper.make_node("ConstantOfShape", ["rshape"], ["half"], name="half",
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Add", ["r", "half"], ["rh"], name="add_half"),
        helper.make_node("GlobalAveragePool", ["rh"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="flat"),
        helper.make_node("Gemm", ["fl", "gw"], ["gm"], name="fc"),
        helper.make_node("MatMul", ["gm", "mw"], ["y"], name="proj"),
    ]
    if not as_constants:
        inits = [numpy_helper.from_array(w, "cw"), numpy_helper.from_array(np.full(4, 0.1, np.float32), "cb"),
                 numpy_helper.from_array(g0.T.copy(), "gw"), numpy_helper.from_array(m16.astype(np.float32), "mw")]
        return _model(act, [_vi("x", ["N", 3, 8, 8])], [_vi("y", ["N", 5])], inits)
    shape4 = numpy_helper.from_array(np.array([4], np.int64), "shape4")
    consts = [
        helper.make_node("Constant", [], ["cw"], name="const_cw", value=numpy_helper.from_array(w)),
        helper.make_node("ConstantOfShape", ["shape4"], ["cb"], name="const_cb",
                         value=numpy_helper.from_array(np.array([0.1], np.float32))),
        helper.make_node("Constant", [], ["g0"], name="const_g0", value=numpy_helper.from_array(g0)),
        helper.make_node("Transpose", ["g0"], ["gw"], name="transpose_g0", perm=[1, 0]),
        helper.make_node("Constant", [], ["m16"], name="const_m16", value=numpy_helper.from_array(m16)),
        helper.make_node("Identity", ["m16"], ["m16i"], name="identity_m16"),
        helper.make_node("Cast", ["m16i"], ["mw"], name="cast_m16", to=TensorProto.FLOAT),
    ]
    return _model(consts + act, [_vi("x", ["N", 3, 8, 8])], [_vi("y", ["N", 5])], [shape4])


def _save(m: onnx.ModelProto, path) -> str:
    onnx.save(m, path)
    return str(path)


def _feeds(n=4, shape=(3, 8, 8)):
    return [{"x": RNG.standard_normal((1, *shape)).astype(np.float32)} for _ in range(n)]


def _assert_same(ref, out):
    assert np.max(np.abs(ref - out)) <= 1e-5 * max(1.0, float(np.max(np.abs(ref))))


def _fp32_reproduces(path, model, feeds):
    """The original file and the FP32 policy's compiled normalised model give the same outputs."""
    ref = run_model(path, feeds)
    _assert_same(ref, run_model(model.proto, feeds))
    return ref


def _project(path, tmp_path, shape=(3, 8, 8), n=16, seed=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "data.npz"
    rng = RNG if seed is None else np.random.default_rng(seed)
    np.savez(data, x=rng.standard_normal((n, *shape)).astype(np.float32))
    return open_project(path, data=str(data), ws=Workspace(tmp_path / "ws"))


def _fp32_and_build(project, path, feeds):
    pol = uniform_policy(project.model, project.layers, "fp32")
    _assert_same(run_model(path, feeds), run_model(compile_policy(project.model, pol).proto, feeds))
    r = build_and_measure(project, project.default_policy(), backend="onnxruntime", warmup=1, iterations=3,
                          profile_iterations=1)
    assert r.precision_counts.get("int8", 0) > 0 and r.quality.cosine_mean > 0.9
    return r


def _steps(model) -> list[str]:
    return [s.step for s in model.normalization]


# --- IR < 4 and opset < 13 ------------------------------------------------------------------------

def test_ir3_initializer_inputs_load_compile_and_build(tmp_path):
    path = _save(_cnn(opset=9, ir=3, init_inputs=True), tmp_path / "ir3.onnx")
    m = load_model(path)
    assert _steps(m) == ["ir_initializer_inputs", "upgrade_opset"]
    assert "10 initializers (weights)" in m.normalization[0].detail
    assert [i.name for i in m.inputs] == ["x"] and m.proto.ir_version >= 7
    assert m.original_opset == 9 and m.opset == 13
    assert m.sha256 == __import__("hashlib").sha256(open(path, "rb").read()).hexdigest()  # the user's bytes
    project = _project(path, tmp_path)
    _fp32_and_build(project, path, _feeds())


def test_opset9_upgrade_keeps_the_users_names(tmp_path):
    orig = _cnn(opset=9)
    path = _save(orig, tmp_path / "cnn9.onnx")
    m = load_model(path)
    assert _steps(m) == ["upgrade_opset"]
    assert "opset 9 → 13" in m.normalization[0].detail
    assert "up1 (Upsample → Resize)" in m.normalization[0].detail
    nodes = {n.name: n for n in m.nodes}
    assert {n.name for n in orig.graph.node} <= set(nodes)
    assert nodes["up1"].op_type == "Resize" and list(nodes["up1"].output) == ["up"]  # tensor name restored
    assert list(nodes["conv2"].input[:1]) == ["up"]
    _fp32_reproduces(path, m, _feeds())


def test_opset9_cnn_builds(tmp_path):
    path = _save(_cnn(opset=9), tmp_path / "cnn9.onnx")
    project = _project(path, tmp_path)
    assert {"conv1", "conv2", "fc"} <= {l.name for l in project.layers if l.eligible}
    _fp32_and_build(project, path, _feeds())


def test_opset11_cnn_with_resize(tmp_path):
    path = _save(_cnn(opset=11), tmp_path / "cnn11.onnx")
    m = load_model(path)
    assert _steps(m) == ["upgrade_opset"] and m.opset == 13 and m.original_opset == 11
    _fp32_reproduces(path, m, _feeds())


def test_opset11_matmul_model_builds(tmp_path):
    orig = _mlp_opset11()
    path = _save(orig, tmp_path / "mlp11.onnx")
    m = load_model(path)
    assert _steps(m) == ["upgrade_opset"]
    names = {n.name for n in m.nodes}
    assert {n.name for n in orig.graph.node} <= names  # Softmax-11 became Flatten/Softmax/Reshape: helpers added
    assert "added" in m.normalization[0].detail
    feeds = [{"x": RNG.standard_normal((1, 5, 6)).astype(np.float32)} for _ in range(4)]
    _fp32_reproduces(path, m, feeds)
    project = _project(path, tmp_path, shape=(5, 6))
    _fp32_and_build(project, path, feeds)


def test_opset11_subgraph_names_kept(tmp_path):
    def branch(name, op):
        nodes = [helper.make_node("Unsqueeze", ["x"], [f"{name}_u"], name=f"{name}_unsq", axes=[0]),
                 helper.make_node(op, [f"{name}_u"], [f"{name}_o"], name=f"{name}_op")]
        return helper.make_graph(nodes, name, [], [_vi(f"{name}_o", [1, 2, 6])])

    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="rs", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if0", then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg"))]
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    path = _save(_model(nodes, [_vi("x", [2, 6])], [_vi("y", [1, 2, 6])], [zero], opset=11, ir=6),
                 tmp_path / "if11.onnx")
    m = load_model(path)
    assert _steps(m) == ["upgrade_opset"]
    if0 = next(n for n in m.nodes if n.name == "if0")
    inner = {x.name for a in if0.attribute for x in a.g.node}
    assert {"then_unsq", "then_op", "else_unsq", "else_op"} <= inner
    for sign in (1, -1):
        _fp32_reproduces(path, m, [{"x": sign * np.abs(RNG.standard_normal((2, 6))).astype(np.float32)}])


def test_failed_upgrade_names_the_op(tmp_path, monkeypatch):
    real = normalize.version_converter.convert_version

    def convert(model, target):
        if any(n.op_type == "Upsample" for n in model.graph.node):
            raise RuntimeError("convert.cc:101: Assertion failed")
        return real(model, target)

    monkeypatch.setattr(normalize.version_converter, "convert_version", convert)
    with pytest.raises(MixprecError, match=r"opset 9.*cannot upgrade op Upsample to opset 13.*Fix: re-export the "
                                           r"model at opset 13 or later"):
        load_model(_save(_cnn(opset=9), tmp_path / "cnn9.onnx"))


def test_modern_model_is_untouched(tmp_path):
    path = _save(_cnn(opset=13), tmp_path / "cnn13.onnx")
    m = load_model(path)
    assert m.normalization == [] and m.original_opset == m.opset == 13


# --- constant-node weights ------------------------------------------------------------------------

def test_constant_weights_become_initializers(tmp_path):
    path = _save(_const_weights(as_constants=True), tmp_path / "const.onnx")
    m = load_model(path)
    assert _steps(m) == ["fold_constants"]
    detail = m.normalization[0].detail
    assert "Constant ×3" in detail and "ConstantOfShape ×1" in detail and "conv, fc, proj" in detail
    inits = m.initializer_names()
    assert {"cw", "cb", "gw", "mw"} <= inits and "shape4" not in inits  # spent helper removed
    ops = [n.op_type for n in m.nodes]
    assert "Constant" not in ops and "Transpose" not in ops and "Cast" not in ops
    # compute on activations is untouched: Shape -> ConstantOfShape -> Add still runs
    assert {"rshape", "half", "add_half"} <= {n.name for n in m.nodes}
    _fp32_reproduces(path, m, _feeds())


def test_constant_weights_quantize_like_initializers(tmp_path):
    """INT8 builds of the Constant-node model and of its initializer twin are the same: per-channel
    int8 weights (Conv axis 0, Gemm/MatMul along the output features) and the same outputs."""
    feeds = _feeds(6)
    compiled = {}
    for kind in ("const", "init"):
        path = _save(_const_weights(as_constants=kind == "const"), tmp_path / f"{kind}.onnx")
        p = _project(path, tmp_path / kind, seed=1)
        pol = p.default_policy()
        assert {"conv", "fc", "proj"} <= {k for k, v in pol.layers.items() if v == "int8"}
        calib = calibrate_policy(p.model, p.calib_data, pol, p.layers, p.ws)
        compiled[kind] = compile_policy(p.model, pol, calib, target="trt").proto
    inits = {k: {i.name: numpy_helper.to_array(i) for i in c.graph.initializer} for k, c in compiled.items()}
    quantized = sorted(n for n in inits["init"] if n.endswith("__int8") or n.endswith("_scale"))
    assert {"cw__int8", "gw__int8", "mw__int8"} <= set(quantized)
    for name in quantized:
        np.testing.assert_array_equal(inits["const"][name], inits["init"][name])
    assert inits["const"]["conv/w1_scale"].shape == (4,)  # per output channel
    assert inits["const"]["fc/w1_scale"].shape == (6,) and inits["const"]["proj/w1_scale"].shape == (5,)
    np.testing.assert_array_equal(run_model(compiled["const"], feeds), run_model(compiled["init"], feeds))


def test_constant_weight_model_builds(tmp_path):
    path = _save(_const_weights(as_constants=True), tmp_path / "const.onnx")
    _fp32_and_build(_project(path, tmp_path), path, _feeds())


def test_fold_size_cap_spares_big_non_weights(tmp_path, monkeypatch):
    """Over the cap, a constant that is not a weight stays computed at run time; a weight is folded."""
    monkeypatch.setattr(normalize, "FOLD_CAP_BYTES", 64)
    big_w = numpy_helper.from_array(np.array([6, 8], np.int64), "wshape")
    big_a = numpy_helper.from_array(np.array([1, 6], np.int64), "ashape")
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w"], name="make_w",
                         value=numpy_helper.from_array(np.array([0.25], np.float32))),
        helper.make_node("ConstantOfShape", ["ashape"], ["bias"], name="make_bias",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Tile", ["bias", "reps"], ["bias_big"], name="tile_bias"),
        helper.make_node("Add", ["x", "bias_big"], ["xb"], name="add_bias"),
        helper.make_node("MatMul", ["xb", "w"], ["y"], name="mm"),
    ]
    reps = numpy_helper.from_array(np.array([1, 1], np.int64), "reps")
    m0 = _model(nodes, [_vi("x", [1, 6])], [_vi("y", [1, 8])], [big_w, big_a, reps])
    path = _save(m0, tmp_path / "cap.onnx")
    m = load_model(path)
    names = {n.name for n in m.nodes}
    assert "make_w" not in names and "w" in m.initializer_names()  # 192 bytes, a weight: folded
    assert {"make_bias", "tile_bias", "add_bias"} <= names  # not a weight: left alone
    _fp32_reproduces(path, m, [{"x": RNG.standard_normal((1, 6)).astype(np.float32)}])


def test_scalar_constant_attributes_keep_their_type(tmp_path):
    """A Constant with value_float (gs alone would make it float64) folds into a float32 Gemm bias."""
    nodes = [helper.make_node("Constant", [], ["c"], name="const_c", value_float=0.25),
             helper.make_node("Constant", [], ["wv"], name="const_w", value_floats=[0.5, -1.0, 2.0, 1.5, 0.25, 3.0]),
             helper.make_node("Reshape", ["wv", "wshape"], ["w"], name="reshape_w"),
             helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")]
    wshape = numpy_helper.from_array(np.array([3, 2], np.int64), "wshape")
    path = _save(_model(nodes, [_vi("x", [1, 3])], [_vi("y", [1, 2])], [wshape]), tmp_path / "scalar.onnx")
    m = load_model(path)
    assert _steps(m) == ["fold_constants"] and [n.name for n in m.nodes] == ["fc"]
    inits = {i.name: i for i in m.proto.graph.initializer}
    assert inits["c"].data_type == inits["w"].data_type == TensorProto.FLOAT
    _fp32_reproduces(path, m, [{"x": RNG.standard_normal((1, 3)).astype(np.float32)}])


def _external_constant_model(tmp_path):
    """The Constant-weight model saved with its Constant values as external data in its folder."""
    folder = tmp_path / "m"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(_const_weights(as_constants=True), path, save_as_external_data=True, location="weights.bin",
                    size_threshold=100, convert_attribute=True)
    return path, onnx.load(path, load_external_data=False)


def test_constant_weights_in_external_data(tmp_path):
    """A Constant node whose value is stored as external data in the model's folder loads and folds."""
    path, raw = _external_constant_model(tmp_path)
    assert any(a.t.data_location == TensorProto.EXTERNAL for n in raw.graph.node for a in n.attribute
               if a.name == "value")
    m = load_model(path)
    assert _steps(m) == ["fold_constants"]
    _fp32_reproduces(path, m, _feeds())


def test_constant_external_data_outside_folder_refused(tmp_path):
    path, raw = _external_constant_model(tmp_path)
    for n in raw.graph.node:
        for a in n.attribute:
            for e in (a.t.external_data if a.name == "value" else []):
                if e.key == "location":
                    e.value = "../secret.bin"
    onnx.save_model(raw, path)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4096)
    with pytest.raises(MixprecError, match="outside its folder"):
        load_model(path)


# --- already quantized ----------------------------------------------------------------------------

def _qdq_model() -> onnx.ModelProto:
    q = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"), numpy_helper.from_array(np.array(0, np.int8), "xz"),
         numpy_helper.from_array(RNG.integers(-127, 127, (4, 3, 3, 3)).astype(np.int8), "wq"),
         numpy_helper.from_array(np.full(4, 0.01, np.float32), "ws"),
         numpy_helper.from_array(np.zeros(4, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw", axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv")]
    return _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 6, 6])], q)


def _qlinearconv_model() -> onnx.ModelProto:
    f = lambda n, v, dt: numpy_helper.from_array(np.array(v, dt), n)  # noqa: E731
    inits = [f("xs", 0.02, np.float32), f("xz", 128, np.uint8), f("ws", 0.01, np.float32), f("wz", 0, np.uint8),
             f("ys", 0.05, np.float32), f("yz", 128, np.uint8),
             numpy_helper.from_array(RNG.integers(0, 255, (4, 3, 3, 3)).astype(np.uint8), "wq")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz"], ["yq"], name="qconv"),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dq")]
    return _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 6, 6])], inits)


def _ms_quantized_model() -> onnx.ModelProto:
    inits = [numpy_helper.from_array(RNG.integers(-127, 127, (6, 4)).astype(np.int8), "bq"),
             numpy_helper.from_array(np.array(0.01, np.float32), "bs")]
    nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "bq", "bs"], ["y"], name="dqmm", domain="com.microsoft")]
    return _model(nodes, [_vi("x", [2, 6])], [_vi("y", [2, 4])], inits,
                  extra_opsets=[helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("build, expected", [
    (_qdq_model, r"qdq\.onnx is already quantized \(DequantizeLinear ×2, QuantizeLinear ×1\)"),
    (_qlinearconv_model, r"qlinear\.onnx is already quantized \(.*QLinearConv ×1"),
    (_ms_quantized_model, r"ms\.onnx is already quantized \(DynamicQuantizeMatMul ×1\)"),
])
def test_already_quantized_is_refused(tmp_path, build, expected):
    name = {"_qdq_model": "qdq", "_qlinearconv_model": "qlinear", "_ms_quantized_model": "ms"}[build.__name__]
    with pytest.raises(MixprecError, match=expected + r".*Fix: give mixprec the float original"):
        load_model(_save(build(), tmp_path / f"{name}.onnx"))


def test_quantized_ops_lists_every_kind():
    assert sorted(quantized_ops(_qlinearconv_model())) == ["DequantizeLinear", "QLinearConv", "QuantizeLinear"]
    assert quantized_ops(_ms_quantized_model()) == ["DynamicQuantizeMatMul"]
    ms = [helper.make_node(op, ["a"], ["b"], domain="com.microsoft") for op in ("QLinearAdd", "QGemm", "MatMulNBits",
                                                                               "QAttention", "FusedConv")]
    onnx_ops = [helper.make_node(op, ["a"], ["b"]) for op in ("ConvInteger", "MatMulInteger",
                                                               "DynamicQuantizeLinear", "Conv")]
    m = _model(ms + onnx_ops, [_vi("a", [1])], [_vi("b", [1])])
    assert quantized_ops(m) == ["QLinearAdd", "QGemm", "MatMulNBits", "QAttention", "ConvInteger",
                                "MatMulInteger", "DynamicQuantizeLinear"]
    assert quantized_ops(_cnn(opset=13)) == []


# --- reporting ------------------------------------------------------------------------------------

def test_normstep_to_dict():
    assert NormStep("upgrade_opset", "opset 9 → 13").to_dict() == {"step": "upgrade_opset", "detail": "opset 9 → 13"}


def test_inspect_shows_normalisation(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    path = _save(_cnn(opset=9, ir=3, init_inputs=True), tmp_path / "ir3.onnx")
    assert cli_main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in doc["normalization"]] == ["ir_initializer_inputs", "upgrade_opset"]
    assert doc["model"]["original_opset"] == 9 and doc["model"]["opset"] == 13
    assert cli_main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "normalised (upgrade_opset): opset 9 → 13" in text
