"""Layer inventory: eligibility, default precisions, MACs, decomposed LayerNorm."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.inventory import build_inventory
from core.model.load import model_from_bytes


def test_minilm_inventory(minilm):
    inv = minilm.inventory()
    mm = inv[inv.op_type == "MatMul"]
    assert len(mm) == 48 and mm.eligible.all() and (mm.default_precision == "int8").all()
    for op, reason in [("LayerNormalization", "layernorm"), ("Softmax", "softmax")]:
        rows = inv[inv.op_type == op]
        assert len(rows) > 0 and (rows.default_precision == "fp16").all() and (rows.default_reason == reason).all()
    gathers = inv[inv.op_type == "Gather"]
    assert set(gathers.default_reason) == {"embedding"} and len(gathers) == 3
    assert int(gathers.params.max()) == 30522 * 384  # word embeddings
    down = inv[inv.name == "/encoder/layer.0/output/dense/MatMul"].iloc[0]
    seq = minilm.input_shapes["input_ids"][1]
    assert down.macs == seq * 1536 * 384 and down.params == 1536 * 384
    assert not inv.eligible[~inv.op_type.isin(["MatMul", "Gemm", "Conv", "ConvTranspose"])].any()
    # the residual Adds are placement layers that stay float by default, with the transformer reason
    adds = inv[inv.placement == "add"]
    assert len(adds) >= 12 and set(adds.default_precision) == {"default"} and not adds.eligible.any()
    assert all(r.startswith("transformer residual") for r in adds.default_reason)
    assert {f"/encoder/layer.{i}/{k}/Add" for i in range(6) for k in ("attention/output", "output")} <= set(adds.name)
    assert set(inv[inv.placement != ""].op_type) == {"Add"}  # no pooling / float Concat in MiniLM


def test_tiny_cnn_macs(tiny_cnn):
    inv = tiny_cnn.inventory().set_index("name")
    conv1 = inv.loc["/conv1/Conv"]
    assert conv1.macs == 8 * 32 * 32 * 3 * 3 * 3  # out pixels × (Cin × kh × kw), 'same' padding
    assert inv.loc["/fc/Gemm"].macs == 16 * 10
    assert {"Conv", "Gemm"} <= set(inv[inv.eligible].op_type) <= {"Conv", "Gemm", "GlobalAveragePool"}
    # the pooling after the last INT8 conv is INT8 by placement when the classifier after it is INT8
    # by default too (issue 11 §1), else the network default
    pool, fc = inv.loc["/pool/GlobalAveragePool"], inv.loc["/fc/Gemm"]
    assert pool.placement == "pooling" and pool.eligible == (pool.default_precision == "int8")
    assert pool.default_precision == ("int8" if fc.default_precision == "int8" else "default")


def test_decomposed_layernorm_defaults_to_fp16(tmp_path):
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], name="ln/mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="ln/sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="ln/pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="ln/var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/add_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
        helper.make_node("Div", ["d", "sd"], ["n"], name="ln/div"),
        helper.make_node("MatMul", ["n", "w"], ["y"], name="proj"),
        helper.make_node("Relu", ["y"], ["z"], name="act"),
    ]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.ones((8, 4), np.float32), "w")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 8])],
                          [helper.make_tensor_value_info("z", f, [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = model_from_bytes(m.SerializeToString(), tmp_path / "ln.onnx")
    by = {l.name: l for l in build_inventory(model)}
    for n in ("ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt", "ln/div"):
        assert by[n].default_precision == "fp16" and by[n].default_reason == "layernorm", n
    assert by["proj"].default_precision == "int8" and by["proj"].macs == 32
    assert by["act"].default_precision == "default"


# --- MACs through Transposes, symbolic batches, recurrent and Einsum ops (issue 10) ---

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _project(tmp_path, nodes, inputs, outputs, inits, name):
    from core.project import open_project
    from core.workspace import Workspace

    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(m.SerializeToString())
    return open_project(str(path), ws=Workspace(tmp_path / "ws"), batch=2)


def test_nhwc_conv_behind_transposes_with_symbolic_batch(tmp_path):
    from core.measure.runs import int8_mac_fraction

    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="to_nchw", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", strides=[2, 2]),
             helper.make_node("Transpose", ["c2"], ["y"], name="to_nhwc", perm=[0, 2, 3, 1])]
    p = _project(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["N", 16, 16, 3])],
                 [helper.make_tensor_value_info("y", F, ["N", 7, 7, 4])],
                 [_w("w1", 8, 3, 3, 3), _w("b1", 8), _w("w2", 4, 8, 3, 3)], "nhwc")
    assert p.input_shapes["x"] == (2, 16, 16, 3)
    by = {l.name: l for l in p.layers}
    assert by["conv1"].macs == 2 * 16 * 16 * 8 * (3 * 3 * 3)
    assert by["conv2"].macs == 2 * 7 * 7 * 4 * (8 * 3 * 3)
    pol = p.default_policy()
    assert int8_mac_fraction(p, pol) == pytest.approx(1.0)
    assert int8_mac_fraction(p, pol.with_layers({"conv2": "fp16"})) == pytest.approx(
        by["conv1"].macs / (by["conv1"].macs + by["conv2"].macs))
    assert int8_mac_fraction(p, pol.with_layers({"conv1": "fp16", "conv2": "fp16"})) == 0.0


def _recurrent(op, hidden, directions=1, layout=0):
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    attrs = {"hidden_size": hidden, "layout": layout}
    if directions == 2:
        attrs["direction"] = "bidirectional"
    return helper.make_node(op, ["x", "W", "R", "B"], ["Y", "Y_h"], name=f"{op.lower()}_0", **attrs), \
        [_w("W", directions, gates * hidden, 6), _w("R", directions, gates * hidden, hidden),
         _w("B", directions, 2 * gates * hidden)]


@pytest.mark.parametrize("op,directions,layout", [("GRU", 1, 0), ("LSTM", 2, 0), ("LSTM", 1, 1), ("RNN", 1, 0)])
def test_recurrent_macs_and_int8_share(tmp_path, op, directions, layout):
    """gates × (input + hidden) × hidden per time step, direction and sample; a GRU encoder with one
    small INT8 Gemm is not 100 % INT8."""
    from core.measure.runs import int8_mac_fraction

    seq, hidden, batch = 5, 4, 2
    rnn, inits = _recurrent(op, hidden, directions, layout)
    x_shape = [seq, "N", 6] if layout == 0 else ["N", seq, 6]
    nodes = [rnn,
             helper.make_node("Reshape", ["Y_h", "flat"], ["h"], name="flatten"),
             helper.make_node("Gemm", ["h", "Wg"], ["y"], name="head")]
    inits += [_w("Wg", directions * hidden, 3), numpy_helper.from_array(np.array([-1, directions * hidden]), "flat")]
    p = _project(tmp_path, nodes, [helper.make_tensor_value_info("x", F, x_shape)],
                 [helper.make_tensor_value_info("y", F, ["N", 3])], inits, op.lower())
    by = {l.name: l for l in p.layers}
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    r = by[f"{op.lower()}_0"]
    assert r.macs == gates * (6 + hidden) * hidden * directions * seq * batch
    assert not r.eligible and "not INT8-eligible" in r.reason and r.default_precision == "default"
    assert "not INT8-eligible" in p.inventory().set_index("name").at[r.name, "reason"]
    head = by["head"]
    assert head.macs == batch * 3 * directions * hidden and head.eligible
    assert p.total_macs == r.macs + head.macs
    assert int8_mac_fraction(p, p.default_policy()) == pytest.approx(head.macs / (r.macs + head.macs))


@pytest.mark.parametrize("equation,a,b,macs", [
    ("bij,bjk->bik", (2, 3, 5), (2, 5, 4), 2 * 3 * 5 * 4),
    ("...ij,jk->...ik", (2, 3, 5), (5, 4), 2 * 3 * 5 * 4),
    ("bhqd,bhkd->bhqk", (1, 2, 3, 4), (1, 2, 6, 4), 1 * 2 * 3 * 4 * 6),
])
def test_einsum_macs(tmp_path, equation, a, b, macs):
    nodes = [helper.make_node("Einsum", ["x", "w"], ["y"], name="contract", equation=equation)]
    rank = len(equation.split("->")[1].replace("...", "")) + (len(a) - 2 if "..." in equation else 0)
    g = helper.make_graph(nodes, "einsum", [helper.make_tensor_value_info("x", F, list(a))],
                          [helper.make_tensor_value_info("y", F, [f"d{i}" for i in range(rank)])], [_w("w", *b)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    layer = build_inventory(model_from_bytes(m.SerializeToString(), tmp_path / "e.onnx"))[0]
    assert layer.macs == macs and not layer.eligible and "Einsum is not INT8-eligible" in layer.reason


def test_attention_macs(tmp_path):
    """ai.onnx Attention (opset 23): QKᵀ and attention·V."""
    b, heads, s_q, s_kv, d = 1, 2, 3, 5, 4
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attn")]
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("q", F, [b, heads, s_q, d])],
                          [helper.make_tensor_value_info("y", F, [b, heads, s_q, d])],
                          [_w("k", b, heads, s_kv, d), _w("v", b, heads, s_kv, d)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    layer = build_inventory(model_from_bytes(m.SerializeToString(), tmp_path / "a.onnx"))[0]
    assert layer.macs == b * heads * s_q * s_kv * 2 * d and not layer.eligible


def test_contrib_attention_is_refused_on_load(tmp_path):
    """com.microsoft Attention (ONNX Runtime's transformer optimizer): TensorRT's ONNX parser cannot import
    it, so the model is refused with the way to export without it (core.model.ms_ops; a test per op in
    tests/unit/model/test_ms_ops.py)."""
    b, s, d = 1, 5, 8
    nodes = [helper.make_node("Attention", ["x", "w", "bias"], ["y"], name="attn", domain="com.microsoft", num_heads=2)]
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", F, ["N", s, d])],
                          [helper.make_tensor_value_info("y", F, ["N", s, d])], [_w("w", d, 3 * d), _w("bias", 3 * d)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(MixprecError, match=r"Attention ×1"):
        model_from_bytes(m.SerializeToString(), tmp_path / "a.onnx")