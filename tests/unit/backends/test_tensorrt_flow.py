"""The TensorRT backend's control flow without a GPU: a fake ``tensorrt`` module and fake engine,
runner and device buffers, with Polygraphy's real ``SetLayerPrecisions``, ``PostprocessNetwork``,
``CreateConfig`` and ``Profile``, on the tiny-cnn sample. What TensorRT itself does is tested by
test_tensorrt.py on a GPU; this covers the backend's own code paths (both build modes, the engine
cache, runner, interleaved timing, profiling and the per-layer table). Device buffers, streams and
events are Polygraphy's real ``polygraphy.cuda`` objects over a simulated CUDA runtime (fake_cuda)."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

import core.backends.tensorrt as tb
from core.backends.base import PER_LAYER_COLUMNS
from core.backends.tensorrt import legacy, runner
from core.errors import MixprecError
from core.quant.calibration import calibrate
from core.quant.policy import Policy
from tests.fixtures.fake_tensorrt import FakeLayer, FakeNetwork, build_engine, fake_tensor, fake_trt


def test_legacy_build_constrains_the_original_network(fakes, project, tmp_path):
    be, policy, engine = build_engine(project, tmp_path)
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
    # the layers the parser made for /fc/Gemm without metadata follow it (issue 11, bug 7)
    shuffle, bias = (next(l for l in net if l.type == kind) for kind in ("SHUFFLE", "ELEMENTWISE"))
    assert shuffle.metadata == bias.metadata == "" and layer["/fc/Gemm"].precision == "i8"
    assert (shuffle.precision, bias.precision, bias.out_types) == ("f32", "f32", {0: "f32"})
    weights = next(l for l in net if l.type == "CONSTANT")
    for name, t in net.tensors.items():
        amax = calib.amax(name) if name in int8_inputs else None
        if name == shuffle.outs[0].name:  # the Gemm's weights, through the parser's Shuffle: max |w|
            amax = float(np.abs(weights.weights).max())
        assert t.dynamic_range == (None if amax is None else (-amax, amax)), name
    config = fakes.configs[-1]
    assert (config.fp16, config.int8, config.precision_constraints) == (True, True, "obey")
    assert config.profiling_verbosity == "detailed" and config.memory_pool_limits == {"workspace": 4 << 30}
    assert [tuple(s) for s in config.profiles[0]["image"]] == [(1, 3, 32, 32), (1, 3, 32, 32), (16, 3, 32, 32)]


@pytest.mark.parametrize("fakes", ["10.12.0.36"], indirect=True)
def test_strongly_typed_build_and_engine_cache(fakes, project, tmp_path):
    be, policy, first = build_engine(project, tmp_path / "a")
    assert first.compiled_path.name == "compiled.onnx" and fakes.networks[-1][1] is True
    config = fakes.configs[-1]
    assert (config.fp16, config.int8, config.precision_constraints) == (False, False, None)
    side = json.loads((tmp_path / "a" / "compiled.tensorrt.json").read_text())
    assert not side["cache_hit"] and side["mode"] == "strongly-typed" and side["gpu"] == "Fake GPU"
    assert side["calibration"] and (project.ws.root / "engines" / "tensorrt" / f"{side['key']}.plan").is_file()
    _, _, second = build_engine(project, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "compiled.tensorrt.json").read_text())["cache_hit"]
    assert len(fakes.built) == 1 and second.artifact_path.read_bytes() == first.artifact_path.read_bytes()
    wide = {"image": ((1, 3, 32, 32), (1, 3, 32, 32), (8, 3, 32, 32))}
    build_engine(project, tmp_path / "c", profiles=wide)
    assert len(fakes.built) == 2  # another profile is another engine


def test_run_time_and_profile(fakes, project, tmp_path):
    be, policy, engine = build_engine(project, tmp_path / "run")
    ref = be.reference(project.model, tmp_path / "ref", project.input_shapes)
    assert ref.compiled_path.name == "reference-fp32.onnx" and fakes.configs[-1].fp16 is False
    feed = project.eval_data.batches(1)[0]
    with be.runner(ref) as r:
        assert r.infer(feed)["logits"].shape == (1, 10)
    lat = be.time_interleaved(engine, ref, feed, warmup=2, iterations=7)
    assert lat.iterations == 7 and lat.median_ms == pytest.approx(0.05) and lat.speedup == pytest.approx(1.0)
    assert not fakes.cuda.memory and not fakes.cuda.events  # device buffers and events released
    df = be.profile(engine, feed, 4, project.layers, policy)
    assert list(df.columns) == PER_LAYER_COLUMNS
    assert df["layer"].tolist() == ["/fc/Gemm", "", "/conv1/Conv"]
    assert df["is_reformat"].tolist() == [False, True, False]
    assert df["ms"].tolist() == pytest.approx([0.3, 0.2, 0.1]) and df["pct"].sum() == pytest.approx(100.0)
    profile = json.loads((tmp_path / "run" / "trt-profile.json").read_text())
    assert profile[0] == {"count": 4}


@pytest.mark.parametrize("fakes", ["11.0.0"], indirect=True)
def test_legacy_refused_on_tensorrt_11(fakes, project, tmp_path):
    with pytest.raises(MixprecError, match="removed in TensorRT 11"):
        build_engine(project, tmp_path, mode="legacy")


def test_policy_checks_hold_on_the_legacy_path(fakes, project, tmp_path):
    be = tb.TensorRTBackend(ws=project.ws)
    with pytest.raises(MixprecError, match="no calibration was given"):
        be.build(project.model, project.default_policy(), None, tmp_path, project.input_shapes)
    other = Policy("x", "f" * 64, "fp32", {})
    with pytest.raises(MixprecError, match="made for another model"):
        be.build(project.model, other, None, tmp_path, project.input_shapes)


def test_no_gpu_is_a_clear_error(fakes, project, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "cuda_device", lambda ordinal=0: None)
    with pytest.raises(MixprecError, match="no CUDA device"):
        build_engine(project, tmp_path)


def test_build_failure_lists_tensorrt_errors(fakes, project, tmp_path, monkeypatch):
    import polygraphy.backend.trt as pt
    from polygraphy.logger import G_LOGGER

    opened = []

    def failing_build(network, config=None):
        def build():
            opened.append(G_LOGGER._log_file)
            G_LOGGER.error("[TRT] 10: Could not find any implementation for node /fc/Gemm [INT8].")
            G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")
        return build

    monkeypatch.setattr(pt, "EngineBytesFromNetwork", failing_build)
    plans = set(project.ws.sub("engines", "tensorrt").glob("*.plan"))
    with pytest.raises(MixprecError, match="could not build the engine") as e:
        build_engine(project, tmp_path, workspace_bytes=1 << 20)  # a key no other test built
    assert any("Could not find any implementation for node /fc/Gemm" in d for d in e.value.details)
    assert G_LOGGER.log_file is None and (tmp_path / "compiled.tensorrt-build.log").is_file()
    assert opened and opened[0].closed  # issue 11, bug 11: the log file Polygraphy opened is closed
    assert set(project.ws.sub("engines", "tensorrt").glob("*.plan")) == plans  # nothing cached


def test_build_and_measure_runs_on_the_tensorrt_backend(fakes, project, monkeypatch):
    from core.measure.runs import build_and_measure
    from core.store.runs import load_run_per_layer

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(project.ws.root))
    result = build_and_measure(project, project.default_policy(), backend="tensorrt", iterations=5)
    assert result.backend == "tensorrt"
    assert result.backend_reason.startswith("tensorrt: TensorRT 10.11.0.33 on Fake GPU")
    assert result.reformat.count == 1 and result.latency.iterations == 5
    assert list(load_run_per_layer(result.run_dir).columns) == PER_LAYER_COLUMNS
    assert (result.run_dir / "compiled.plan").is_file() and (result.run_dir / "trt-layers.json").is_file()


def test_the_projects_profile_reaches_every_engine(fakes, project, monkeypatch):
    """A project opened with --profile (issue 22 §4) runs at its opt, and the engines of its build (the
    policy's and the FP32 reference) are built for its min/opt/max, the batch reaching EVAL_BATCH (16)."""
    from core.measure.runs import build_and_measure
    from core.project import open_project

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(project.ws.root))
    p = open_project("sample:tiny-cnn", ws=project.ws,
                     profiles={"image": ((1, 3, 32, 32), (2, 3, 32, 32), (8, 3, 32, 32))})
    assert p.input_shapes == {"image": (2, 3, 32, 32)}
    n = len(fakes.configs)
    result = build_and_measure(p, p.default_policy(), backend="tensorrt", iterations=2)
    assert result.input_shapes == {"image": [2, 3, 32, 32]}
    built = [[tuple(s) for s in c.profiles[0]["image"]] for c in fakes.configs[n:]]
    assert len(built) == 2 and all(b == [(1, 3, 32, 32), (2, 3, 32, 32), (16, 3, 32, 32)] for b in built)


