"""State that survives a reload: a dashboard *project* (the model with its display name, data,
input shapes, deployment target and a few kept settings such as the run label) and, per model and
calibration data, the *draft* policy being edited with its undo and redo history. Both live in
the workspace under a project id that the dashboard keeps in the URL (``?project=<id>``), so a
reload or a shared link restores them on every page.

Layout (under the workspace root)::

    projects/<id>/project.json        the SavedProject record (its ProjectSource, name and settings)
    projects/<id>/drafts/<key>.json   one Draft per model + calibration data (key: draft_key)
    projects/<id>/drafts/<key>.lock   its lock (``fcntl.flock``): one read-check-write of the draft at a time
    projects/<id>/project.lock        the project file's lock, likewise

Writes are atomic (``core.workspace``). Undo and redo steps store only what an edit changed (the
layers' previous precisions and the policy's other fields), at most ``MAX_UNDO`` of them.

Two sessions (browser tabs) on one project write the same files, and neither loses the other's edits.
A draft carries a ``version``, one more at every write. A session writes its edit with
:func:`commit_draft`, a compare-and-swap under the draft's lock: if the stored draft is still the
version the session edited, the edit is written; if another session wrote meanwhile, the session's
change (the layers and fields it changed) is applied to the newer draft, one undoable step on its
history. Where both changed the same layer or field differently, the other session's value stays and
the session is told (:class:`DraftWrite`'s ``conflicts``): nothing is dropped without a word. Undo and
redo (:func:`update_draft`) work on the stored draft under the lock. The project file is merged the
same way (:func:`merge_save_project`: the fields and settings this session changed, over the stored
ones). A session sees another's edits when the file's stamp (:func:`file_stamp`) changes. No Streamlit
here: the pages call these through ``ui.saved_project`` and ``ui.draft``."""
from __future__ import annotations

import fcntl
import json
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar

