"""State that survives a reload: a dashboard *project* (the model with its display name, data,
input shapes, deployment target and a few kept settings such as the run label) and, per model and
calibration data, the *draft* policy being edited with its undo and redo history. Both live in
the workspace under a project id that the dashboard keeps in the URL (``?project=<id>``), so a
reload or a shared link restores them on every page.

Layout (under the workspace root)::

    projects/<id>/project.json        the SavedProject record (its ProjectSource, name and settings)
    projects/<id>/drafts/<key>.json   one Draft per model + calibration data (key: draft_key)

Writes are atomic (``core.workspace``). Undo and redo steps store only what an edit changed (the
layers' previous precisions and the policy's other fields), at most ``MAX_UNDO`` of them. Two
sessions on one shared project write the same files: the last write wins, and a session sees the
other's edits when the file's stamp (:func:`file_stamp`) changes. No Streamlit here: the pages
call these through ``ui.saved_project`` and ``ui.draft``."""
from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from core.errors import MixprecError
from core.project import ProjectSource
from core.records import check_format
from core.workspace import Workspace, atomic_write_json, sha256_bytes

MAX_UNDO = 100
PROJECT_ID = re.compile(r"[a-z0-9]{8,32}")
SETTING_TYPES = (str, bool, int, float)  # kept settings are plain values (a label, a budget, a flag)


def new_project_id() -> str:
    """A fresh project id: 12 random lowercase hex characters (URL- and file-name-safe)."""
    return secrets.token_hex(6)


def check_project_id(text) -> str | None:
    """``text`` if it is a well-formed project id, else None (a URL parameter is user input: it
    never becomes a path unless it is one of ours in form)."""
    return text if isinstance(text, str) and PROJECT_ID.fullmatch(text) else None


def _project_dir(ws: Workspace, project_id: str) -> Path:
    if check_project_id(project_id) is None:
        raise MixprecError(f"{str(project_id)[:40]!r} is not a project id", "open the dashboard without ?project=")
    return ws.project_dir(project_id)


def draft_key(model_sha256: str, calib_sha256: str) -> str:
    """Drafts are kept per model and calibration data (a policy records the data it was calibrated on)."""
    return sha256_bytes(f"{model_sha256}|{calib_sha256}".encode())[:32]


def project_path(ws: Workspace, project_id: str) -> Path:
    return _project_dir(ws, project_id) / "project.json"


def draft_path(ws: Workspace, project_id: str, key: str) -> Path:
    if not re.fullmatch(r"[0-9a-f]{32}", str(key)):
        raise MixprecError(f"{str(key)[:40]!r} is not a draft key", "use core.store.drafts.draft_key")
    _project_dir(ws, project_id)  # a well-formed id
    return ws.drafts_dir(project_id) / f"{key}.json"


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of a stored file, None if there is none: a cached read is still good
    while its stamp is unchanged."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


# --- the project -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SavedProject:
    """What the dashboard restores: the project's :class:`ProjectSource` (the model and data, paths
    or ``sample:NAME``, the input shapes and the deployment target), the model's display name and the
    kept ``settings``."""

    FORMAT_VERSION: ClassVar[int] = 2  # format 1 had no dims or batch in its source (_migrate_v1)
    KIND: ClassVar[str] = "project"

    id: str
    source: ProjectSource
    model_name: str = ""
    settings: dict = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    models: dict = field(default_factory=dict)  # model -> the ProjectSource JSON last used with it (data, shapes…)

    def to_json(self) -> dict:
        """The source's fields flat in the document (``ProjectSource.to_json``), as a job's params carry them;
        ``models``: the source each other model of the project had when the user switched away from it."""
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "id": self.id, **self.source.to_json(),
                "model_name": self.model_name, "settings": dict(self.settings), "created": self.created,
                "updated": self.updated, "models": {k: dict(v) for k, v in self.models.items()}}

    @classmethod
    def from_json(cls, doc: dict) -> "SavedProject":
        doc = check_format(_migrate_v1(doc), cls.KIND, cls.FORMAT_VERSION, "project")
        settings = {str(k): v for k, v in (doc.get("settings") or {}).items() if isinstance(v, SETTING_TYPES)}
        pid = check_project_id(doc["id"])
        if pid is None:
            raise ValueError("the id is not a string of the right form")
        return cls(pid, _source(doc), str(doc.get("model_name") or ""), settings,
                   float(doc.get("created") or 0), float(doc.get("updated") or 0), _models(doc.get("models")))


def _migrate_v1(doc):
    """A format-1 project (its source without dims or batch) as format 2; any other document as it is."""
    if not (isinstance(doc, dict) and doc.get("kind") == SavedProject.KIND and doc.get("format_version") == 1):
        return doc
    return {**doc, "format_version": 2, "dims": None, "batch": 1}  # migration 1 -> 2


def _source(doc: dict) -> ProjectSource:
    """The project's source, read as format 1 always was: an empty or non-text path or target is none, and
    so are shapes that are not a map (a model that is not a string is a damaged file)."""
    shapes = doc.get("shapes")
    lenient = {k: _opt_str(doc.get(k)) for k in ("data", "eval_data", "target")}
    return ProjectSource.from_json({**doc, **lenient, "shapes": shapes if isinstance(shapes, dict) else None})


