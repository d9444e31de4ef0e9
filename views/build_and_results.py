"""Build and results: the job queue, and what each run cost in latency, reformats and quality."""
import streamlit as st

from core.jobs import build_params
from core.plots import plot_quality_vs_latency, plot_run_latency, plot_run_layers, plot_run_quality, \
    plot_run_reformat, run_names
from core.policy import uniform_policy
from core.policy_edit import policy_diff, run_comparison
from core.project import TARGET_LABELS
from core.runs import GENERATED_NOTE, latency_caveat, speedup_text
from core.store import list_runs, load_run_per_layer, run_dir, run_policy
from ui import common as ui
from ui import engine_report, run_notes

p = ui.project()
src = ui.source()
st.subheader("Jobs")
ui.job_panel(limit=8)
if st.button("Build the all-FP16 baseline", key="fp16_baseline"):
    ui.submit("build", build_params(src["model"], uniform_policy(p.model, p.layers, "fp16").to_json(), src["data"],
                                    src["eval_data"], label="all-FP16", shapes=ui.shapes(), target=ui.target()),
              "all-FP16 baseline")
    st.rerun()

engine_report.section([l.name for l in p.layers])

runs = list_runs(p.ws, p.model.sha256)
st.subheader(f"Runs of {ui.md(p.model.name)}")
if runs.empty:
    st.info("No runs yet: press **Rebuild** on the Precision page.")
    st.stop()
runs.insert(runs.columns.get_loc("speedup") + 1, "vs FP32", [speedup_text(v)[0] for v in runs["speedup"]])
last = runs.iloc[0]
c = st.columns([1, 1.7, 1, 0.8, 1])  # the latency's delta says its speedup in words
c[0].metric("Latest run", ui.md(last["label"]))
ui.speedup_metric(c[1], "Median latency", f"{last['latency_median_ms']:.3f} ms", last["speedup"],
                  help=f"{last['latency_source']} · target {TARGET_LABELS.get(last['target'], last['target'])}")
c[2].metric("Cosine (mean)", f"{last['cosine_mean']:.4f}",
            f"min {last['cosine_min']:.4f}" + (f" · {GENERATED_NOTE}" if last["data_generated"] else ""),
            delta_color="off", delta_arrow="off")
c[3].metric("SNR", f"{last['snr_db']:.1f} dB" if last["snr_db"] == last["snr_db"] else "∞")
c[4].metric("Reformats", f"{int(last['reformat_count'])}", f"{last['reformat_pct']:.1f}% of per-layer time",
            delta_color="off", delta_arrow="off")
st.caption(f"Latency of {ui.md(last['label'])}: {ui.md(last['latency_source'])} · deployment target "
           f"{TARGET_LABELS.get(p.target, p.target)}")
caveat = latency_caveat(p.target, last["backend"])
if caveat:
    st.info(caveat)
run_notes.section(p, last["run_id"])
g1, g2 = st.columns(2)
g1.plotly_chart(plot_run_latency(runs), key="latency_chart")
g2.plotly_chart(plot_run_quality(runs), key="quality_chart")
g3, g4 = st.columns(2)
g3.plotly_chart(plot_run_reformat(runs), key="reformat_chart")
g4.plotly_chart(plot_quality_vs_latency(runs), key="tradeoff_chart")

names = dict(zip(runs["run_id"], run_names(runs)))
sel = st.selectbox("Per-layer latency of run", list(names), format_func=names.get, key="layers_run")
try:
    st.plotly_chart(plot_run_layers(load_run_per_layer(run_dir(p.ws, sel)),
                                    backend=runs.set_index("run_id").at[sel, "backend"]), key="layers_chart")
except Exception as e:  # noqa: BLE001 - a damaged run must not break the page
    st.error(ui.md(e))
if sel != last["run_id"]:
    run_notes.section(p, sel)

st.subheader("Run history")
st.dataframe(runs, hide_index=True, height=260)
if len(runs) >= 2:
    st.subheader("Compare two runs")
    a_col, b_col = st.columns(2)
    a = a_col.selectbox("Run A", list(names), index=1, format_func=names.get, key="cmp_a")
    b = b_col.selectbox("Run B", list(names), index=0, format_func=names.get, key="cmp_b")
    st.dataframe(run_comparison(runs, a, b))
    run_notes.comparison(runs, a, b)
    try:
        diff = policy_diff(run_policy(p, run_dir(p.ws, a)), run_policy(p, run_dir(p.ws, b)), p.layers)
        st.caption(f"{len(diff)} layer(s) differ between A ('built') and B ('now')")
        st.dataframe(diff, hide_index=True)
    except Exception as e:  # noqa: BLE001
        st.error(ui.md(e))
