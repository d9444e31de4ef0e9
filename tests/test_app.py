"""Streamlit AppTest for each page, on the tiny samples: load, rank, toggle, rebuild, results, export, import."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.errors import MixprecError
from core.jobs import JobManager
from core.store.results import store_upload
from core.workspace import Workspace
from conftest import dynamic_cnn

APP = str(Path(__file__).resolve().parents[1] / "app.py")
LAYER = "/conv2/Conv"  # a tiny-cnn layer, INT8 by default


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path))
    return Workspace(tmp_path)


def page(name: str | None = None, model: str = "sample:tiny-cnn", state: dict | None = None) -> AppTest:
    """A new session on page ``views/<name>.py`` of the app's frame (the home page without a name)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["source"] = {"model": model, "data": None, "eval_data": None}
    for k, v in (state or {}).items():
        at.session_state[k] = v
    at.run()  # the home page: st.navigation registers the pages (switch_page matches their scripts)
    if name:
        at.switch_page(f"views/{name}.py").run()
    return at


def shown(el) -> str:
    """The text an element shows: its Markdown source without the escapes (ui.md) that keep user
    text literal."""
    return re.sub(r"\\(.)", r"\1", el.value)


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def wait_all(ws: Workspace):
    mgr = JobManager.for_workspace(ws)
    jobs = [mgr.wait(j.id, 180) for j in mgr.jobs()]
    assert all(j.status == "done" for j in jobs), [(j.label, j.error) for j in jobs]
    return jobs


def test_home_and_model_page(ws):
    ok(page())
    at = ok(page("model"))
    assert at.metric[0].label == "Layers" and at.metric[0].value == "8"
    assert "sha256" in at.caption[-1].value or any("sha256" in c.value for c in at.caption)
    at.multiselect(key="inv_ops").select("Conv").run()
    assert any(c.value.startswith("3 of 8 layers") for c in at.caption)
    assert len(at.get("plotly_chart")) == 1


