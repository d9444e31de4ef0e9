"""The TensorRT backend's control flow without a GPU: a fake ``tensorrt`` module and fake engine,
runner and device buffers, with Polygraphy's real ``SetLayerPrecisions``, ``PostprocessNetwork``,
``CreateConfig`` and ``Profile``, on the tiny-cnn sample. What TensorRT itself does is tested by
test_tensorrt.py on a GPU; this covers the backend's own code paths (both build modes, the engine
cache, runner, interleaved timing, profiling and the per-layer table)."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

import core.backends.tensorrt as tb
from core.backends.base import PER_LAYER_COLUMNS
from core.calibration import calibrate
from core.errors import MixprecError
from core.project import open_project
from core.samples import materialize_sample
from core.workspace import Workspace

KINDS = {"Conv": "CONVOLUTION", "Gemm": "MATRIX_MULTIPLY", "Relu": "ACTIVATION"}


def _fake_trt(version: str):
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.float32, trt.float16, trt.int8 = "f32", "f16", "i8"
    trt.LayerType = types.SimpleNamespace(**{k: k for k in (
        "CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "CONSTANT", "SHAPE", "SHUFFLE", "ACTIVATION", "OTHER")})
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="detailed")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="workspace")
    trt.LayerInformationFormat = types.SimpleNamespace(JSON="json")
    trt.IConstantLayer = object

    class IProfiler:
        def __init__(self):
            pass

    trt.IProfiler = IProfiler
    return trt


class _Layer:
    def __init__(self, node, tensor):
        self.name, self.type = node.name, KINDS.get(node.op_type, "OTHER")
        self.metadata = f"[ONNX Layer: {node.name}]"
        self.precision, self.out_types = None, {}
        self.ins, self.outs = [tensor(n) for n in node.input[:1]], [tensor(n) for n in node.output]
        self.num_inputs, self.num_outputs = len(self.ins), len(self.outs)

    def get_input(self, k):
        return self.ins[k]

    def get_output(self, k):
        return self.outs[k]

    def set_output_type(self, k, dtype):
        self.out_types[k] = dtype


class _Network(list):
    """One layer per ONNX node (weights are not inputs), iterable like INetworkDefinition."""

    def __init__(self, graph):
        self.tensors = {}

        def tensor(name):
            return self.tensors.setdefault(name, types.SimpleNamespace(name=name, dtype="f32", dynamic_range=None))

        super().__init__(_Layer(n, tensor) for n in graph.node)
        self.inputs = [tensor(i.name) for i in graph.input]
        self.num_inputs, self.num_layers = len(self.inputs), len(self)

    def get_input(self, i):
        return self.inputs[i]

    def get_layer(self, i):
        return self[i]


class _Fakes:
    def __init__(self):
        self.built, self.networks, self.configs = [], [], []

    def network_from_onnx_path(self, path, strongly_typed=None):
        import onnx

        net = _Network(onnx.load(path).graph)
        self.networks.append((path, strongly_typed, net))
        return lambda: ("builder", net, "parser")

    def engine_bytes(self, network, config=None):
        self.built.append(network[1])
        self.configs.append(config)
        return lambda: b"PLAN-" + str(len(self.built)).encode()


class _Runner:
    """Stands in for TrtRunner: the 'engine' is the plan bytes; each infer reports layer times."""

    def __init__(self, engine, name=None):
        self.loader, self.name = engine, name

    def activate(self):
        self.plan = self.loader()
        self.context = types.SimpleNamespace(profiler=None)
        names = ["/conv1/Conv + /relu1/Relu", "Reformatting CopyNode for Input Tensor 0 to /fc/Gemm", "/fc/Gemm"]
        layers = [{"Name": n, "LayerType": "Reformat" if n.startswith("Reformatting") else "CaskConvolution",
                   "Inputs": [{"Name": "a", "Format/Datatype": "Row major Int8 format"}],
                   "Outputs": [{"Name": "b", "Format/Datatype": "Row major linear FP32"}]} for n in names]
        info = json.dumps({"Layers": layers, "Bindings": ["image", "logits"]})
        inspector = types.SimpleNamespace(execution_context=None, get_engine_information=lambda fmt: info)
        self.engine = types.SimpleNamespace(create_engine_inspector=lambda: inspector, names=names)

    def infer(self, feed, check_inputs=True, copy_outputs_to_host=True):
        if self.context.profiler is not None:
            for i, n in enumerate(self.engine.names):
                self.context.profiler.report_layer_time(n, 0.1 * (i + 1))
        return {"logits": np.full((1, 10), float(len(self.plan)), np.float32)}

    def deactivate(self):
        del self.context, self.engine


class _DeviceArray:
    freed = 0

    def __init__(self, shape=None, dtype=None):
        self.shape = shape

    def copy_from(self, a):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _DeviceArray.freed += 1


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("flow-ws"))
    materialize_sample("tiny-cnn", ws)
    return open_project("sample:tiny-cnn", ws=ws)


@pytest.fixture
def fakes(monkeypatch, request):
    import polygraphy.backend.trt as pt
    import polygraphy.cuda as pc

    f = _Fakes()
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_trt(getattr(request, "param", "10.11.0.33")))
    monkeypatch.setattr(pt, "NetworkFromOnnxPath", f.network_from_onnx_path)
    monkeypatch.setattr(pt, "EngineBytesFromNetwork", f.engine_bytes)
    monkeypatch.setattr(pt, "EngineFromBytes", lambda data: lambda: data)
    monkeypatch.setattr(pt, "TrtRunner", _Runner)
    monkeypatch.setattr(pc, "DeviceArray", _DeviceArray)
    monkeypatch.setattr(tb, "cuda_device", lambda ordinal=0: ("Fake GPU", "8.9"))
    return f


def _build(project, tmp_path, mode="auto", **kw):
    policy = project.default_policy().with_layers({"/conv2/Conv": "fp16"})
    calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws)
    be = tb.TensorRTBackend(ws=project.ws, mode=mode, **kw)
    return be, policy, be.build(project.model, policy, calib, tmp_path, project.input_shapes)


def test_legacy_build_constrains_the_original_network(fakes, project, tmp_path):
    be, policy, engine = _build(project, tmp_path)
    path, strongly_typed, net = fakes.networks[-1]
    assert engine.compiled_path == tmp_path / "model.onnx" and path == str(engine.compiled_path)
    assert strongly_typed is False and fakes.built[-1] is net
    layer = {l.name: l for l in net}
    assert layer["/conv1/Conv"].precision == "i8" and layer["/conv1/Conv"].out_types == {0: "f32"}
    assert layer["/conv2/Conv"].precision == "f16" and layer["/conv2/Conv"].out_types == {0: "f16"}
    assert layer["/relu1/Relu"].precision == "f32" and layer["/relu1/Relu"].out_types == {0: "f32"}
    assert layer["/flatten/Flatten"].precision is None and layer["/flatten/Flatten"].out_types == {}  # not a layer
    calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws)
    int8_inputs = {l.ins[0].name for l in net if l.precision == "i8"}
    assert "image" in int8_inputs and len(int8_inputs) >= 3  # conv1, conv3, fc
    for name, t in net.tensors.items():
        amax = calib.amax(name) if name in int8_inputs else None
        assert t.dynamic_range == (None if amax is None else (-amax, amax)), name
    config = fakes.configs[-1]
    assert (config.fp16, config.int8, config.precision_constraints) == (True, True, "obey")
    assert config.profiling_verbosity == "detailed" and config.memory_pool_limits == {"workspace": 4 << 30}
    assert [tuple(s) for s in config.profiles[0]["image"]] == [(1, 3, 32, 32)] * 3


@pytest.mark.parametrize("fakes", ["10.12.0.36"], indirect=True)
def test_strongly_typed_build_and_engine_cache(fakes, project, tmp_path):
    be, policy, first = _build(project, tmp_path / "a")
    assert first.compiled_path.name == "compiled.onnx" and fakes.networks[-1][1] is True
    config = fakes.configs[-1]
    assert (config.fp16, config.int8, config.precision_constraints) == (False, False, None)
    side = json.loads((tmp_path / "a" / "compiled.tensorrt.json").read_text())
    assert not side["cache_hit"] and side["mode"] == "strongly-typed" and side["gpu"] == "Fake GPU"
    assert side["calibration"] and (project.ws.root / "engines" / "tensorrt" / f"{side['key']}.plan").is_file()
    _, _, second = _build(project, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "compiled.tensorrt.json").read_text())["cache_hit"]
    assert len(fakes.built) == 1 and second.artifact_path.read_bytes() == first.artifact_path.read_bytes()
    _, _, other = _build(project, tmp_path / "c", profiles={"image": ((1, 3, 32, 32), (1, 3, 32, 32), (8, 3, 32, 32))})
    assert len(fakes.built) == 2  # another profile is another engine


def test_run_time_and_profile(fakes, project, tmp_path):
    be, policy, engine = _build(project, tmp_path / "run")
    ref = be.reference(project.model, tmp_path / "ref", project.input_shapes)
    assert ref.compiled_path.name == "reference-fp32.onnx" and fakes.configs[-1].fp16 is False
    feed = project.eval_data.batches(1)[0]
    with be.runner(ref) as r:
        assert r.infer(feed)["logits"].shape == (1, 10)
    lat = be.time_interleaved(engine, ref, feed, warmup=2, iterations=7)
    assert lat.iterations == 7 and lat.median_ms > 0 and _DeviceArray.freed >= 1
    df = be.profile(engine, feed, 4, project.layers, policy)
    assert list(df.columns) == PER_LAYER_COLUMNS
    assert df["layer"].tolist() == ["/fc/Gemm", "", "/conv1/Conv"] and df["is_reformat"].tolist() == [False, True, False]
    assert df["ms"].tolist() == pytest.approx([0.3, 0.2, 0.1]) and df["pct"].sum() == pytest.approx(100.0)
    profile = json.loads((tmp_path / "run" / "trt-profile.json").read_text())
    assert profile[0] == {"count": 4}


@pytest.mark.parametrize("fakes", ["11.0.0"], indirect=True)
def test_legacy_refused_on_tensorrt_11(fakes, project, tmp_path):
    with pytest.raises(MixprecError, match="removed in TensorRT 11"):
        _build(project, tmp_path, mode="legacy")


def test_no_gpu_is_a_clear_error(fakes, project, tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "cuda_device", lambda ordinal=0: None)
    with pytest.raises(MixprecError, match="no CUDA device"):
        _build(project, tmp_path)


def test_build_failure_lists_tensorrt_errors(fakes, project, tmp_path, monkeypatch):
    import polygraphy.backend.trt as pt
    from polygraphy.logger import G_LOGGER

    def failing_build(network, config=None):
        def build():
            G_LOGGER.error("[TRT] 10: Could not find any implementation for node /fc/Gemm [INT8].")
            G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")
        return build

    monkeypatch.setattr(pt, "EngineBytesFromNetwork", failing_build)
    plans = set(project.ws.sub("engines", "tensorrt").glob("*.plan"))
    with pytest.raises(MixprecError, match="could not build the engine") as e:
        _build(project, tmp_path, workspace_bytes=1 << 20)  # a key no other test built
    assert any("Could not find any implementation for node /fc/Gemm" in d for d in e.value.details)
    assert G_LOGGER.log_file is None and (tmp_path / "compiled.tensorrt-build.log").is_file()
    assert set(project.ws.sub("engines", "tensorrt").glob("*.plan")) == plans  # nothing cached
