"""The record of one background job, as stored in ``jobs/<id>.json`` (written by the manager only)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields

ACTIVE = ("queued", "running")  # the other statuses: done, failed, cancelled, interrupted


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
    owner: str = ""  # the token of the session that submitted it ("" = anyone's); see JobManager.cancel
    notes: list[str] = field(default_factory=list)  # e.g. a corrupt cache that was computed again

    def owned_by(self, owner: str | None) -> bool:
        """Whether ``owner`` (a session token) submitted this job; a job without an owner is everyone's."""
        return not self.owner or (owner is not None and owner == self.owner)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def elapsed(self) -> float:
        """Seconds running (or queued, if not started yet)."""
        start = self.started or self.created
        return (self.finished or time.time()) - start

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
