"""Session glue shared by the pages: workspace, job manager, the cached project, the session's
policy, stored results and the job panel. No logic beyond wiring Streamlit state to core."""
from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import replace
from pathlib import Path

import streamlit as st

from core.store import drafts

from core.backends import select_backend
from core.errors import MixprecError
from core.jobs import Job, JobManager, can_cancel
from core.measure.runs import speedup_text
from core.model import samples as core_samples
from core.project import DEFAULT_TARGET, DEPLOY_TARGETS, Project, ProjectSource
from core.quant.policy import Policy, policy_from_dict
from core.store import results as store
from core.workspace import Workspace

SAMPLES = [f"sample:{name}" for name in core_samples.SAMPLES]
DEFAULT_MODEL = SAMPLES[0]
SOURCE_KEYS = ("model", "data", "eval_data")  # and "shapes" (the input shapes the user set), "target" (sidebar)
# widget values kept across pages and saved with the project (a page's widgets forget their value
# when another page runs): the run label, the search budget and smoothing
KEPT_SETTINGS = ("run_label", "search_budget", "search_smooth")
# kept across pages for the session only: the layer selection, the ranking and the table's filters
SESSION_KEPT = ("sel_layers", "rank_choice", "view_ops", "view_name", "view_prec", "pick_chart")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+!|~$:&^=])")


def md(text) -> str:
    """User text (a model, layer or run name, a label, a regex) made literal inside Markdown:
    every character Markdown, math, emoji or colour directives would read is escaped."""
    return _MARKDOWN.sub(r"\\\1", str(text))


def code(text) -> str:
    """User text as inline Markdown code (a path, a queue, a hash): literal, whatever it holds."""
    text = str(text)
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def workspace() -> Workspace:
    return Workspace.default()


def manager() -> JobManager:
    return JobManager.for_workspace(workspace())


@st.cache_resource(show_spinner=False)
def auto_backend() -> str:
    """Which backend `auto` picks here, and why (TensorRT needs the package and a CUDA device)."""
    return select_backend("auto")[1]


def auto_backend_name() -> str:
    """The name of the backend `auto` picks here (``onnxruntime`` or ``tensorrt``)."""
    return auto_backend().split(":", 1)[0]


_DELTA = {"up": "green", "down": "red", "off": "gray"}


def speedup_metric(where, label: str, value: str, speedup, help: str | None = None) -> None:
    """An ``st.metric`` whose delta is the speedup against FP32 in words: green with an up arrow
    when faster, red with a down arrow and "slower than FP32" when slower (``core.measure.runs.speedup_text``)."""
    text, direction = speedup_text(speedup)
    where.metric(label, value, text, delta_color=_DELTA[direction], delta_arrow=direction, help=help)


# --- the model and data of this session -------------------------------------------------------
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


def _keep(src: ProjectSource) -> None:
    """Make ``src`` the session's source (a target that is not a deployment target: none chosen). The
    session holds its JSON (``ProjectSource.to_json``): plain data, as Streamlit's session state keeps best."""
    st.session_state["source"] = replace(src, target=src.target if src.target in DEPLOY_TARGETS else None).to_json()


def source() -> ProjectSource:
    """The session's model/data paths and input shapes: at the first run, the saved project of the
    URL's ``?project=`` (a reload or a shared link), else the URL's own parameters; MiniLM at first."""
    if "source" not in st.session_state:
        qp = st.query_params
        src = ProjectSource(qp.get("model") or DEFAULT_MODEL, qp.get("data"), qp.get("eval_data"),
                            _shapes_from_text(qp.get("shapes")), target=qp.get("target"))
        saved = saved_project()
        if saved is not None:
            src = saved.source
            for k, v in saved.settings.items():
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


def set_source(src: ProjectSource) -> None:
    """The session's model, data, input shapes and deployment target (a new model: ``ProjectSource(model,
    target=source().target)``, its default shapes and data); kept in the URL and saved with the project."""
    _keep(src)
    sync_url()
    save_project()


def set_shapes(shapes: dict | None) -> None:
    """Keep the model and data, use these input shapes (None: back to the defaults)."""
    set_source(replace(source(), shapes=shapes))