def test_model_page_bad_path_shows_error_and_recovers(ws, tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes((ws.samples.parent / "x").as_posix().encode() * 3)
    at = page("model")
    at.radio(key="model_how").set_value("Path on the server").run()
    at.text_input(key="model_path").input(str(bad))
    at.button(key="load_path").click().run()
    assert at.error and "Fix:" in shown(at.error[0])
    at.radio(key="model_how").set_value("Bundled sample").run()
    at.selectbox(key="sample_pick").select("sample:tiny-transformer").run()
    ok(at)
    assert at.session_state["source"]["model"] == "sample:tiny-transformer"


def test_upload_validation(ws, tmp_path):
    with pytest.raises(MixprecError, match="Fix"):
        store_upload(ws, b"not an onnx file", "x.onnx", "model")
    from core.project import open_project

    model = open_project("sample:tiny-cnn", ws=ws).model
    bad = tmp_path / "pickled.npz"
    np.savez(bad, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(MixprecError, match="pickled"):
        store_upload(ws, bad.read_bytes(), "pickled.npz", "data", model)
    good = store_upload(ws, model.path.read_bytes(), "tiny.onnx", "model")
    assert good.parent == ws.models / model.sha256 and good.name == "tiny.onnx"  # keeps its file name (issue 13)


def test_sensitivity_rank_job_and_stored_result(ws):
    at = ok(page("sensitivity"))
    at.button(key="run_rank").click().run()
    wait_all(ws)
    at.run()
    ok(at)
    assert len(at.get("plotly_chart")) == 1 and len(at.dataframe) == 1
    at.radio(key="rank_metric").set_value("snr_db").run()
    ok(at)
    again = ok(page("sensitivity"))  # a new session: the stored ranking, no recomputation
    assert [b.key for b in again.main.button] == ["run_isolated"] and len(JobManager.for_workspace(ws).jobs()) == 1


def test_isolated_ranking_next_to_cumulative(ws):
    at = ok(page("sensitivity", model="sample:tiny-transformer"))
    at.button(key="run_rank").click().run()
    at.button(key="run_isolated").click().run()
    jobs = wait_all(ws)
    assert {j.kind for j in jobs} == {"rank", "isolated"} and {j.queue for j in jobs} == {"rank"}
    at.run()
    ok(at)
    charts = at.get("plotly_chart")
    assert len(charts) == 2 and len(at.dataframe) == 2 and not at.main.button  # the sidebar keeps "New project"
    both = at.dataframe[1].value
    assert list(both.columns[:5]) == ["name", "op_type", "macs", "isolated_rank", "isolated_delta"]
    assert both["isolated_rank"].tolist() == list(range(1, 9)) and sorted(both["cumulative_rank"]) == list(range(1, 9))
    fig = json.loads(charts[1].proto.spec)
    assert [t["xaxis"] for t in fig["data"]] == ["x", "x2"] and len(fig["data"][0]["y"]) == 8
    at.radio(key="iso_mode").set_value("leave-one-out").run()
    ok(at)
    assert at.button(key="run_isolated").label.startswith("Leave-one-out")
    again = ok(page("sensitivity", model="sample:tiny-transformer"))  # stored: nothing to recompute
    assert not again.main.button and len(again.get("plotly_chart")) == 2


def policy_key(ws, model: str) -> str:
    from core.project import open_project

    p = open_project(model, ws=ws)
    return f"policy:{p.model.sha256}:{p.calib_data.sha256}"


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


def test_export_and_import(ws):
    at = ok(page("export"))
    assert [b.proto.label for b in at.get("download_button")][0] == "Policy JSON"
    assert len(at.get("download_button")) == 3 and len(at.code) == 6  # 3 commands folded, each whole in an expander
    at.button(key="compile").click().run()
    ok(at)
    assert len(at.get("download_button")) > 3 and not [b for b in at.button if b.key == "compile"]
    from core.project import open_project

    other = open_project("sample:tiny-transformer", ws=ws).default_policy().to_json()
    at.text_area(key="policy_text").input(other)
    at.button(key="import").click().run()
    assert at.error and "does not fit the model" in at.error[0].value and "unknown layer" in at.error[0].value
    mine = json.loads(open_project("sample:tiny-cnn", ws=ws).default_policy().to_json())
    mine["layers"][LAYER] = "fp32"
    at.text_area(key="policy_text").input(json.dumps(mine))
    at.button(key="import").click().run()
    ok(at)
    fp32 = list(mine["layers"].values()).count("fp32")  # the imported policy is the one shown (and exported)
    assert at.success and f"fp32 {fp32} · " in at.caption[1].value and at.selectbox(key="export_run").value == "session"


def test_reload_reattaches_to_job(ws):
    at = page("precision")
    at.button(key="rebuild").click().run()
    job_id = at.query_params["job"]
    wait_all(ws)
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload: new session, same URL
    reloaded.query_params.update({"model": "sample:tiny-cnn", "job": job_id})
    reloaded.run()  # lands on the home page, then opens the Precision page
    ok(reloaded.switch_page("views/precision.py").run())
    assert reloaded.session_state["my_jobs"] == [job_id]
    assert any("build" in m.value and "done" in m.value for m in reloaded.markdown)


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


def test_sidebar_says_which_backend_and_why(ws):
    at = ok(page("model"))
    text = " ".join(c.value for c in at.sidebar.caption)
    assert "Backend (auto): onnxruntime" in text and "TensorRT not chosen" in text


def test_user_text_is_literal_in_markdown():
    from ui.session import code, md

    assert md("a_b*c :red[x] $y$ <b>") == r"a\_b\*c \:red\[x\] \$y\$ \<b\>"
    assert md("sample:tiny-cnn") == r"sample\:tiny-cnn"
    assert code("/tmp/x_y.onnx") == "`/tmp/x_y.onnx`" and code("a`b") == "``a`b``" and code("`a") == "`` `a ``"


def test_model_page_shape_editor_and_generated_data(ws, tmp_path):
    """The Model page lists every dynamic dim with its value and source (guesses marked), Apply
    reopens the project at the edited shapes (kept in the session and the URL), and every job
    started from then on carries them; the data is said to be generated."""
    model = str(dynamic_cnn(tmp_path / "dyn.onnx"))
    at = ok(page("model", model=model))
    keys = {n.label: n.key for n in at.number_input}
    assert [n.value for n in at.number_input] == [1, 224, 224] and len(keys) == 3
    assert sum("guessed: 224 — set it" in c.value.replace("\\", "") for c in at.caption) == 2
    assert any("calibration and evaluation data is generated" in i.value for i in at.info)
    origin = next(d.value for d in at.dataframe if "origin" in d.value.columns)
    assert origin["origin"].tolist() == ["generated", "generated"]
    assert any("Nothing changed" in c.value for c in at.caption)
    h, w = (next(k for label, k in keys.items() if label.endswith(f"· {axis}")) for axis in "HW")
    at.number_input(key=h).set_value(320)
    at.number_input(key=w).set_value(320)
    at.button(key="apply_shapes").click().run()
    ok(at)
    assert at.session_state["source"]["shapes"] == {"images": [1, 3, 320, 320]}
    assert json.loads(at.query_params["shapes"]) == {"images": [1, 3, 320, 320]}
    io = next(d.value for d in at.dataframe if "resolved shape" in d.value.columns)
    assert io["resolved shape"].iloc[0] == "(1, 3, 320, 320)"
    assert sum("set by you" in c.value for c in at.caption) == 3 and [n.value for n in at.number_input] == [1, 320, 320]
    at.switch_page("views/precision.py").run()
    at.button(key="rebuild").click().run()
    (job,) = wait_all(ws)
    assert job.params["shapes"] == {"images": [1, 3, 320, 320]}
    res = ok(page("build_and_results", model=model, state={"source": dict(at.session_state["source"])}))
    cosine = next(m for m in res.metric if m.label == "Cosine (mean)")
    assert "on generated data" in cosine.delta
    assert any("images=1x3x320x320" in c.value.replace("\\", "") and "on generated data" in c.value
               for c in res.caption)
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload keeps the shapes (URL)
    reloaded.query_params.update({"model": model, "shapes": at.query_params["shapes"]})
    reloaded.run()
    ok(reloaded.switch_page("views/model.py").run())
    assert [n.value for n in reloaded.number_input] == [1, 320, 320]
    reloaded.button(key="reset_shapes").click().run()
    ok(reloaded)
    assert reloaded.session_state["source"]["shapes"] is None and "shapes" not in reloaded.query_params
    assert [n.value for n in reloaded.number_input] == [1, 224, 224]


def test_model_page_shows_normalisation_steps(ws, tmp_path):
    model = str(dynamic_cnn(tmp_path / "old.onnx", opset=11))
    at = ok(page("model", model=model))
    steps = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "detail"])
    assert len(steps) >= 1 and steps["detail"].str.contains("13").any()
    assert any("step(s) made the model fit" in c.value and "Opset 11 → 13" in c.value for c in at.caption)


