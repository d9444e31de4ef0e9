"""Precision page, rebuild: the diff against the last built policy, the run label and backend,
the Rebuild button and this session's builds."""
from __future__ import annotations

import time

import pyarrow as pa
import streamlit as st

from core.backends import BACKENDS
from core.display.precision_edit import policy_diff
from core.errors import MixprecError
from core.jobs import build_params
from core.project import Project
from core.quant.policy import Policy
from core.store.runs import last_built_policy
from ui import job_panel, quality_panel, saved_project, session
from ui.session import md


def section(p: Project, pol: Policy, counts: dict) -> None:
    """``counts``: the policy's layers per precision (``precision_editor.summary``), for the default label."""
    _diff(p, pol)
    r1, r2, r3 = st.columns([3, 1, 1])
    r1.text_input("Run label", placeholder="e.g. layer5 down-proj fp16", key="run_label", persist_state="session")
    r2.selectbox("Backend", BACKENDS, key="backend")
    r3.write("")
    r3.button("Rebuild", type="primary", key="rebuild", on_click=_rebuild,
              args=(saved_project.source(), pol, counts, job_panel.owner_token()))
    job_panel.submit_error()
    if st.session_state.get(QUEUED):
        st.toast(st.session_state.pop(QUEUED))
    mine = st.session_state.get("my_jobs", [])
    if mine:
        st.caption("Your builds (details and results on **Build and results**):")
        job_panel.show(kind="build", only=mine, limit=3)


QUEUED = "rebuild:queued"  # the toast of the build just queued, shown by the run after the click


def _rebuild(src, pol: Policy, counts: dict, owner: str) -> None:
    """Rebuild's ``on_click`` (``job_panel.submit``: the click starts the build even if its run is cut short): the
    policy the page showed, with the label and backend the click's request carries."""
    label = st.session_state.get("run_label") or ""
    backend = st.session_state.get("backend") or BACKENDS[0]
    try:
        params = build_params(src, pol.to_json(), backend, label, metrics=quality_panel.current())
    except MixprecError as e:
        st.session_state[job_panel.SUBMIT_ERROR] = md(e)
        return
    job = job_panel.submit("build", params, label or f"int8={counts['int8']} fp16={counts['fp16']} fp32={counts['fp32']}",
                           owner)
    if job:
        st.session_state[QUEUED] = f"Build queued: {md(job.label)}"


@st.cache_data(show_spinner=False, max_entries=32)
def _last_built(model_sha256: str, calib_sha256: str, runs_stamp: tuple, _p: Project) -> Policy | None:
    """The newest run's policy, read once per model sha256 and change of the runs folder (a run is
    published by renaming its folder in), not at every page run."""
    return last_built_policy(_p)


def _runs_stamp(p: Project) -> tuple:
    try:
        s = p.ws.runs.stat()
    except OSError:
        return ()
    return s.st_mtime_ns, s.st_nlink, int(time.monotonic() // 5)  # the tick bounds staleness within one mtime tick


def _diff(p: Project, pol: Policy) -> None:
    built = _last_built(p.model.sha256, p.calib_data.sha256, _runs_stamp(p), p)
    # kept while both policies are the same, as an Arrow table: converting the pandas frame at every
    # rerun was a large part of a click's time under load (issue 23 fault 10)
    diff = session.memo("rebuild_diff", (p.model.sha256, built.sha256 if built else "", pol.sha256),
                        lambda: pa.Table.from_pandas(policy_diff(built, pol, p.layers), preserve_index=False))
    title = (f"Diff against the last built policy: {diff.num_rows} layer(s) differ" if built
             else "Diff against the last built policy: nothing built yet")
    with st.expander(title, expanded=bool(built) and 0 < diff.num_rows < 30):
        st.dataframe(diff, hide_index=True)
