"""The session's project: its source (a ``core.project.ProjectSource``: the model, data, input
shapes and deployment target) kept in the URL (``?project=<id>&model=…``) and saved in the workspace
under the project id with a few kept settings (``core.store.drafts``), so a reload or a shared link
restores it; and the project opened from it (cached) for the pages."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import streamlit as st

from core.errors import MixprecError
from core.model import samples as core_samples
from core.project import DEFAULT_TARGET, DEPLOY_TARGETS, Project, ProjectSource
from core.store import drafts
from core.workspace import Workspace
from ui.session import flash, md, workspace

SAMPLES = [f"sample:{name}" for name in core_samples.SAMPLES]
DEFAULT_MODEL = SAMPLES[0]
SOURCE_KEYS = ("model", "data", "eval_data")  # and "shapes" (the input shapes the user set), "target" (sidebar)
# widget values saved with the project: the run label, the search budget and smoothing. They, and the layer
# selection, the ranking and the table's filters, are kept across pages by their widgets (persist_state="session"),
# never written back at every run (keep_settings says why)
KEPT_SETTINGS = ("run_label", "search_budget", "search_smooth")


def _shapes_text(shapes: dict | None) -> str:
    """Input shapes as the URL keeps them (JSON, any input name): ``{"images":[1,3,320,320]}``."""
    return json.dumps({str(k): [int(d) for d in v] for k, v in shapes.items()}, separators=(",", ":"),
                      sort_keys=True) if shapes else ""


def _shapes_from_text(text: str | None) -> dict[str, list[int]] | None:
    """The shapes of :func:`_shapes_text`; None for nothing or for anything that is not such a map."""
    try:
        doc = json.loads(text) if text else None
        return {str(k): [int(d) for d in v] for k, v in doc.items()} if isinstance(doc, dict) and doc else None
    except (ValueError, TypeError, AttributeError):
        return None


def _branches_text(branches: dict | None) -> str:
    """``{"use_cache_branch": False}`` → ``use_cache_branch:0`` (the URL's ``branch`` parameter)."""
    return ",".join(f"{k}:{int(v)}" for k, v in sorted((branches or {}).items()))


def _branches_from_text(text: str | None) -> dict[str, bool] | None:
    out = {}
    for part in (text or "").split(","):
        name, sep, value = part.rpartition(":")
        if sep and name and value in ("0", "1"):
            out[name] = value == "1"
    return out or None


def _keep(src: ProjectSource) -> None:
    """Make ``src`` the session's source (a target that is not a deployment target: none chosen). The
    session holds its JSON (``ProjectSource.to_json``): plain data, as Streamlit's session state keeps best."""
    st.session_state["source"] = replace(src, target=src.target if src.target in DEPLOY_TARGETS else None).to_json()


def source() -> ProjectSource:
    """The session's model/data paths and input shapes: at the first run, the saved project of the
    URL's ``?project=`` (a reload or a shared link; a ``?model=`` naming another model of it opens that model,
    with the data and shapes it had there), else the URL's own parameters; MiniLM at first."""
    if "source" not in st.session_state:
        qp = st.query_params
        src = ProjectSource(qp.get("model") or DEFAULT_MODEL, qp.get("data"), qp.get("eval_data"),
                            _shapes_from_text(qp.get("shapes")), target=qp.get("target"),
                            branches=_branches_from_text(qp.get("branch")),
                            no_batch=[n for n in (qp.get("no_batch") or "").split(",") if n] or None)
        kept = saved()
        if kept is not None:
            named = qp.get("model")
            if named and named != kept.source.model:  # a link names another model of the project: open that one
                st.session_state[PER_MODEL] = {**kept.models, kept.source.model: replace(kept.source, target=None).to_json()}
                back = remembered(named)
                src = replace(back, target=kept.source.target) if back is not None else src
            else:
                src = kept.source
            for k, v in kept.settings.items():
                if k in KEPT_SETTINGS:
                    st.session_state.setdefault(k, v)
        _keep(replace(src, model=src.model or DEFAULT_MODEL))
        if qp.get("job"):  # re-attach to the job this browser tab started before a reload
            st.session_state.setdefault("my_jobs", []).append(qp["job"])
    return ProjectSource.from_json(st.session_state["source"])


def target() -> str:
    """The session's deployment target (sidebar; kept in the URL): ``tensorrt`` unless the user picked another."""
    return source().deploy_target


def set_target(value: str) -> None:
    """Deploy on ``value`` (``core.project.DEPLOY_TARGETS``); keeps the model, data and shapes."""
    set_source(replace(source(), target=value))


PER_MODEL = "per_model_sources"  # session: model -> the ProjectSource JSON it had when the user switched away


def _per_model() -> dict:
    if PER_MODEL not in st.session_state:
        kept = saved()
        st.session_state[PER_MODEL] = dict(kept.models) if kept is not None else {}
    return st.session_state[PER_MODEL]


def remembered(model: str) -> ProjectSource | None:
    """The source ``model`` had in this project when the user last switched away from it (its data, shapes,
    branch, no-batch inputs and profiles), or None."""
    doc = _per_model().get(model)
    try:
        return ProjectSource.from_json(doc) if doc else None
    except (TypeError, ValueError):
        return None


def set_source(src: ProjectSource) -> None:
    """The session's model, data, input shapes and deployment target; kept in the URL and saved with the
    project. Switching models keeps the one left's source in the project (:func:`remembered`), and a model
    picked bare (``ProjectSource(model, target=…)``) comes back with the data and shapes it had."""
    cur = source()
    if src.model != cur.model:
        _per_model()[cur.model] = replace(cur, target=None).to_json()
        back = remembered(src.model)
        if back is not None and src == ProjectSource(src.model, target=src.target):
            src = replace(back, target=src.target)
            kept = [what for what, v in (("its data", back.data or back.eval_data), ("its input shapes", back.shapes
                    or back.dims or back.profiles), ("its no-batch inputs", back.no_batch),
                    ("its branch", back.branches)) if v]
            if kept:
                flash(f"{md(back.model)} is back with {', '.join(kept)} as you left them in this project.")
    _keep(src)
    sync_url()
    save()


def set_shapes(shapes: dict | None, profiles: dict | None = None, no_batch=None) -> None:
    """Keep the model and data, use these input shapes, dynamic-shape profiles and inputs without a batch axis
    (None: back to the defaults)."""
    set_source(replace(source(), shapes=shapes, profiles=profiles, no_batch=no_batch or None))


def set_branch(name: str, widget: str) -> None:
    """A widget's ``on_change``: fix the merged decoder's branch input ``name`` at the value picked in
    ``widget`` (True: the then-branch); the model is loaded again with it (its data and shapes stay)."""
    src, picked = source(), st.session_state.get(widget)
    branches = {k: v for k, v in (src.branches or {}).items() if k != name}
    if picked in (BRANCH_TRUE, BRANCH_FALSE):
        branches[name] = picked == BRANCH_TRUE
    set_source(replace(src, branches=branches or None))


BRANCH_TRUE = "true: the then-branch"
BRANCH_FALSE = "false: the else-branch"
BRANCH_OPEN = "not fixed (the If stays, FP32)"


def set_data(data: str | None, eval_data: str | None) -> None:
    """Keep the model and shapes, use this calibration and evaluation data (None: the default data)."""
    set_source(replace(source(), data=data, eval_data=eval_data))


def load_typed_path(widget: str) -> None:
    """A button's ``on_click``: load the model whose server path is typed in the text input ``widget`` (a new
    model keeps only the deployment target); nothing if it is empty or already loaded. As a callback it runs
    at the start of the run that carries the click, so the click is kept even if that run is interrupted."""
    typed = (st.session_state.get(widget) or "").strip()
    if typed and typed != source().model:
        set_source(ProjectSource(typed, target=source().target))


DATA_ERROR = "data_path_error"  # why the last typed data paths were refused, for the next drawing


def load_typed_data(calib_widget: str, eval_widget: str) -> None:
    """A button's ``on_click``: use the calibration / evaluation ``.npz`` whose server paths are typed in the
    text inputs (an empty one keeps what is used now). The project is opened with them first: a file that does
    not fit the model is refused (``DATA_ERROR``, shown at the next drawing) and nothing changes."""
    calib = (st.session_state.get(calib_widget) or "").strip() or None
    evald = (st.session_state.get(eval_widget) or "").strip() or None
    if not calib and not evald:
        return
    src = source()
    new = replace(src, data=calib or src.data, eval_data=evald or src.eval_data)
    try:
        open_source(new)
    except MixprecError as e:
        st.session_state[DATA_ERROR] = md(e)
        return
    st.session_state.pop(DATA_ERROR, None)
    set_source(new)
    flash("Data: " + ", ".join(f"{what} {md(path)}" for what, path in (("calibration", calib), ("evaluation", evald))
                               if path) + ". Jobs started from now on use it.")


def project_id() -> str:
    """The id of the session's saved project: the URL's ``?project=`` if well-formed, else a new one."""
    if "project_id" not in st.session_state:
        st.session_state["project_id"] = (drafts.check_project_id(st.query_params.get("project"))
                                          or drafts.new_project_id())
    return st.session_state["project_id"]


def saved() -> drafts.SavedProject | None:
    """The project as saved when this session started or last saved it (None before its first
    save). A damaged file is said once (``autosave_note``) and replaced at the next save."""
    if "saved_project" not in st.session_state:
        try:
            st.session_state["saved_project"] = drafts.load_project(workspace(), project_id())
        except MixprecError as e:
            st.session_state["saved_project"] = None
            st.session_state["autosave_note"] = f"The saved project could not be read, so it starts again: {md(e)}"
    return st.session_state["saved_project"]


def autosave(write) -> bool:
    """Run a save; a write error (full disk, permissions) is kept for the page to show, never raised."""
    try:
        write()
    except (MixprecError, OSError) as e:
        st.session_state["autosave_error"] = md(e)
        return False
    st.session_state.pop("autosave_error", None)
    return True


def save(**changes) -> None:
    """Save the session's source with the project (and ``changes``: ``model_name``, ``settings``);
    nothing is written when nothing changed, and only what this session changed is written over what
    another tab on the project saved (``core.store.drafts.merge_save_project``)."""
    old = saved() or drafts.SavedProject(project_id(), source())
    new = replace(old, **changes, source=source(), models=dict(_per_model()))
    if new.source.model != old.source.model and "model_name" not in changes:
        new = replace(new, model_name="")  # the name of the model before: known again once it opens
    same = {k: v for k, v in old.to_json().items() if k not in ("created", "updated")} == \
        {k: v for k, v in new.to_json().items() if k not in ("created", "updated")}
    if saved() is not None and same:
        return
    # merged over the stored project: what another tab saved meanwhile (its settings, its models) stays; the
    # session keeps its own view (``saved``: what it changed is compared against it at the next save)
    if autosave(lambda: drafts.merge_save_project(workspace(), saved(), new)):
        st.session_state["saved_project"] = new


def _url_params() -> dict[str, str]:
    src = source()
    out = {"model": src.model, "data": src.data, "eval_data": src.eval_data, "shapes": _shapes_text(src.shapes),
           "target": src.target, "branch": _branches_text(src.branches),
           "no_batch": ",".join(src.no_batch) if src.no_batch else None, "project": project_id()}
    return {k: str(v) for k, v in out.items() if v}


def sync_url() -> None:
    """Keep the project id and the source in the URL (``?project=…&model=…``), which switching
    pages drops: a reload or a copied link then finds them. ``?job=`` is left as it is."""
    want, qp = _url_params(), st.query_params
    for k in (*SOURCE_KEYS, "shapes", "target", "branch", "no_batch", "project"):
        if k in want and qp.get(k) != want[k]:
            qp[k] = want[k]
        elif k not in want and k in qp:
            del qp[k]


def keep_settings() -> None:
    """At the start of every run: the KEPT_SETTINGS widget values are saved with the project when changed.
    Only read: their widgets keep them across pages (``persist_state="session"``). A widget key written at every
    run (``st.session_state[k] = st.session_state[k]``, how it was done) makes every run send that value to
    the browser, and a request the browser sent before such an answer arrived carries the older value back."""
    now = {k: st.session_state[k] for k in KEPT_SETTINGS if k in st.session_state}
    kept = saved()
    old = dict(kept.settings) if kept is not None else {}
    if now and {**old, **now} != old:
        save(settings={**old, **now})


def new_project() -> None:
    """Leave this project (it stays saved under its id) for a new one with the default model (the
    deployment target stays)."""
    target = source().target
    for k in ("saved_project", "drafts", "autosave_error", "autosave_note", *KEPT_SETTINGS):
        st.session_state.pop(k, None)
    st.session_state["project_id"] = drafts.new_project_id()
    _keep(ProjectSource(DEFAULT_MODEL, target=target))
    sync_url()


@st.cache_resource(show_spinner="Opening the model (the first MiniLM load exports it: ~20 s)…", max_entries=8)
def _open(source_json: str, ws_root: str) -> Project:
    return ProjectSource.from_json(json.loads(source_json)).open(Workspace(Path(ws_root)))


def open_source(src: ProjectSource) -> Project:
    """The (cached) project of ``src``, for its deployment target (opened once for every target)."""
    key = json.dumps(replace(src, target=None).to_json(), sort_keys=True)
    p = _open(key, str(workspace().root))
    t = src.target if src.target in DEPLOY_TARGETS else DEFAULT_TARGET
    return p if p.target == t else replace(p, target=t)


def project() -> Project:
    """The session's project, or an error with the way out (and the page stops). Its model's
    display name is saved with the project."""
    try:
        p = open_source(source())
    except MixprecError as e:
        st.error(md(e))
        st.info("Pick another model or data on the **Model** page.")
        st.stop()
    save(model_name=p.model.name)
    return p
