"""mixprec dashboard: `streamlit run app.py`. This is the home page; the five pages live in pages/."""
import streamlit as st

from ui import common as ui

ui.header("mixprec", "Sensitivity-guided mixed precision for ONNX models headed to TensorRT")
st.markdown(
    "Load a model, see which layers are sensitive to INT8, choose FP32 / FP16 / INT8 per layer, "
    "rebuild, and compare what each choice costs in latency, reformat overhead and quality. "
    "Then export the precision policy.")
for page, label, icon, what in [
    ("pages/1_Model.py", "Model", "📦", "upload an ONNX model or pick a sample; calibration / evaluation data"),
    ("pages/2_Sensitivity.py", "Sensitivity", "🎯", "layer-wise ranking against FP32"),
    ("pages/3_Precision.py", "Precision", "🎚️", "per-layer FP32 / FP16 / INT8, bulk actions, rebuild"),
    ("pages/4_Build_and_results.py", "Build and results", "📈", "jobs, latency, reformats, quality"),
    ("pages/5_Export.py", "Export", "📤", "policy JSON, trtexec commands, compiled ONNX; import"),
]:
    st.page_link(page, label=f"{label}: {what}", icon=icon)
ui.job_panel(limit=5)
