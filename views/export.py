"""Export the session's policy (JSON, trtexec commands, compiled ONNX); import a policy JSON."""
import streamlit as st

from core.errors import MixprecError
from core.export import compiled_onnx, policy_filename, polygraphy_command, trtexec_legacy_command, \
    trtexec_typed_command
from core.policy import policy_from_text
from ui import common as ui

p = ui.project()
pol = ui.policy(p)
ui.show_flash()
counts = pol.precision_counts()
st.caption(f"{ui.md(p.model.name)}: fp32 {counts['fp32']} · fp16 {counts['fp16']} · int8 {counts['int8']} · "
           f"policy sha256 `{pol.sha256[:16]}…`")
st.download_button("Download policy JSON", pol.to_json(), policy_filename(pol), "application/json",
                   key="dl_policy", type="primary")
onnx_name = policy_filename(pol, ".mixprec.onnx")
st.subheader("TensorRT ≤ 10.11: per-layer precision constraints (deprecated in 10.12, removed in 11)")
st.caption("INT8 Gemm/MatMul layers need the Polygraphy post-process script that `python -m core export "
           "--format trtexec` writes beside the command (the parser makes their weights Constant layers without "
           "ranges); this preview shows the trtexec form.")
try:
    st.code(trtexec_legacy_command(p.model, pol, "model.onnx", "calibration.cache", p.input_shapes), language="bash", wrap_lines=True)
except MixprecError as e:
    st.warning(ui.md(e))
st.subheader("TensorRT ≥ 10.12 / 11: strongly typed build of the explicit-precision ONNX")
try:
    st.code(trtexec_typed_command(p.model, onnx_name, p.input_shapes), language="bash", wrap_lines=True)
    st.code(polygraphy_command(p.model, onnx_name, p.input_shapes), language="bash", wrap_lines=True)
    st.caption("The Polygraphy preview uses a fixed tolerance; `python -m core export --format polygraphy` "
               "measures the policy's error and compares TensorRT against saved FP32 outputs.")
except MixprecError as e:
    st.warning(ui.md(e))
if st.button("Compile the explicit-precision ONNX", key="compile"):
    try:
        with st.spinner("Calibrating and compiling…"):
            st.session_state["compiled"] = (pol.sha256, compiled_onnx(p, pol))
    except MixprecError as e:
        st.error(ui.md(e))
compiled = st.session_state.get("compiled")
if compiled and compiled[0] == pol.sha256:
    st.download_button(f"Download {onnx_name} ({len(compiled[1]) / 1e6:.1f} MB)", compiled[1], onnx_name,
                       "application/octet-stream", key="dl_onnx")

st.subheader("Import a policy")
st.caption("The policy is validated against the loaded model; every mismatch is listed and nothing is applied "
           "unless all of it fits.")
up = st.file_uploader("Policy JSON", type=["json"], key="policy_file")
text = st.text_area("…or paste it", height=140, key="policy_text")
if st.button("Validate and apply", key="import"):
    raw = up.getvalue().decode("utf-8", errors="replace") if up is not None else text
    try:
        ui.set_policy(p, policy_from_text(raw, p.model, p.layers, source=up.name if up else "the pasted policy"))
        ui.flash("Policy applied: see the Precision page.", rerun=True)
    except MixprecError as e:
        st.error(ui.md(e))
