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
files_for = export_panel.project_for(p, choice)  # a run's own shapes when it was built at others
export_panel.summary(files_for, choice)
export_panel.estimate(files_for, choice)
version, tf32 = export_panel.options()
scripts = export_panel.downloads(files_for, choice, version, tf32)
export_panel.commands(files_for, scripts)

st.subheader("Import a policy")
st.caption("The policy is validated against the loaded model; every mismatch is listed and nothing is applied "
           "unless all of it fits.")
st.file_uploader("Policy JSON", type=["json"], key="policy_file")
st.text_area("…or paste it", height=140, key="policy_text")


def _import(project) -> None:
    """The button's ``on_click`` (at the start of the run that carries the click: a newer request cannot lose it)."""
    up, text = st.session_state.get("policy_file"), st.session_state.get("policy_text") or ""
    raw = up.getvalue().decode("utf-8", errors="replace") if up is not None else text
    try:
        pol = policy_from_text(raw, project.model, project.layers, source=up.name if up else "the pasted policy")
    except MixprecError as e:
        st.session_state["import_error"] = md(e)
        return
    draft.set_policy(project, pol)
    export_panel.choose_run(export_panel.SESSION)  # show what was applied
    session.flash("Policy applied: see the Precision page.")


st.button("Validate and apply", key="import", on_click=_import, args=(p,))
if st.session_state.get("import_error"):
    st.error(st.session_state.pop("import_error"))
