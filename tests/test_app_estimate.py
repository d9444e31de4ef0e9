"""AppTest of the TensorRT estimate in the UI (issue 12 §5): the Precision page's live panel (a
toggle changes the estimate, no build), its GPU picker kept with the project, labels (estimate, GPU,
basis) on every page that shows one, the calibration offer of the engine-report import, and the
estimate in the export bundle."""
from __future__ import annotations

import json

from core.display.tables import ms_text
from core.estimate.predict import predict
from core.export import ESTIMATE_NAME, README_NAME, export_bundle
from core.jobs import JobManager
from core.project import open_project
from core.store.drafts import load_project
from core.store.results import load_gpu_calibration
from test_app import LAYER, charts_by_key, ok, page, shown, wait_all, ws  # noqa: F401 (fixture)

MODEL = "sample:tiny-cnn"


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label))


def _labels(at) -> str:
    return " ".join(shown(c) for c in at.caption)


def test_toggle_a_layer_changes_the_estimate_without_a_build(ws):
    at = ok(page("precision"))
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA A100") for s in at.subheader)
    before, reformats = _metric(at, "Estimated TensorRT time"), _metric(at, "Predicted reformats")
    text = _labels(at)
    assert "Estimate, not measured" in text and "on NVIDIA A100" in text and "basis: fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)" in text
    p = open_project(MODEL, ws=ws)
    want = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    assert before == ms_text(want.total_ms) and reformats == str(want.reformat_count)
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.selectbox(key="bulk_regex_prec").select("fp16")
    at.button(key="apply_regex").click().run()
    ok(at)
    after = _metric(at, "Estimated TensorRT time")
    assert after != before or _metric(at, "Predicted reformats") != reformats  # the toggle moved the estimate
    pol = at.session_state[f"policy:{p.model.sha256}:{p.calib_data.sha256}"]
    assert pol.layers[LAYER] == "fp16"
    again = predict(p.model, pol, p.input_shapes, "a100")
    assert after == ms_text(again.total_ms)
    assert _metric(at, "Predicted reformats") == str(again.reformat_count)
    assert not JobManager.for_workspace(ws).jobs()  # no build was needed
    assert not at.get("plotly_chart")
    at.toggle(key="estimate_chart_on").set_value(True).run()
    (chart,) = ok(at).get("plotly_chart")
    title = json.loads(chart.proto.spec)["layout"]["title"]["text"]
    assert "Estimated TensorRT time per engine layer on NVIDIA A100" in title and "estimate, not measured" in title


def test_the_estimate_panel_shows_the_band_and_says_unvalidated_where_nothing_was_validated(ws):
    """A100 (Ampere, held-out engines): "likely lo–hi ms"; H100 (Hopper, no case): "unvalidated"."""
    at = ok(page("precision"))
    p = open_project(MODEL, ws=ws)
    a100 = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    (metric,) = [m for m in at.metric if m.label == "Estimated TensorRT time"]
    assert metric.proto.delta == f"estimate · likely {a100.band.range_text()}"
    assert a100.band.status == "validated" and a100.estimate_text() in _labels(at)
    at.selectbox(key="estimate_gpu").select("h100").run()
    ok(at)
    h100 = predict(p.model, p.default_policy(), p.input_shapes, "h100")
    (metric,) = [m for m in at.metric if m.label == "Estimated TensorRT time"]
    assert metric.proto.delta == f"estimate · unvalidated: likely {h100.band.range_text()}"
    assert "unvalidated on Hopper GPUs: likely" in _labels(at) and h100.estimate_text() in _labels(at)


def test_gpu_picker_changes_the_estimate_and_is_saved_with_the_project(ws):
    at = ok(page("precision"))
    a100 = _metric(at, "Estimated TensorRT time")
    at.selectbox(key="estimate_gpu").select("t4").run()
    ok(at)
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA T4") for s in at.subheader)
    assert "on NVIDIA T4" in _labels(at)
    p = open_project(MODEL, ws=ws)
    t4 = predict(p.model, p.default_policy(), p.input_shapes, "t4")
    assert _metric(at, "Estimated TensorRT time") == ms_text(t4.total_ms)
    assert a100 == ms_text(predict(p.model, p.default_policy(), p.input_shapes, "a100").total_ms)
    saved = load_project(ws, at.session_state["project_id"])
    assert saved.settings.get("estimate_gpu") == "t4"
    at.switch_page("views/model.py").run()
    at.switch_page("views/precision.py").run()  # another page and back: the same GPU
    assert ok(at).selectbox(key="estimate_gpu").value == "t4"


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
    text = _labels(res)
    assert "Measured: " in text and "Estimate, not measured" in text and "basis: fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)" in text
    assert want.estimate_text() in text and "held-out cases: a100" in text  # the band and what it rests on


