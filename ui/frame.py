"""The frame around every page (``app.py``): the page list's entries, the state every run keeps
(the saved project in the URL, kept settings), the sidebar (model, project, jobs, backend) and
each page's title and caption. Pages then hold only their own content."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from core.measure.runs import latency_caveat
from core.model.load import shown_path
from core.project import DEPLOY_TARGETS, TARGET_LABELS
from ui import cluster, draft, job_panel, saved_project, session
from ui.session import code, md


@dataclass(frozen=True)
class PageInfo:
    """One entry of the page list: ``script`` (relative to app.py; None for a callable page),
    its ``url_path`` (``/Precision``), the navigation ``title`` and ``icon``, what the page is for
    (``summary``, on the home page) and the ``caption`` under its ``heading`` (the title unless given)."""
    script: str | None
    url_path: str
    title: str
    icon: str
    summary: str = ""
    caption: str = ""
    heading: str | None = None

    def page(self, target=None, default: bool = False) -> st.Page:
        return st.Page(target or self.script, title=self.title, icon=self.icon, url_path=self.url_path,
                       default=default)


def _pick_target() -> None:
    saved_project.set_target(st.session_state["target_pick"])


def keep_state() -> None:
    """Before any page draws: restore the saved project (first run of a session), keep the
    settings widgets hold across pages, and keep the project id and source in the URL."""
    saved_project.source()
    saved_project.keep_settings()
    saved_project.sync_url()


def _new_project() -> None:
    saved_project.new_project()


def sidebar() -> None:
    src = saved_project.source()
    with st.sidebar:
        saved = saved_project.saved()
        name = saved.model_name if saved is not None and saved.source.model == src.model and saved.model_name else None
        st.markdown(f"**Model:** {code(shown_path(name or src.model))}")  # (a link's ?model= is any text: cut short)
        if name and name != src.model:
            st.caption(f"from {code(shown_path(src.model))}")
        target = saved_project.target()
        st.selectbox("Deployment target", DEPLOY_TARGETS, index=DEPLOY_TARGETS.index(target), key="target_pick",
                     format_func=TARGET_LABELS.get, on_change=_pick_target,
                     help="Where the model will run. It labels every latency number and sets what the search "
                          "optimises.")
        st.markdown(f"**Target:** {TARGET_LABELS[target]}")
        caveat = latency_caveat(target, session.auto_backend_name())
        if caveat:
            st.caption(caveat)
        if src.shapes:
            st.caption("Input shapes: " + ", ".join(f"{md(n)}={'x'.join(map(str, dims))}"
                                                    for n, dims in src.shapes.items()))
        text, failed = draft.autosave_status()
        (st.warning if failed else st.caption)(text)
        if st.session_state.get("autosave_note"):
            st.warning(st.session_state.pop("autosave_note"))
        st.button("New project", key="new_project", on_click=_new_project,
                  help="Start again from the default model and policy. This project stays saved: its URL brings it "
                       "back.")
        cluster.sidebar_fields()
        active = [j for j in job_panel.jobs(limit=50) if j.active]
        st.caption(f"{len(active)} job(s) queued or running" if active else "No job running")
        st.caption(f"Workspace: {code(session.workspace().root)}")
        st.caption(f"Backend (auto): {session.auto_backend()}")


def current(infos: list[PageInfo], page: st.Page) -> PageInfo:
    """The entry of the page ``st.navigation`` chose."""
    return next(i for i in infos if i.title == page.title)


def heading(info: PageInfo) -> None:
    st.title(info.heading or info.title)
    if info.caption:
        st.caption(info.caption)
