"""The TensorRT backend on a GPU: the tiny samples built under both build paths (strongly typed
and legacy), checked against ONNX Runtime, timed, profiled and read back. Needs TensorRT and an
NVIDIA GPU (``pytest -m tensorrt``); everywhere else these tests are skipped."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from tests.fixtures.trt import trt_version
from core.backends import tensorrt_available
from core.backends.base import PER_LAYER_COLUMNS
from core.backends.reports import load_engine_report
from core.measure.metrics import quality
from core.model.samples import materialize_sample
from core.project import open_project
from core.quant.calibration import calibrate
from core.workspace import Workspace


TRT_VERSION = trt_version()
USABLE, WHY = tensorrt_available() if TRT_VERSION else (False, "")
pytestmark = [
    pytest.mark.tensorrt,
    pytest.mark.skipif(TRT_VERSION is None, reason="TensorRT not installed"),
    pytest.mark.skipif(TRT_VERSION is not None and not USABLE, reason=WHY),
]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("trt-ws"))


@pytest.fixture(scope="module", params=["tiny-cnn", "tiny-transformer"])
def project(request, ws):
    materialize_sample(request.param, ws)
    return open_project(f"sample:{request.param}", ws=ws)


@pytest.fixture(params=["strongly-typed", "legacy"])
def backend(request, ws):
    from core.backends.tensorrt import LEGACY_REMOVED_IN, TensorRTBackend, parse_version

    if request.param == "legacy" and parse_version(TRT_VERSION) >= LEGACY_REMOVED_IN:
        pytest.skip(f"TensorRT {TRT_VERSION} has no per-layer precision APIs (the legacy build)")
    return TensorRTBackend(ws=ws, mode=request.param)


def _outputs(backend, engine, batches, name):
    with backend.runner(engine) as r:
        return [r.infer(b)[name] for b in batches]


def _sidecar(engine) -> dict:
    return json.loads(engine.artifact_path.with_suffix(".tensorrt.json").read_text())


def _build(backend, project, policy, out_dir):
    calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws) \
        if "int8" in policy.layers.values() else None
    return backend.build(project.model, policy, calib, out_dir, project.input_shapes)


def test_reference_matches_onnxruntime(backend, project, tmp_path):
    ref = backend.reference(project.model, tmp_path, project.input_shapes)
    assert ref.artifact_path.is_file() and _sidecar(ref)["mode"] == backend.mode
    out = next(o.name for o in project.model.outputs if o.is_float)
    batches = project.eval_data.batches(1)[:8]
    sess = ort.InferenceSession(project.model.serialized(), providers=["CPUExecutionProvider"])
    expected = [sess.run([out], b)[0] for b in batches]
    for got, want in zip(_outputs(backend, ref, batches, out), expected):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
    if all(0 in s.dynamic_axes for s in project.model.inputs):  # runs.py evaluates in batches of up to 16
        big = project.eval_data.batches(16)[0]
        assert _outputs(backend, ref, [big], out)[0].shape[0] == 16


def test_build_time_profile_and_layer_info(backend, project, tmp_path):
    policy = project.default_policy()  # INT8 where eligible, FP16 LayerNorm/Softmax
    engine = _build(backend, project, policy, tmp_path / "run")
    ref = backend.reference(project.model, tmp_path / "ref", project.input_shapes)
    assert _sidecar(engine)["mode"] == backend.mode
    assert engine.compiled_path.name == ("compiled.onnx" if backend.mode == "strongly-typed" else "model.onnx")

    out = next(o.name for o in project.model.outputs if o.is_float)
    batches = project.eval_data.batches(1)
    q = quality(_outputs(backend, ref, batches, out), _outputs(backend, engine, batches, out), out)
    assert q.cosine_mean > 0.95, q

    lat = backend.time_interleaved(engine, ref, batches[0], warmup=5, iterations=30)
    assert lat.iterations == 30 and 0 < lat.median_ms <= lat.p95_ms and lat.ref_median_ms > 0 and lat.speedup > 0

    df = backend.profile(engine, batches[0], 10, project.layers, policy)
    assert list(df.columns) == PER_LAYER_COLUMNS and df["ms"].sum() > 0
    mapped = set(df["layer"]) - {""}
    assert mapped and mapped <= set(policy.layers)

    report = load_engine_report(tmp_path / "run" / "trt-layers.json", tmp_path / "run" / "trt-profile.json")
    assert report.has_profile and len(report.layers) == len(df)
    if project.model.sample == "tiny-cnn":  # (Myelin may fuse the transformer into one foreign node)
        assert "INT8" in set(report.layers["precision"])  # the INT8 convolutions really run int8


def test_fp16_policy_runs_fp16(backend, project, tmp_path):
    from core.quant.policy import uniform_policy

    policy = uniform_policy(project.model, project.layers, "fp16")
    engine = _build(backend, project, policy, tmp_path)
    backend.profile(engine, project.eval_data.batches(1)[0], 3, project.layers, policy)
    report = load_engine_report(tmp_path / "trt-layers.json")
    if project.model.sample == "tiny-cnn":
        assert "FP16" in set(report.layers["precision"])


def test_engine_cache_hit(backend, project, tmp_path):
    policy = project.default_policy()
    first = _build(backend, project, policy, tmp_path / "a")
    second = _build(backend, project, policy, tmp_path / "b")
    assert _sidecar(second)["cache_hit"] and _sidecar(second)["key"] == _sidecar(first)["key"]
    assert second.artifact_path.read_bytes() == first.artifact_path.read_bytes()
    assert second.build_seconds < first.build_seconds or _sidecar(first)["cache_hit"]


def test_explicit_profile_serves_a_range_of_batches(ws, tmp_path):
    from core.backends.tensorrt import TensorRTBackend

    materialize_sample("tiny-cnn", ws)
    project = open_project("sample:tiny-cnn", ws=ws)
    be = TensorRTBackend(ws=ws, profiles={"image": ((1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))})
    ref = be.reference(project.model, tmp_path, project.input_shapes)
    assert _sidecar(ref)["profiles"]["image"] == [[1, 3, 32, 32], [2, 3, 32, 32], [4, 3, 32, 32]]
    with be.runner(ref) as r:
        assert r.infer({"image": project.eval_data.arrays["image"][:4]})["logits"].shape == (4, 10)
        assert r.infer({"image": project.eval_data.arrays["image"][:1]})["logits"].shape == (1, 10)


def test_search_fits_its_latency_model_on_tensorrt(ws):
    """The search with ``backend="tensorrt"``: the latency model from TensorRT profiles and
    wall-clock times, and the verifying build on TensorRT."""
    from core.search import SearchConfig, latency_model, search

    materialize_sample("tiny-transformer", ws)
    project = open_project("sample:tiny-transformer", ws=ws)
    base = project.default_policy()
    lat = latency_model(project, base, calibrate(project.model, project.calib_data, base.calibration, ws), "tensorrt")
    eligible = {l.name for l in project.layers if l.eligible}
    assert lat.wall.fp16_total_ms > 0 and lat.wall.int8_total_ms > 0 and lat.fp32_total_ms > 0
    assert lat.estimate(eligible)[0] == pytest.approx(lat.wall.int8_total_ms, rel=1e-9)
    r = search(project, SearchConfig("cosine_mean>=0.99", methods=("minmax",), workers=1, backend="tensorrt"))
    assert r.run is not None and r.run.backend == "tensorrt" and r.met_on_holdout is not None


# ---------------------------------------------------------------------------- issue 11, section 4 (GPU tests)

def _cnn(ws):
    materialize_sample("tiny-cnn", ws)
    return open_project("sample:tiny-cnn", ws=ws)


def _mixed_policy(project):
    """INT8 where eligible, the second convolution (and the Relu after it, which TensorRT fuses into it)
    FP32, everything else FP16: every precision, and FP32 between INT8/FP16 neighbours, where a builder
    would most like to change it."""
    names = [l.name for l in project.layers]
    conv = [l.name for l in project.layers if l.op_type == "Conv"][1]
    after = project.layers[names.index(conv) + 1]
    block = {conv: "fp32", **({after.name: "fp32"} if after.op_type == "Relu" else {})}
    changes = {n: "fp16" for n, p in project.default_policy().layers.items() if p == "fp32"}
    return project.default_policy().with_layers({**changes, **block}), conv


def _node_precisions(report) -> dict[str, set[str]]:
    """{ONNX node: precisions of the compute (non-reformat) engine layers that run it} of an inspector report."""
    out: dict[str, set[str]] = {}
    for nodes, precision, reformat in zip(report.layers["onnx_nodes"], report.layers["precision"],
                                          report.layers["is_reformat"]):
        for n in ([] if reformat else nodes):
            out.setdefault(n, set()).add(precision)
    return out


def _profiled_report(backend, project, policy, out_dir):
    engine = _build(backend, project, policy, out_dir)
    backend.profile(engine, project.eval_data.batches(1)[0], 3, project.layers, policy)
    return load_engine_report(out_dir / "trt-layers.json", out_dir / "trt-profile.json")


def test_fp32_layers_stay_fp32_in_the_inspector_output(backend, ws, tmp_path):
    project = _cnn(ws)
    policy, fp32_layer = _mixed_policy(project)
    precisions = _node_precisions(_profiled_report(backend, project, policy, tmp_path))
    assert precisions.get(fp32_layer) == {"FP32"}, precisions  # not FP16, INT8 or TF32-fused away
    int8_convs = [l.name for l in project.layers if l.op_type == "Conv" and policy.layers.get(l.name) == "int8"]
    assert int8_convs and all("INT8" in precisions.get(n, set()) for n in int8_convs), precisions


def test_legacy_and_typed_paths_agree_on_precisions(ws, tmp_path):
    from core.backends.tensorrt import LEGACY_REMOVED_IN, TensorRTBackend, parse_version

    if parse_version(TRT_VERSION) >= LEGACY_REMOVED_IN:
        pytest.skip(f"TensorRT {TRT_VERSION} has no legacy build to compare with")
    project = _cnn(ws)
    policy, _ = _mixed_policy(project)
    got = {mode: _node_precisions(_profiled_report(TensorRTBackend(ws=ws, mode=mode), project, policy, tmp_path / mode))
           for mode in ("strongly-typed", "legacy")}
    common = set(got["strongly-typed"]) & set(got["legacy"]) & set(policy.layers)
    assert len(common) >= 4, got
    assert {n: got["strongly-typed"][n] for n in common} == {n: got["legacy"][n] for n in common}


def _run_script(script, env_path):
    import os
    import subprocess

    env = {**os.environ, "PATH": f"{env_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=1800)


def test_exported_trtexec_and_polygraphy_commands_run_and_pass(ws, tmp_path):
    import shutil
    import sys
    from pathlib import Path

    from core.backends.tensorrt import STRONG_TYPING_FROM, parse_version
    from core.export import export_policy

    if shutil.which("trtexec") is None:
        pytest.skip("trtexec is not on PATH (it ships in the TensorRT tarball / NGC containers, not the wheel)")
    bin_dir = Path(sys.executable).parent  # the polygraphy CLI of this environment
    project = _cnn(ws)
    policy, fp32_layer = _mixed_policy(project)
    legacy = parse_version(TRT_VERSION) < STRONG_TYPING_FROM
    for fmt in (["trtexec"] if legacy else []) + ["trtexec-typed", "polygraphy"]:
        out = export_policy(project, policy, fmt, tmp_path / fmt / "build.sh", trt_version=TRT_VERSION)
        res = _run_script(out, bin_dir)
        assert res.returncode == 0, (fmt, res.stdout[-4000:], res.stderr[-4000:])
        if fmt == "polygraphy":
            assert "PASSED" in res.stdout + res.stderr and "FAILED" not in res.stdout + res.stderr
            continue
        assert "&&&& PASSED" in res.stdout
        report = load_engine_report(out.parent / "layers.json", out.parent / "profile.json")
        assert report.has_profile and _node_precisions(report).get(fp32_layer) == {"FP32"}


def test_speedup_is_measured_with_cuda_events(ws, monkeypatch):
    """time_interleaved's numbers are the cudaEventElapsedTime of each execute_async_v3, and that GPU time
    is not more than the wall-clock time of a Polygraphy infer of the same engine (which adds Python
    setup and a synchronisation)."""
    import time

    import core.backends.tensorrt as tb
    from core.backends.tensorrt import timing

    project = _cnn(ws)
    backend = tb.TensorRTBackend(ws=ws)
    policy = project.default_policy()
    engine = _build(backend, project, policy, ws.root / "events-run")
    ref = backend.reference(project.model, ws.root / "events-ref", project.input_shapes)
    elapsed = []
    real = timing.CudaEvents.elapsed_ms

    def spy(self, start, end):
        elapsed.append(real(self, start, end))
        return elapsed[-1]

    monkeypatch.setattr(timing.CudaEvents, "elapsed_ms", spy)
    feed = project.eval_data.batches(16)[0]
    lat = backend.time_interleaved(engine, ref, feed, warmup=10, iterations=50)
    cand, refs = np.array(elapsed[0::2]), np.array(elapsed[1::2])
    assert len(elapsed) == 100 and (cand > 0).all() and (refs > 0).all()
    assert lat.median_ms == pytest.approx(float(np.median(cand)), rel=1e-6)
    assert lat.ref_median_ms == pytest.approx(float(np.median(refs)), rel=1e-6)
    assert lat.speedup == pytest.approx(float(np.median(refs / cand)), rel=1e-6)
    with backend.runner(engine) as r:
        for _ in range(5):
            r.infer(feed)
        wall = []
        for _ in range(20):
            t0 = time.perf_counter()
            r.infer(feed)
            wall.append((time.perf_counter() - t0) * 1e3)
    assert float(np.median(wall)) >= 0.9 * lat.median_ms
