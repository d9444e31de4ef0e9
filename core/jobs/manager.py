"""Background jobs: builds and analyses run in child processes, supervised by threads.

One supervisor thread per queue (``build-onnxruntime``, ``build-tensorrt``, ``rank``…) takes
jobs in FIFO order and runs each in a fresh child interpreter (``python -m core.jobs RECORD``),
so a native crash, an OOM kill or a cancel never takes the server down. (Not multiprocessing's
``spawn``: Streamlit puts the running page in ``sys.modules['__main__']``, and spawn re-runs
``__main__`` in every child.) Records live in
``ws.jobs/<id>.json`` (written atomically, by the manager only); the child writes its progress
to ``<id>.progress.json`` and its outcome to ``<id>.outcome.json``, and the supervisor folds
both into the record. A record left ``queued``/``running`` by a server that is gone becomes
``interrupted`` when the next manager opens the workspace — unless its child finished and wrote its
outcome meanwhile: then the real outcome (done with its result, or failed with its error) is recorded.
A starting manager also removes the temp run folders, the temp work folders (``tmp/``: a killed calibration's
model copies, a killed search's trial data) and write temp files no live process owns.

Owners: a job records the token of the session that submitted it (``submit(..., owner=token)``).
Everyone sees every job; only its owner can cancel it (``cancel(job_id, owner=token)``), unless the
server runs with ``MIXPREC_ADMIN=1``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import asdict
from pathlib import Path

from core.backends import select_backend
from core.errors import MixprecError
from core.jobs.kinds import ANALYSIS_KINDS, KINDS
from core.jobs.params import BuildParams, job_label
from core.jobs.record import Job
from core.model.data_errors import feed_error, is_ort_run_error
from core.workspace import (REPO_ROOT, Workspace, atomic_write_json, clean_temp_folders, clean_temp_runs,
                            process_start, sweep_stale_temp, take_notes)

POLL_SECONDS = 0.1
KILL_GRACE_SECONDS = 3.0
CHILD_NICENESS = 19  # jobs yield the CPU to the server: pages stay responsive while builds run


def lower_priority(pid: int = 0) -> None:
    """Give process ``pid`` (0: this one) the niceness ``CHILD_NICENESS`` (never raise its priority).
    The supervisor applies it right after spawning, so the child's imports already run niced; threads
    the child starts later (ONNX Runtime's pools) inherit it."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < CHILD_NICENESS:
            os.setpriority(os.PRIO_PROCESS, pid, CHILD_NICENESS)
    except OSError:  # the child already exited, or the platform refuses: priority is best effort
        pass


def is_admin() -> bool:
    """Whether this server runs with ``MIXPREC_ADMIN=1`` (anyone may cancel any job)."""
    return os.environ.get("MIXPREC_ADMIN", "").strip().lower() in ("1", "true", "yes")


def can_cancel(job: Job, owner: str | None) -> bool:
    """Whether the session ``owner`` may cancel ``job``: its own job (or one without an owner), or any as admin."""
    return job.owned_by(owner) or is_admin()


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwind on cancel, so worker pools (search trials) shut down too


def child_main(record_path: str) -> None:
    """Entry point of the child process: run the job of one record, write its outcome, exit."""
    record = Path(record_path)
    job = Job.from_dict(json.loads(record.read_text()))
    progress_path, outcome_path = (record.with_name(f"{job.id}.{s}.json") for s in ("progress", "outcome"))
    last = [0.0]

    def progress(fraction: float, text: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2 or fraction >= 1.0:
            last[0] = now
            atomic_write_json(progress_path, {"progress": float(fraction), "stage": str(text)})

    ws = Workspace(record.parent.parent)
    lower_priority()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = KINDS[job.kind](job.params, ws, progress)
    except SystemExit:
        raise
    except MixprecError as e:
        atomic_write_json(outcome_path, {"error": str(e), "notes": take_notes()})
        sys.exit(3)
    except BaseException as e:  # noqa: BLE001 - report anything, the server stays up
        if isinstance(e, Exception) and is_ort_run_error(e):  # inputs ONNX Runtime refused: the user's to fix
            atomic_write_json(outcome_path, {"error": str(feed_error(e, None, "running the model")),
                                             "notes": take_notes()})
            sys.exit(3)
        traceback.print_exc()
        atomic_write_json(outcome_path, {"error": f"internal error: {type(e).__name__}: {e}", "notes": take_notes()})
        sys.exit(1)
    atomic_write_json(outcome_path, {"result_path": result, "notes": take_notes()})
    sys.exit(0)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _notes(outcome: dict) -> list[str]:
    notes = outcome.get("notes")
    return [str(n) for n in notes] if isinstance(notes, list) else []


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_job_child(pid: int | None, job_id: str) -> bool:
    """Whether ``pid`` is still the child running ``job_id`` (not a process that reused the pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
    except OSError:
        return False
    return b"core.jobs" in cmdline and job_id.encode() in cmdline


def _stop(pid: int, timeout: float = KILL_GRACE_SECONDS) -> None:
    """SIGKILL process ``pid`` and wait (up to ``timeout``) until it is dead, so that the sweep after it removes
    the temp work it owned."""
    start = process_start(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while start is not None and process_start(pid) == start and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS / 10)


def describe_exit(code: int | None) -> str:
    """A failure reason for a child that died without writing its outcome."""
    if code is None:
        return "the job process vanished"
    if code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = {signal.SIGKILL: " (likely out of memory)", signal.SIGABRT: " (native abort)",
               signal.SIGSEGV: " (native crash)"}.get(sig, "")
        return f"killed by signal {sig} ({name}){why}"
    return f"the job process exited with code {code} without a result"


# --- the manager -----------------------------------------------------------------------------------
# Kept on ``sys`` so that a re-import of this module (Streamlit reloads changed modules) finds
# the managers, queues and supervisor threads that are already running.
_MANAGERS: dict[Path, "JobManager"] = sys.__dict__.setdefault("_mixprec_job_managers", {})
_MANAGERS_LOCK: threading.Lock = sys.__dict__.setdefault("_mixprec_job_managers_lock", threading.Lock())


class JobManager:
    """Submits, supervises, cancels and lists jobs of one workspace. Use :meth:`for_workspace`
    to get the process-wide manager of a workspace (one per server)."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        self.dir = ws.jobs
        self.pid = os.getpid()
        self._lock = threading.RLock()
        self._queues: dict[str, deque[str]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._cancel: set[str] = set()
        self.recover()

    @classmethod
    def for_workspace(cls, ws: Workspace | None = None) -> "JobManager":
        ws = ws or Workspace.default()
        with _MANAGERS_LOCK:
            mgr = _MANAGERS.get(ws.root)
            if mgr is None:
                mgr = _MANAGERS[ws.root] = cls(ws)
            return mgr

    # records
    def _path(self, job_id: str, suffix: str = "") -> Path:
        return self.dir / f"{job_id}{'.' + suffix if suffix else ''}.json"

    def _save(self, job: Job) -> None:
        atomic_write_json(self._path(job.id), asdict(job))

    def get(self, job_id: str) -> Job:
        d = _read_json(self._path(job_id))
        if d is None:
            raise MixprecError(f"there is no job {job_id!r} in {self.dir}", "pick a job from the job list")
        return Job.from_dict(d)

    def jobs(self, kind: str | None = None, limit: int | None = None) -> list[Job]:
        """All job records, newest first."""
        out = []
        for p in self.dir.glob("*.json"):
            if p.name.count(".") > 1 or p.name.startswith("."):
                continue  # progress/outcome side files, temp files
            d = _read_json(p)
            if d and "kind" in d and (kind is None or d["kind"] == kind):
                out.append(Job.from_dict(d))
        out.sort(key=lambda j: j.created, reverse=True)
        return out[:limit] if limit else out

    def queue_position(self, job_id: str) -> int | None:
        """0 for the next job to start in its queue, 1 for the one after… None if not queued here."""
        with self._lock:
            for q in self._queues.values():
                if job_id in q:
                    return list(q).index(job_id)
        return None

    def recover(self) -> list[str]:
        """Settle jobs left queued/running by a server that is gone: a child that finished meanwhile
        has its outcome recorded (done or failed); the others are interrupted (a child still running
        is stopped, and its trial workers with it). Then remove the temp run folders, temp folders (``tmp/``) and
        temp files no live process owns."""
        changed = []
        with self._lock:
            for job in self.jobs():
                if not job.active:
                    continue
                if job.server_pid == self.pid or _pid_alive(job.server_pid):
                    continue  # its server is alive (this one, or another on the same workspace)
                if _is_job_child(job.child_pid, job.id):
                    _stop(job.child_pid)  # an orphaned child of the dead server (its trial workers follow it)
                self._settle_orphan(job)
                changed.append(job.id)
        clean_temp_runs(self.ws)
        clean_temp_folders(self.ws)
        sweep_stale_temp(self.ws.root)
        return changed

    def _settle_orphan(self, job: Job) -> None:
        """Record the end of a job whose server died: the outcome its child wrote, else interrupted."""
        outcome_path = self._path(job.id, "outcome")
        outcome = _read_json(outcome_path) or {}
        job.finished = job.finished or time.time()
        job.notes = _notes(outcome)
        result = outcome.get("result_path")
        if result and Path(str(result)).exists():
            job.status, job.progress, job.stage, job.result_path = "done", 1.0, "done", str(result)
            job.notes.append(f"finished after its server (pid {job.server_pid}) stopped")
        elif outcome.get("error"):
            job.status, job.stage, job.error = "failed", "failed", str(outcome["error"])
        else:
            job.status = "interrupted"
            job.error = f"the server (pid {job.server_pid}) stopped while this job was {job.stage or job.status}"
        self._save(job)
        for side in ("progress", "outcome"):
            self._path(job.id, side).unlink(missing_ok=True)

    # submit / cancel
    def submit(self, kind: str, params: dict, label: str = "", queue: str | None = None, owner: str = "") -> Job:
        """Queue a job; ``owner`` is the submitting session's token (only it may cancel the job)."""
        if kind not in KINDS:
            raise MixprecError(f"unknown job kind {kind!r}", f"use one of {', '.join(KINDS)}")
        json.dumps(params)  # params must be JSON-serialisable: fail here, not in the child
        if queue is None:
            queue = _default_queue(kind, params)
        job = Job(id=time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8], kind=kind,
                  label=job_label(kind, params, label), queue=queue, params=params, owner=str(owner or ""))
        with self._lock:
            job.created = time.time()  # stamped in queue order: FIFO by `created` holds across threads
            self._save(job)
            self._queues.setdefault(queue, deque()).append(job.id)
            t = self._threads.get(queue)
            if t is None or not t.is_alive():
                t = threading.Thread(target=self._supervise, args=(queue,), name=f"jobs-{queue}", daemon=True)
                self._threads[queue] = t
                t.start()
        return job

    def cancel(self, job_id: str, owner: str | None = None) -> Job:
        """Cancel a job for the session ``owner``: a MixprecError if the job is another session's
        (unless the server runs with ``MIXPREC_ADMIN=1``)."""
        with self._lock:
            job = self.get(job_id)
            if not can_cancel(job, owner):
                raise MixprecError(f"the job {job.label!r} ({job.id}) belongs to another session, which alone can "
                                   "cancel it", "ask whoever started it, or run the server with MIXPREC_ADMIN=1")
            if not job.active:
                return job
            for q in self._queues.values():
                if job_id in q:  # not started yet: just drop it
                    q.remove(job_id)
                    job.status, job.stage, job.finished, job.error = "cancelled", "cancelled", time.time(), \
                        "cancelled before it started"
                    self._save(job)
                    return job
            self._cancel.add(job_id)
        return job

    def wait(self, job_id: str, timeout: float = 120.0) -> Job:
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if not job.active or time.monotonic() > deadline:
                return job
            time.sleep(POLL_SECONDS)

    # supervision
    def _supervise(self, queue: str) -> None:
        while True:
            with self._lock:
                q = self._queues[queue]
                if not q:
                    self._threads.pop(queue, None)
                    return
                job_id = q.popleft()
            try:
                self._run(self.get(job_id))
            except Exception as e:  # noqa: BLE001 - never let one job stop the queue
                with self._lock:
                    job = self.get(job_id)
                    job.status, job.finished, job.error = "failed", time.time(), f"supervisor error: {e}"
                    self._save(job)

    def _run(self, job: Job) -> None:
        progress_path, outcome_path = self._path(job.id, "progress"), self._path(job.id, "outcome")
        for p in (progress_path, outcome_path):
            p.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        with self._lock, open(self.dir / f"{job.id}.log", "ab") as log:
            job.status, job.started, job.stage = "running", time.time(), "starting"
            self._save(job)
            proc = subprocess.Popen([sys.executable, "-m", "core.jobs", str(self._path(job.id))], cwd=REPO_ROOT,
                                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            lower_priority(proc.pid)
            job.child_pid = proc.pid
            self._save(job)
        seen, cancelled_at = None, None
        while proc.poll() is None:
            time.sleep(POLL_SECONDS)
            with self._lock:
                if job.id in self._cancel and cancelled_at is None:
                    cancelled_at = time.monotonic()
                    proc.terminate()
                    job.stage = "cancelling"
                    self._save(job)
            if cancelled_at is not None and time.monotonic() - cancelled_at > KILL_GRACE_SECONDS:
                proc.kill()
            p = _read_json(progress_path)
            if p and p != seen and cancelled_at is None:
                seen = p
                job.progress, job.stage = float(p.get("progress", 0.0)), str(p.get("stage", ""))
                with self._lock:
                    self._save(job)
        outcome = _read_json(outcome_path) or {}
        job.exit_code, job.finished = proc.returncode, time.time()
        job.notes = _notes(outcome)
        with self._lock:
            if job.id in self._cancel:
                self._cancel.discard(job.id)
                job.status, job.stage, job.error = "cancelled", "cancelled", "cancelled by the user"
            elif proc.returncode == 0 and outcome.get("result_path"):
                job.status, job.progress, job.stage = "done", 1.0, "done"
                job.result_path = outcome["result_path"]
            else:
                job.status, job.stage = "failed", "failed"
                job.error = outcome.get("error") or describe_exit(proc.returncode)
            self._save(job)
        for p in (progress_path, outcome_path):
            p.unlink(missing_ok=True)


def _default_queue(kind: str, params: dict) -> str:
    if kind == "build":
        backend, _ = select_backend(BuildParams.from_params(params).backend)
        return f"build-{backend.name}"
    return "rank" if kind in ANALYSIS_KINDS else kind
