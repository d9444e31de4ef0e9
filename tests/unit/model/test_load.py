"""Model loading: samples, validation errors with fixes, stable names, dynamic dims."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.load import load_model
from core.model.shapes import resolve_input_shapes


def _tiny_matmul(path, external: str | None = None, int_output=False):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if int_output:
        nodes.append(helper.make_node("ArgMax", ["y"], ["idx"], name="argmax", axis=1))
        out = helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 1])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])], [out], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save_model(m, path, save_as_external_data=True, location="w.bin", size_threshold=0)
        # point the weight at another location, without touching that file
        m2 = onnx.load(path, load_external_data=False)
        for e in m2.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = external
        onnx.save_model(m2, path)
    else:
        onnx.save_model(m, path)
    return path


def test_missing_path(tmp_path):
    with pytest.raises(MixprecError, match="does not exist.*Fix: .*sample:minilm"):
        load_model(tmp_path / "nope.onnx")


def test_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("hello, this is not a model\n" * 20)
    with pytest.raises(MixprecError, match="is not an ONNX model.*Fix:"):
        load_model(p)


def test_truncated(tmp_path, tiny_cnn_sample):
    data = tiny_cnn_sample.model.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(MixprecError, match="truncated.*Fix: copy or export the model again"):
        load_model(p)


def test_external_data_outside_folder_is_refused_unread(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 48)
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    p = _tiny_matmul(model_dir / "model.onnx", external="../secret.bin")
    before = secret.stat().st_atime_ns
    with pytest.raises(MixprecError, match="outside its folder.*w -> ../secret.bin"):
        load_model(p)
    assert secret.stat().st_atime_ns == before


def test_external_data_absolute_path_refused(tmp_path):
    p = _tiny_matmul(tmp_path / "model.onnx", external="/etc/hostname")
    with pytest.raises(MixprecError, match="outside its folder"):
        load_model(p)


def test_missing_external_data(tmp_path):
    p = _tiny_matmul(tmp_path / "model.onnx", external="gone.bin")
    with pytest.raises(MixprecError, match="external data files are missing.*gone.bin"):
        load_model(p)


def test_external_data_inside_folder_loads(tmp_path):
    p = _tiny_matmul(tmp_path / "model.onnx", external="w.bin")
    m = load_model(p)
    w = numpy_helper.to_array(m.proto.graph.initializer[0])
    assert w.shape == (3, 4) and w[2, 3] == 11.0


def test_no_float_outputs(tmp_path):
    p = _tiny_matmul(tmp_path / "model.onnx", int_output=True)
    with pytest.raises(MixprecError, match="no floating-point outputs.*idx: int64"):
        load_model(p)


def test_checker_failure_names_fix(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.graph.node[0].input[0] = "undefined_tensor"
    p = tmp_path / "bad.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(MixprecError, match="checker.*Fix:"):
        load_model(p)


def test_stable_generated_names(ws, tiny_transformer_sample):
    a = load_model(tiny_transformer_sample.model)
    b = load_model(tiny_transformer_sample.model)
    assert a.generated_names and a.generated_names == b.generated_names
    assert all(n.startswith("node_of_") for n in a.generated_names)
    names = [n.name for n in a.nodes]
    assert len(names) == len(set(names)) and "" not in names


def test_sample_spec_and_shapes(ws, minilm):
    m = minilm.model
    assert m.name == "sample:minilm" and m.opset == 17 and len(m.sha256) == 64
    assert [s.name for s in m.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    seq = minilm.calib_data.arrays["input_ids"].shape[1]
    assert minilm.input_shapes["input_ids"] == (1, seq)
    over = resolve_input_shapes(m, None, batch=4, overrides={m.inputs[0].shape[1]: 32})
    assert over["attention_mask"] == (4, 32)


def test_samples_need_no_normalisation(minilm, tiny_cnn, tiny_transformer):
    """Current exports are left as they are: no step, the file's own opset, nothing folded
    (MiniLM's 138 Constant nodes feed shapes, not weights)."""
    for p in (minilm, tiny_cnn, tiny_transformer):
        m = p.model
        assert m.normalization == [] and m.original_opset == m.opset == 17
    raw = onnx.load(str(minilm.model.path))
    assert len(minilm.model.nodes) == len(raw.graph.node)


def test_loaded_model_is_the_normalised_one(tmp_path):
    """``proto`` (what every runtime gets) is normalised; ``sha256``/``size_bytes`` stay those of
    the user's file."""
    import hashlib

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    p = tmp_path / "old.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)], ir_version=3), p)
    m = load_model(p)
    assert [s.step for s in m.normalization] == ["ir_initializer_inputs", "upgrade_opset"]
    assert m.original_opset == 8 and m.opset == 13 and [i.name for i in m.inputs] == ["x"]
    again = onnx.load_model_from_string(m.serialized())
    assert again.ir_version >= 7 and [i.name for i in again.graph.input] == ["x"]
    data = p.read_bytes()
    assert m.sha256 == hashlib.sha256(data).hexdigest() and m.size_bytes == len(data)
