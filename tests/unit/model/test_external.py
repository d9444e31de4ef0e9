"""Large external weights converted to float16 chunk by chunk (core.model.external.Spill.converted): the
same values as converting in memory, written to the compiled model's data file, and used by the
compiler's FP16 layers."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

import core.model.external as ext


def _external_constant(tmp_path, values: np.ndarray) -> gs.Constant:
    path = tmp_path / "w.data"
    path.write_bytes(b"\0" * 4096 + values.astype("<f4").tobytes())
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(values.shape))
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.data"), ("offset", "4096"), ("length", str(values.nbytes))):
        t.external_data.add(key=k, value=v)
    return gs.Constant("w", ext.ExternalValues(t, path))


@pytest.mark.parametrize("steps", [(np.float16,), (np.float16, np.float32)])
def test_streamed_conversion_equals_the_in_memory_one(tmp_path, monkeypatch, steps):
    monkeypatch.setattr(ext, "CHUNK_BYTES", 1000)  # many chunks, the last one partial
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((37, 53)) * 100).astype(np.float32)
    w[0, :3] = [7000.0, -1e-8, np.float32(np.finfo(np.float16).max)]  # overflow and underflow round alike
    spill = ext.Spill(tmp_path / "out")
    c = spill.converted("w__r16", _external_constant(tmp_path, w), steps)
    assert c is not None and ext.is_external(c)
    got = ext.values_of(c)
    want = w
    for dt in steps:
        want = want.astype(dt)
    assert got.dtype == want.dtype and got.shape == w.shape
    np.testing.assert_array_equal(got, want)
    spill.close()
    assert spill.bytes >= want.nbytes


def test_small_or_inline_constants_are_left_to_the_caller(tmp_path, monkeypatch):
    spill = ext.Spill(tmp_path / "out")
    inline = gs.Constant("a", np.ones((4, 4), np.float32))
    assert spill.converted("a16", inline, (np.float16,)) is None
    small = _external_constant(tmp_path, np.ones((4, 4), np.float32))  # under CHUNK_BYTES
    assert spill.converted("s16", small, (np.float16,)) is None


def test_compiler_fp16_of_an_external_embedding_is_streamed(tmp_path, monkeypatch):
    """A Gather from an external table at FP16: the compiled model's table is the float16 rounding of
    the original, read from the compiled model's own data file, and the outputs agree."""
    from core.quant.calibration import calibrate_policy
    from core.quant.compile import compile_policy
    from core.project import open_project
    from core.workspace import Workspace
    import onnxruntime as ort

    monkeypatch.setattr(ext, "CHUNK_BYTES", 4096)
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    rng = np.random.default_rng(1)
    table = rng.standard_normal((2000, 16)).astype(np.float32)  # 128 KB: above what loading inlines
    w = rng.standard_normal((16, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="emb"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="fc")],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "m" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="model.data",
                    size_threshold=0)
    ids = rng.integers(0, 2000, (8, 1, 6)).astype(np.int64)
    np.savez(tmp_path / "d.npz", ids=ids[:, 0])
    p = open_project(str(src), data=str(tmp_path / "d.npz"), ws=Workspace(tmp_path / "ws"))
    assert p.model.external
    pol = p.default_policy().with_layers({"emb": "fp16", "fc": "fp32"})
    calib = calibrate_policy(p.model, p.calib_data, pol, p.layers, p.ws)
    calls = []
    real = ext.Spill.add_converted
    monkeypatch.setattr(ext.Spill, "add_converted", lambda self, name, *a, **k: calls.append(name) or real(self, name, *a, **k))
    out = compile_policy(p.model, pol, calib, target="ort").save(tmp_path / "c" / "compiled.onnx")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"ids": ids[0]})[0]
    ref = table.astype(np.float16).astype(np.float32)[ids[0]] @ w
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert calls == ["table__fp16"]  # the table went through the streamed conversion (to float16: ORT gathers it)
