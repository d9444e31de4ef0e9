"""Export a policy (the session's, or any past run's): the policy JSON, the build scripts, the
compiled ONNX, the calibration cache, the Polygraphy check and a bundle zip; import a policy JSON."""
import streamlit as st

from core.errors import MixprecError
from core.quant.policy import policy_from_text
from ui import draft, export_panel, saved_project, session
from ui.session import md

p = saved_project.project()
session.show_flash()
choice = export_panel.pick(p)
export_panel.summary(p, choice)
version, tf32 = export_panel.options()
scripts = export_panel.downloads(p, choice, version, tf32)
export_panel.commands(p, scripts)

st.subheader("Import a policy")
st.caption("The policy is validated against the loaded model; every mismatch is listed and nothing is applied "
           "unless all of it fits.")
up = st.file_uploader("Policy JSON", type=["json"], key="policy_file")
text = st.text_area("…or paste it", height=140, key="policy_text")
if st.button("Validate and apply", key="import"):
    raw = up.getvalue().decode("utf-8", errors="replace") if up is not None else text
    try:
        draft.set_policy(p, policy_from_text(raw, p.model, p.layers, source=up.name if up else "the pasted policy"))
        export_panel.choose_run(export_panel.SESSION)  # show what was applied
        session.flash("Policy applied: see the Precision page.", rerun=True)
    except MixprecError as e:
        st.error(md(e))
