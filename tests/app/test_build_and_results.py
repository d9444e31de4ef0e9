"""Streamlit AppTest of the Build and results page (views/build_and_results.py): runs, their latency labels and
warnings, the job panel (interrupted jobs, cancel), trtexec report imports and the estimator calibration
they offer (tests/app/test_engine_report.py: the report matched to the model, the calibration's GPU), the
estimate beside the measured latency."""
from __future__ import annotations

import json

import pytest

from core.display.tables import ms_text
from core.estimate.predict import predict
from core.jobs import JobManager
from core.project import open_project
from tests.fixtures.apptest import MODEL, captions_text, ok, page, shown, wait_all


def test_job_of_a_dead_server_shows_interrupted(ws):
    from core.jobs import Job
    from core.workspace import atomic_write_json

    job = Job(id="old", kind="build", label="before restart", queue="build-onnxruntime", params={},
              status="running", stage="timing", server_pid=2 ** 22 + 1)  # above pid_max: never alive
    atomic_write_json(ws.jobs / "old.json", job.__dict__)
    at = page("build_and_results")
    assert any("interrupted" in m.value for m in at.markdown)
    assert at.error and "stopped while this job was timing" in at.error[0].value


@pytest.mark.parametrize("fixture,count", [("a100-resnet-qat", 12), ("a100-resnet-fp16", 2)])
def test_results_page_imports_trtexec_reports(ws, trt_reports_dir, fixture, count):
    at = ok(page("build_and_results"))
    at.text_input(key="trt_graph_path").input(str(trt_reports_dir / f"{fixture}.graph.json"))
    at.text_input(key="trt_profile_path").input(str(trt_reports_dir / f"{fixture}.profile.json")).run()
    ok(at)
    assert any(f"{count} reformat layers" in m.value for m in at.markdown)
    assert len(at.get("plotly_chart")) == 4  # no runs yet: every chart is the report's


def test_results_page_rejects_a_bad_report(ws, trt_reports_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"Layers": ["conv1", "relu1"]}')
    at = ok(page("build_and_results"))
    at.text_input(key="trt_graph_path").input(str(bad)).run()
    assert at.error and "profilingVerbosity=detailed" in shown(at.error[0])
    assert not at.exception


def test_results_page_shows_the_quality_warning(ws):
    from core.project import open_project
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    r = build_and_measure(p, p.default_policy(), iterations=3, profile_iterations=1, warn_below=1.01)
    assert r.warnings
    at = ok(page("build_and_results"))
    assert at.warning and "is below 1.01" in at.warning[0].value and "Sensitivity page" in at.warning[0].value


def test_results_page_shows_a_slowdown_as_one_and_the_latency_source(ws):
    """A run slower than FP32 reads "… slower than FP32" in red with a down arrow (not "↑ 0.78×");
    a faster one in green with an up arrow. The latency says what measured it, and, for the TensorRT
    target, that ONNX Runtime CPU latency does not predict TensorRT's."""
    from streamlit.proto.Metric_pb2 import Metric as MetricProto

    from core.quant.policy import uniform_policy
    from core.project import open_project
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    fast = build_and_measure(p, p.default_policy(), label="fast", iterations=3, profile_iterations=1)
    slow = build_and_measure(p, uniform_policy(p.model, p.layers, "fp16"), label="all-FP16", iterations=3,
                             profile_iterations=1)
    for run, speedup in ((fast, 1.5), (slow, 0.78)):  # this CPU's noise must not decide the test
        doc = json.loads((run.run_dir / "metrics.json").read_text())
        (run.run_dir / "metrics.json").write_text(json.dumps(doc | {"speedup": speedup}))
    at = ok(page("build_and_results"))
    metric = next(m for m in at.metric if m.label == "Median latency")  # the newest run: all-FP16
    assert metric.delta == "1.28× slower than FP32"
    assert metric.proto.color == MetricProto.MetricColor.RED and metric.proto.direction == MetricProto.MetricDirection.DOWN
    assert "ONNX Runtime CPU, measured" in metric.help
    captions = [c.value for c in at.caption]
    assert any("ONNX Runtime CPU, measured · deployment target TensorRT (GPU)" in c for c in captions)
    assert any("latency ONNX Runtime CPU, measured · target TensorRT (GPU)" in c.replace("\\", "") for c in captions)
    assert at.info and "does not predict TensorRT latency" in at.info[0].value
    assert any(c.startswith("Run A latency: ONNX Runtime CPU, measured") and "does not predict" in c for c in captions)
    history = at.dataframe[0].value
    assert set(history["vs FP32"]) == {"1.50× faster than FP32", "1.28× slower than FP32"}
    layers = at.get("plotly_chart")[-1].proto.spec
    assert "FP16 (simulated on CPU)" in layers and "not FP16 time" in layers
    at.selectbox(key="layers_run").select(fast.run_id).run()
    assert "FP16 (simulated on CPU)" not in ok(at).get("plotly_chart")[-1].proto.spec  # INT8 default policy


