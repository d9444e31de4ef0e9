"""Layer inventory: eligibility, default precisions, MACs, decomposed LayerNorm."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from core.inventory import build_inventory
from core.model import model_from_bytes


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


def test_tiny_cnn_macs(tiny_cnn):
    inv = tiny_cnn.inventory().set_index("name")
    conv1 = inv.loc["/conv1/Conv"]
    assert conv1.macs == 8 * 32 * 32 * 3 * 3 * 3  # out pixels × (Cin × kh × kw), 'same' padding
    assert inv.loc["/fc/Gemm"].macs == 16 * 10
    assert set(inv[inv.eligible].op_type) == {"Conv", "Gemm"}


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
