"""Streamlit AppTest of the Precision page (views/precision.py): the layer table, bulk and one-click
precisions, chart selections, reset and undo, the search under a budget and its GPU, the live TensorRT
estimate panel and "Add a GPU"."""
from __future__ import annotations

import json
import re

import pytest
from streamlit.testing.v1 import AppTest

from core.display.tables import ms_text
from core.estimate.gpus import GPU, GPUS
from core.estimate.predict import predict
from core.jobs import JobManager
from core.project import open_project
from core.store.drafts import load_project
from core.store.results import save_gpu_spec
from tests.fixtures.apptest import LAYER, MODEL, captions_text, ok, page, policy_key, shown, wait_all


def charts_by_key(at: AppTest) -> dict:
    """The page's plotly charts by their key (the end of the element id)."""
    return {c.proto.id.rsplit("-", 1)[-1]: c for c in at.get("plotly_chart")}


def test_search_under_budget_pareto_and_use_this_policy(ws):
    from core.project import open_project
    from core.store.results import load_search

    model = "sample:tiny-transformer"
    at = ok(page("precision", model=model))
    assert at.text_input(key="search_budget").value == "cosine_mean>=0.99" and not at.get("plotly_chart")
    at.button(key="start_search").click().run()
    (job,) = wait_all(ws)
    assert job.kind == "search" and job.params["budget"] == "cosine_mean>=0.99" and job.params["smooth"] is False
    at.run()
    ok(at)
    from ui.session import md

    assert md("meets cosine_mean>=0.99") in at.success[0].value and "held-out half" in at.success[0].value
    assert job.params["target"] == "tensorrt" and "does not optimise CPU latency" in at.success[0].value
    chart = charts_by_key(at)["pareto_chart"]
    # the isolated ranking the search measured is stored once, where the rankings list reads it (issue 20 §3)
    assert at.selectbox(key="rank_choice").value == "isolated:minmax" and "sens_pick_chart" in charts_by_key(at)
    spec = json.loads(chart.proto.spec)
    names = [t["name"] for t in spec["data"]]
    assert names[:2] == ["other candidates", "Pareto front"]
    assert "estimated TensorRT ms on the" in spec["layout"]["xaxis"]["title"]["text"]  # the objective (H4)
    project = open_project(model, ws=ws)
    result = load_search(ws, project, "cosine_mean>=0.99", False)
    pick = at.selectbox(key="front_pick")
    assert pick.options and pick.value == result.chosen  # issue 13: the chosen point, not the first one
    fails = set(result.front.loc[~result.front["meets_budget"].astype(bool), "candidate"])
    assert [o for o in pick.options if "fails the budget" in o] == [o for o in pick.options
                                                                    if int(re.match(r"#(\d+)", o)[1]) in fails]
    assert ("fails the budget" in names) == (~result.candidates["meets_budget"].astype(bool)).any()
    at.button(key="use_front").click().run()  # asks first
    assert not any("is now the current policy" in s.value for s in ok(at).success)
    assert at.session_state[policy_key(ws, model)].sha256 == open_project(model, ws=ws).default_policy().sha256
    assert any("You can undo it" in shown(w) for w in at.warning)
    at.button(key="use_front_confirm").click().run()
    ok(at)
    assert any("is now the current policy" in s.value for s in at.success)
    want = result.policy if pick.value == result.chosen else result.front_policy(pick.value)
    assert at.session_state[policy_key(ws, model)].sha256 == want.sha256
    again = ok(page("precision", model=model))  # a new session: the stored search, no recomputation
    assert "pareto_chart" in charts_by_key(again) and len(JobManager.for_workspace(ws).jobs()) == 1
    again.sidebar.selectbox(key="target_pick").select("onnxruntime").run()  # stored searches are kept per target
    assert "pareto_chart" not in charts_by_key(ok(again))  # the TensorRT-target search is not shown as the CPU target's
    assert load_search(ws, open_project(model, ws=ws, target="onnxruntime"), "cosine_mean>=0.99", False) is None