# --- the saved project: id in the URL, source and kept settings in the workspace (core.store.drafts) ---
def project_id() -> str:
    """The id of the session's saved project: the URL's ``?project=`` if well-formed, else a new one."""
    if "project_id" not in st.session_state:
        st.session_state["project_id"] = (drafts.check_project_id(st.query_params.get("project"))
                                          or drafts.new_project_id())
    return st.session_state["project_id"]


def saved_project() -> drafts.SavedProject | None:
    """The project as saved when this session started or last saved it (None before its first
    save). A damaged file is said once (``autosave_note``) and replaced at the next save."""
    if "saved_project" not in st.session_state:
        try:
            st.session_state["saved_project"] = drafts.load_project(workspace(), project_id())
        except MixprecError as e:
            st.session_state["saved_project"] = None
            st.session_state["autosave_note"] = f"The saved project could not be read, so it starts again: {md(e)}"
    return st.session_state["saved_project"]


def _autosave(write) -> bool:
    """Run a save; a write error (full disk, permissions) is kept for the page to show, never raised."""
    try:
        write()
    except (MixprecError, OSError) as e:
        st.session_state["autosave_error"] = md(e)
        return False
    st.session_state.pop("autosave_error", None)
    return True


def save_project(**changes) -> None:
    """Save the session's source with the project (and ``changes``: ``model_name``, ``settings``);
    nothing is written when nothing changed."""
    old = saved_project() or drafts.SavedProject(project_id(), source())
    new = replace(old, **changes, source=source())
    if new.source.model != old.source.model and "model_name" not in changes:
        new = replace(new, model_name="")  # the name of the model before: known again once it opens
    same = {k: v for k, v in old.to_json().items() if k not in ("created", "updated")} == \
        {k: v for k, v in new.to_json().items() if k not in ("created", "updated")}
    if saved_project() is not None and same:
        return
    if _autosave(lambda: drafts.save_project(workspace(), new)):
        st.session_state["saved_project"] = new


def _url_params() -> dict[str, str]:
    src = source()
    out = {"model": src.model, "data": src.data, "eval_data": src.eval_data, "shapes": _shapes_text(src.shapes),
           "target": src.target, "project": project_id()}
    return {k: str(v) for k, v in out.items() if v}


def sync_url() -> None:
    """Keep the project id and the source in the URL (``?project=…&model=…``), which switching
    pages drops: a reload or a copied link then finds them. ``?job=`` is left as it is."""
    want, qp = _url_params(), st.query_params
    for k in (*SOURCE_KEYS, "shapes", "target", "project"):
        if k in want and qp.get(k) != want[k]:
            qp[k] = want[k]
        elif k not in want and k in qp:
            del qp[k]


def keep_settings() -> None:
    """At the start of every run: the KEPT_SETTINGS widget values outlive the pages that do not
    draw them (re-assigned, Streamlit keeps them), and are saved with the project when changed."""
    for k in SESSION_KEPT:
        if k in st.session_state:
            st.session_state[k] = st.session_state[k]
    now = {}
    for k in KEPT_SETTINGS:
        if k in st.session_state:
            st.session_state[k] = st.session_state[k]
            now[k] = st.session_state[k]
    saved = saved_project()
    old = dict(saved.settings) if saved is not None else {}
    if now and {**old, **now} != old:
        save_project(settings={**old, **now})


def new_project() -> None:
    """Leave this project (it stays saved under its id) for a new one with the default model (the
    deployment target stays)."""
    target = source().target
    for k in ("saved_project", "drafts", "autosave_error", "autosave_note", *KEPT_SETTINGS):
        st.session_state.pop(k, None)
    st.session_state["project_id"] = drafts.new_project_id()
    _keep(ProjectSource(DEFAULT_MODEL, target=target))
    sync_url()


def autosave_status(p: Project | None = None) -> tuple[str, bool]:
    """(what the autosave did, whether it failed), for a caption or a warning."""
    err = st.session_state.get("autosave_error")
    if err:
        return f"Autosave failed: {err} Your edits are kept in this browser tab only.", True
    text = f"Project {code(project_id())}: autosaved in the workspace; reload or share this page's URL to " \
           "come back to it."
    if p is not None:
        d = draft(p)
        text += f" {len(d.undo)} edit(s) to undo, {len(d.redo)} to redo."
    return text, False


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
    save_project(model_name=p.model.name)
    return p


