"""Sensitivity: the cumulative Polygraphy ranking (all eligible layers INT8 vs FP32; its chart and table
show the INT8-eligible layers unless the user asks for every layer: the others only inherit their drop) next
to the isolated one (one layer at a time, core.sensitivity), each computed once by a background job."""
from dataclasses import replace

import streamlit as st

from core.display.charts import plot_ranking, plot_sensitivity_compare
from core.jobs import isolated_params, rank_params
from core.measure.runs import GENERATED_NOTE
from core.quant.policy import CALIB_METHODS
from core.sensitivity import MODES, RANK_METRICS, RANKING_NOTE, RUNNER_LABELS, ranking_comparison
from ui import cluster, job_panel, results, saved_project, tables
from ui.session import md

p = saved_project.project()
src = replace(saved_project.source(), target=None)  # the rankings do not depend on the target: one job for all
if p.data_generated:
    st.caption(f"Cosine drops and SNR below are {GENERATED_NOTE} (give .npz files on the Model page for real inputs).")
method = st.selectbox("Calibration method", CALIB_METHODS, key="rank_method")
ranking = results.ranking(p, method)
table = ranking.table if ranking is not None else None
st.subheader("Cumulative (Polygraphy)")
st.caption(RANKING_NOTE)
job_panel.job_button("rank", rank_params(src, method, max_memory=cluster.max_memory()),
                     f"rank {p.model.name}", "Run the ranking", "run_rank", table is not None,
                     "This model and data have not been ranked with this calibration method yet.")
if table is not None:
    where = RUNNER_LABELS.get(ranking.runner, ranking.runner)
    st.caption(f"Stored ranking of {len(table)} layers, compared on {where} (kept per model, calibration and "
               "evaluation data, and method: revisiting does not recompute).")
    c1, c2, c3 = st.columns([2, 1, 1])
    metric = c1.radio("Metric", RANK_METRICS, horizontal=True, key="rank_metric",
                      format_func={"cos_drop": "cosine drop", "added_cos_drop": "added cosine drop",
                                   "snr_db": "SNR", "max_abs": "max abs"}.get)
    eligible = c3.toggle("INT8-eligible only", value=True, key="rank_eligible", on_change=st.session_state.pop,
                         args=("rank_top", None),  # Top N starts again from its default for the other list
                         help="Layers that cannot be INT8 (bias Adds, Muls, activations…) stay FP32 in the ranking: "
                              "their drop is inherited from the INT8 layers before them.")
    shown = table[table["eligible"].astype(bool)] if eligible else table
    if shown.empty:  # no eligible layer: every layer, said so
        shown = table
        c3.caption("No INT8-eligible layer: every layer is shown.")
    top = c2.number_input("Top N", 1, max(1, len(shown)), min(20, max(1, len(shown))), key="rank_top")
    st.plotly_chart(plot_ranking(shown, metric, top), key="ranking_chart")
    if eligible and len(shown) < len(table):
        st.caption(f"{len(shown)} INT8-eligible layer(s) of {len(table)}: turn off “INT8-eligible only” for every "
                   "layer.")
    tables.show(shown, hide_index=True, height=400)

st.subheader("Isolated (one layer at a time)")
labels = {"isolated": "Isolated (one layer at a time)", "leave-one-out": "Leave-one-out (all but one layer INT8)"}
mode = st.radio("Mode", MODES, horizontal=True, key="iso_mode", format_func=labels.get)
sens = results.sensitivity(p, method, mode)
job_panel.job_button("isolated",
                     isolated_params(src, method, mode, ray=cluster.ray_address()),
                     f"{mode} {p.model.name}", f"Run the {mode} ranking", "run_isolated", sens is not None,
                     f"No {mode} ranking yet for this model, data and calibration method: each eligible layer is "
                     "measured on the dev half of the evaluation data (calibrated once, trials in parallel).")
if sens is not None:
    iso = sens.table
    if sens.trials_on:
        st.caption(f"Trials ran on: {md(sens.trials_on)}")
    st.caption("delta: cosine drop with only this layer INT8 (isolated), or cosine gain when only this layer "
               "leaves INT8 (leave-one-out). Next to it: the layer's rank and drop in the cumulative ranking"
               + ("." if table is not None else " (run the cumulative ranking above to fill them in)."))
    n = st.number_input("Top N", 1, max(1, len(iso)), min(20, max(1, len(iso))), key="iso_top")
    st.plotly_chart(plot_sensitivity_compare(table, iso, n), key="compare_chart")
    tables.show(ranking_comparison(table, iso), hide_index=True, height=400)