def test_search_bad_budget_shows_the_fix(ws):
    at = page("precision", model="sample:tiny-transformer")
    at.text_input(key="search_budget").input("cosine>=0.99").run()
    assert len(at.error) == 1 and "cannot read the budget" in shown(at.error[0]) and "Fix:" in shown(at.error[0])
    assert not [b for b in at.button if b.key == "start_search"] and at.button(key="rebuild")
    at.text_input(key="search_budget").input("snr_db<=30").run()
    assert "the wrong way" in shown(at.error[0]) and "snr_db>=30" in shown(at.error[0])
    at.text_input(key="search_budget").input("snr_db >= 30").run()
    ok(at)
    assert at.button(key="start_search") and not JobManager.for_workspace(ws).jobs()


def test_precision_toggle_rebuild_results_and_compare(ws):
    at = ok(page("precision"))
    fp16_before = int(at.metric[1].value)
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.selectbox(key="bulk_regex_prec").select("fp16")
    at.button(key="apply_regex").click().run()
    ok(at)
    assert int(at.metric[1].value) == fp16_before + 1 and "1 layer(s) → FP16" in at.success[0].value
    at.text_input(key="run_label").input("conv2 fp16")
    at.button(key="rebuild").click().run()
    at.button(key="reset").click().run()  # a second build: the defaults (Reset asks first)
    at.button(key="reset_confirm").click().run()
    at.button(key="rebuild").click().run()
    jobs = wait_all(ws)
    assert len(jobs) == 2 and jobs[0].started >= jobs[1].finished
    at.run()
    assert any("layer(s) differ" in e.label for e in at.expander)
    res = ok(page("build_and_results", state={}))
    assert len(res.get("plotly_chart")) == 6  # 4 of all runs, A against B per layer, one run's layers
    labels = {m.label: m.value for m in res.metric}
    assert float(labels["Cosine (mean)"]) > 0.9
    assert len(res.dataframe) == 3  # history, comparison, policy diff
    assert "1 layer(s) differ" in [c.value for c in res.caption if "differ" in c.value][0]


def test_precision_page_states_the_search_objective(ws):
    at = ok(page("precision"))
    assert any("Objective: the estimated TensorRT time" in i.value for i in at.info)  # TensorRT target, not here
    at.sidebar.selectbox(key="target_pick").select("onnxruntime").run()
    assert not any("Objective: the estimated TensorRT" in i.value for i in ok(at).info)
    assert any("Objective: the estimated latency on onnxruntime" in c.value for c in at.caption)


