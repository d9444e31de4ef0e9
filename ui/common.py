"""Session glue shared by the pages: workspace, job manager, the cached project, the session's
policy, stored results and the job panel. No logic beyond wiring Streamlit state to core."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import streamlit as st

from core import store
from core.backends import select_backend
from core.errors import MixprecError
from core.jobs import Job, JobManager
from core.policy import Policy
from core.project import DEFAULT_TARGET, DEPLOY_TARGETS, Project, open_project
from core.runs import speedup_text
from core.workspace import Workspace

SAMPLES = ["sample:minilm", "sample:tiny-cnn", "sample:tiny-transformer"]
DEFAULT_MODEL = SAMPLES[0]
SOURCE_KEYS = ("model", "data", "eval_data")  # and "shapes" (the input shapes the user set), "target" (sidebar)
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
    when faster, red with a down arrow and "slower than FP32" when slower (``core.runs.speedup_text``)."""
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


def source() -> dict:
    """The session's model/data paths and input shapes; restored from the URL after a reload; MiniLM at first."""
    if "source" not in st.session_state:
        qp = st.query_params
        st.session_state["source"] = {k: qp.get(k) for k in SOURCE_KEYS}
        st.session_state["source"]["model"] = st.session_state["source"]["model"] or DEFAULT_MODEL
        st.session_state["source"]["shapes"] = _shapes_from_text(qp.get("shapes"))
        st.session_state["source"]["target"] = qp.get("target") if qp.get("target") in DEPLOY_TARGETS else None
        if qp.get("job"):  # re-attach to the job this browser tab started before a reload
            st.session_state.setdefault("my_jobs", []).append(qp["job"])
    return st.session_state["source"]


def shapes() -> dict[str, list[int]] | None:
    """The input shapes the user set on the Model page (None: the defaults), for every job's params."""
    return source().get("shapes") or None


def target() -> str:
    """The session's deployment target (sidebar; kept in the URL): ``tensorrt`` unless the user picked another."""
    t = source().get("target")
    return t if t in DEPLOY_TARGETS else DEFAULT_TARGET


def set_target(value: str) -> None:
    """Deploy on ``value`` (``core.project.DEPLOY_TARGETS``); keeps the model, data and shapes."""
    src = source()
    set_source(src["model"], src.get("data"), src.get("eval_data"), src.get("shapes"), value)


def set_source(model: str, data: str | None = None, eval_data: str | None = None,
               shapes: dict | None = None, target: str | None = None) -> None:
    """The session's model, data and input shapes (a new model starts from its default shapes) and
    deployment target (None: the one chosen so far); kept in the URL."""
    target = target or st.session_state.get("source", {}).get("target")
    st.session_state["source"] = {"model": model, "data": data, "eval_data": eval_data,
                                  "shapes": _shapes_from_text(_shapes_text(shapes)),
                                  "target": target if target in DEPLOY_TARGETS else None}
    for k, v in {**st.session_state["source"], "shapes": _shapes_text(shapes)}.items():
        if v:
            st.query_params[k] = v
        elif k in st.query_params:
            del st.query_params[k]


def set_shapes(shapes: dict | None) -> None:
    """Keep the model and data, use these input shapes (None: back to the defaults)."""
    src = source()
    set_source(src["model"], src.get("data"), src.get("eval_data"), shapes, src.get("target"))


@st.cache_resource(show_spinner="Opening the model (the first MiniLM load exports it: ~20 s)…", max_entries=8)
def _open(model: str, data: str | None, eval_data: str | None, shapes: str, ws_root: str) -> Project:
    return open_project(model, data, eval_data, ws=Workspace(Path(ws_root)), shapes=_shapes_from_text(shapes))


def open_source(model: str, data: str | None = None, eval_data: str | None = None,
                shapes: dict | None = None, target: str | None = None) -> Project:
    """The (cached) project, for the deployment ``target`` (the session's if None)."""
    p = _open(model, data, eval_data, _shapes_text(shapes), str(workspace().root))
    t = target if target in DEPLOY_TARGETS else DEFAULT_TARGET
    return p if p.target == t else replace(p, target=t)


def project() -> Project:
    """The session's project, or an error with the way out (and the page stops)."""
    src = source()
    try:
        return open_source(**src)
    except MixprecError as e:
        st.error(md(e))
        st.info("Pick another model or data on the **Model** page.")
        st.stop()


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


# --- stored results (records from core.store; a document of another format is shown as an error) ---
def _stored(load, *args):
    try:
        return load(*args)
    except MixprecError as e:
        st.error(md(e))
        return None


def ranking(p: Project, method: str = "minmax"):
    """The stored cumulative ``Ranking`` of this model, data and method, or None."""
    return _stored(store.load_ranking, p.ws, p, method)


def sensitivity(p: Project, method: str = "minmax", mode: str = "isolated"):
    """The stored isolated / leave-one-out ``Sensitivity``, or None."""
    return _stored(store.load_sensitivity, p.ws, p, method, mode)


def search_result(p: Project, budget: str, smooth: bool):
    """The stored ``SearchResult`` of this budget and smoothing, or None."""
    return _stored(store.load_search, p.ws, p, budget, smooth)


# --- the session's policy ----------------------------------------------------------------------
def _policy_key(p: Project) -> str:
    return f"policy:{p.model.sha256}:{p.calib_data.sha256}"


def policy(p: Project) -> Policy:
    return st.session_state.get(_policy_key(p)) or p.default_policy()


def set_policy(p: Project, pol: Policy, reset_editor: bool = True) -> None:
    """Store the session's policy; ``reset_editor`` redraws the precision table from it."""
    st.session_state[_policy_key(p)] = pol
    if reset_editor:
        st.session_state["editor_version"] = st.session_state.get("editor_version", 0) + 1


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
def submit(kind: str, params: dict, label: str) -> Job | None:
    try:
        job = manager().submit(kind, params, label=label)
    except MixprecError as e:
        st.error(md(e))
        return None
    st.session_state.setdefault("my_jobs", []).append(job.id)
    st.query_params["job"] = job.id
    return job


def job_button(kind: str, params: dict, label: str, button: str, key: str, stored: bool, missing: str) -> None:
    """The job behind a stored result: its live row while it runs; else, if the result is not
    ``stored`` yet, ``missing``, the last failure and a button that starts it."""
    mine = [j for j in manager().jobs(kind=kind) if all(j.params.get(k) == v for k, v in params.items())]
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
        right.button("Cancel", key=f"cancel-{job.id}", on_click=mgr.cancel, args=(job.id,))
    if job.error and job.status in ("failed", "interrupted"):
        st.error(f"{md(job.label)}: {md(job.error)}")


@st.fragment(run_every=1.0)
def job_panel(kind: str | None = None, only: list[str] | None = None, limit: int = 10) -> None:
    """Live job list; reruns the whole page once a job this session saw running has ended."""
    jobs = manager().jobs(kind=kind)
    if only is not None:
        jobs = [j for j in jobs if j.id in only]
    jobs = jobs[:limit]
    seen = st.session_state.setdefault("active_seen", set())
    mine = set(st.session_state.get("my_jobs", []))  # only this session's jobs rerun its page: no rerun storms
    ended = [j.id for j in jobs if not j.active and j.id in seen]
    seen.update(j.id for j in jobs if j.active and j.id in mine)
    if not jobs:
        st.caption("No jobs yet.")
    for job in jobs:
        job_row(job)
    if ended:
        seen.difference_update(ended)
        st.rerun(scope="app")