from core.errors import MixprecError
from core.project import ProjectSource
from core.records import check_format
from core.workspace import Workspace, atomic_write_json, sha256_bytes, write_error

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


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime in ns, size, inode) of a stored file, None if there is none: a cached read is still good
    while its stamp is unchanged (every atomic write is a new file, so a new inode, even when two writes
    of the same size fall in one tick of the file system's clock)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


@contextmanager
def _locked(lock: Path):
    """An exclusive ``fcntl.flock`` on the file ``lock`` (created beside what it guards) for one
    read-check-write; every process and thread that writes it takes it (each open is its own lock)."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock, "a+b")
    except OSError as e:
        raise write_error(lock, e) from e
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    path = project_path(ws, project.id)
    with _locked(path.with_name("project.lock")):
        return atomic_write_json(path, project.to_json())


def _merged_map(base: dict, new: dict, stored: dict) -> dict:
    """``stored`` with the keys this session changed (``base`` → ``new``: set, changed or removed)."""
    out = dict(stored)
    for k in {*base, *new}:
        if k not in new:
            out.pop(k, None)
        elif k not in base or not _same(base[k], new[k]):
            out[k] = new[k]
    return out


def merge_save_project(ws: Workspace, base: SavedProject | None, new: SavedProject) -> SavedProject:
    """Save ``new``, this session's project made from ``base`` (the project as this session last read or saved
    it; None: it had none), over what is stored now, under the project's lock: what this session changed is its
    own — its source (model, data, shapes, target… as one: the parts of two sources never mix) with the model's
    name, each kept setting and each per-model source — and the rest stays as another session (tab) saved it
    meanwhile. Returns the project written."""
    path = project_path(ws, new.id)
    with _locked(path.with_name("project.lock")):
        try:
            stored = load_project(ws, new.id)
        except MixprecError:
            stored = None  # a damaged file is replaced (the session said so when it read it)
        out = new
        if stored is not None and base is not None:
            b, n, s = base.to_json(), new.to_json(), stored.to_json()
            source_keys = list(new.source.to_json())
            doc = {**s, **{k: n[k] for k in ("kind", "format_version", "id")}}
            if any(not _same(b.get(k), n.get(k)) for k in source_keys):
                doc.update({k: n[k] for k in (*source_keys, "model_name")})
            elif not _same(b.get("model_name"), n["model_name"]) and s.get("model") == n.get("model"):
                doc["model_name"] = n["model_name"]
            for k in ("settings", "models"):
                doc[k] = _merged_map(b[k], n[k], s[k])
            out = SavedProject.from_json(doc)
        now = time.time()
        out = replace(out, created=(stored.created if stored is not None else 0) or out.created or now, updated=now)
        atomic_write_json(path, out.to_json())
        return out


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
    version: int = field(default=0, compare=False)  # of the stored file: 0 never stored, one more at each write

    def edited(self, policy: dict, what: str) -> "Draft":
        if _same(policy, self.policy):
            return self
        return Draft(policy, (*self.undo, _step(what, self.policy, policy))[-MAX_UNDO:], (), self.version)

    def undone(self) -> "Draft":
        """The draft before its last edit (unchanged if there is nothing to undo)."""
        if not self.undo:
            return self
        step = self.undo[-1]
        before = _apply(self.policy, step)
        return Draft(before, self.undo[:-1], (*self.redo, _step(step.what, self.policy, before)), self.version)

    def redone(self) -> "Draft":
        if not self.redo:
            return self
        step = self.redo[-1]
        after = _apply(self.policy, step)
        return Draft(after, (*self.undo, _step(step.what, self.policy, after)), self.redo[:-1], self.version)

    @property
    def undo_what(self) -> str | None:
        return self.undo[-1].what if self.undo else None

    @property
    def redo_what(self) -> str | None:
        return self.redo[-1].what if self.redo else None

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "version": self.version,
                "policy": self.policy, "undo": [s.to_json() for s in self.undo],
                "redo": [s.to_json() for s in self.redo]}

    @classmethod
    def from_json(cls, doc: dict) -> "Draft":
        doc = check_format(doc, cls.KIND, cls.FORMAT_VERSION, "draft")
        if not isinstance(doc["policy"], dict):
            raise TypeError("the draft's policy is an object")
        version = doc.get("version") or 0  # a file written before versions: 0
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise TypeError("the draft's version is a count")
        return cls(doc["policy"], tuple(Step.from_json(s) for s in doc.get("undo") or [])[-MAX_UNDO:],
                   tuple(Step.from_json(s) for s in doc.get("redo") or [])[-MAX_UNDO:], version)


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def load_draft(ws: Workspace, project_id: str, key: str) -> Draft | None:
    """The saved draft, None if there is none; a MixprecError if its file is damaged."""
    return _load(draft_path(ws, project_id, key), "draft policy", Draft.from_json)


@contextmanager
def _draft_locked(ws: Workspace, project_id: str, key: str):
    """The draft's lock held; yields (its path, the stored draft or None: none, or a damaged file, which
    the write replaces)."""
    path = draft_path(ws, project_id, key)
    with _locked(path.with_suffix(".lock")):
        try:
            stored = _load(path, "draft policy", Draft.from_json)
        except MixprecError:
            stored = None
        yield path, stored


def _write(path: Path, draft: Draft, stored: Draft | None) -> Draft:
    """``draft`` written as the version after ``stored``'s (the lock held)."""
    out = replace(draft, version=(stored.version if stored is not None else 0) + 1)
    atomic_write_json(path, out.to_json())
    return out


def save_draft(ws: Workspace, project_id: str, key: str, draft: Draft) -> Draft:
    """Write ``draft`` over whatever is stored (a reset, a test): the version after the stored one. Returns
    the draft written. A session's edit goes through :func:`commit_draft`, which loses no other session's."""
    with _draft_locked(ws, project_id, key) as (path, stored):
        return _write(path, draft, stored)


