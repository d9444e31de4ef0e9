"""The backends' shared per-layer table (core.backends.base), through ONNX Runtime's profiler trace."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.backends.base import PER_LAYER_COLUMNS, owner_layer
from core.backends.onnxruntime import per_layer_from_trace
from core.quant.policy import Policy


def test_owner_layer_longest_prefix_first():
    names = sorted(["conv1", "conv1/sub", "fc"], key=len, reverse=True)
    assert owner_layer("conv1/sub/QuantizeLinear", names) == "conv1/sub"
    assert owner_layer("conv1_fused", names) == "conv1"
    assert owner_layer("fc", names) == "fc"
    assert owner_layer("fcx", names) is None


def test_per_layer_from_trace():
    def ev(node, op, dur):
        return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur, "args": {"op_name": op}}

    events = [ev("conv1", "Conv", 3000), ev("conv1/x0/QuantizeLinear", "QuantizeLinear", 1000),
              ev("Relu_9", "Relu", 500), ev("conv1", "Conv", 3000),
              {"cat": "Session", "name": "model_run", "dur": 99999}]
    policy = Policy("m", "0" * 64, "fp32", {"conv1": "int8"})
    df = per_layer_from_trace(events, 2, [SimpleNamespace(name="conv1")], policy)
    assert list(df.columns) == PER_LAYER_COLUMNS
    assert df["name"].tolist() == ["conv1", "conv1/x0/QuantizeLinear", "Relu_9"]
    assert df["layer"].tolist() == ["conv1", "conv1", ""]
    assert df["precision"].tolist() == ["int8", "int8", ""]
    assert df["is_reformat"].tolist() == [False, True, False]
    assert df["ms"].tolist() == pytest.approx([3.0, 0.5, 0.25]) and df["pct"].sum() == pytest.approx(100.0)


def test_per_layer_from_trace_without_node_events():
    df = per_layer_from_trace([], 1, [], Policy("m", "0" * 64, "fp32", {}))
    assert list(df.columns) == PER_LAYER_COLUMNS and df.empty


def test_reference_outputs_are_cached_per_backend_identity(tmp_path, monkeypatch):
    """Issue 11, bug 5: the FP32 reference outputs were cached without the TensorRT version or GPU,
    so another TensorRT or GPU reused outputs it did not compute."""
    import numpy as np

    import core.measure.reference as ev

    calls = []
    monkeypatch.setattr(ev, "engine_outputs", lambda be, ref, batches, name: calls.append(be) or [np.ones(2)])
    project = SimpleNamespace(eval_data=SimpleNamespace(sha256="d" * 64))
    reference = SimpleNamespace(compiled_path=tmp_path / "reference-fp32.onnx")

    def backend(identity):
        return SimpleNamespace(name="tensorrt", identity=lambda: identity)

    a, b = backend("tensorrt 10.11.0.33 on NVIDIA A100"), backend("tensorrt 10.12.0.36 on NVIDIA A100")
    ev.reference_outputs(a, reference, project, [{}], "y")
    ev.reference_outputs(a, reference, project, [{}], "y")
    assert len(calls) == 1  # cached
    ev.reference_outputs(b, reference, project, [{}], "y")
    ev.reference_outputs(backend("tensorrt 10.11.0.33 on NVIDIA H100"), reference, project, [{}], "y")
    assert len(calls) == 3
    assert "tensorrt: tensorrt 10.11" in ev.backend_identity(a)
    assert ev.backend_identity(SimpleNamespace(name="onnxruntime")) == "onnxruntime"