def test_only_the_session_that_started_a_job_cancels_it_after_asking(ws):
    """Issue 13 §9 wired: jobs carry the session's owner token; another session's Cancel is disabled;
    one's own Cancel asks first ("Stop it" / "Keep")."""
    from core.jobs import build_params
    from core.project import open_project

    pol = open_project("sample:tiny-cnn", ws=ws).default_policy().to_json()
    mgr = JobManager.for_workspace(ws)
    first = mgr.submit("build", build_params("sample:tiny-cnn", pol, label="first"), label="first", owner="mine")
    queued = mgr.submit("build", build_params("sample:tiny-cnn", pol, label="second"), label="second", owner="mine")
    other = ok(page("build_and_results", state={"owner_token": "theirs"}))
    assert other.button(key=f"cancel-{queued.id}").disabled
    at = ok(page("build_and_results", state={"owner_token": "mine"}))
    assert not at.button(key=f"cancel-{queued.id}").disabled
    at.button(key=f"cancel-{queued.id}").click().run()  # asks first
    assert mgr.get(queued.id).status == "queued"
    at.button(key=f"cancel-{queued.id}-confirm").click().run()
    assert mgr.wait(queued.id, 30).status == "cancelled" and mgr.wait(first.id, 180).status == "done"
    at = ok(page("precision", state={"owner_token": "mine"}))
    at.button(key="rebuild").click().run()
    assert mgr.get(at.query_params["job"]).owner == "mine"
    wait_all_done = [mgr.wait(j.id, 180) for j in mgr.jobs() if j.active]
    assert all(j.status == "done" for j in wait_all_done)


def test_results_page_shows_the_estimate_beside_the_measured_latency(ws):
    at = ok(page("precision"))
    at.button(key="rebuild").click().run()
    wait_all(ws)
    res = ok(page("build_and_results", state={}))
    labels = {m.label: m for m in res.metric}
    assert "Measured latency" in labels and labels["Measured latency"].proto.delta == "measured"
    est = [m for m in res.metric if m.label.startswith("Estimated TensorRT time on NVIDIA A100")]
    p = open_project(MODEL, ws=ws)
    want = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    assert est and est[0].proto.delta == f"estimate · likely {want.band.range_text()}"
    text = captions_text(res)
    assert "Measured: " in text and "Estimate, not measured" in text and "basis: fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)" in text
    assert want.estimate_text() in text and "held-out cases: a100" in text  # the band and what it rests on


def test_results_page_shows_the_quality_headline_and_its_selector_reaches_the_build_job(ws):
    """Issue 22 §3: a classifier's headline is its top-1 agreement (not only a column of a table); the
    selector's metric outputs and task travel in the params of the builds the page queues."""
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    r = build_and_measure(p, p.default_policy(), iterations=3, profile_iterations=1)
    at = ok(page("build_and_results"))
    head = next(m for m in at.metric if m.label.startswith("Quality headline"))
    assert head.label == "Quality headline: top-1 agreement" and head.value == f"{r.quality.top1_agreement:.4f}"
    at.text_area(key="quality:slices").input("first=logits[...,:5]")
    at.selectbox(key="quality:task").select("classification").run()
    ok(at)
    at.button(key="fp16_baseline").click().run()
    job = next(j for j in wait_all(ws) if j.label.startswith("all-FP16"))
    assert job.params["metrics"]["outputs"] == [{"name": "first", "output": "logits", "start": None, "stop": 5}]
    assert job.params["metrics"]["task"] == "classification"
    at = ok(page("build_and_results"))
    head = next(m for m in at.metric if m.label.startswith("Quality headline"))
    assert head.label == "Quality headline: top-1 agreement of first"


def _plant_infinite_snr(run) -> None:
    """A stored run whose outputs are identical to FP32: SNR = ∞, stored as null."""
    doc = json.loads((run.run_dir / "metrics.json").read_text())
    doc["quality"]["snr_db"] = None
    (run.run_dir / "metrics.json").write_text(json.dumps(doc))