def test_calibrate_the_estimator_on_an_imported_report(ws, trt_reports_dir):
    at = ok(page("build_and_results"))
    at.text_input(key="trt_graph_path").input(str(trt_reports_dir / "a100-resnet-fp16.graph.json"))
    at.text_input(key="trt_profile_path").input(str(trt_reports_dir / "a100-resnet-fp16.profile.json")).run()
    at.selectbox(key="calib_gpu").select("l4").run()
    at.button(key="calibrate_gpu").click().run()
    ok(at)
    (msg,) = [s.value for s in at.success if "your calibration" in s.value]
    assert "NVIDIA L4" in msg and "calibrated on" in msg and "layers of your engine, median error" in msg
    params = load_gpu_calibration(ws, "l4")
    assert params is not None and params.gpu == "l4" and params.n_layers > 0
    pre = ok(page("precision", state={"estimate_gpu:value": "l4"}))
    text = _labels(pre)
    assert "on NVIDIA L4" in text and f"basis: calibrated on {params.n_layers} layers of your engine" in text


def test_export_bundle_labels_the_estimate(ws):
    p = open_project(MODEL, ws=ws)
    pol = p.default_policy()
    r = predict(p.model, pol, p.input_shapes, "h100")
    b = export_bundle(p, pol, estimate=r)
    doc = json.loads(b.files[ESTIMATE_NAME])
    assert doc["label"] == "estimate" and doc["gpu"]["key"] == "h100" and doc["basis"] == "fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)"
    assert abs(doc["total_ms"] - r.total_ms) < 1e-12
    readme = b.files[README_NAME].decode()
    assert "an estimate, not measured" in readme and "NVIDIA H100" in readme and "basis" in readme
    assert ESTIMATE_NAME not in export_bundle(p, pol).files


def test_the_search_panel_shows_the_band_and_the_tie_of_a_stored_search(ws, monkeypatch):
    """A TensorRT-estimate search whose planted estimates make a tie inside a ±12 % difference band: the
    verdict says so, the front's table and picker show each point's band, the Pareto chart draws it as
    error bars."""
    import numpy as np

    import core.search.searcher as searcher
    from core.estimate.validation import Band
    from core.search import SearchConfig, search
    from core.store.results import save_search

    real, planted = searcher.estimated_latency, {0: 0.2, 3: 0.080, 4: 0.085, 5: 0.07}

    def plant(*a, **k):
        lat = real(*a, **k)
        lat.estimate = lambda int8: (planted.get(len(int8), 0.3), 0.0)
        lat.band = lambda int8: Band(planted.get(len(int8), 0.3) / 1.12, planted.get(len(int8), 0.3) * 1.12,
                                     "validated", "ampere", float(np.log(1.12)), "planted",
                                     diff_log_spread=float(np.log(1.12)), diff_status="validated")
        return lat

    monkeypatch.setattr(searcher, "estimated_latency", plant)
    p = open_project(MODEL, ws=ws)
    assert p.target == "tensorrt"
    budget = "cosine_mean>=0.9999"
    r = search(p, SearchConfig(budget, methods=("minmax",), workers=1, verify=False))
    assert "a tie; chose" in r.message
    save_search(ws, p, r, smooth=False)
    at = ok(page("precision"))
    at.text_input(key="search_budget").input(budget).run()
    ok(at)
    verdict = " ".join(shown(s) for s in at.success)
    assert "within the estimate's ±12 % difference band" in verdict and \
        f"chose #{r.chosen}, the one with fewer boundaries" in verdict
    pick = at.selectbox(key="front_pick")
    chosen = r.candidates.set_index("candidate").loc[r.chosen]  # a tie: it may be off the raw front
    assert pick.value == r.chosen
    assert f"(likely {chosen.est_low_ms:.3f}–{chosen.est_high_ms:.3f})" in pick.format_func(r.chosen)
    chart = charts_by_key(at)["pareto_chart"]  # beside it, the isolated ranking the search measured (issue 20 §3)
    spec = json.loads(chart.proto.spec)
    front = next(t for t in spec["data"] if t["name"] == "Pareto front")
    assert front["error_x"]["array"] and front["error_x"]["arrayminus"]
    assert "bars: the estimate's band" in spec["layout"]["xaxis"]["title"]["text"]
    table = next(d for d in at.dataframe if "est_low_ms" in d.value.columns)
    assert table.value["est_high_ms"].notna().all()