# --- issue 13 §1, §2: state that survives, quick editing ------------------------------------------
def send_selection(at: AppTest, element, selection: dict) -> AppTest:
    """Run with what the browser sends when the user selects on a Plotly chart or in a table
    (``{"points": [...]}`` / ``{"rows": [...]}``): AppTest cannot click inside them."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=element.proto.id, string_value=json.dumps({"selection": selection})))
    return at._run(states)


def layer_table(at: AppTest):
    return next(d for d in at.dataframe if (d.key or "").startswith("layer_table-"))


def test_reset_asks_first_and_can_be_undone(ws):
    at = ok(page("precision"))
    assert at.button(key="reset").disabled  # the defaults already
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.button(key="apply_regex").click().run()
    edited = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    at.button(key="reset").click().run()
    assert any("Reset every layer" in shown(w) and "1 layer(s)" in shown(w) for w in ok(at).warning)
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256  # nothing yet
    at.button(key="reset_cancel").click().run()
    assert not any("Reset every layer" in shown(w) for w in ok(at).warning)
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256
    at.button(key="reset").click().run()
    at.button(key="reset_confirm").click().run()
    assert ok(at).session_state[policy_key(ws, "sample:tiny-cnn")].layers[LAYER] == "int8"
    assert "reset to the defaults" in at.button(key="undo").help
    at.button(key="undo").click().run()
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256


def test_table_filters_row_selection_and_one_click_precision(ws):
    from core.model.placement import boundaries
    from core.project import open_project

    p = open_project("sample:tiny-cnn", ws=ws)
    at = ok(page("precision"))
    table = layer_table(at).value
    assert len(table) == len(p.layers)  # (its height, 20 rows, is checked in the browser test)
    at.multiselect(key="view_ops").select("Conv").run()
    assert set(layer_table(at).value["op_type"]) == {"Conv"}
    at.text_input(key="view_name").input("CONV2").run()  # name contains, case ignored
    assert layer_table(ok(at)).value["name"].tolist() == [LAYER]
    at.text_input(key="view_name").input("").run()
    at.multiselect(key="view_prec").select("int8").run()
    shown_names = layer_table(at).value["name"].tolist()
    assert shown_names and all(p.default_policy().layers[n] == "int8" for n in shown_names)
    at.button(key="sel_all").click().run()
    assert at.multiselect(key="sel_layers").value == shown_names
    at.button(key="sel_fp16").click().run()  # one click for the whole selection
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert all(pol.layers[n] == "fp16" for n in shown_names) and any("→ FP16" in s.value for s in ok(at).success)
    at.button(key="sel_clear").click().run()
    at.multiselect(key="view_ops").set_value([]).run()
    at.multiselect(key="view_prec").set_value([]).run()
    names = layer_table(at).value["name"].tolist()
    before = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    send_selection(at, layer_table(at), {"rows": [0, 2], "columns": [], "cells": []})  # two rows ticked
    assert at.multiselect(key="sel_layers").value == [names[0], names[2]]
    assert any("2 selected" in c.value for c in at.caption)
    at.button(key="sel_fp32").click().run()
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert pol.layers[names[0]] == pol.layers[names[2]] == "fp32"
    view = layer_table(ok(at)).value  # boundaries of the draft, per layer (core.model.placement)
    want = boundaries(p.model, p.layers, pol).groupby("layer").size()
    assert view.set_index("name")["boundaries"].to_dict() == {n: int(want.get(n, 0)) for n in view["name"]}
    assert any(e.label.startswith("Boundaries of the 2 selected") for e in at.expander)
    at.button(key="undo").click().run()  # one edit, one undo
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == before.sha256


def test_select_on_the_sensitivity_and_latency_charts_then_set_precision(ws):
    from core.display.precision_edit import ranked_layers
    from core.project import open_project
    from core.store.results import load_ranking

    p = open_project("sample:tiny-cnn", ws=ws)
    at = ok(page("precision"))
    assert not at.get("plotly_chart") and any("No ranking to draw" in i.value for i in at.info)
    at.switch_page("views/sensitivity.py").run()
    at.button(key="run_rank").click().run()
    wait_all(ws)
    at.switch_page("views/precision.py").run()
    (chart,) = ok(at).get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    ranked = ranked_layers(load_ranking(ws, p).table, "cumulative")
    bars = {c[0] for t in spec["data"] for c in t["customdata"]}
    assert bars == set(ranked["name"]) and "select bars" in spec["layout"]["title"]["text"]
    assert {t["name"] for t in spec["data"]} <= {"FP32", "FP16", "INT8"}
    picked = ranked["name"].head(2).tolist()
    points = [{"curve_number": 0, "point_index": i, "customdata": [n, n, "Conv", "INT8"], "y": n, "x": 0.1}
              for i, n in enumerate(picked)]
    send_selection(at, chart, {"points": points, "point_indices": [0, 1], "box": [], "lasso": []})
    assert ok(at).multiselect(key="sel_layers").value == picked
    assert sorted(layer_table(at).proto.selection_state and json.loads(layer_table(at).proto.selection_state)
                  ["selection"]["rows"]) == sorted(layer_table(at).value.index[layer_table(at).value["name"]
                                                                                .isin(picked)].tolist())
    at.button(key="sel_fp16").click().run()
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert [pol.layers[n] for n in picked] == ["fp16", "fp16"]
    recoloured = json.loads(ok(at).get("plotly_chart")[0].proto.spec)
    assert {c[0] for t in recoloured["data"] if t["name"] == "FP16" for c in t["customdata"]} >= set(picked)

    at.text_input(key="run_label").input("two fp16")
    at.button(key="rebuild").click().run()
    wait_all(ws)
    at.radio(key="pick_chart").set_value("Per-layer latency of the last run").run()
    (chart,) = ok(at).get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    assert "two fp16" in spec["layout"]["title"]["text"]
    slowest = spec["data"][0]["customdata"][-1][0]
    send_selection(at, chart, {"points": [{"customdata": [slowest], "y": slowest}, {"customdata": ["not a layer"]}],
                               "point_indices": [0, 1], "box": [], "lasso": []})
    assert ok(at).multiselect(key="sel_layers").value == [slowest]
    at.button(key="sel_int8").click().run()
    eligible = {l.name for l in p.layers if l.eligible}
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert pol.layers[slowest] == ("int8" if slowest in eligible else open_project(
        "sample:tiny-cnn", ws=ws).default_policy().layers[slowest])


def _saved_rankings(ws, p):
    """A cumulative and an isolated ranking of tiny-cnn whose orders differ (reversed)."""
    from core.measure.metrics import Quality
    from core.sensitivity import RANK_COLUMNS, SENSITIVITY_COLUMNS, Ranking, Sensitivity
    from core.store.results import save_ranking, save_sensitivity
    import pandas as pd

    elig = [l for l in p.layers if l.eligible]
    cum = pd.DataFrame([(i + 1, l.name, l.op_type, "int8", True, l.macs, 1 - 0.01 * (i + 1), 0.01 * (len(elig) - i),
                         0.0, 30.0, 0.1) for i, l in enumerate(elig)], columns=RANK_COLUMNS)
    iso = pd.DataFrame([(i + 1, l.name, l.op_type, l.macs, "isolated", "minmax", 0.99, 0.001 * (len(elig) - i), 30.0)
                        for i, l in enumerate(reversed(elig))], columns=SENSITIVITY_COLUMNS)
    save_ranking(ws, p, Ranking(cum, "cos_drop", 8, 0.1, False, "minmax"))
    save_sensitivity(ws, p, Sensitivity(iso, "isolated", "minmax", Quality(1, 1, 99, 0, None, None, 8), 0.1, False))
    return [l.name for l in elig]


def test_top_k_uses_the_ranking_the_user_picks_and_says_which(ws):
    from core.project import open_project

    p = open_project("sample:tiny-cnn", ws=ws)
    elig = _saved_rankings(ws, p)
    at = ok(page("precision"))
    pick = at.selectbox(key="rank_choice")
    assert pick.value == "isolated:minmax" and any(o.startswith("cumulative") and o.endswith("(minmax)")
                                                   for o in pick.options)
    k = next(n for n in at.number_input if n.key == "bulk_k")
    assert k.max == len(elig) and k.value == min(3, len(elig))
    assert any("isolated ranking (minmax)" in shown(c) for c in at.caption)
    k.set_value(1)
    at.button(key="apply_topk").click().run()
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert pol.layers[elig[-1]] == "fp16" and pol.layers[elig[0]] == "int8"  # isolated: reversed order
    assert any("top 1 of the isolated ranking (minmax)" in shown(s) for s in ok(at).success)
    at.button(key="undo").click().run()
    at.selectbox(key="rank_choice").set_value("cumulative:minmax").run()
    assert any("cumulative ranking (minmax)" in shown(c) for c in ok(at).caption)
    next(n for n in at.number_input if n.key == "bulk_k").set_value(1)
    at.button(key="apply_topk").click().run()
    pol = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert pol.layers[elig[0]] == "fp16" and pol.layers[elig[-1]] == "int8"
    assert any("top 1 of the cumulative ranking (minmax)" in shown(s) for s in ok(at).success)
    sens = layer_table(at).value.set_index("name")["sensitivity"]
    assert sens[elig[0]] == pytest.approx(0.01 * len(elig))  # the table shows the picked ranking's scores


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label))


def test_toggle_a_layer_changes_the_estimate_without_a_build(ws):
    at = ok(page("precision"))
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA A100") for s in at.subheader)
    before, reformats = _metric(at, "Estimated TensorRT time"), _metric(at, "Predicted reformats")
    text = captions_text(at)
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


def test_the_live_estimate_of_the_draft_says_its_shapes(ws):
    """Issue 23 §1: the draft's estimate is at today's shapes (2×3×32×32 here), and its caption and per-layer chart
    say them: "Estimated for 2×3×32×32 (today's shapes, set on the Model page), the draft policy (<hash>), …"."""
    shapes = {"image": [2, 3, 32, 32]}
    at = ok(page("precision", state={"source": {"model": MODEL, "data": None, "eval_data": None, "shapes": shapes}}))
    p = open_project(MODEL, ws=ws, shapes=shapes)
    pol = at.session_state[f"policy:{p.model.sha256}:{p.calib_data.sha256}"]
    want = predict(p.model, pol, {"image": (2, 3, 32, 32)}, "a100")
    assert _metric(at, "Estimated TensorRT time") == ms_text(want.total_ms)
    assert (f"Estimated for 2×3×32×32 (today's shapes, set on the Model page), the draft policy ({pol.sha256[:8]}), "
            f"{want.gpu_name} (the GPU picked here).") in captions_text(at)
    at.toggle(key="estimate_chart_on").set_value(True).run()
    (chart,) = ok(at).get("plotly_chart")
    title = json.loads(chart.proto.spec)["layout"]["title"]["text"]
    assert f"for 2×3×32×32, the draft policy ({pol.sha256[:8]})" in title


def test_the_estimate_panel_shows_the_band_and_says_unvalidated_where_nothing_was_validated(ws):
    """A100 (Ampere, held-out engines): "likely lo–hi ms"; H100 (Hopper, no case): "unvalidated"."""
    at = ok(page("precision"))
    p = open_project(MODEL, ws=ws)
    a100 = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    (metric,) = [m for m in at.metric if m.label == "Estimated TensorRT time"]
    assert metric.proto.delta == f"estimate · likely {a100.band.range_text()}"
    assert a100.band.status == "validated" and a100.estimate_text() in captions_text(at)
    at.selectbox(key="estimate_gpu").select("h100").run()
    ok(at)
    h100 = predict(p.model, p.default_policy(), p.input_shapes, "h100")
    (metric,) = [m for m in at.metric if m.label == "Estimated TensorRT time"]
    assert metric.proto.delta == f"estimate · unvalidated: likely {h100.band.range_text()}"
    assert "unvalidated on Hopper GPUs: likely" in captions_text(at) and h100.estimate_text() in captions_text(at)


def test_gpu_picker_changes_the_estimate_and_is_saved_with_the_project(ws):
    at = ok(page("precision"))
    a100 = _metric(at, "Estimated TensorRT time")
    at.selectbox(key="estimate_gpu").select("t4").run()
    ok(at)
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA T4") for s in at.subheader)
    assert "on NVIDIA T4" in captions_text(at)
    p = open_project(MODEL, ws=ws)
    t4 = predict(p.model, p.default_policy(), p.input_shapes, "t4")
    assert _metric(at, "Estimated TensorRT time") == ms_text(t4.total_ms)
    assert a100 == ms_text(predict(p.model, p.default_policy(), p.input_shapes, "a100").total_ms)
    saved = load_project(ws, at.session_state["project_id"])
    assert saved.settings.get("estimate_gpu") == "t4"
    at.switch_page("views/model.py").run()
    at.switch_page("views/precision.py").run()  # another page and back: the same GPU
    assert ok(at).selectbox(key="estimate_gpu").value == "t4"


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
    table = next(d for d in at.dataframe if "likely from (ms)" in d.value.columns)  # front_table's headings
    assert table.value["likely to (ms)"].notna().all()


A6000 = {"key": "rtx-a6000", "name": "NVIDIA RTX A6000", "arch": "ampere", "sm_count": 84, "fp32_tflops": 38.7,
         "tf32_tflops": 77.4, "fp16_tflops": 154.8, "fp16_acc16_tflops": 154.8, "int8_tops": 309.7,
         "bandwidth_gbs": 768.0, "memory_gb": 48.0}


def _fill(at, doc: dict):
    at.text_input(key="gpu_form_key").input(doc["key"])
    at.text_input(key="gpu_form_name").input(doc["name"])
    at.selectbox(key="gpu_form_arch").select(doc["arch"])
    for f in ("sm_count", "fp32_tflops", "tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops",
              "bandwidth_gbs", "memory_gb"):
        if doc.get(f) is not None:
            at.number_input(key=f"gpu_form_{f}").set_value(doc[f])
    return at.button(key="gpu_form_save").click().run()


def test_add_a_gpu_then_estimate_on_it(ws):
    at = ok(page("precision"))
    assert "NVIDIA RTX A6000 (added)" not in at.selectbox(key="estimate_gpu").options
    # a figure that is not positive: the same check as --gpu-spec, shown; nothing saved, the page still works
    at = _fill(at, {**A6000, "bandwidth_gbs": -768.0})
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert "bandwidth_gbs is -768, not positive" in err.replace("\\", "")
    assert not (ws.root / "gpus" / "rtx-a6000.json").exists()
    assert _metric(at, "Estimated TensorRT time")  # the panel is still there
    # the right figures: saved, offered in the picker and selected, the estimate on it
    at.number_input(key="gpu_form_bandwidth_gbs").set_value(768.0)
    at = ok(at.button(key="gpu_form_save").click().run())
    saved = json.loads((ws.root / "gpus" / "rtx-a6000.json").read_text())
    assert GPU.from_json(saved) == GPU.from_json(A6000)
    picker = at.selectbox(key="estimate_gpu")
    assert "NVIDIA RTX A6000 (added)" in picker.options  # beside the table's rows
    assert "NVIDIA T4" in picker.options
    assert picker.value == "rtx-a6000"
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA RTX A6000") for s in at.subheader)
    p = open_project("sample:tiny-cnn", ws=ws)
    want = predict(p.model, p.default_policy(), p.input_shapes, GPU.from_json(A6000))
    assert _metric(at, "Estimated TensorRT time") == ms_text(want.total_ms)
    assert any("Saved NVIDIA RTX A6000" in s.value.replace("\\", "") for s in at.success)
    # kept with the project: a new session of the same project starts on it
    again = ok(page("precision", state={"estimate_gpu:value": "rtx-a6000"}))
    assert again.selectbox(key="estimate_gpu").value == "rtx-a6000"


def test_a_corrupt_saved_gpu_is_skipped_with_a_note(ws):
    (ws.root / "gpus").mkdir(parents=True, exist_ok=True)
    (ws.root / "gpus" / "broken.json").write_text("{not json")
    (ws.root / "gpus" / "rtx-a6000.json").write_text(json.dumps(A6000))
    at = page("precision")
    assert not at.exception and not at.error
    assert any("broken.json" in w.value for w in at.warning)
    assert "NVIDIA RTX A6000 (added)" in at.selectbox(key="estimate_gpu").options
    at.selectbox(key="estimate_gpu").select("rtx-a6000").run()
    ok(at)
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA RTX A6000") for s in at.subheader)


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


def test_the_search_measures_quality_as_the_build_page_selector_says(ws):
    """Issue 22 §3: the Build page's quality selector (here: a slice of the logits) goes with the Precision page's
    search into its job, the result is stored for that spec, and the page finds it again; the default search of
    the same budget is another search."""
    from core.measure.evaluation import MetricOutput, MetricSpec
    from core.project import open_project
    from core.store.results import load_search
    from ui.quality_panel import SPEC_KEY

    model = "sample:tiny-transformer"
    out = open_project(model, ws=ws).model.outputs[0].name
    spec = MetricSpec((MetricOutput.parse(f"first={out}[...,0:4]"),)).to_json()
    at = ok(page("precision", model=model, state={SPEC_KEY: spec}))
    assert any("Quality as the Build page measures it: first" in c.value for c in at.caption)
    at.button(key="start_search").click().run()
    (job,) = wait_all(ws)
    assert job.status == "done" and job.params["metrics"] == spec
    p = open_project(model, ws=ws)
    assert load_search(ws, p, "cosine_mean>=0.99", False, metrics=spec) is not None
    assert load_search(ws, p, "cosine_mean>=0.99", False) is None
    at.run()
    ok(at)
    assert at.get("plotly_chart") and not [b for b in at.button if b.key == "start_search"]
