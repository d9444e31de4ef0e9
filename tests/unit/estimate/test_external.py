"""The TensorRT estimate of models whose weights are in external data files (core.model.external): the
predictor works from shapes, types and metadata only. A model saved with every tensor in a data file gets
exactly the estimate of the same model with its weights in the graph (loaded as usual, and kept external);
only the small tensors shape inference may need (a Reshape's shape) are read, one at a time; a missing data
file is a MixprecError with a fix. The model over 2 GB is in tests/scale/test_estimate_large.py."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.cli.commands import main as cli_main
from core.errors import MixprecError
from core.estimate import fusion
from core.estimate.fusion import SMALL_VALUE, engine_layers, static_net
from core.estimate.predict import PREDICTION_COLUMNS, placeholder_calibration, predict
from core.project import open_project
from core.quant.compile import compile_policy
from core.workspace import Workspace

SHAPES = {"x": (2, 16, 32, 32)}
MIXED = {"conv1": "fp16", "conv2": "int8", "fc1": "int8", "fc2": "fp16"}


def cnn_weights() -> dict[str, np.ndarray]:
    """Conv weights under and over core.model.external.INLINE_BELOW (64 KiB), a Gemm (transB) and a MatMul
    weight over it, biases and the Reshape's shape (small)."""
    rng = np.random.default_rng(7)
    w = {"W1": rng.standard_normal((32, 16, 3, 3)) / 12, "B1": rng.standard_normal(32) / 10,
         "W2": rng.standard_normal((64, 32, 3, 3)) / 17, "B2": rng.standard_normal(64) / 10,
         "W3": rng.standard_normal((96, 4096)) / 64, "B3": rng.standard_normal(96) / 10,
         "W4": rng.standard_normal((96, 200)) / 10}
    out = {k: v.astype(np.float32) for k, v in w.items()}
    out["shape"] = np.array([0, -1], np.int64)
    return out


