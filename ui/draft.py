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


def _entry(p: Project) -> dict:
    """The session's view of the draft (``current``): ``draft`` (what it shows), ``base`` (the stored draft
    it last read or wrote, with its version: what its next edit is compared and swapped against),
    ``stamp`` (of the file when read) and ``unsaved`` (edits the autosave could not write yet)."""
    path = _draft_file(p)
    cache = st.session_state.setdefault("drafts", {})
    hit = cache.get(str(path))
    if hit is not None and (hit["unsaved"] or hit["stamp"] == drafts.file_stamp(path)):
        return hit
    stamp = drafts.file_stamp(path)
    d = None
    if stamp is not None:
        try:
            d = drafts.load_draft(workspace(), saved_project.project_id(), path.stem)
        except MixprecError as e:
            st.session_state["autosave_note"] = f"The saved draft could not be read, so it starts again: {md(e)}"
    d = d or drafts.Draft(p.default_policy().to_dict())
    cache[str(path)] = {"stamp": stamp, "draft": d, "base": d, "unsaved": False}
    return cache[str(path)]


def current(p: Project) -> drafts.Draft:
    """The project's current draft for ``p``'s model and data: the saved one (read again when its file
    changed, e.g. another tab on the same project edited it), else the default policy."""
    return _entry(p)["draft"]


def _seen(p: Project) -> dict:
    """The view the session's last read made (the draft its pages and this edit were drawn from), not read
    again: an edit is this session's change of what it saw, whatever was written since (commit_draft merges)."""
    hit = st.session_state.get("drafts", {}).get(str(_draft_file(p)))
    return hit if hit is not None else _entry(p)


CONFLICT = "draft_conflict"  # what the last edit could not apply (another tab changed the same layers), for the page
MERGED = "draft_merged"  # another tab's changes the last edit was merged with


def _names(names, n: int = 6) -> str:
    names = list(names)
    return ", ".join(code(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _store_draft(p: Project, new: drafts.Draft, what: str, seen: dict | None = None) -> drafts.DraftWrite | None:
    """Autosave ``new`` (this session's draft after an edit of ``seen``, its view) as a compare-and-swap
    (``core.store.drafts.commit_draft``): another tab's edits since are merged, never overwritten; what both
    changed differently keeps the other's value and is said (the sidebar and the Precision page)."""
    path = _draft_file(p)
    seen = seen if seen is not None else _seen(p)
    done = []
    saved = saved_project.autosave(lambda: done.append(
        drafts.commit_draft(workspace(), saved_project.project_id(), path.stem, seen["base"], new, what)))
    cache = st.session_state.setdefault("drafts", {})
    if saved:
        w = done[0]
        cache[str(path)] = {"stamp": w.stamp, "draft": w.draft, "base": w.draft, "unsaved": False}
        st.session_state.pop(CONFLICT, None)
        st.session_state.pop(MERGED, None)
        if w.merged:
            st.session_state[MERGED] = f"Merged with another tab's edits of {_names(w.merged)}."
        if w.conflicts:
            st.session_state[CONFLICT] = (  # shown by autosave_status (the sidebar, the Precision page)
                f"Another tab on this project changed {_names(w.conflicts)} meanwhile, so your change of "
                f"{'it' if len(w.conflicts) == 1 else 'them'} ({md(what)}) was not applied: the other tab's "
                "value is kept. Make the change again to overwrite it.")
        saved_project.save(model_name=p.model.name)
    else:
        cache[str(path)] = {**seen, "stamp": None, "draft": new, "unsaved": True}
        w = None
    st.session_state["editor_version"] = st.session_state.get("editor_version", 0) + 1
    return w


def policy(p: Project) -> Policy:
    """The session's policy: the draft, validated against the model (the defaults if it no longer fits)."""
    d, key = current(p), _policy_key(p)
    # validated once per draft document: the same Draft object (drafts are frozen and replaced at each edit or
    # read), else the same document (a JSON dump is a large part of a page run under load: issue 23 fault 10)
    if key in st.session_state and st.session_state.get(f"{key}:draft") is d:
        return st.session_state[key]
    tag = json.dumps(d.policy, sort_keys=True)
    if key in st.session_state and st.session_state.get(f"{key}:doc") == tag:
        st.session_state[f"{key}:draft"] = d
        return st.session_state[key]
    try:
        pol = policy_from_dict(d.policy, p.model, p.layers)
    except MixprecError as e:
        st.session_state["autosave_note"] = f"The saved draft does not fit the model, so it starts again: {md(e)}"
        pol = p.default_policy()
    st.session_state[key], st.session_state[f"{key}:doc"], st.session_state[f"{key}:draft"] = pol, tag, d
    return pol


def set_policy(p: Project, pol: Policy, reset_editor: bool = True, what: str = "policy edit"
               ) -> drafts.DraftWrite | None:
    """Make ``pol`` the session's policy: one undoable step described by ``what`` (plain text),
    autosaved with the project; another tab's edits since this session read the draft are kept (see
    ``_store_draft``). Returns what the save did (None: it failed, the edit is kept in this tab). (``reset_editor``
    is kept for callers; the table always redraws.)"""
    seen = _seen(p)
    return _store_draft(p, seen["draft"].edited(pol.to_dict(), what), what, seen)


def _step(p: Project, undo: bool) -> str | None:
    """Undo (or redo) the last edit of the project's draft as stored now (the history two tabs share), under
    its lock; returns what it was (None: nothing to undo). With edits the autosave could not write yet, this
    session's own draft is stepped and saved as an edit."""
    seen = _seen(p)
    if seen["unsaved"]:
        d = seen["draft"]
        what = d.undo_what if undo else d.redo_what
        if what is not None:
            _store_draft(p, d.undone() if undo else d.redone(), f"{'undo' if undo else 'redo'} of {what}", seen)
        return what
    path, default = _draft_file(p), drafts.Draft(p.default_policy().to_dict())

    def change(stored):
        d = stored if stored is not None else default
        out = d.undone() if undo else d.redone()
        return None if out is d else out  # nothing to undo (redo): nothing is written

    done = []
    if not saved_project.autosave(lambda: done.append(
            drafts.update_draft(workspace(), saved_project.project_id(), path.stem, change))):
        return None
    before, after, stamp = done[0]
    before = before if before is not None else default
    what = before.undo_what if undo else before.redo_what
    after = after if after is not None else default
    st.session_state.setdefault("drafts", {})[str(path)] = {"stamp": stamp, "draft": after, "base": after,
                                                           "unsaved": False}
    st.session_state.pop(CONFLICT, None)
    if what is not None:
        saved_project.save(model_name=p.model.name)
        st.session_state["editor_version"] = st.session_state.get("editor_version", 0) + 1
    return what


def undo(p: Project) -> str | None:
    """Undo the last policy edit; returns what it was (None: nothing to undo)."""
    return _step(p, undo=True)


def redo(p: Project) -> str | None:
    return _step(p, undo=False)


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
    if st.session_state.get(CONFLICT):
        return f"{text} {st.session_state[CONFLICT]}", True
    if st.session_state.get(MERGED):
        text += f" {st.session_state[MERGED]}"
    return text, False