def _models(doc) -> dict:
    """The per-model sources of a project document: each a readable ProjectSource of that model; anything
    else (an older file has none; a damaged entry) is left out, never fatal."""
    out = {}
    for model, src in (doc.items() if isinstance(doc, dict) else ()):
        try:
            if isinstance(model, str) and isinstance(src, dict) and ProjectSource.from_json(src).model == model:
                out[model] = ProjectSource.from_json(src).to_json()
        except (TypeError, ValueError):
            continue
    return out


def _opt_str(v) -> str | None:
    return v if isinstance(v, str) and v else None


def save_project(ws: Workspace, project: SavedProject) -> Path:
    now = time.time()
    project = replace(project, created=project.created or now, updated=now)
    return atomic_write_json(project_path(ws, project.id), project.to_json())


def load_project(ws: Workspace, project_id: str) -> SavedProject | None:
    """The saved project, None if there is none; a MixprecError if its file is damaged."""
    path = project_path(ws, project_id)
    return _load(path, "project", SavedProject.from_json)


def _load(path: Path, what: str, from_json):
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise MixprecError(f"cannot read the saved {what} {path}: {e}", f"delete {path}; it is started again") from e
    try:
        return from_json(json.loads(text))
    except MixprecError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise MixprecError(f"the saved {what} {path} is damaged ({type(e).__name__})",
                           f"delete {path}; it is started again") from e


# --- the draft policy and its history ---------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One undoable edit: its description and what turns the policy back (``layers``: the
    previous precision of each layer it changed, None where the layer was absent; ``rest``: the
    policy document's other fields before the edit)."""

    what: str
    layers: dict
    rest: dict
    at: float = 0.0

    def to_json(self) -> dict:
        return {"what": self.what, "layers": dict(self.layers), "rest": dict(self.rest), "at": self.at}

    @classmethod
    def from_json(cls, doc: dict) -> "Step":
        layers, rest = doc["layers"], doc["rest"]
        if not isinstance(layers, dict) or not isinstance(rest, dict):
            raise TypeError("a step's layers and rest are objects")
        return cls(str(doc["what"]), dict(layers), dict(rest), float(doc.get("at") or 0))


def _step(what: str, target: dict, current: dict) -> Step:
    """The step that turns ``current`` into ``target``."""
    old, new = target.get("layers") or {}, current.get("layers") or {}
    changed = {n: old.get(n) for n in (*old, *(n for n in new if n not in old)) if old.get(n) != new.get(n)}
    return Step(what, changed, {k: v for k, v in target.items() if k != "layers"}, time.time())


def _apply(doc: dict, step: Step) -> dict:
    layers = dict(doc.get("layers") or {})
    for name, prec in step.layers.items():
        if prec is None:
            layers.pop(name, None)
        else:
            layers[name] = prec
    return {**step.rest, "layers": layers}


@dataclass(frozen=True)
class Draft:
    """The policy being edited (a ``Policy.to_dict()`` document) with its undo and redo stacks
    (newest last). Editing clears the redo stack; an edit that changes nothing is not recorded."""

    FORMAT_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "draft"

    policy: dict
    undo: tuple[Step, ...] = ()
    redo: tuple[Step, ...] = ()

    def edited(self, policy: dict, what: str) -> "Draft":
        if _same(policy, self.policy):
            return self
        return Draft(policy, (*self.undo, _step(what, self.policy, policy))[-MAX_UNDO:], ())

    def undone(self) -> "Draft":
        """The draft before its last edit (unchanged if there is nothing to undo)."""
        if not self.undo:
            return self
        step = self.undo[-1]
        before = _apply(self.policy, step)
        return Draft(before, self.undo[:-1], (*self.redo, _step(step.what, self.policy, before)))

    def redone(self) -> "Draft":
        if not self.redo:
            return self
        step = self.redo[-1]
        after = _apply(self.policy, step)
        return Draft(after, (*self.undo, _step(step.what, self.policy, after)), self.redo[:-1])

    @property
    def undo_what(self) -> str | None:
        return self.undo[-1].what if self.undo else None

    @property
    def redo_what(self) -> str | None:
        return self.redo[-1].what if self.redo else None

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "policy": self.policy,
                "undo": [s.to_json() for s in self.undo], "redo": [s.to_json() for s in self.redo]}

    @classmethod
    def from_json(cls, doc: dict) -> "Draft":
        doc = check_format(doc, cls.KIND, cls.FORMAT_VERSION, "draft")
        if not isinstance(doc["policy"], dict):
            raise TypeError("the draft's policy is an object")
        return cls(doc["policy"], tuple(Step.from_json(s) for s in doc.get("undo") or [])[-MAX_UNDO:],
                   tuple(Step.from_json(s) for s in doc.get("redo") or [])[-MAX_UNDO:])


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def save_draft(ws: Workspace, project_id: str, key: str, draft: Draft) -> Path:
    return atomic_write_json(draft_path(ws, project_id, key), draft.to_json())


def load_draft(ws: Workspace, project_id: str, key: str) -> Draft | None:
    """The saved draft, None if there is none; a MixprecError if its file is damaged."""
    return _load(draft_path(ws, project_id, key), "draft policy", Draft.from_json)
