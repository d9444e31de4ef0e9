"""Loading a model without copying its weights through onnx's C++ side (core.model.graph.without_weights):
shape inference on a weightless copy gives the same proto as inferring the model itself, and constant
folding on a copy that keeps only the initializers constant nodes read folds the same tensors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.model.graph import LIGHT_FROM, without_weights
from core.model.load import _infer_light, load_model
from core.model.normalize import _folded_values, normalize_model
from core.workspace import Workspace


def _model() -> onnx.ModelProto:
    """x [1, 256] -> MatMul(W, 256 KB) -> Reshape(shape initializer) -> MatMul(Transpose(W2), a
    weight computed by a constant node from a 256 KB initializer) -> Add(bias) -> y."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    w2t = rng.standard_normal((64, 256)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1, 256], np.int64), "shape"),
             numpy_helper.from_array(w2t, "W2t"), numpy_helper.from_array(np.zeros(64, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="fc1"),
             helper.make_node("Reshape", ["h", "shape"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["W2t"], ["W2"], name="transpose_w2", perm=[1, 0]),
             helper.make_node("MatMul", ["r", "W2"], ["m"], name="fc2"),
             helper.make_node("Add", ["m", "b"], ["y"], name="bias")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")


def test_without_weights_leaves_out_only_large_initializers():
    m = _model()
    twin, added = without_weights(m)
    assert added == {"W", "W2t"} and {t.name for t in twin.graph.initializer} == {"shape", "b"}
    assert {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in twin.graph.input
            if i.name in added} == {"W": [256, 256], "W2t": [64, 256]}
    assert twin.producer_name == "test" and twin.opset_import[0].version == 17 and len(twin.graph.node) == 5
    kept, added = without_weights(m, keep={"W2t"})
    assert added == {"W"} and "W2t" in {t.name for t in kept.graph.initializer}
    assert m.graph.initializer[0].ByteSize() >= LIGHT_FROM  # the original is untouched
    assert len(m.graph.initializer) == 4 and len(m.graph.input) == 1


def test_light_inference_gives_the_same_proto(tmp_path):
    m = _model()
    want = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    got = _infer_light(m, tmp_path / "m.onnx")
    assert got.SerializeToString() == want.SerializeToString()
    assert [d.dim_value for d in {v.name: v for v in got.graph.value_info}["r"].type.tensor_type.shape.dim] == [1, 256]


def test_folding_on_the_light_copy_folds_the_same_tensors():
    m = _model()
    values = _folded_values(m)
    assert set(values) == {"W2"}  # the Transpose of an initializer, computed from the kept W2t
    np.testing.assert_array_equal(values["W2"], numpy_helper.to_array(m.graph.initializer[2]).T)
    normalized, steps = normalize_model(m, None)
    assert [s.step for s in steps] == ["fold_constants"]
    assert "transpose_w2" not in {n.name for n in normalized.graph.node}


def test_a_loaded_model_is_what_plain_inference_gives(tmp_path):
    m = _model()
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path))
    loaded = load_model(path, Workspace(tmp_path / "ws"))
    normalized, _ = normalize_model(onnx.load(str(path)), tmp_path)
    plain = onnx.shape_inference.infer_shapes(normalized, strict_mode=True)
    from core.model.load import assign_stable_names

    assign_stable_names(plain)
    assert loaded.proto.SerializeToString() == plain.SerializeToString()


def test_inference_errors_stay_mixprec_errors(tmp_path):
    from core.errors import MixprecError

    m = _model()
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([3, 7], np.int64), "shape"))  # 256 != 21
    with pytest.raises(MixprecError, match="shape inference fails on m.onnx"):
        _infer_light(m, tmp_path / "m.onnx")
