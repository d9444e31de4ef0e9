"""The record of one background job, as stored in ``jobs/<id>.json`` (written by the manager only).

Records are read back with :meth:`Job.from_dict`, which checks every field's type: a record with a field of
the wrong type (a hand edit, a damaged file, another program's write) is shown, never crashes the job list —
its bad fields take their defaults and the job reads as ``failed``, its error naming what was wrong
(:attr:`Job.damaged`). Its time left (:meth:`Job.eta_seconds`) comes from the trials its stage names
(``core.search.progress``)."""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field, fields

from core.search.progress import eta_seconds, trials_in

ACTIVE = ("queued", "running")  # the other statuses: done, failed, cancelled, interrupted
STATUSES = (*ACTIVE, "done", "failed", "cancelled", "interrupted")
DAMAGED_STAGE = "damaged record"


@dataclass
class Job:
    id: str
    kind: str
    label: str
    queue: str
    params: dict
    status: str = "queued"
    progress: float = 0.0
    stage: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    error: str = ""
    result_path: str = ""
    server_pid: int = field(default_factory=os.getpid)
    child_pid: int | None = None
    exit_code: int | None = None
    owner: str = ""  # who submitted it (ui.job_panel.owner_token: its project's token; "" = anyone's)
    notes: list[str] = field(default_factory=list)  # e.g. a corrupt cache that was computed again

    def owned_by(self, owner: str | None) -> bool:
        """Whether ``owner`` (a session's owner token) submitted this job; a job without an owner is everyone's."""
        return not self.owner or (owner is not None and owner == self.owner)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def damaged(self) -> bool:
        """Whether the record had fields of the wrong type (:meth:`from_dict`): shown as failed, never run."""
        return self.stage == DAMAGED_STAGE

    @property
    def elapsed(self) -> float:
        """Seconds running (or queued, if not started yet)."""
        start = self.started or self.created
        return (self.finished or time.time()) - start

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left of a running job, from the trials its stage names (``core.search.progress``): the time since
        it started per trial done, times the trials left; None before two trials or without a trial count."""
        counts = trials_in(self.stage) if self.status == "running" and self.started else None
        if counts is None:
            return None
        return eta_seconds((now if now is not None else time.time()) - self.started, *counts)

    @classmethod
    def from_dict(cls, d) -> "Job":
        """The job of a stored record. Unknown keys are ignored (a newer mixprec's); a field of the wrong type
        takes its default, and the job is then marked failed with the problems as its error (never active)."""
        if not isinstance(d, dict):
            d, problems = {}, [f"the record is a JSON {type(d).__name__}, not an object"]
        else:
            problems = []
        names = {f.name for f in fields(cls)}
        values = {}
        for k, v in d.items():
            if k not in names:
                continue
            ok, value = _check(k, v)
            if ok:
                values[k] = value
            else:
                problems.append(f"{k}: {_short(v)} ({_WANT[k]})")
        for k in ("id", "kind", "label", "queue", "params"):
            if k not in values:
                if k not in d:
                    problems.append(f"{k}: missing")
                values[k] = {} if k == "params" else ""
        if not problems:
            return cls(**values)
        values["id"] = values["id"] or "damaged-" + hashlib.sha1(repr(sorted(map(repr, d.items()))).encode()
                                                                  ).hexdigest()[:8]
        values["kind"] = values["kind"] or "unknown"
        values["label"] = values["label"] or values["id"]
        values.setdefault("created", 0.0)  # a damaged record without a time sorts last, not first
        values["finished"] = values.get("finished") or values.get("started") or values["created"]
        values.update(status="failed", stage=DAMAGED_STAGE,
                      error="its job record is damaged, so it is shown as failed: " + "; ".join(problems))
        return cls(**values)


def project_owner(project_id: str) -> str:
    """The owner token of the jobs started in the saved project ``project_id`` (``ui.job_panel.owner_token``):
    the same for every session on that project — a reload, or the project's link opened again — so whoever has
    the project can cancel the jobs started in it, and nobody else (the id is 48 random bits, in the URL)."""
    return hashlib.sha256(f"mixprec.job-owner:{project_id}".encode()).hexdigest()[:32]


_WANT = {"id": "want text", "kind": "want text", "label": "want text", "queue": "want text", "params": "want an object",
         "status": f"want one of {', '.join(STATUSES)}", "progress": "want a number",
         "stage": "want text", "created": "want a time", "started": "want a time or null",
         "finished": "want a time or null", "error": "want text", "result_path": "want text",
         "server_pid": "want a process id", "child_pid": "want a process id or null",
         "exit_code": "want an integer or null", "owner": "want text", "notes": "want a list of text"}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(name: str, v) -> tuple[bool, object]:
    """Whether ``v`` is a good value of the field ``name``, and the value to keep."""
    if name in ("id", "kind", "label", "queue", "stage", "error", "result_path", "owner"):
        return isinstance(v, str), v
    if name == "params":
        return isinstance(v, dict), v
    if name == "status":
        return v in STATUSES, v
    if name == "progress":
        return _number(v), min(max(float(v), 0.0), 1.0) if _number(v) else v  # a fraction: kept within 0…1
    if name == "created":
        return _number(v) and v >= 0, float(v) if _number(v) else v
    if name in ("started", "finished"):
        return v is None or (_number(v) and v >= 0), float(v) if _number(v) else v
    if name == "server_pid":
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0, v
    if name in ("child_pid", "exit_code"):
        return v is None or (isinstance(v, int) and not isinstance(v, bool)), v
    if name == "notes":
        return isinstance(v, list) and all(isinstance(n, str) for n in v), v
    return True, v


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "…"
