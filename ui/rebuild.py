"""Precision page, rebuild: the diff against the last built policy, the run label and backend,
the Rebuild button and this session's builds."""
from __future__ import annotations

import time

import streamlit as st

from core.backends import BACKENDS
from core.display.precision_edit import policy_diff
from core.jobs import build_params
from core.project import Project
from core.quant.policy import Policy
from core.store.runs import last_built_policy
from ui import job_panel, saved_project
from ui.session import md


def section(p: Project, pol: Policy, counts: dict) -> None:
    """``counts``: the policy's layers per precision (``precision_editor.summary``), for the default label."""
    _diff(p, pol)
    r1, r2, r3 = st.columns([3, 1, 1])
    label = r1.text_input("Run label", value="", placeholder="e.g. layer5 down-proj fp16", key="run_label")
    backend = r2.selectbox("Backend", BACKENDS, key="backend")
    r3.write("")
    if r3.button("Rebuild", type="primary", key="rebuild"):
        job = job_panel.submit("build", build_params(saved_project.source(), pol.to_json(), backend, label),
                               label or f"int8={counts['int8']} fp16={counts['fp16']} fp32={counts['fp32']}")
        if job:
            st.toast(f"Build queued: {md(job.label)}")
    mine = st.session_state.get("my_jobs", [])
    if mine:
        st.caption("Your builds (details and results on **Build and results**):")
        job_panel.show(kind="build", only=mine, limit=3)


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
    diff = policy_diff(built, pol, p.layers)
    title = (f"Diff against the last built policy: {len(diff)} layer(s) differ" if built
             else "Diff against the last built policy: nothing built yet")
    with st.expander(title, expanded=bool(built) and 0 < len(diff) < 30):
        st.dataframe(diff, hide_index=True)