def test_results_page_shows_the_quality_warning(ws):
    from core.project import open_project
    from core.measure.runs import build_and_measure

    p = open_project("sample:tiny-cnn", ws=ws)
    r = build_and_measure(p, p.default_policy(), iterations=3, profile_iterations=1, warn_below=1.01)
    assert r.warnings
    at = ok(page("build_and_results"))
    assert at.warning and "is below 1.01" in at.warning[0].value and "Sensitivity page" in at.warning[0].value


def test_sidebar_shows_and_keeps_the_deployment_target(ws):
    """TensorRT by default (where mixprec's users deploy), with the caveat that this machine's CPU
    latency does not predict it; picking ONNX Runtime keeps it in the session and the URL, and
    jobs carry it."""
    at = ok(page("precision"))
    pick = at.sidebar.selectbox(key="target_pick")
    assert pick.value == "tensorrt" and any("**Target:** TensorRT (GPU)" in m.value for m in at.sidebar.markdown)
    assert any("does not predict TensorRT latency" in c.value for c in at.sidebar.caption)
    pick.select("onnxruntime").run()
    ok(at)
    assert at.session_state["source"]["target"] == "onnxruntime" and at.query_params["target"] == "onnxruntime"
    assert any("**Target:** ONNX Runtime (CPU)" in m.value for m in at.sidebar.markdown)
    assert not any("does not predict" in c.value for c in at.sidebar.caption)
    at.button(key="rebuild").click().run()
    (job,) = wait_all(ws)
    assert job.params["target"] == "onnxruntime"
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload keeps the target (URL)
    reloaded.query_params.update({"model": "sample:tiny-cnn", "target": "onnxruntime"})
    ok(reloaded.run())
    assert reloaded.sidebar.selectbox(key="target_pick").value == "onnxruntime"


