"""The session's policy: the saved project's draft for this model and calibration data
(``core.store.drafts.Draft``) with its undo and redo, autosaved at every edit; and what the autosave did."""
from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from core.errors import MixprecError
from core.project import Project
from core.quant.policy import Policy, policy_from_dict
from core.store import drafts
from ui import saved_project
from ui.session import code, md, workspace


def _policy_key(p: Project) -> str:
    return f"policy:{p.model.sha256}:{p.calib_data.sha256}"


def _draft_file(p: Project) -> Path:
    key = drafts.draft_key(p.model.sha256, p.calib_data.sha256)
    return drafts.draft_path(workspace(), saved_project.project_id(), key)


def current(p: Project) -> drafts.Draft:
    """The project's current draft for ``p``'s model and data: the saved one (read again when its file
    changed, e.g. another tab on the same project edited it), else the default policy."""
    path = _draft_file(p)
    cache = st.session_state.setdefault("drafts", {})
    hit = cache.get(str(path))
    if hit is not None and hit["unsaved"]:
        return hit["draft"]
    stamp = drafts.file_stamp(path)
    if hit is not None and hit["stamp"] == stamp:
        return hit["draft"]
    d = None
    if stamp is not None:
        try:
            d = drafts.load_draft(workspace(), saved_project.project_id(), path.stem)
        except MixprecError as e:
            st.session_state["autosave_note"] = f"The saved draft could not be read, so it starts again: {md(e)}"
    d = d or drafts.Draft(p.default_policy().to_dict())
    cache[str(path)] = {"stamp": stamp, "draft": d, "unsaved": False}
    return d


def _store_draft(p: Project, d: drafts.Draft) -> None:
    path = _draft_file(p)
    saved = saved_project.autosave(lambda: drafts.save_draft(workspace(), saved_project.project_id(), path.stem, d))
    st.session_state.setdefault("drafts", {})[str(path)] = {"stamp": drafts.file_stamp(path) if saved else None,
                                                           "draft": d, "unsaved": not saved}
    if saved:
        saved_project.save(model_name=p.model.name)
    st.session_state["editor_version"] = st.session_state.get("editor_version", 0) + 1


def policy(p: Project) -> Policy:
    """The session's policy: the draft, validated against the model (the defaults if it no longer fits)."""
    d, key = current(p), _policy_key(p)
    tag = json.dumps(d.policy, sort_keys=True)
    if key in st.session_state and st.session_state.get(f"{key}:doc") == tag:
        return st.session_state[key]
    try:
        pol = policy_from_dict(d.policy, p.model, p.layers)
    except MixprecError as e:
        st.session_state["autosave_note"] = f"The saved draft does not fit the model, so it starts again: {md(e)}"
        pol = p.default_policy()
    st.session_state[key], st.session_state[f"{key}:doc"] = pol, tag
    return pol


def set_policy(p: Project, pol: Policy, reset_editor: bool = True, what: str = "policy edit") -> None:
    """Make ``pol`` the session's policy: one undoable step described by ``what`` (plain text),
    autosaved with the project. (``reset_editor`` is kept for callers; the table always redraws.)"""
    _store_draft(p, current(p).edited(pol.to_dict(), what))


def undo(p: Project) -> str | None:
    """Undo the last policy edit; returns what it was (None: nothing to undo)."""
    d = current(p)
    if d.undo_what is not None:
        _store_draft(p, d.undone())
    return d.undo_what


def redo(p: Project) -> str | None:
    d = current(p)
    if d.redo_what is not None:
        _store_draft(p, d.redone())
    return d.redo_what


def autosave_status(p: Project | None = None) -> tuple[str, bool]:
    """(what the autosave did, whether it failed), for a caption or a warning."""
    err = st.session_state.get("autosave_error")
    if err:
        return f"Autosave failed: {err} Your edits are kept in this browser tab only.", True
    text = f"Project {code(saved_project.project_id())}: autosaved in the workspace; reload or share this page's " \
           "URL to come back to it."
    if p is not None:
        d = current(p)
        text += f" {len(d.undo)} edit(s) to undo, {len(d.redo)} to redo."
    return text, False
