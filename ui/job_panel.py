"""Jobs from the pages: submitting one as the project's own, the button behind a stored result,
and the live job list (polled by a fragment, fast while a job runs: progress, stage, elapsed time and, from
the trials done, the time left), with Cancel for the project's jobs. User text (a run label) is shown as
code: literal, never a link."""
from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from core.errors import MixprecError
from core.jobs import Job, can_cancel
from core.jobs.record import project_owner
from core.search.progress import eta_text
from ui import saved_project
from ui.session import code, fragment_rerun, manager, md

OWNER, OWNER_OF = "owner_token", "owner_token:project"


def owner_token() -> str:
    """The owner of the jobs this session submits, who alone may cancel them (``core.jobs``): the token of the
    session's saved project (``core.jobs.record.project_owner`` of the URL's ``?project=``), so a reload — a new
    session on the same URL — or the project's link opened again can still cancel them. A token the session
    holds for no project (set before its first run) stays its own."""
    pid = saved_project.project_id()
    if OWNER in st.session_state and st.session_state.get(OWNER_OF, pid) == pid:
        return st.session_state[OWNER]
    st.session_state[OWNER], st.session_state[OWNER_OF] = project_owner(pid), pid
    return st.session_state[OWNER]


SUBMIT_ERROR = "submit_error"  # why the last job could not be queued, for the next drawing (submit_error)


def submit(kind: str, params: dict, label: str, owner: str | None = None) -> Job | None:
    """Queue a job as this session's own (``owner``: its token, read while the page was drawn when this runs
    as a button's ``on_click``); None when it cannot be queued, the reason kept for :func:`submit_error`.

    Buttons start jobs from their ``on_click`` callback: it runs at the start of the run that carries the
    click, so the job is queued even if that run is then interrupted (a newer request, or a fragment's
    ``st.rerun`` above the button) or no longer draws the button; an ``if st.button(...)`` line is reached
    only when the run gets that far. The job is queued first, before any other session-state access (each
    is a point where Streamlit may stop the callback for a newer request)."""
    try:
        job = manager().submit(kind, params, label=label, owner=owner or owner_token())
    except MixprecError as e:
        st.session_state[SUBMIT_ERROR] = md(e)
        return None
    st.session_state.pop(SUBMIT_ERROR, None)
    st.session_state.setdefault("my_jobs", []).append(job.id)
    st.query_params["job"] = job.id
    return job


def submit_error() -> None:
    """The reason the last job could not be queued (once), where the button that started it is."""
    if st.session_state.get(SUBMIT_ERROR):
        st.error(st.session_state.pop(SUBMIT_ERROR))


WHERE_PARAMS = ("ray", "max_memory")  # where and in how much memory a job runs, not what it computes


def job_button(kind: str, params: dict, label: str, button: str, key: str, stored: bool, missing: str) -> None:
    """The job behind a stored result: its live row while it runs; else, if the result is not
    ``stored`` yet, ``missing``, the last failure and a button that starts it."""
    same = {k: v for k, v in params.items() if k not in WHERE_PARAMS}  # a result is the same wherever it ran
    mine = [j for j in jobs(kind=kind) if all(j.params.get(k) == v for k, v in same.items())]
    if any(j.active for j in mine):
        show(kind=kind, only=[j.id for j in mine], limit=1)
    elif not stored:
        st.info(missing)
        if mine and mine[0].status != "done":
            st.error(f"The last run {mine[0].status}: {md(mine[0].error)}")
        st.button(button, type="primary", key=key, on_click=submit, args=(kind, params, label, owner_token()))
        submit_error()


def job_line(job: Job) -> str:
    """What a job is, under its label: its kind, its queue when that says more ("build · `build-onnxruntime`",
    "rank", not "rank · rank"), its status (a damaged record: "damaged record")."""
    parts = [md(job.kind)]
    if job.queue and job.queue != job.kind:
        parts.append(code(job.queue))
    parts.append(f"**{DAMAGED if job.damaged else md(job.status)}**")
    return " · ".join(dict.fromkeys(parts))


DAMAGED = "damaged record"


def progress_text(job: Job, now: float | None = None) -> str:
    """The progress bar's text: the stage, the time so far and, once two trials are done, the time left."""
    now = time.time() if now is None else now
    stage = md(job.stage) if job.stage and job.stage != job.status else ""
    eta = eta_text(job.eta_seconds(now))
    return " · ".join(t for t in (stage or md(job.status), f"{job.elapsed:.0f} s", eta) if t)


def job_row(job: Job) -> None:
    mgr = manager()
    left, mid, right = st.columns([3, 4, 1])
    left.markdown(f"{code(job.label)}  \n{job_line(job)}")  # code: a label's URL or Markdown stays text
    text = progress_text(job)
    if job.status == "queued":
        pos = mgr.queue_position(job.id)
        text = f"queued{f' (#{pos + 1} in {job.queue})' if pos is not None else ''} · waiting {job.elapsed:.0f} s"
    mid.progress(min(max(job.progress, 0.0), 1.0), text=text)
    if job.active:
        _cancel_button(right, job)
    if job.error and job.status in ("failed", "interrupted"):
        st.error(f"{code(job.label)}: {md(job.error)}")


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
                     help="Another project's job: only a session on the project that started it can cancel it (or "
                          "anyone, when the server runs with MIXPREC_ADMIN=1).")
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
    other sessions' jobs ending rerun nothing but the fragment: no rerun storms. Only in the fragment's own
    (timed) run: drawn inline in a page run, an ``st.rerun`` would stop that run here and the clicks it
    carries for the widgets below would be lost (a stopped run resets every button's trigger:
    ``SessionState.on_script_finished``); the fragment's next run, within a poll interval, does it."""
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
    if ended and fragment_rerun():  # drawn inline in a page run, it leaves them to its next own run (below)
        seen.difference_update(ended)
        st.rerun(scope="app")


@st.fragment(run_every=ACTIVE_POLL_SECONDS)
def _job_panel_fast(kind: str | None, only: list[str] | None, limit: int) -> None:
    _panel(kind, only, limit)


@st.fragment(run_every=IDLE_POLL_SECONDS)
def _job_panel_slow(kind: str | None, only: list[str] | None, limit: int) -> None:
    _panel(kind, only, limit)


def show(kind: str | None = None, only: list[str] | None = None, limit: int = 10) -> None:
    """Live job list: polls every second if it showed a queued/running job when the page ran, every
    5 s otherwise (a page run, e.g. after this session's Rebuild or once its job ended, picks again;
    switching never reruns the page by itself)."""
    shown = [j for j in jobs(kind=kind) if only is None or j.id in only][:limit]
    (_job_panel_fast if any(j.active for j in shown) else _job_panel_slow)(kind, only, limit)
