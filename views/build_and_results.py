"""Build and results: the job queue, and what each run cost in latency, reformats and quality."""
import streamlit as st

from core.display.charts import plot_quality_vs_latency, plot_run_latency, plot_run_layers, plot_run_quality, \
    plot_run_reformat
from core.display.tables import local_time, metric_text, ms_text, run_context, run_history, run_title
from core.jobs import build_params
from core.measure.runs import GENERATED_NOTE, latency_caveat
from core.project import TARGET_LABELS
from core.quant.policy import uniform_policy
from core.store.runs import list_runs, load_run, load_run_per_layer, run_dir
from ui import (engine_report, estimate_panel, export_panel, job_panel, quality_panel, run_compare, run_notes,
                saved_project, session, tables)
from ui.session import code, md

p = saved_project.project()
st.subheader("Jobs")
job_panel.show(limit=8)


def _baseline(project, src, owner: str) -> None:
    """The baseline button's ``on_click`` (``job_panel.submit``: queued even if the click's run is cut short)."""
    fp16 = uniform_policy(project.model, project.layers, "fp16").to_json()
    job_panel.submit("build", build_params(src, fp16, label="all-FP16", metrics=quality_panel.current()),
                     "all-FP16 baseline", owner)


st.button("Build the all-FP16 baseline", key="fp16_baseline", icon=":material/play_arrow:", on_click=_baseline,
          args=(p, saved_project.source(), job_panel.owner_token()))
job_panel.submit_error()
quality_panel.selector(p)  # what the builds of this session measure quality on

engine_report.section([l.name for l in p.layers], p)

runs = list_runs(p.ws, p.model.sha256)
st.subheader(f"Runs of {md(p.model.name)}")
if runs.empty:
    st.info("No runs yet: press **Rebuild** on the Precision page.", icon=":material/info:")
    st.stop()
last = runs.iloc[0]
c = st.columns([1, 1.7, 1, 0.8, 1])  # the latency's delta says its speedup in words
c[0].metric("Latest run", md(last["label"]), f"built {local_time(last['created'])}", delta_color="off",
            delta_arrow="off", help=f"Label: {md(last['label'])} · run {code(last['run_id'])}")
session.speedup_metric(c[1], "Median latency", ms_text(last["latency_median_ms"]), last["speedup"],
                       help=f"{md(last['latency_source'])} · target "
                       f"{TARGET_LABELS.get(last['target'], last['target'])}"
                       f" · p95 {ms_text(last['latency_p95_ms'])} · FP32 {ms_text(last['fp32_median_ms'])}")
c[2].metric("Cosine (mean)", f"{last['cosine_mean']:.4f}",
            f"min {last['cosine_min']:.4f}" + (f" · {GENERATED_NOTE}" if last["data_generated"] else ""),
            delta_color="off", delta_arrow="off")
snr = metric_text("snr_db", last["snr_db"])  # None (∞: outputs identical to FP32) in every run: an object column
c[3].metric("SNR", snr.split(" (")[0], "outputs identical to FP32" if snr.startswith("∞") else None,
            delta_color="off", delta_arrow="off")
c[4].metric("Reformats", f"{int(last['reformat_count'])}", f"{last['reformat_pct']:.1f}% of per-layer time",
            delta_color="off", delta_arrow="off", help=f"{ms_text(last['reformat_ms'])} in precision conversions")
try:
    last_run = load_run(p.ws, last["run_id"])
    quality_panel.headline_section(last_run)
except Exception as e:  # noqa: BLE001 - a damaged run must not break the page
    last_run = None
    st.error(md(e))
st.caption(f"Latency of {md(last['label'])}: {md(last['latency_source'])} · deployment target "
           f"{TARGET_LABELS.get(last['target'], last['target'])} · {md(run_context(last, source=False))}")
if last_run is not None:
    estimate_panel.beside_run(p, last_run, ms_text(last["latency_median_ms"]))
caveat = latency_caveat(last["target"], last["backend"])  # the run's target, as built
if caveat:
    st.info(caveat, icon=":material/info:")
run_notes.section(p, last["run_id"])
g1, g2 = st.columns(2)
g1.plotly_chart(plot_run_latency(runs), key="latency_chart")
g2.plotly_chart(plot_run_quality(runs), key="quality_chart")
g3, g4 = st.columns(2)
g3.plotly_chart(plot_run_reformat(runs), key="reformat_chart")
g4.plotly_chart(plot_quality_vs_latency(runs), key="tradeoff_chart")

st.subheader("Run history")
tables.show(run_history(runs), hide_index=True, height=260)
if len(runs) >= 2:
    run_compare.section(p, runs)

st.subheader("Per-layer latency of one run")
ids = list(runs["run_id"])
pick, go = st.columns([4, 1])
PICKED, NEWEST = "layers_run:picked", "layers_run:newest"  # the run the user picked (None: follow the newest)


def _picked_run(newest: str) -> None:
    if session.fragment_rerun():  # a job list's poll carries the picker's value as the browser had it: stale
        st.session_state["layers_run"] = st.session_state.get(PICKED) or newest
        return
    v = st.session_state.get("layers_run")
    st.session_state[PICKED] = v if v != newest else None


if st.session_state.get(NEWEST) != ids[0]:  # a new run has landed: show it, unless the user picked another run
    st.session_state[NEWEST] = ids[0]
    if st.session_state.get(PICKED) not in ids:
        st.session_state["layers_run"] = ids[0]
elif st.session_state.get("layers_run") not in ids:
    st.session_state.pop("layers_run", None)
sel = pick.selectbox("Run", ids, format_func=lambda r: run_title(runs, r), key="layers_run", on_change=_picked_run,
                     args=(ids[0],), persist_state="session")
go.write("")
if go.button("Export this run", key="export_this_run", icon=":material/download:"):
    export_panel.choose_run(sel)
    st.switch_page("views/export.py")
try:
    picked = runs.set_index("run_id").loc[sel]
    st.plotly_chart(plot_run_layers(load_run_per_layer(run_dir(p.ws, sel)), backend=picked["backend"],
                                    context=run_context(picked.to_dict() | {"run_id": sel})), key="layers_chart")
except Exception as e:  # noqa: BLE001 - a damaged run must not break the page
    st.error(md(e))
if sel != last["run_id"]:
    run_notes.section(p, sel)