def upload(file, kind: str, model=None) -> str | None:
    """Store an uploaded model or .npz in the workspace after validating it; None (with an
    error shown) if it is bad."""
    if file is None:
        return None
    try:
        return str(store.store_upload(workspace(), file.getvalue(), file.name, kind, model))
    except MixprecError as e:
        st.error(md(e))
        return None


# --- stored results (records from core.store.results; a document of another format is shown as an error) ---
def _stored(load, *args):
    try:
        return load(*args)
    except MixprecError as e:
        st.error(md(e))
        return None


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file, or None if it is missing: results are written atomically (rename),
    so a new document always has a new stamp."""
    try:
        st_ = path.stat()
    except OSError:
        return None
    return st_.st_mtime_ns, st_.st_size


@st.cache_data(show_spinner=False, max_entries=64)
def _load_cached(kind: str, path: str, stamp, model_sha256: str, calib_sha256: str, _p: Project, *args):
    """A stored result read once per file version (``stamp``) and model/data sha256, not per page run."""
    load = {"ranking": store.load_ranking, "sensitivity": store.load_sensitivity, "search": store.load_search}[kind]
    return load(_p.ws, _p, *args)


def _stored_file(kind: str, path: Path, p: Project, *args):
    stamp = _stamp(path)
    if stamp is None:
        return None
    return _stored(_load_cached, kind, str(path), stamp, p.model.sha256, p.calib_data.sha256, p, *args)


def ranking(p: Project, method: str = "minmax"):
    """The stored cumulative ``Ranking`` of this model, data and method, or None."""
    return _stored_file("ranking", store.ranking_path(p.ws, store.project_ranking_key(p, method)), p, method)


def sensitivity(p: Project, method: str = "minmax", mode: str = "isolated"):
    """The stored isolated / leave-one-out ``Sensitivity``, or None."""
    path = store.ranking_path(p.ws, store.project_ranking_key(p, method, mode))
    return _stored_file("sensitivity", path, p, method, mode)


def search_result(p: Project, budget: str, smooth: bool, gpu=None):
    """The stored ``SearchResult`` of this budget, smoothing and (TensorRT target) GPU of the estimate
    (a ``GPU``), or None."""
    return _stored_file("search", store.stored_search_path(p.ws, p, budget, smooth, gpu), p, budget, smooth, gpu)


# --- the session's policy: the project's draft of this model and data, with undo/redo ----------
def _policy_key(p: Project) -> str:
    return f"policy:{p.model.sha256}:{p.calib_data.sha256}"


def _draft_file(p: Project) -> Path:
    return drafts.draft_path(workspace(), project_id(), drafts.draft_key(p.model.sha256, p.calib_data.sha256))


def draft(p: Project) -> drafts.Draft:
    """The project's draft for ``p``'s model and data: the saved one (read again when its file
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
            d = drafts.load_draft(workspace(), project_id(), path.stem)
        except MixprecError as e:
            st.session_state["autosave_note"] = f"The saved draft could not be read, so it starts again: {md(e)}"
    d = d or drafts.Draft(p.default_policy().to_dict())
    cache[str(path)] = {"stamp": stamp, "draft": d, "unsaved": False}
    return d


def _store_draft(p: Project, d: drafts.Draft) -> None:
    path = _draft_file(p)
    saved = _autosave(lambda: drafts.save_draft(workspace(), project_id(), path.stem, d))
    st.session_state.setdefault("drafts", {})[str(path)] = {"stamp": drafts.file_stamp(path) if saved else None,
                                                           "draft": d, "unsaved": not saved}
    if saved:
        save_project(model_name=p.model.name)
    st.session_state["editor_version"] = st.session_state.get("editor_version", 0) + 1


def policy(p: Project) -> Policy:
    """The session's policy: the draft, validated against the model (the defaults if it no longer fits)."""
    d, key = draft(p), _policy_key(p)
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
    _store_draft(p, draft(p).edited(pol.to_dict(), what))


def undo(p: Project) -> str | None:
    """Undo the last policy edit; returns what it was (None: nothing to undo)."""
    d = draft(p)
    if d.undo_what is not None:
        _store_draft(p, d.undone())
    return d.undo_what


def redo(p: Project) -> str | None:
    d = draft(p)
    if d.redo_what is not None:
        _store_draft(p, d.redone())
    return d.redo_what


def confirmed(key: str, label: str, question: str, confirm_label: str, box=None, **button) -> bool:
    """A destructive action's button: pressing ``label`` asks ``question`` (Markdown, user text
    escaped by the caller) with ``confirm_label`` (key ``<key>_confirm``) and Cancel
    (``<key>_cancel``), in ``box`` (a container; here if None); True in the run where the user confirms."""
    flag = f"confirm:{key}"
    if st.button(label, key=key, **button):
        st.session_state[flag] = True
    if not st.session_state.get(flag):
        return False
    with (box if box is not None else st.container()).container(border=True):
        st.warning(question)
        c1, c2, _ = st.columns([1, 1, 3])
        yes = c1.button(confirm_label, key=f"{key}_confirm", type="primary")
        no = c2.button("Cancel", key=f"{key}_cancel")
    if yes or no:
        st.session_state.pop(flag, None)
    if no:
        st.rerun()
    return yes


def flash(message: str, rerun: bool = False) -> None:
    """A success message shown once, at the next run of the page (``show_flash``). User text in
    ``message`` goes through ``md``."""
    st.session_state["flash"] = message
    if rerun:
        st.rerun()


def show_flash() -> None:
    if "flash" in st.session_state:
        st.success(st.session_state.pop("flash"))


# --- jobs --------------------------------------------------------------------------------------
def owner_token() -> str:
    """This browser session's token: the jobs it submits are its own, and only it may cancel them
    (``core.jobs``; a reload is a new session, so ``?job=`` re-attaches read-only)."""
    if "owner_token" not in st.session_state:
        st.session_state["owner_token"] = secrets.token_hex(16)
    return st.session_state["owner_token"]


def submit(kind: str, params: dict, label: str) -> Job | None:
    try:
        job = manager().submit(kind, params, label=label, owner=owner_token())
    except MixprecError as e:
        st.error(md(e))
        return None
    st.session_state.setdefault("my_jobs", []).append(job.id)
    st.query_params["job"] = job.id
    return job


WHERE_PARAMS = ("ray", "max_memory")  # where and in how much memory a job runs, not what it computes


def job_button(kind: str, params: dict, label: str, button: str, key: str, stored: bool, missing: str) -> None:
    """The job behind a stored result: its live row while it runs; else, if the result is not
    ``stored`` yet, ``missing``, the last failure and a button that starts it."""
    same = {k: v for k, v in params.items() if k not in WHERE_PARAMS}  # a result is the same wherever it ran
    mine = [j for j in jobs(kind=kind) if all(j.params.get(k) == v for k, v in same.items())]
    if any(j.active for j in mine):
        job_panel(kind=kind, only=[j.id for j in mine], limit=1)
    elif not stored:
        st.info(missing)
        if mine and mine[0].status != "done":
            st.error(f"The last run {mine[0].status}: {md(mine[0].error)}")
        if st.button(button, type="primary", key=key):
            submit(kind, params, label)
            st.rerun()


def job_row(job: Job) -> None:
    mgr = manager()
    left, mid, right = st.columns([3, 4, 1])
    left.markdown(f"**{md(job.label)}**  \n{job.kind} · {code(job.queue)} · **{job.status}**")
    text = f"{job.stage} · {job.elapsed:.0f} s"
    if job.status == "queued":
        pos = mgr.queue_position(job.id)
        text = f"queued{f' (#{pos + 1} in {job.queue})' if pos is not None else ''} · waiting {job.elapsed:.0f} s"
    mid.progress(min(max(job.progress, 0.0), 1.0), text=text)
    if job.active:
        _cancel_button(right, job)
    if job.error and job.status in ("failed", "interrupted"):
        st.error(f"{md(job.label)}: {md(job.error)}")


def _ask_cancel(job_id: str, ask: bool) -> None:
    st.session_state[f"confirm:cancel-{job_id}"] = ask


def _cancel(job_id: str) -> None:
    st.session_state.pop(f"confirm:cancel-{job_id}", None)
    try:
        manager().cancel(job_id, owner_token())
    except MixprecError as e:
        st.session_state["cancel_error"] = md(e)


def _cancel_button(where, job: Job) -> None:
    """Cancel, for this session's own jobs (any job with MIXPREC_ADMIN=1), after a second click."""
    if not can_cancel(job, owner_token()):
        where.button("Cancel", key=f"cancel-{job.id}", disabled=True,
                     help="Another session's job: only the session that started it can cancel it (or anyone, when "
                          "the server runs with MIXPREC_ADMIN=1).")
    elif st.session_state.get(f"confirm:cancel-{job.id}"):
        where.button("Stop it", key=f"cancel-{job.id}-confirm", type="primary", on_click=_cancel, args=(job.id,),
                     help="The job's work so far is lost.")
        where.button("Keep", key=f"cancel-{job.id}-keep", on_click=_ask_cancel, args=(job.id, False))
    else:
        where.button("Cancel", key=f"cancel-{job.id}", on_click=_ask_cancel, args=(job.id, True),
                     help="Stop this job (asks first)")
    if st.session_state.get("cancel_error"):
        st.error(st.session_state.pop("cancel_error"))


JOBS_REREAD_SECONDS = 3.0


def _dir_stamp(folder: Path) -> int:
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return 0


@st.cache_data(show_spinner=False, max_entries=16)
def _job_list(root: str, stamp: int, tick: int) -> list[Job]:
    return manager().jobs()


def jobs(kind: str | None = None, limit: int | None = None) -> list[Job]:
    """The job records, newest first, read once per change of the jobs folder (every record write
    is an atomic rename, which changes the folder's mtime) instead of once per page run and poll:
    eight polling sessions read them once a change, not eight times a second."""
    mgr = manager()
    tick = int(time.monotonic() // JOBS_REREAD_SECONDS)  # bounds staleness if two writes share an mtime tick
    out = [j for j in _job_list(str(mgr.dir), _dir_stamp(mgr.dir), tick) if kind is None or j.kind == kind]
    return out[:limit] if limit else out


ACTIVE_POLL_SECONDS = 1.0  # a job list with a queued/running job
IDLE_POLL_SECONDS = 5.0  # a job list without one: only new jobs of other sessions can appear


def _panel(kind: str | None, only: list[str] | None, limit: int) -> None:
    """Draw the job list. Reruns the whole page (not only the
    fragment) once a job *this session submitted* and saw running has ended, so its results show;
    other sessions' jobs ending rerun nothing but the fragment: no rerun storms."""
    shown = jobs(kind=kind)
    if only is not None:
        shown = [j for j in shown if j.id in only]
    shown = shown[:limit]
    seen = st.session_state.setdefault("active_seen", set())
    mine = set(st.session_state.get("my_jobs", []))
    ended = [j.id for j in shown if not j.active and j.id in seen]
    seen.update(j.id for j in shown if j.active and j.id in mine)
    if not shown:
        st.caption("No jobs yet.")
    for job in shown:
        job_row(job)
    if ended:
        seen.difference_update(ended)
        st.rerun(scope="app")


@st.fragment(run_every=ACTIVE_POLL_SECONDS)
def _job_panel_fast(kind: str | None, only: list[str] | None, limit: int) -> None:
    _panel(kind, only, limit)


@st.fragment(run_every=IDLE_POLL_SECONDS)
def _job_panel_slow(kind: str | None, only: list[str] | None, limit: int) -> None:
    _panel(kind, only, limit)


def job_panel(kind: str | None = None, only: list[str] | None = None, limit: int = 10) -> None:
    """Live job list: polls every second if it showed a queued/running job when the page ran, every
    5 s otherwise (a page run, e.g. after this session's Rebuild or once its job ended, picks again;
    switching never reruns the page by itself)."""
    shown = [j for j in jobs(kind=kind) if only is None or j.id in only][:limit]
    (_job_panel_fast if any(j.active for j in shown) else _job_panel_slow)(kind, only, limit)
