"""The TensorRT engine-report import (trtexec --exportLayerInfo / --exportProfile), as in
NVIDIA's TREx: four charts and the reformats next to this model's layers."""
from __future__ import annotations

import streamlit as st

from core.backends.reports import PCT_LABEL, load_engine_report, reformat_table
from core.display.charts import plot_latency_by_type, plot_layer_latency, plot_precision_distribution, \
    plot_reformat_overhead
from core.display.tables import ms_text
from core.errors import MixprecError
from ui import estimate_panel, tables
from ui.session import md


def section(layer_names: list[str], p=None) -> None:
    with st.expander("Import TensorRT engine reports (from trtexec on any GPU machine)", icon=":material/upload_file:"):
        st.caption("Build with `trtexec --onnx=… --profilingVerbosity=detailed --exportLayerInfo=layers.json "
                   "--exportProfile=profile.json` (the Export page's scripts and bundle do), then load both files.")
        up1, up2 = st.columns(2)
        g_up = up1.file_uploader("Layer info JSON (--exportLayerInfo)", type=["json"], key="trt_graph_upload")
        p_up = up2.file_uploader("Profile JSON (--exportProfile)", type=["json"], key="trt_profile_upload")
        g_path = up1.text_input("…or its path on the server", key="trt_graph_path")
        p_path = up2.text_input("…or its path on the server", key="trt_profile_path")
        graph = g_up.getvalue() if g_up else (g_path.strip() or None)
        profile = p_up.getvalue() if p_up else (p_path.strip() or None)
        if graph is None:
            return
        try:
            rep = load_engine_report(graph, profile, name=g_up.name if g_up else None)
        except MixprecError as e:
            st.error(md(e))
            return
        rf = rep.reformat
        st.markdown(f"**{md(rep.name)}**: {len(rep.layers)} engine layers; {rf.count} reformat layers"
                    + (f", {ms_text(rf.ms)} of {ms_text(rf.total_ms)} ({rf.pct:.1f} {PCT_LABEL})" if rep.has_profile
                       else " (no profile loaded: no times)"))
        if rep.has_profile:
            st.caption("Latency: TensorRT on the GPU that ran trtexec, measured (the imported profile).")
            if p is not None:
                estimate_panel.calibration_offer(p, graph, profile)
        if rep.has_profile:
            c1, c2 = st.columns(2)
            c1.plotly_chart(plot_layer_latency(rep.layers), key="trt_layers_chart")
            c2.plotly_chart(plot_latency_by_type(rep.latency_by_type()), key="trt_types_chart")
            c3, c4 = st.columns(2)
            c3.plotly_chart(plot_reformat_overhead(reformat_table([rep])), key="trt_reformat_chart")
            c4.plotly_chart(plot_precision_distribution(rep.precision_distribution()), key="trt_precision_chart")
        joined = rep.join_onnx(layer_names)
        if len(joined.neighbours):
            st.caption("Your layers next to a reformat (before/after it in the engine):")
            tables.show(joined.neighbours, hide_index=True)
        tables.show(rep.layers.drop(columns=["in_tensors", "out_tensors"], errors="ignore"), hide_index=True,
                    height=260)