# ---------------------------------------------------------------------------- legacy constraints on a hand-made network

def _gemm_network():
    """conv1 -> relu1 -> fc (MatMul on Shuffle(Constant) weights, then a bias add) -> relu2, plus a Shape
    layer. As in the real parser, the weight Constant, its Shuffle and the bias add have no metadata."""
    t = {n: fake_tensor(n) for n in ("x", "c1", "r1", "w", "wt", "mm", "fc_out", "r2")}
    layers = [
        FakeLayer("conv1", "CONVOLUTION", [t["x"]], [t["c1"]]),
        FakeLayer("relu1", "ACTIVATION", [t["c1"]], [t["r1"]]),
        FakeLayer("(Unnamed Layer* 2) [Constant]", "CONSTANT", [], [t["w"]], False,
               weights=np.array([[-3.0, 1.0]], np.float32)),
        FakeLayer("(Unnamed Layer* 3) [Shuffle]", "SHUFFLE", [t["w"]], [t["wt"]], False),
        FakeLayer("fc", "MATRIX_MULTIPLY", [t["r1"], t["wt"]], [t["mm"]]),
        FakeLayer("(Unnamed Layer* 5) [ElementWise]", "ELEMENTWISE", [t["mm"]], [t["fc_out"]], False),
        FakeLayer("relu2", "ACTIVATION", [t["fc_out"]], [t["r2"]]),
        FakeLayer("shape_of_x", "SHAPE", [t["x"]], [fake_tensor("shape", "i64")], "norm"),
    ]
    return FakeNetwork([t["x"]], layers)


