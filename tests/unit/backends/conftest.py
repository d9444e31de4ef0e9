"""Fixtures of the TensorRT backend tests without a GPU: the tiny-cnn project and the fakes."""
from __future__ import annotations

import itertools
import json
import sys
import types

import numpy as np
import pytest

from core.backends.tensorrt import runner, versions
from core.model.samples import materialize_sample
from core.project import open_project
from core.workspace import Workspace
from tests.fixtures.fake_cuda import FakeEngine, install
from tests.fixtures.fake_tensorrt import FakeNetwork, fake_trt


class _Fakes:
    def __init__(self):
        self.built, self.networks, self.configs = [], [], []

    def network_from_onnx_path(self, path, strongly_typed=None):
        import onnx

        net = FakeNetwork.from_onnx(onnx.load(path).graph)
        self.networks.append((path, strongly_typed, net))
        return lambda: ("builder", net, "parser")

    def engine_bytes(self, network, config=None):
        self.built.append(network[1])
        self.configs.append(config)
        return lambda: b"PLAN-" + str(len(self.built)).encode()


class _Runner:
    """Stands in for TrtRunner: the 'engine' is the plan bytes; ``infer`` returns outputs; the bound
    context's ``execute_async_v3`` (fake_cuda) reports layer times to a profiler attached to it."""

    lib = None

    def __init__(self, engine, name=None):
        self.loader, self.name = engine, name

    def activate(self):
        self.plan = self.loader()
        names = ["/conv1/Conv + /relu1/Relu", "Reformatting CopyNode for Input Tensor 0 to /fc/Gemm", "/fc/Gemm"]
        layers = [{"Name": n, "LayerType": "Reformat" if n.startswith("Reformatting") else "CaskConvolution",
                   "Inputs": [{"Name": "a", "Format/Datatype": "Row major Int8 format"}],
                   "Outputs": [{"Name": "b", "Format/Datatype": "Row major linear FP32"}]} for n in names]
        info = json.dumps({"Layers": layers, "Bindings": ["image", "logits"]})
        inspector = types.SimpleNamespace(execution_context=None, get_engine_information=lambda fmt: info)
        self.engine = FakeEngine({"image": ((1, 3, 32, 32), np.float32)}, {"logits": ((1, 10), np.float32)},
                                 itertools.repeat(0.05), layer_names=names)
        self.engine.create_engine_inspector = lambda: inspector
        self.context = self.engine.create_execution_context(self.lib)

    def infer(self, feed, check_inputs=True, copy_outputs_to_host=True):
        batch = next(iter(feed.values())).shape[0]
        return {"logits": np.full((batch, 10), float(len(self.plan)), np.float32)}

    def deactivate(self):
        del self.context, self.engine


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("flow-ws"))
    materialize_sample("tiny-cnn", ws)
    return open_project("sample:tiny-cnn", ws=ws)


@pytest.fixture
def fakes(monkeypatch, request):
    import polygraphy.backend.trt as pt

    f = _Fakes()
    f.cuda = install(monkeypatch)
    monkeypatch.setattr(_Runner, "lib", f.cuda)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt(getattr(request, "param", "10.11.0.33")))
    monkeypatch.setattr(pt, "NetworkFromOnnxPath", f.network_from_onnx_path)
    monkeypatch.setattr(pt, "EngineBytesFromNetwork", f.engine_bytes)
    monkeypatch.setattr(pt, "EngineFromBytes", lambda data: lambda: data)
    monkeypatch.setattr(pt, "TrtRunner", _Runner)
    monkeypatch.setattr(versions, "cuda_device", lambda ordinal=0: ("Fake GPU", "8.9"))  # availability
    monkeypatch.setattr(runner, "cuda_device", lambda ordinal=0: ("Fake GPU", "8.9"))  # the build, the identity
    yield f
    for mod in [m for n, m in sys.modules.items() if n.startswith("polygraphy") and m is not None]:
        lazy = vars(mod).get("trt")
        if type(lazy).__name__ == "LazyModule":  # Polygraphy caches the module it imported: forget the fake
            object.__setattr__(lazy, "module", None)
