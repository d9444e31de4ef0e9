"""Sensitivity: Polygraphy layer-wise ranking (all eligible layers INT8 vs FP32), as a background job."""
import streamlit as st

from core.compare import RANK_METRICS
from core.jobs import rank_params
from core.plots import plot_ranking
from core.policy import CALIB_METHODS
from ui import common as ui

ui.header("Sensitivity", "How far each layer's output drifts from FP32 when every eligible layer is INT8 "
          "(ONNX Runtime, Polygraphy Comparator). Errors are cumulative; 'added_cos_drop' isolates a layer's own share.")
p = ui.project()
src = ui.source()
method = st.selectbox("Calibration method", CALIB_METHODS, key="rank_method")
table = ui.ranking(p, method)
mine = [j for j in ui.manager().jobs(kind="rank")
        if j.params.get("model") == src["model"] and j.params.get("data") == src["data"]
        and j.params.get("eval_data") == src["eval_data"] and j.params.get("method") == method]
if any(j.active for j in mine):
    ui.job_panel(kind="rank", only=[j.id for j in mine], limit=1)
elif table is None:
    st.info("This model and data have not been ranked with this calibration method yet.")
    if mine and mine[0].status != "done":
        st.error(f"The last ranking {mine[0].status}: {mine[0].error}")
    if st.button("Run the ranking", type="primary", key="run_rank"):
        ui.submit("rank", rank_params(src["model"], src["data"], src["eval_data"], method), f"rank {p.model.name}")
        st.rerun()
if table is not None:
    st.caption(f"Stored ranking of {len(table)} layers (kept per model, calibration and evaluation data, and method: "
               "revisiting does not recompute).")
    c1, c2 = st.columns([2, 1])
    metric = c1.radio("Metric", RANK_METRICS, horizontal=True, key="rank_metric",
                      format_func={"cos_drop": "cosine drop", "added_cos_drop": "added cosine drop",
                                   "snr_db": "SNR", "max_abs": "max abs"}.get)
    top = c2.number_input("Top N", 1, max(1, len(table)), min(20, max(1, len(table))), key="rank_top")
    st.plotly_chart(plot_ranking(table, metric, top), key="ranking_chart")
    st.dataframe(table, hide_index=True, height=400)