def test_legacy_constraints_and_ranges():
    net = _gemm_network()
    policy = Policy("m", "0" * 64, "fp16", {"conv1": "fp32", "relu1": "fp16", "fc": "int8", "relu2": "fp16",
                                            "norm": "fp16"})
    calib = types.SimpleNamespace(ranges={"r1": (-0.5, 6.0), "x": (-1.0, 1.0)}, amax={"r1": 6.0, "x": 1.0}.get)
    precisions, outputs, ranges = legacy.legacy_constraints(net, policy, calib, fake_trt())
    # the MatMul of the INT8 node runs int8; the weight Shuffle and bias add the parser made for it (with no
    # metadata, issue 11 bug 7) follow that node, the bias add its MatMul rather than the relu2 it feeds.
    # Under an fp16 network default the INT8 node still outputs fp32, as the strongly typed path's
    # DequantizeLinear does (bug 6); constants and shape layers are never constrained
    shuffle, bias = "(Unnamed Layer* 3) [Shuffle]", "(Unnamed Layer* 5) [ElementWise]"
    assert precisions == {"conv1": "f32", "relu1": "f16", shuffle: "f32", "fc": "i8", bias: "f32", "relu2": "f16"}
    assert outputs == {"conv1": "f32", "relu1": "f16", shuffle: "f32", "fc": "f32", bias: "f32", "relu2": "f16"}
    assert ranges == {"r1": 6.0, "wt": 3.0}  # the calibrated activation; the weights through the Shuffle
    legacy._apply_types_and_ranges(net, outputs, ranges)
    assert net[4].out_types == {0: "f32"} and net.tensors["r1"].dynamic_range == (-6.0, 6.0)
    assert net.tensors["wt"].dynamic_range == (-3.0, 3.0) and net.tensors["x"].dynamic_range is None


def test_legacy_constraints_name_int8_inputs_without_range():
    policy = Policy("m", "0" * 64, "fp32", {"fc": "int8"})
    calib = types.SimpleNamespace(ranges={}, amax=lambda n: 0.0)
    with pytest.raises(MixprecError, match="no calibrated range") as e:
        legacy.legacy_constraints(_gemm_network(), policy, calib, fake_trt())
    assert e.value.details == ["fc: input 0 (r1)"]


# ---------------------------------------------------------------------------- issue 11, section 2

@pytest.mark.parametrize("fakes", ["10.12.0.36"], indirect=True)
def test_engine_cache_key_covers_the_compiled_onnx(fakes, project, tmp_path, monkeypatch):
    """Bug 5: a compiler change (other compiled bytes for the same model, policy and calibration)
    silently reused the stale engine."""
    build_engine(project, tmp_path / "a", workspace_bytes=6 << 30)  # a key no other test builds
    build_engine(project, tmp_path / "b", workspace_bytes=6 << 30)
    assert len(fakes.built) == 1  # unchanged: a cache hit
    real = runner.compile_policy

    def changed_compiler(*args, **kwargs):
        compiled = real(*args, **kwargs)
        compiled.proto.doc_string = "compiled by a newer mixprec"
        return compiled

    monkeypatch.setattr(runner, "compile_policy", changed_compiler)
    build_engine(project, tmp_path / "c", workspace_bytes=6 << 30)
    side = json.loads((tmp_path / "c" / "compiled.tensorrt.json").read_text())
    assert len(fakes.built) == 2 and not side["cache_hit"] and len(side["onnx_sha256"]) == 64