def test_results_page_with_infinite_snr_in_every_run(ws):
    """Issue 23 fault 5: every run of the model has SNR = ∞ (outputs identical to FP32): the page draws its
    metrics, history, charts and comparison without an exception (it raised a TypeError formatting None)."""
    from core.measure.runs import build_and_measure
    from core.quant.policy import uniform_policy

    p = open_project("sample:tiny-cnn", ws=ws)
    for label in ("fp32 a", "fp32 b"):
        _plant_infinite_snr(build_and_measure(p, uniform_policy(p.model, p.layers, "fp32"), label=label,
                                              iterations=3, profile_iterations=1))
    at = ok(page("build_and_results"))
    snr = next(m for m in at.metric if m.label == "SNR")
    assert snr.value == "∞" and snr.delta == "outputs identical to FP32"
    compared = at.dataframe[1].value  # Compare two runs
    assert compared.at["SNR", compared.columns[0]] == "∞ (outputs identical)"
    assert len(at.get("plotly_chart")) >= 5


def _plant(run, **changes) -> None:
    doc = json.loads((run.run_dir / "metrics.json").read_text())
    (run.run_dir / "metrics.json").write_text(json.dumps(doc | changes))


def test_the_estimate_beside_a_past_run_is_for_its_shapes_policy_and_gpu(ws):
    """Issue 23 §1: a run built at 4×3×32×32 shows the estimate at 4×3×32×32 (not today's 1×3×32×32), and says so:
    "Estimated for 4×3×32×32, policy <label> (<hash>), NVIDIA A100 (the GPU picked on the Precision page…)"; the
    per-layer chart of the run says its shapes and policy too."""
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    run = build_and_measure(p, p.default_policy(), label="at batch 4", iterations=3, profile_iterations=1)
    _plant(run, input_shapes={"image": [4, 3, 32, 32]})
    res = ok(page("build_and_results"))
    want = predict(p.model, p.default_policy(), {"image": (4, 3, 32, 32)}, "a100")
    today = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    assert want.total_ms != today.total_ms
    est = next(m for m in res.metric if m.label.startswith("Estimated TensorRT time on"))
    assert est.value == ms_text(want.total_ms)
    text = captions_text(res)
    assert (f"Estimated for 4×3×32×32, policy at batch 4 ({run.policy_sha256[:8]}), {want.gpu_name} (the GPU picked "
            "on the Precision page)") in text
    assert f"for 4×3×32×32, policy at batch 4 ({run.policy_sha256[:8]})" in text  # the latency's caption
    layers = json.loads(res.get("plotly_chart")[-1].proto.spec)["layout"]["title"]["text"]
    assert "for 4×3×32×32" in layers and run.policy_sha256[:8] in layers


def test_the_estimate_of_a_tensorrt_run_is_for_the_gpu_it_was_measured_on(ws):
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    run = build_and_measure(p, p.default_policy(), label="on a T4", iterations=3, profile_iterations=1)
    _plant(run, latency_source="TensorRT 10.13 on Tesla T4, measured")
    res = ok(page("build_and_results"))  # the session's GPU is the A100
    est = next(m for m in res.metric if m.label.startswith("Estimated TensorRT time on"))
    assert est.label == "Estimated TensorRT time on NVIDIA T4"
    assert est.value == ms_text(predict(p.model, p.default_policy(), p.input_shapes, "t4").total_ms)
    assert "NVIDIA T4 (the GPU the run was measured on)" in captions_text(res)


def test_two_runs_of_the_same_policy_are_marked_with_their_intervals(ws):
    """Issue 23 §6: the same policy measured twice reads as such — the history's policy column, the pickers and
    an info under the comparison with each speedup's 95 % interval (from the run's interleaved pairs)."""
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    first, second = (build_and_measure(p, p.default_policy(), label=f"take {i}", iterations=8, profile_iterations=1)
                     for i in (1, 2))
    assert first.policy_sha256 == second.policy_sha256 and first.speedup_ci is not None
    at = ok(page("build_and_results"))
    history = at.dataframe[0].value
    assert set(history["policy"]) == {f"{first.policy_sha256[:8]} · 2 runs"}
    assert all(t.endswith("(8 pairs)") for t in history["vs FP32, 95 % interval"])
    assert at.selectbox(key="cmp_a").format_func(first.run_id).endswith(f"policy {first.policy_sha256[:8]}, 2 runs")
    (note,) = [i.value for i in at.info if "same policy" in i.value]
    lo, hi = first.speedup_ci
    assert f"content hash {first.policy_sha256[:8]}" in note and f"{lo:.2f}–{hi:.2f}×" in note
    compared = at.dataframe[1].value
    assert compared.at["policy (content hash)", "B vs A"] == "same policy"