def cnn_proto() -> onnx.ModelProto:
    """x [N,16,32,32] -> Conv -> Relu -> Conv (stride 2) -> Relu -> MaxPool -> Reshape -> Gemm -> Relu -> MatMul."""
    inits = [numpy_helper.from_array(v, k) for k, v in cnn_weights().items()]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "W3", "B3"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["hr"], name="relu3"),
             helper.make_node("MatMul", ["hr", "W4"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 200])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def save_cnn(folder: Path, external: bool) -> Path:
    """The model as ``folder/cnn.onnx``: weights in the graph, or every tensor in ``cnn.onnx.data``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cnn.onnx"
    onnx.save_model(cnn_proto(), str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                    location="cnn.onnx.data", size_threshold=0)
    return path


@pytest.fixture(scope="module")
def cnn_projects(tmp_path_factory):
    """The same model three ways: weights in the graph; saved with external data and loaded as usual
    (read into the graph, it is small); saved with external data and kept external (threshold lowered)."""
    root = tmp_path_factory.mktemp("cnn")
    embedded, external = save_cnn(root / "embedded", False), save_cnn(root / "external", True)
    ws = Workspace(tmp_path_factory.mktemp("cnn-ws"))
    opened = {"embedded": open_project(embedded, ws=ws, shapes=SHAPES),
              "external, read": open_project(external, ws=ws, shapes=SHAPES)}
    os.environ["MIXPREC_EXTERNAL_WEIGHTS_FROM"] = "1"
    try:
        opened["external, kept"] = open_project(external, ws=ws, shapes=SHAPES)
    finally:
        del os.environ["MIXPREC_EXTERNAL_WEIGHTS_FROM"]
    return opened


def _policies(p):
    layers = {l.name for l in p.layers if l.eligible}
    assert set(MIXED) <= layers
    return {"default": p.default_policy(), "mixed": p.default_policy().with_layers(MIXED),
            "fp32": p.default_policy().with_layers({n: "fp32" for n in layers})}


def test_external_data_gives_the_embedded_estimate(cnn_projects):
    kept = cnn_projects["external, kept"].model
    assert kept.external and not cnn_projects["embedded"].model.external
    ext = {i.name for i in kept.proto.graph.initializer if i.data_location == TensorProto.EXTERNAL}
    assert {"W2", "W3", "W4"} <= ext  # the weights over 64 KiB stay in the data file
    w = cnn_weights()
    results = {}
    for how, p in cnn_projects.items():
        for name, policy in _policies(p).items():
            results[how, name] = predict(p.model, policy, p.input_shapes, "a100")
    for name in ("default", "mixed", "fp32"):
        base = results["embedded", name]
        assert base.total_ms > 0 and list(base.layers.columns) == PREDICTION_COLUMNS
        # the weight counts the cost model prices come from the weights' dims
        convs = {l.onnx_nodes: l for l in base.engine if l.layer_class == "conv_gemm"}
        counted = sorted(l.weights for l in convs.values())
        assert counted == sorted(w[k].size for k in ("W1", "W2", "W3", "W4")), name
        for how in ("external, read", "external, kept"):
            other = results[how, name]
            pd.testing.assert_frame_equal(other.layers, base.layers)
            assert other.total_ms == base.total_ms and other.notes == base.notes, (how, name)
            assert other.engine == base.engine, (how, name)
    mixed = results["external, kept", "mixed"].layers
    assert {"int8", "fp16"} <= set(mixed.precision)  # the compiler's new weights (its data file) were priced too


def test_static_net_reads_only_the_small_external_tensors(tmp_path, monkeypatch):
    """From a graph whose every tensor is in a data file: the same shapes, types and engine as from the
    graph with its weights, reading only the tensors under SMALL_VALUE (the Reshape's shape, biases)."""
    path = save_cnn(tmp_path / "m", True)
    proto = onnx.load(str(path), load_external_data=False)
    assert all(i.data_location == TensorProto.EXTERNAL for i in proto.graph.initializer)
    read = []
    real = fusion.read_tensor
    monkeypatch.setattr(fusion, "read_tensor", lambda t, p: read.append(t.name) or real(t, p))
    files = {"cnn.onnx.data": path.with_name("cnn.onnx.data")}
    ext, emb = static_net(proto, SHAPES, files), static_net(cnn_proto(), SHAPES)
    small = {k for k, v in cnn_weights().items() if v.nbytes < SMALL_VALUE}
    assert sorted(read) == sorted(small) and "shape" in small and "W3" not in small
    assert ext.shapes == emb.shapes and ext.dtypes == emb.dtypes
    assert ext.shape("f") == (2, 4096)  # known only from the Reshape's shape, read from the data file
    assert engine_layers(ext) == engine_layers(emb)


def test_a_missing_data_file_is_a_mixprec_error_with_a_fix(tmp_path):
    path = save_cnn(tmp_path / "m", True)
    proto = onnx.load(str(path), load_external_data=False)
    for files in ({}, {"cnn.onnx.data": tmp_path / "gone.data"}):
        with pytest.raises(MixprecError, match="cnn.onnx.data.*missing") as e:
            static_net(proto, SHAPES, files)
        assert "data files" in e.value.fix


def test_a_data_file_removed_after_loading(tmp_path, monkeypatch):
    """The predictor reads no weight, not even to compile the policy (``structure_only``): every
    policy, those that quantize and convert weights too, is still estimated, as before; a full
    compile (a build's), which converts them, cannot."""
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = save_cnn(tmp_path / "m", True)
    p = open_project(path, ws=Workspace(tmp_path / "ws"), shapes=SHAPES)
    policies = _policies(p)
    before = {k: predict(p.model, pol, p.input_shapes, "a100") for k, pol in policies.items()}
    path.with_name("cnn.onnx.data").unlink()
    for k, pol in policies.items():
        pd.testing.assert_frame_equal(predict(p.model, pol, p.input_shapes, "a100").layers, before[k].layers)
    with pytest.raises(FileNotFoundError):
        compile_policy(p.model, policies["mixed"], placeholder_calibration(p.model, policies["mixed"]), target="trt")


def test_cli_estimate_of_a_model_with_a_missing_data_file_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    path = save_cnn(tmp_path / "m", True)
    path.with_name("cnn.onnx.data").unlink()
    assert cli_main(["estimate", str(path), "--shape", "x=2x16x32x32", "--json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: " in err and "Fix:" in err and "cnn.onnx.data" in err