def test_engine_cache_key_covers_the_legacy_constraints(fakes, project, tmp_path, monkeypatch):
    """Bug 5: on the legacy path the key lacked the precisions, output types and ranges applied."""
    build_engine(project, tmp_path / "a", workspace_bytes=3 << 30)
    before = len(fakes.built)
    build_engine(project, tmp_path / "b", workspace_bytes=3 << 30)
    assert len(fakes.built) == before  # unchanged: a cache hit
    real = runner.legacy_constraints

    def other_ranges(*args):
        precisions, outputs, ranges = real(*args)
        return precisions, outputs, {k: 2 * v for k, v in ranges.items()}

    monkeypatch.setattr(runner, "legacy_constraints", other_ranges)
    build_engine(project, tmp_path / "c", workspace_bytes=3 << 30)
    assert len(fakes.built) == before + 1
    assert json.loads((tmp_path / "c" / "compiled.tensorrt.json").read_text())["legacy_constraints"]


def test_tf32_is_explicit_in_the_config_and_the_key(fakes, project, tmp_path):
    """Bug 4: TF32 is off unless asked for, set in the builder config, and part of the engine key."""
    build_engine(project, tmp_path / "off", workspace_bytes=5 << 30)
    assert fakes.configs[-1].tf32 is False
    off = json.loads((tmp_path / "off" / "compiled.tensorrt.json").read_text())
    build_engine(project, tmp_path / "on", workspace_bytes=5 << 30, tf32=True)
    assert fakes.configs[-1].tf32 is True
    on = json.loads((tmp_path / "on" / "compiled.tensorrt.json").read_text())
    assert (off["tf32"], on["tf32"]) == (False, True) and off["key"] != on["key"]
    assert tb.TensorRTBackend(tf32=True).identity() == "tensorrt 10.11.0.33 on Fake GPU (sm 8.9) tf32=True"


def _constrained(net):
    return ({l.name: (l.precision, dict(l.out_types)) for l in net},
            {n: t.dynamic_range for n, t in net.tensors.items()})


def test_exported_postprocess_script_constrains_like_the_backend(monkeypatch):
    """Bug 1: the script the <= 10.11 export ships applies the backend's legacy constraints, including
    ranges on the weight Constant (through its Shuffle) of an INT8 Gemm, and enables INT8 without a calibrator."""
    fake = fake_trt()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    policy = Policy("m", "0" * 64, "fp16", {"conv1": "fp32", "relu1": "fp16", "fc": "int8", "norm": "fp16"})
    calib = types.SimpleNamespace(ranges={"r1": (-0.5, 6.0), "x": (-1.0, 1.0)}, amax={"r1": 6.0, "x": 1.0}.get)
    backend_net, script_net = _gemm_network(), _gemm_network()
    precisions, outputs, ranges = legacy.legacy_constraints(backend_net, policy, calib, fake)
    for layer in backend_net:
        if layer.name in precisions:
            layer.precision = precisions[layer.name]
    legacy._apply_types_and_ranges(backend_net, outputs, ranges)
    ns: dict = {}
    exec(compile(tb.legacy_postprocess_script(policy, calib), "postprocess.py", "exec"), ns)
    assert ns["postprocess"](network=script_net) is script_net
    assert _constrained(script_net) == _constrained(backend_net)
    assert script_net.tensors["wt"].dynamic_range == (-3.0, 3.0)  # max |w| of the Constant behind the Shuffle
    flags = []
    ns["postprocess_config"](builder=None, network=script_net, config=types.SimpleNamespace(set_flag=flags.append))
    assert flags == ["int8-flag"]
    missing = Policy("m", "0" * 64, "fp32", {"fc": "int8"})
    ns = {}
    exec(compile(tb.legacy_postprocess_script(missing, types.SimpleNamespace(ranges={}, amax=None)), "p.py", "exec"), ns)
    with pytest.raises(RuntimeError, match="fc: input 0"):
        ns["postprocess"](network=_gemm_network())


@pytest.mark.parametrize("fakes", ["10.12.0.36"], indirect=True)
def test_trt_build_requires_opset_13(fakes, project, tmp_path):
    """Bug 8: the strongly typed build compiles Q/DQ with per-channel axis, which needs opset >= 13."""
    from dataclasses import replace

    old = replace(project.model, opset=12)
    calib = calibrate(project.model, project.calib_data, project.default_policy().calibration, project.ws)
    with pytest.raises(MixprecError, match="opset 12.*needs opset >= 13"):
        tb.TensorRTBackend(ws=project.ws).build(old, project.default_policy(), calib, tmp_path, project.input_shapes)
