"""Model page: pick a sample, upload an ONNX file or give a server path; optional calibration/eval data;
what loading changed, the input shapes (editable) and which data is generated. Every choice is saved
with the project (ui.saved_project.set_source); each model keeps its own draft policy."""
from dataclasses import replace

import pandas as pd
import streamlit as st

from core.display.charts import plot_op_types
from core.errors import MixprecError
from core.project import ProjectSource
from ui import data_import, model_facts, saved_project, session, shape_editor
from ui.session import md

src = saved_project.source()
limit = st.get_option("server.maxUploadSize")
how = st.radio("Model source", ["Bundled sample", "Upload an ONNX file", "Path on the server"], horizontal=True,
               index=0 if src.model.startswith("sample:") else 2, key="model_how")
if how == "Bundled sample":
    current = src.model if src.model in saved_project.SAMPLES else saved_project.DEFAULT_MODEL
    samples = saved_project.SAMPLES
    sample = st.selectbox("Sample", samples, index=samples.index(current), key="sample_pick")
    if sample != src.model:
        saved_project.set_source(ProjectSource(sample, target=src.target))
        st.rerun()  # the sidebar, drawn before this page, shows the new model at once
elif how == "Upload an ONNX file":
    st.caption(f"Uploads are limited to {limit} MB (server.maxUploadSize in .streamlit/config.toml). "
               "Larger models: give their path on the server.")
    path = session.upload(st.file_uploader("ONNX model", type=["onnx"], key="model_file"), "model")
    if path and path != src.model:
        saved_project.set_source(ProjectSource(path, target=src.target))
        st.rerun()
else:
    with st.form("path_form"):
        typed = st.text_input("Path of an .onnx file on the server", value="" if src.model.startswith("sample:")
                              else src.model, key="model_path")
        st.form_submit_button("Load", key="load_path", on_click=saved_project.load_typed_path, args=("model_path",))

with st.expander("Calibration and evaluation data (.npz, optional)", expanded=bool(src.data or src.eval_data)):
    st.caption(f"One array per model input, keyed by input name (numpy.savez). Up to {limit} MB. Without them, "
               "samples use their bundled data and other models get generated data; evaluation never sees "
               "calibration samples.")
    c1, c2 = st.columns(2)
    try:
        model = saved_project.open_source(ProjectSource(src.model)).model
    except Exception:  # noqa: BLE001 - the error is shown below by saved_project.project()
        model = None
    calib = session.upload(c1.file_uploader("Calibration .npz", type=["npz"], key="calib_file"), "data", model)
    evald = session.upload(c2.file_uploader("Evaluation .npz", type=["npz"], key="eval_file"), "data", model)
    if (calib or evald) and (calib, evald) != (src.data, src.eval_data):
        saved_project.set_source(replace(src, data=calib or src.data, eval_data=evald or src.eval_data))
        st.rerun()
    with st.form("data_path_form"):  # or files on the server (no upload limit), as for models
        d1, d2 = st.columns(2)
        d1.text_input("Calibration .npz: a file on the server", key="calib_path",
                      value=src.data if src.data and not src.data.startswith(str(session.workspace().root)) else "")
        d2.text_input("Evaluation .npz: a file on the server (optional)", key="eval_path",
                      value=src.eval_data if src.eval_data and not src.eval_data.startswith(str(session.workspace().root))
                      else "")
        st.form_submit_button("Use these files", key="load_data_path", on_click=saved_project.load_typed_data,
                              args=("calib_path", "eval_path"))
    if st.session_state.get(saved_project.DATA_ERROR):
        st.error(st.session_state.pop(saved_project.DATA_ERROR))
    if src.data or src.eval_data:
        st.button("Use the default data", key="clear_data", on_click=saved_project.set_data, args=(None, None))
    data_import.section(src)

# shapes (or profiles) that no longer fit (e.g. new data): say so, and offer the way back
if saved_project.source().shapes or saved_project.source().profiles:
    try:
        saved_project.open_source(saved_project.source())
    except MixprecError as e:
        st.error(f"At the input shapes you set: {md(e)}")
        st.button("Back to the default shapes", key="reset_bad_shapes", on_click=saved_project.set_shapes, args=(None,))
        st.stop()
session.show_flash()
p = saved_project.project()
m = p.model
st.subheader(md(m.name))
c = st.columns(5)
c[0].metric("Layers", len(p.layers))
c[1].metric("INT8-eligible", sum(l.eligible for l in p.layers))
c[2].metric("Opset", m.opset)
c[3].metric("Size", f"{m.size_bytes / 1e6:.1f} MB")
c[4].metric("Samples (calib / eval)", f"{p.calib_data.num_samples} / {p.eval_data.num_samples}")
st.caption(f"sha256 `{m.sha256}` · calibration: {md(p.calib_data.source)} · evaluation: {md(p.eval_data.source)}")
for note in p.data_notes:
    st.warning(md(note), icon=":material/dataset:")
model_facts.data_origin(p)
io = pd.DataFrame([("input", s.name, s.dtype, str(s.shape), str(p.input_shapes.get(s.name, ""))) for s in m.inputs]
                  + [("output", s.name, s.dtype, str(s.shape), "") for s in m.outputs],
                  columns=["kind", "name", "dtype", "shape", "resolved shape"])
st.dataframe(io, hide_index=True)
model_facts.branches(p)
shape_editor.section(p)
model_facts.normalization(p)

st.subheader("Layer inventory")
inv = p.inventory()
f1, f2 = st.columns([3, 1])
ops = f1.multiselect("Op types", sorted(inv["op_type"].unique()), key="inv_ops")
eligible_only = f2.checkbox("INT8-eligible only", key="inv_eligible")
shown = inv[(inv["op_type"].isin(ops) | (not ops)) & (inv["eligible"] | (not eligible_only))]
st.caption(f"{len(shown)} of {len(inv)} layers")
st.dataframe(shown, hide_index=True, height=320)
st.plotly_chart(plot_op_types(inv), key="op_types_chart")