@dataclass(frozen=True)
class DraftWrite:
    """What :func:`commit_draft` did. ``draft``: the draft stored now (with its ``version``), what the
    session shows from here; ``stamp``: its file's stamp, taken under the lock; ``merged``: the layers and
    fields another session changed since this session's base, kept beside this session's change;
    ``conflicts``: those both changed to different values, where the other session's value stays and this
    session's change of them was not applied (say so: applying it again overwrites)."""

    draft: Draft
    stamp: tuple | None = None
    merged: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()


_ABSENT = object()


def _changes(old: dict, new: dict) -> dict:
    """What turns policy document ``old`` into ``new``: ``("layer", name)`` -> its precision (None: removed)
    for each layer that differs, ``("field", key)`` -> its value (``_ABSENT``: removed) for every other field."""
    out = {}
    ol, nl = old.get("layers") or {}, new.get("layers") or {}
    for n in (*ol, *(n for n in nl if n not in ol)):
        if ol.get(n) != nl.get(n):
            out[("layer", n)] = nl.get(n)
    for k in (*old, *(k for k in new if k not in old)):
        if k == "layers":
            continue
        if (k in old) != (k in new) or not _same(old[k], new[k]):
            out[("field", k)] = new.get(k, _ABSENT)
    return out


def _changed(doc: dict, changes: dict) -> dict:
    doc = {**doc, "layers": dict(doc.get("layers") or {})}
    for (kind, name), value in changes.items():
        where = doc["layers"] if kind == "layer" else doc
        if value is None or value is _ABSENT:
            where.pop(name, None)
        else:
            where[name] = value
    return doc


def _label(change_key: tuple) -> str:
    return change_key[1] if change_key[0] == "layer" else f"the policy's {change_key[1]}"


def _same_value(a, b) -> bool:
    return a is b or (a is not _ABSENT and b is not _ABSENT and _same(a, b))


def commit_draft(ws: Workspace, project_id: str, key: str, base: Draft, new: Draft, what: str) -> DraftWrite:
    """Save ``new``, a session's draft made from ``base`` (the stored draft it last read or wrote, with its
    ``version``; version 0: none was stored), as a compare-and-swap on the version under the draft's lock.
    Still ``base``'s version stored: ``new`` is written (its own history). Another session wrote
    meanwhile: this session's change (``base`` → ``new``, by layer and field) is applied to the stored draft
    as one undoable step ``what``, except where the other changed the same layer or field to another value
    (``conflicts``: its value stays). Returns what was done (:class:`DraftWrite`)."""
    with _draft_locked(ws, project_id, key) as (path, stored):
        if stored is None or stored.version == base.version:  # (none stored: a first write, or a file deleted)
            out = _write(path, new, stored)
            return DraftWrite(out, file_stamp(path))
        mine = _changes(base.policy, new.policy)
        theirs = _changes(base.policy, stored.policy)
        conflicts = {k: v for k, v in mine.items() if k in theirs and not _same_value(theirs[k], v)}
        applied = {k: v for k, v in mine.items() if k not in conflicts}
        merged = tuple(_label(k) for k in theirs if k not in mine)
        result = stored.edited(_changed(stored.policy, applied), what)
        out = _write(path, result, stored) if result is not stored else stored
        return DraftWrite(out, file_stamp(path), merged, tuple(_label(k) for k in conflicts))


def update_draft(ws: Workspace, project_id: str, key: str, change: Callable[[Draft | None], Draft | None]
                 ) -> tuple[Draft | None, Draft | None, tuple | None]:
    """Apply ``change`` to the stored draft (None: there is none) under its lock and write what it returns
    unless that is None or the same draft (e.g. an undo with nothing to undo). Returns (the stored draft before, the
    draft stored after, its file's stamp): undo and redo of the shared history, on its latest version."""
    with _draft_locked(ws, project_id, key) as (path, stored):
        after = change(stored)
        if after is None or after is stored:
            return stored, stored, file_stamp(path)
        out = _write(path, after, stored)
        return stored, out, file_stamp(path)