def test_precision_page_states_the_search_objective(ws):
    at = ok(page("precision"))
    assert any("Objective: the estimated TensorRT time" in i.value for i in at.info)  # TensorRT target, not here
    at.sidebar.selectbox(key="target_pick").select("onnxruntime").run()
    assert not any("Objective: the estimated TensorRT" in i.value for i in ok(at).info)
    assert any("Objective: the estimated latency on onnxruntime" in c.value for c in at.caption)


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
    assert metric.delta == "0.78× · 1.28× slower than FP32"
    assert metric.proto.color == MetricProto.MetricColor.RED and metric.proto.direction == MetricProto.MetricDirection.DOWN
    assert "ONNX Runtime CPU, measured" in metric.help
    captions = [c.value for c in at.caption]
    assert any("ONNX Runtime CPU, measured · deployment target TensorRT (GPU)" in c for c in captions)
    assert any("latency ONNX Runtime CPU, measured · target TensorRT (GPU)" in c.replace("\\", "") for c in captions)
    assert at.info and "does not predict TensorRT latency" in at.info[0].value
    assert any(c.startswith("Run A latency: ONNX Runtime CPU, measured") and "does not predict" in c for c in captions)
    history = at.dataframe[0].value
    assert set(history["vs FP32"]) == {"1.50× faster than FP32", "0.78× · 1.28× slower than FP32"}
    layers = at.get("plotly_chart")[-1].proto.spec
    assert "FP16 (simulated on CPU)" in layers and "not FP16 time" in layers
    at.selectbox(key="layers_run").select(fast.run_id).run()
    assert "FP16 (simulated on CPU)" not in ok(at).get("plotly_chart")[-1].proto.spec  # INT8 default policy


# --- issue 13 §1, §2: state that survives, quick editing ------------------------------------------
def send_selection(at: AppTest, element, selection: dict) -> AppTest:
    """Run with what the browser sends when the user selects on a Plotly chart or in a table
    (``{"points": [...]}`` / ``{"rows": [...]}``): AppTest cannot click inside them."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=element.proto.id, string_value=json.dumps({"selection": selection})))
    return at._run(states)


def reload(query: dict, page_script: str | None = None) -> AppTest:
    """A browser reload (or a shared link): a new session with only the URL."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    if page_script:
        at.switch_page(f"views/{page_script}.py").run()
    return at


def counts(at: AppTest) -> dict[str, int]:
    return {m.label: int(m.value) for m in at.metric if m.label in ("FP32", "FP16", "INT8")}


def layer_table(at: AppTest):
    return next(d for d in at.dataframe if (d.key or "").startswith("layer_table-"))


def test_reload_restores_project_and_draft_on_every_page_with_undo_redo(ws):
    """The project (tiny-cnn, not the default MiniLM), its draft policy and the run label are saved
    under ?project=; a reload onto any page restores them; undo/redo walk the edits, also after a
    reload."""
    from core.project import open_project

    base = open_project("sample:tiny-cnn", ws=ws).default_policy()
    at = ok(page("precision"))
    pid = at.query_params["project"]
    assert at.query_params["model"] == "sample:tiny-cnn" and len(pid) >= 8
    assert at.button(key="undo").disabled and at.button(key="redo").disabled
    before = counts(at)
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.selectbox(key="bulk_regex_prec").select("fp16")
    at.button(key="apply_regex").click().run()
    at.text_input(key="run_label").input("conv2 *fp16*").run()
    edited = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert edited.layers[LAYER] == "fp16" and counts(ok(at))["FP16"] == before["FP16"] + 1
    at.switch_page("views/model.py").run()
    at.switch_page("views/precision.py").run()  # another page in between: the label is kept
    assert at.text_input(key="run_label").value == "conv2 *fp16*"
    for script in ("model", "sensitivity", "precision", "build_and_results", "export"):
        again = ok(reload({"project": pid}, script))
        assert again.session_state["source"]["model"] == "sample:tiny-cnn", script
        assert any("tiny-cnn" in shown(m) for m in again.sidebar.markdown), script
        assert again.query_params["project"] == pid and again.query_params["model"] == "sample:tiny-cnn"
    assert again.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256  # the Export page
    at = ok(reload({"project": pid}, "precision"))
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256
    assert counts(at) == counts(at) | {"FP16": before["FP16"] + 1}
    assert at.text_input(key="run_label").value == "conv2 *fp16*"
    undo = at.button(key="undo")
    assert not undo.disabled and LAYER in undo.help and at.button(key="redo").disabled
    undo.click().run()
    assert counts(ok(at)) == before and at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == base.sha256
    assert any(s.value.startswith("Undone:") for s in at.success)
    at.button(key="redo").click().run()
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256
    at.button(key="undo").click().run()
    assert ok(reload({"project": pid}, "precision")).session_state[policy_key(ws, "sample:tiny-cnn")].sha256 \
        == base.sha256  # the undo was saved too
    fresh = ok(reload({"project": "../../etc", "model": "sample:tiny-cnn"}, "precision"))  # hostile id: ignored
    assert fresh.query_params["project"] != "../../etc" and not (ws.root / "etc").exists()
    assert fresh.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == base.sha256


