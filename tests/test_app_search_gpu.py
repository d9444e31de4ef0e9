"""AppTest of the search panel's GPU (issue 19 §4 follow-up): a TensorRT-target search estimates on the
GPU picked in the Precision page's estimate panel (a table row or a GPU added in the workspace), shown
in a GPU picker beside the budget that defaults to the estimate panel's pick and may override it; the
submitted job carries that GPU, and a search stored for another GPU is not shown as this one's: each
GPU's search of a budget is stored on its own (core.store.results.search_path keys it by the GPU)."""
from __future__ import annotations

import json

from core.estimate.gpus import GPU, GPUS
from core.jobs import JobManager
from core.store.results import save_gpu_spec
from test_app import charts_by_key, ok, page, shown, wait_all, ws  # noqa: F401 (fixture)

A6000 = {"key": "rtx-a6000", "name": "NVIDIA RTX A6000", "arch": "ampere", "sm_count": 84, "fp32_tflops": 38.7,
         "tf32_tflops": 77.4, "fp16_tflops": 154.8, "fp16_acc16_tflops": 154.8, "int8_tops": 309.7,
         "bandwidth_gbs": 768.0, "memory_gb": 48.0}


def _axis(at) -> str:
    chart = charts_by_key(at)["pareto_chart"]  # beside it, the isolated ranking the search measured (issue 20 §3)
    return json.loads(chart.proto.spec)["layout"]["xaxis"]["title"]["text"]


def test_the_search_estimates_on_the_estimate_panels_gpu_and_the_job_carries_it(ws):
    at = ok(page("precision"))
    assert at.selectbox(key="search_gpu").value == "a100"  # no pick yet: the estimate panel's default
    at.selectbox(key="estimate_gpu").select("t4").run()
    ok(at)
    picker = at.selectbox(key="search_gpu")
    assert picker.value == "t4" and "NVIDIA T4" in picker.options and len(picker.options) == len(GPUS)
    assert any("estimated TensorRT ms on the NVIDIA T4" in i.value for i in at.info)  # the objective says which
    at.button(key="start_search").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.kind == "search" and job.params["gpu"] == "t4" and job.params["gpu_spec"] is None
    assert "on the NVIDIA T4" in job.label
    wait_all(ws)
    ok(at.run())
    assert "estimated TensorRT ms on the NVIDIA T4" in _axis(at)  # the job estimated on the T4
    verdict = " ".join(shown(s) for s in [*at.success, *at.warning])
    assert "NVIDIA T4" in verdict

    # an override beside the budget: the A100 for the search only; the T4's stored search is not its own
    at.selectbox(key="search_gpu").select("a100").run()
    ok(at)
    assert at.selectbox(key="estimate_gpu").value == "t4"  # the estimate panel keeps its GPU
    assert "pareto_chart" not in charts_by_key(at) and at.button(key="start_search")
    assert any("Not searched yet for this budget on the NVIDIA A100 80GB SXM" in i.value for i in at.info)
    at.button(key="start_search").click().run()
    newest = max(JobManager.for_workspace(ws).jobs(), key=lambda j: j.created)
    assert newest.params["gpu"] == "a100" and newest.params["gpu_spec"] is None
    wait_all(ws)
    ok(at.run())
    assert "estimated TensorRT ms on the NVIDIA A100 80GB SXM" in _axis(at)
    # each GPU's search is stored on its own: the T4's was not replaced by the A100's
    at.selectbox(key="search_gpu").select("t4").run()
    assert "estimated TensorRT ms on the NVIDIA T4" in _axis(ok(at))
    at.selectbox(key="search_gpu").select("a100").run()
    assert "estimated TensorRT ms on the NVIDIA A100 80GB SXM" in _axis(ok(at))
    # another page and back: the override is kept for the session; a new session on the T4 follows it again
    at.switch_page("views/model.py").run()
    at.switch_page("views/precision.py").run()
    assert ok(at).selectbox(key="search_gpu").value == "a100" and at.selectbox(key="estimate_gpu").value == "t4"
    again = ok(page("precision", state={"estimate_gpu:value": "t4"}))
    assert again.selectbox(key="search_gpu").value == "t4"


def test_a_gpu_added_in_the_workspace_travels_with_its_figures(ws):
    save_gpu_spec(ws, A6000)
    at = ok(page("precision", state={"estimate_gpu:value": "rtx-a6000"}))
    picker = at.selectbox(key="search_gpu")
    assert picker.value == "rtx-a6000" and "NVIDIA RTX A6000 (added)" in picker.options
    at.button(key="start_search").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.params["gpu"] == "rtx-a6000" and GPU.from_json(job.params["gpu_spec"]) == GPU.from_json(A6000)
    wait_all(ws)
    ok(at.run())
    assert "estimated TensorRT ms on the NVIDIA RTX A6000" in _axis(at)


def test_no_gpu_picker_when_the_search_does_not_estimate_tensorrt(ws):
    at = ok(page("precision"))
    at.sidebar.selectbox(key="target_pick").select("onnxruntime").run()
    ok(at)
    assert not [s for s in at.selectbox if s.key == "search_gpu"] and at.button(key="start_search")
