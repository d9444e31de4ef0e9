"""Issue 21 §1: ONNX Runtime's fused transformer ops (``com.microsoft``, as its transformer optimizer writes
them), one test per op: the normalisation / GELU fusions are taken apart on load into ai.onnx ops that
compute what ONNX Runtime's fused kernel computes; the attention fusions are refused, naming the op and how
to export without it; MatMulNBits is refused as already quantized."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.load import load_model

H = 8
RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.normal(size=shape).astype(np.float32), name)


def _model(path, op, inputs, inits, attrs=None, outputs=("y",), opset=17, extra_inputs=()):
    """x → MatMul(w) → h → <com.microsoft op>(h, …) → y (the MatMul: a layer to quantize beside it)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node(op, inputs, list(outputs), name=f"fused_{op}", domain="com.microsoft", **(attrs or {}))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, H]), *extra_inputs],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 5, H] if o in ("y", "sum") else
                                                         ["b", "heads", "s", "d"]) for o in outputs if o],
                          [_w("w", H, H), *inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


SUPPORTED = {
    "SkipLayerNormalization": lambda p: _model(p, "SkipLayerNormalization", ["h", "x", "g", "b", "bias"],
                                               [_w("g", H), _w("b", H), _w("bias", H)], {"epsilon": 1e-5},
                                               outputs=("y", "", "", "sum")),
    "SkipSimplifiedLayerNormalization": lambda p: _model(p, "SkipSimplifiedLayerNormalization", ["h", "x", "g"],
                                                         [_w("g", H)], {"epsilon": 1e-6}),
    "SimplifiedLayerNormalization": lambda p: _simplified(p),
    "Gelu": lambda p: _model(p, "Gelu", ["h"], []),
    "BiasGelu": lambda p: _model(p, "BiasGelu", ["h", "bias"], [_w("bias", H)]),
    "FastGelu": lambda p: _model(p, "FastGelu", ["h", "bias"], [_w("bias", H)]),
    "QuickGelu": lambda p: _model(p, "QuickGelu", ["h"], [], {"alpha": 1.5}),
}


def _simplified(path):
    """SimplifiedLayerNormalization, which ONNX Runtime registers in the default domain (the RMSNorm of its
    LLM exports)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("SimplifiedLayerNormalization", ["h", "g"], ["y"], name="rms", axis=-1, epsilon=1e-6)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, H])], [_w("w", H, H), _w("g", H)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path), save_as_external_data=False)
    return path


def _run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


@pytest.mark.parametrize("op", sorted(SUPPORTED))
def test_a_fused_normalisation_or_gelu_is_taken_apart_into_what_it_computes(op, ws, tmp_path):
    path = SUPPORTED[op](tmp_path / f"{op}.onnx")
    feeds = {"x": RNG.normal(size=(2, 5, H)).astype(np.float32)}
    want = _run(path, feeds)  # ONNX Runtime's fused kernel
    m = load_model(path, ws)
    assert not [n for n in m.proto.graph.node if n.domain == "com.microsoft" or n.op_type == op]
    assert all(d.domain != "com.microsoft" for d in m.proto.opset_import)
    step = next(s for s in m.normalization if s.step == "unfuse_ms_ops")
    assert f"{op} ×1" in step.detail
    got = _run(m.save(tmp_path / "unfused.onnx"), feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert any(n.op_type == "MatMul" for n in m.proto.graph.node)


def test_a_fused_layer_norm_below_opset_17_takes_the_decomposed_form(ws, tmp_path):
    path = _model(tmp_path / "sln13.onnx", "SkipLayerNormalization", ["h", "x", "g", "b"], [_w("g", H), _w("b", H)],
                  {"epsilon": 1e-5}, opset=13)
    feeds = {"x": RNG.normal(size=(2, 5, H)).astype(np.float32)}
    m = load_model(path, ws)
    assert "LayerNormalization" not in {n.op_type for n in m.proto.graph.node}
    np.testing.assert_allclose(_run(m.save(tmp_path / "u.onnx"), feeds)["y"], _run(path, feeds)["y"], rtol=1e-4, atol=1e-5)


def _attention(path):
    return _model(path, "Attention", ["h", "qkv_w", "qkv_b"], [_w("qkv_w", H, 3 * H), _w("qkv_b", 3 * H)],
                  {"num_heads": 2})


def _mha(path):
    return _model(path, "MultiHeadAttention", ["h", "h", "h"], [], {"num_heads": 2})


def _gqa(path):
    i32 = [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [2]),
           helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    return _model(path, "GroupQueryAttention", ["h", "h", "h", "", "", "seqlens_k", "total_sequence_length"], [],
                  {"num_heads": 2, "kv_num_heads": 2}, outputs=("y", "present_key", "present_value"), extra_inputs=i32)


def _rotary(path):
    pos = [helper.make_tensor_value_info("position_ids", TensorProto.INT64, [2, 5])]
    return _model(path, "RotaryEmbedding", ["h", "position_ids", "cos", "sin"], [_w("cos", 16, H // 4), _w("sin", 16, H // 4)],
                  {"num_heads": 2}, extra_inputs=pos)


REFUSED = {"Attention": _attention, "MultiHeadAttention": _mha, "GroupQueryAttention": _gqa,
           "RotaryEmbedding": _rotary}


@pytest.mark.parametrize("op", sorted(REFUSED))
def test_an_attention_fusion_is_refused_with_the_way_to_export_without_it(op, ws, tmp_path):
    path = REFUSED[op](tmp_path / f"{op}.onnx")
    onnx.checker.check_model(str(path))  # a model ONNX Runtime's optimizer could have written
    with pytest.raises(MixprecError) as e:
        load_model(path, ws)
    assert f"{op} ×1" in e.value.what and "TensorRT's ONNX parser cannot import" in e.value.what
    assert "without ONNX Runtime's transformer optimizer" in e.value.fix and "optimum-cli export onnx" in e.value.fix


def test_matmul_nbits_is_refused_as_already_quantized(ws, tmp_path):
    nodes = [helper.make_node("MatMulNBits", ["x", "qw", "scales"], ["y"], name="q4", domain="com.microsoft",
                              K=H, N=H, bits=4, block_size=16)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H])],
                          [numpy_helper.from_array(np.zeros((H, 1, 8), np.uint8), "qw"),
                           numpy_helper.from_array(np.ones(H, np.float32), "scales")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, str(tmp_path / "nbits.onnx"))
    with pytest.raises(MixprecError, match=r"already quantized \(MatMulNBits ×1\)") as e:
        load_model(tmp_path / "nbits.onnx", ws)
    assert "float original" in e.value.fix


def test_the_cli_refuses_a_fused_attention_without_a_traceback(ws, tmp_path, capfd, monkeypatch):
    from tests.fixtures.cli import cli_in_process

    path = _attention(tmp_path / "att.onnx")
    p = cli_in_process(capfd, monkeypatch, ("inspect", str(path)), {"MIXPREC_WORKSPACE": str(ws.root)})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "Attention ×1" in p.stderr and "Fix: export the model without" in p.stderr