def test_a_damaged_saved_project_starts_again_with_a_note(ws):
    from core.store.drafts import new_project_id, project_path

    pid = new_project_id()
    path = project_path(ws, pid)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    at = reload({"project": pid, "model": "sample:tiny-cnn"})  # said once, on the first page
    assert not at.exception and any("could not be read" in shown(w) for w in at.sidebar.warning)
    ok(at.switch_page("views/precision.py").run())
    assert at.session_state["source"]["model"] == "sample:tiny-cnn"
    assert json.loads(path.read_text())["model"] == "sample:tiny-cnn"  # replaced at the next save


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


def mlp(path: Path, n_matmul: int) -> Path:
    """x[1,4] → (MatMul → Relu) × n → Relu: a model with exactly ``n_matmul`` INT8-eligible layers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(n_matmul)
    nodes, inits, t = [], [], "x"
    for i in range(n_matmul):
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [t, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        t = f"r{i}"
    nodes.append(helper.make_node("Sigmoid", [t], ["y"], name="out"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_models_with_0_1_2_eligible_layers_on_every_page(ws, tmp_path):
    """Every page works on models with 0, 1 and 2 INT8-eligible layers: no number box defaults above
    its maximum (the issue's StreamlitValueAboveMaxError with k = 3), also when the same page moves
    on to a model with fewer layers."""
    scripts = ("model", "sensitivity", "build_and_results", "export", "precision")
    models = {n: str(mlp(tmp_path / f"mlp{n}.onnx", n)) for n in (2, 1, 0)}
    for n in (2, 1):  # rankings first: the k boxes need one
        at = ok(page("sensitivity", model=models[n]))
        at.button(key="run_rank").click().run()
        wait_all(ws)
    at = ok(page("sensitivity", model=models[2]))
    top = next(b for b in at.number_input if b.key == "rank_top")
    assert top.max == 5 and top.value == 5  # the cumulative ranking lists all 5 layers
    top.set_value(5).run()
    at.session_state["source"] = {"model": models[1], "data": None, "eval_data": None}
    ok(at.run())  # the same page, the next model: 3 layers, a kept 5 must not break it
    assert next(b for b in at.number_input if b.key == "rank_top").max == 3
    at.session_state["source"] = {"model": models[2], "data": None, "eval_data": None}
    at.switch_page("views/precision.py").run()
    k = next(b for b in ok(at).number_input if b.key == "bulk_k")
    assert k.max == 2 and k.value == 2
    k.set_value(2)
    at.button(key="apply_topk").click().run()
    assert any("2 layer(s) → FP16" in s.value for s in ok(at).success)
    for n in (1, 0):
        at.session_state["source"] = {"model": models[n], "data": None, "eval_data": None}
        at.run()  # the same page, a model with fewer eligible layers
        for script in scripts:
            at.switch_page(f"views/{script}.py").run()
            ok(at)
        k = [b for b in at.number_input if b.key == "bulk_k"]  # the Precision page, last
        if n:
            assert k and k[0].max == n and k[0].value == n
            at.button(key="apply_topk").click().run()
            assert any(f"{n} layer(s) → FP16" in s.value for s in ok(at).success)
        else:
            assert not k and not at.get("plotly_chart")
            assert any("No sensitivity ranking" in c.value for c in at.caption)


def test_new_project_leaves_the_old_one_saved(ws):
    at = ok(page("precision"))
    old = at.query_params["project"]
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.button(key="apply_regex").click().run()
    at = ok(reload({"project": old}))  # on the home page, which opens no model
    assert at.session_state["source"]["model"] == "sample:tiny-cnn"
    at.sidebar.button(key="new_project").click().run()
    ok(at)
    assert at.query_params["project"] != old and at.session_state["source"]["model"] == "sample:minilm"
    back = ok(reload({"project": old}, "precision"))
    assert back.session_state[policy_key(ws, "sample:tiny-cnn")].layers[LAYER] == "fp16"


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
