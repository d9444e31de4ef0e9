"""The workspace: ``workspace/`` next to the code, or ``$MIXPREC_WORKSPACE``; and its layout.

This module names every folder of the workspace (:data:`FOLDERS`, the :class:`Workspace` methods), and
only this one: no other module spells a folder name (``tests/unit/test_workspace_layout.py`` checks it). It
sits at the base of core/ so that every wing may ask it — the model wing for the folders of models with
external weights, quant for calibration caches, measure for runs and FP32 references, sensitivity and
search for their caches — while reading and writing the stored results (rankings, sensitivity tables,
searches, runs, GPUs, saved projects) is the store wing's (``core.store.results``, ``core.store.runs``,
``core.store.drafts``); the wings below the store may not import it (``tests/unit/test_architecture.py``).

Layout::

    models/<sha256>/<name>.onnx   uploaded models, by content hash, under the user's file name
    data/<sha256>/<name>.npz      uploaded data, likewise
    samples/<name>-v<N>/          materialised samples (model.onnx, calib.npz, eval.npz)
    external/<sha256[:32]>/       a model whose weights stay in external files: its normalised graph
    external/hashes/<key>.json    the sha256 of big files, by path, inode, size and mtime
    calib/<key>.json              calibration caches (key = hashes + method + format version)
    reference/<backend>/<sha256[:16]>/   the FP32 reference engine of a model and its outputs
    engines/<backend>/<key>.plan  the engine cache (TensorRT)
    runs/<id>/                    one build: policy.json, metrics.json, per_layer.csv, compiled.onnx, engine
                                  artifact, profile (built in runs/.tmp-<id>/, renamed when complete)
    rankings/<key>.json           cumulative rankings and isolated / leave-one-out sensitivity tables (each
                                  written once: the search reads the isolated table from here too)
    searches/<key>.json           searches under a budget
    search/<sha256[:16]>/         the search's builds: switchable models, latency/<backend>/<precision>/
                                  (and, from older versions, sensitivity-<mode>-<key>.json: read, then moved)
    jobs/<id>.json                background job records
    gpus/<key>.json               GPUs the user describes
    gpu_calibrations/<key>.v<N>.json   the cost model calibrated on a GPU
    projects/<id>/                a saved dashboard project: project.json, drafts/<key>.json
    policies/                     policies the CLI's search writes when no --out is given
    scratch/                      the diagnostic job kinds' files (tests)
    tmp/<prefix><random>/         temp work (a calibration's model copies, a trial pool's data), claimed by
                                  its process: removed when done, or swept once that process is gone

Where each stored result lives and how it is read back: ``core.store.results`` and ``core.store.runs``.

Every write is atomic: a temp file in the same folder, then ``os.replace``. A write that fails
(a full disk, a read-only folder) removes its temp file and raises a MixprecError naming the
folder, the workspace and the space needed (:func:`write_error`). A folder written in several steps
(a run) is built under a temp name with an owner file and renamed when complete
(:func:`claim_folder`); one that no live process owns is removed (:func:`clean_temp_runs`). Temp work
never goes to the system's temp folder: a :class:`TempFolder` in ``tmp/`` (or a model's ``external/<sha>/tmp/``)
is claimed the same way, and one whose process was killed is removed by the next one made there and when a
job manager starts (:func:`clean_temp_folders`).

Processes that work for another (a trial pool's workers, a job's child) die with it: :func:`die_with_parent`
(the kernel's parent-death signal) and :func:`exit_when_gone` (a thread that watches the owner).

Cache reads never fail a build: a corrupt cache file is removed and computed again, with a note
(:func:`discard_corrupt`, :func:`cache_note`; :func:`take_notes` hands the notes to the CLI, the
job record or the page). Files the user names on the server (models, data, policies) are read
through :func:`read_user_file`: regular files only, size-limited, and confined under
``$MIXPREC_MODEL_ROOT`` (plus the workspace) when it is set.
"""
from __future__ import annotations

import ctypes
import functools
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_ready
from pathlib import Path

from core.errors import MixprecError

REPO_ROOT = Path(__file__).resolve().parent.parent
SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
STALE_TEMP_SECONDS = 3600  # an atomic write's temp file older than this is a leftover of a killed process
_log = logging.getLogger("mixprec")


def default_root() -> Path:
    """The workspace folder (``$MIXPREC_WORKSPACE`` or ``workspace/`` next to the code), not created."""
    env = os.environ.get("MIXPREC_WORKSPACE")
    # Resolved once per (setting, working folder): every dashboard rerun asks, and resolve() walks
    # the path's links on each call (the largest cost of a rerun under load, issue 23 fault 10).
    relative = bool(env) and not os.path.isabs(os.path.expanduser(env))
    return _resolved_root(env or "", os.getcwd() if relative else "")


@functools.lru_cache(maxsize=32)
def _resolved_root(env: str, cwd: str) -> Path:
    return (Path(env).expanduser() if env else REPO_ROOT / "workspace").resolve()


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    n = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space of the file system holding ``path`` (its nearest existing parent); None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _where(path: Path) -> str:
    root = default_root()
    inside = path == root or root in path.parents
    return f"{path.parent} (the workspace {root})" if inside else str(path.parent)


def is_space_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full disk or quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS:
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def space_error(path: str | os.PathLike, needed: int | None = None) -> MixprecError:
    """The error of a write that ran out of space in ``path``'s folder."""
    path = Path(path)
    free = free_bytes(path)
    need = f"about {human_bytes(needed)} needed, " if needed else ""
    have = f"{human_bytes(free)} free" if free is not None else "free space unknown"
    return MixprecError(f"no space left to write {path.name} in {_where(path)}: {need}{have}",
                        "free space on that disk, or set MIXPREC_WORKSPACE to a folder on a disk with more room")


def write_error(path: str | os.PathLike, exc: OSError, needed: int | None = None) -> MixprecError:
    """A MixprecError for a failed write of ``path``: out of space, read-only, permissions, other."""
    path = Path(path)
    if is_space_error(exc):
        return space_error(path, needed)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return MixprecError(f"cannot write {path.name} in {_where(path)}: {exc.strerror}",
                            "make the folder writable, or set MIXPREC_WORKSPACE to a writable folder")
    return MixprecError(f"cannot write {path.name} in {_where(path)}: {exc.strerror or exc}",
                        "check the disk and the folder, or set MIXPREC_WORKSPACE to another folder")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; on any failure the temp file is removed, and an
    OSError (full disk, read-only folder…) becomes a MixprecError (:func:`write_error`)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(e, OSError):
            raise write_error(path, e, len(data)) from e
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_save_npz(path: str | os.PathLike, arrays: dict) -> Path:
    import numpy as np  # third-party, heavy: only when an .npz is written

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


# --- notes about caches (a corrupt cache is recomputed, never fatal) --------------------------------
_NOTES: list[str] = []
_NOTES_LOCK = threading.Lock()


def cache_note(text: str) -> str:
    """Record a note for the user (e.g. a corrupt cache that is computed again); see :func:`take_notes`."""
    with _NOTES_LOCK:
        if text not in _NOTES:
            _NOTES.append(text)
            del _NOTES[:-50]
    _log.warning(text)
    return text


def take_notes() -> list[str]:
    """The notes recorded since the last call (and forget them): the CLI prints them on stderr, a job
    stores them in its record, a page shows them."""
    with _NOTES_LOCK:
        out = list(_NOTES)
        _NOTES.clear()
    return out


def discard_corrupt(path: str | os.PathLike, what: str, reason: object = "") -> str:
    """Remove the corrupt cache file ``path`` (the caller computes it again) and note it."""
    path = Path(path)
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
    why = f" ({str(reason)[:200]})" if str(reason) else ""
    return cache_note(f"the cached {what} {path.name} was unreadable{why}; it was removed and is computed again")


def file_stamp(path: str | os.PathLike) -> dict | None:
    """``{"size", "mtime_ns"}`` of a file (None if it is missing): a cache records the stamps of the
    files it wrote, and a read checks them (a file rewritten, truncated or replaced fails the check)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def stamps_match(stamps: dict, folder: str | os.PathLike) -> bool:
    """Whether every ``{file name: stamp}`` of ``stamps`` still matches the file in ``folder``."""
    if not isinstance(stamps, dict) or not stamps:
        return False
    return all(isinstance(v, dict) and file_stamp(Path(folder) / k) == v for k, v in stamps.items())


def sweep_stale_temp(root: str | os.PathLike, max_age: float = STALE_TEMP_SECONDS, depth: int = 3) -> list[Path]:
    """Remove the temp files of atomic writes (``.<name>.<random>.tmp``) older than ``max_age``
    under ``root`` (``depth`` levels): leftovers of processes killed while writing."""
    removed, now = [], time.time()
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).relative_to(root).parts) >= depth:
            dirnames[:] = []
        for name in filenames:
            p = Path(dirpath) / name
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    if now - p.stat().st_mtime > max_age:
                        p.unlink()
                        removed.append(p)
                except OSError:
                    pass
    return removed


# --- files the user names on the server -----------------------------------------------------------
SPECIAL_ROOTS = ("/proc", "/sys", "/dev")


def allowed_roots(ws_root: str | os.PathLike | None = None) -> list[Path] | None:
    """Where user-named files may live: None (anywhere) unless ``$MIXPREC_MODEL_ROOT`` is set (a team
    server); then under it, or under the workspace (uploads, samples)."""
    env = os.environ.get("MIXPREC_MODEL_ROOT")
    if not env:
        return None
    roots = [Path(r).expanduser().resolve() for r in env.split(os.pathsep) if r]
    return roots + [Path(ws_root).resolve() if ws_root else default_root()]


def check_confined(path: str | os.PathLike, what: str, ws_root=None) -> None:
    """A MixprecError if ``$MIXPREC_MODEL_ROOT`` is set and ``path`` (symlinks resolved) is outside it
    and the workspace."""
    roots = allowed_roots(ws_root)
    if roots is None:
        return
    try:
        real = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        real = Path(os.path.abspath(Path(path).expanduser()))
    if not any(real == r or r in real.parents for r in roots):
        raise MixprecError(f"the {what} {path} is outside the folders this server reads ({', '.join(map(str, roots))})",
                           "put the file under MIXPREC_MODEL_ROOT, or upload it")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_user_path(path: str | os.PathLike, what: str, max_bytes: int, ws_root=None) -> Path:
    """``path`` resolved, if it is a regular, non-empty file of at most ``max_bytes`` where user
    files may live (:func:`allowed_roots`); else a MixprecError that says what it is. Never opens it."""
    path = Path(path).expanduser()
    check_confined(path, what, ws_root)  # first: say nothing about files outside the allowed folders
    try:
        real = path.resolve(strict=True)
        st = os.stat(real)
    except FileNotFoundError as e:
        raise MixprecError(f"the {what} {path} does not exist", f"check the path of the {what}") from e
    except (OSError, RuntimeError) as e:
        raise MixprecError(f"cannot read the {what} {path}: {getattr(e, 'strerror', None) or e}",
                           "check the path and its permissions") from e
    special = next((r for r in SPECIAL_ROOTS if str(real) == r or str(real).startswith(r + "/")), None)
    if special:
        raise MixprecError(f"the {what} {path} is a system file under {special}, not a file of yours",
                           f"give the path of a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise MixprecError(f"the {what} {path} is {_kind(st.st_mode)}, not a regular file",
                           f"give the path of a {what} file")
    if st.st_size == 0:
        raise MixprecError(f"the {what} {path} is empty (0 bytes)", f"give a complete {what} file")
    if st.st_size > max_bytes:
        raise MixprecError(f"the {what} {path} is {human_bytes(st.st_size)}, more than the {human_bytes(max_bytes)} "
                           f"this server reads", f"give a smaller file (or raise the limit on a server you run)")
    return real


def read_user_file(path: str | os.PathLike, what: str, max_bytes: int, ws_root=None) -> bytes:
    """The bytes of a file the user names (see :func:`check_user_path`), read without blocking on a
    file swapped for a FIFO meanwhile and never beyond ``max_bytes``."""
    real = check_user_path(path, what, max_bytes, ws_root)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise MixprecError(f"the {what} {path} is not a regular file", f"give the path of a {what} file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise MixprecError(f"cannot read the {what} {path}: {e.strerror or e}",
                           "check the file and its permissions") from e
    if len(data) > max_bytes:
        raise MixprecError(f"the {what} {path} is larger than the {human_bytes(max_bytes)} this server reads",
                           "give a smaller file")
    return data


def env_bytes(name: str, default: int) -> int:
    """A byte count from the environment (``8G``, ``512M``, ``1000000``), else ``default``."""
    text = os.environ.get(name, "").strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return default
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    try:
        return int(float(text[:-1] if mult > 1 else text) * mult)
    except ValueError as e:
        raise MixprecError(f"{name}={os.environ[name]!r} is not a size", f"write e.g. {name}=8G") from e


# --- the layout -----------------------------------------------------------------------------------
# Every folder directly under the workspace root (what it holds: the module docstring's layout).
FOLDERS = ("models", "data", "samples", "external", "calib", "reference", "engines", "runs", "rankings",
           "searches", "search", "jobs", "gpus", "gpu_calibrations", "projects", "policies", "scratch", "tmp")
UPLOAD_FOLDERS = {"model": "models", "data": "data"}  # an upload's kind -> its folder
# The files of a run folder runs/<id>/ (the compiled model and the engine artifacts are the backend's)
POLICY_FILE, METRICS_FILE, PER_LAYER_FILE = "policy.json", "metrics.json", "per_layer.csv"
TMP_PREFIX, OWNER_FILE = ".tmp-", ".owner.json"  # a build's folder until it is complete, and who builds it
OWNERLESS_GRACE_SECONDS = 60.0  # a temp folder without an owner file younger than this is just being created
OTHER_HOST_GRACE_SECONDS = 86400.0  # a temp folder of another host (a shared workspace) is kept this long


_MADE_ROOTS: set[Path] = set()  # workspace roots Workspace.default has seen as folders


@dataclass(frozen=True)
class Workspace:
    """A workspace folder and its layout: each method names one folder (:data:`FOLDERS`) or a file in
    it. Folders are created when asked for, except where a method says it only names the path (a
    reader that must not create what is not there)."""

    root: Path

    @classmethod
    def default(cls) -> "Workspace":
        root = default_root()  # resolved
        if root in _MADE_ROOTS:  # created by this process already: no stat at every call (every page run asks)
            return cls(root)
        if not root.is_dir():
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise MixprecError(
                    f"cannot create the workspace folder {root}: {e.strerror}",
                    "set MIXPREC_WORKSPACE to a writable folder",
                ) from e
        _MADE_ROOTS.add(root)
        return cls(root)

    def sub(self, *parts: str) -> Path:
        """``root/parts…``, created. The layout's own helper: other modules ask a named method."""
        p = self.root.joinpath(*parts)
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(p / ".", e) from e
        return p

    def folder(self, name: str, *parts: str, create: bool = True) -> Path:
        """The folder ``name`` of :data:`FOLDERS` (and ``parts`` under it); created unless ``create`` is False."""
        if name not in FOLDERS:
            raise ValueError(f"{name!r} is not a folder of the workspace layout")
        return self.sub(name, *parts) if create else self.root.joinpath(name, *parts)

    # inputs: uploads, samples, models with external weights
    @property
    def models(self) -> Path:
        return self.folder("models")

    def upload_dir(self, kind: str, sha256: str) -> Path:
        """Where an upload of ``kind`` (``model`` / ``data``) with this content hash is kept (not created)."""
        return self.folder(UPLOAD_FOLDERS[kind]) / sha256

    @property
    def samples(self) -> Path:
        return self.folder("samples")

    def external_dir(self, model_sha256: str) -> Path:
        """The folder of a model whose weights stay external (its normalised graph, its own data file)."""
        return self.folder("external", model_sha256[:32])

    @property
    def file_hashes(self) -> Path:
        """The cached sha256 of big files (``core.model.external.file_sha256``)."""
        return self.folder("external", "hashes")

    # caches below the store: calibration, references, engines, the search's builds
    @property
    def calib(self) -> Path:
        return self.folder("calib")

    def reference_dir(self, backend: str, model_sha256: str, create: bool = True) -> Path:
        """The FP32 reference engine of a model on ``backend``, and its outputs."""
        return self.folder("reference", backend, model_sha256[:16], create=create)

    def engine_cache(self, backend: str) -> Path:
        """The engines ``backend`` built, by key (TensorRT's engine cache)."""
        return self.folder("engines", backend)

    def search_dir(self, model_sha256: str, *parts: str, create: bool = True) -> Path:
        """The search's builds of a model: its switchable models and (``latency_dir``) latency builds."""
        return self.folder("search", model_sha256[:16], *parts, create=create)

    def latency_dir(self, model_sha256: str, backend: str, precision: str) -> Path:
        """The build the search's latency model profiles: every eligible layer at ``precision``."""
        return self.search_dir(model_sha256, "latency", backend, precision)

    def legacy_sensitivity_file(self, model_sha256: str, mode: str, key: str) -> Path:
        """Where versions before the layout kept an isolated / leave-one-out table (its copy in
        ``rankings/`` is the one now): read if it is there, never written (not created)."""
        return self.search_dir(model_sha256, create=False) / f"sensitivity-{mode}-{key}.json"

    # runs
    @property
    def runs(self) -> Path:
        return self.folder("runs")

    def run_dir(self, run_id: str) -> Path:
        """The folder of a stored run: ``runs/<id>/`` (not created)."""
        return self.runs / run_id

    def temp_run_dir(self, run_id: str) -> Path:
        """The folder a run is built in until it is complete: ``runs/.tmp-<id>/`` (not created:
        :func:`claim_folder`)."""
        return self.runs / f"{TMP_PREFIX}{run_id}"

    # stored results (read and written by core.store)
    @property
    def rankings(self) -> Path:
        return self.folder("rankings")

    def ranking_file(self, key: str) -> Path:
        """A stored ranking or isolated / leave-one-out sensitivity table (key: :func:`analysis_key`)."""
        return self.rankings / f"{key}.json"

    def search_file(self, key: str) -> Path:
        """A stored search (key: :func:`analysis_key` of mode ``search``)."""
        return self.folder("searches") / f"{key}.json"

    @property
    def jobs(self) -> Path:
        return self.folder("jobs")

    def gpu_specs(self, create: bool = True) -> Path:
        """The GPUs the user describes, one ``<key>.json`` each."""
        return self.folder("gpus", create=create)

    def gpu_calibration_file(self, gpu_key: str, version: int) -> Path:
        """The cost model calibrated on a GPU, in the parameters' format ``version``."""
        return self.folder("gpu_calibrations") / f"{gpu_key}.v{version}.json"

    def project_dir(self, project_id: str) -> Path:
        """A saved dashboard project (``project.json``) (not created)."""
        return self.folder("projects", project_id, create=False)

    def drafts_dir(self, project_id: str) -> Path:
        """A saved project's drafts, one per model and calibration data (not created)."""
        return self.project_dir(project_id) / "drafts"

    @property
    def policies(self) -> Path:
        """Policies the CLI writes when not told where (``search`` without ``--out``)."""
        return self.folder("policies")

    @property
    def scratch(self) -> Path:
        """Files of the diagnostic job kinds."""
        return self.folder("scratch")

    @property
    def tmp(self) -> Path:
        """Temp work of running processes (:class:`TempFolder`), swept by :func:`clean_temp_folders`."""
        return self.folder("tmp")


def analysis_key(model_sha256: str, calib_sha256: str, eval_sha256: str, method: str,
                 mode: str = "cumulative") -> str:
    """The key a stored analysis of a model and its data goes under (``rankings/``, ``searches/``): the
    cumulative ranking of ``method``, an ``isolated`` / ``leave-one-out`` table (``mode``), a search…"""
    tag = method if mode == "cumulative" else f"{mode}:{method}"
    return sha256_bytes(f"{model_sha256}|{calib_sha256}|{eval_sha256}|{tag}".encode())[:32]


# --- folders written in several steps (a run): built under a temp name, claimed by their process --------
def process_start(pid) -> str | None:
    """The start time of process ``pid`` (from /proc, so a reused pid does not pass for it); None if gone (a
    zombie, dead but not yet reaped, is gone)."""
    try:
        fields = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[-1].split()
    except (OSError, ValueError, TypeError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _write_owner(folder: Path) -> None:
    (folder / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "start": process_start(os.getpid()),
                                                 "host": socket.gethostname()}))


def claim_folder(folder: Path) -> Path:
    """Create ``folder`` (a temp folder, e.g. :meth:`Workspace.temp_run_dir`) with an owner file naming
    this process, so that a clean-up spares it while the process lives. Raises the OSError."""
    folder.mkdir(parents=True)
    _write_owner(folder)
    return folder


def publish_folder(tmp: Path, final: Path) -> Path:
    """Rename the complete temp folder ``tmp`` (its owner file removed) to ``final``."""
    (tmp / OWNER_FILE).unlink(missing_ok=True)
    os.replace(tmp, final)
    return final


def _age(folder: Path) -> float:
    try:
        return time.time() - folder.stat().st_mtime
    except OSError:
        return float("inf")


def owned_by_live_process(folder: Path) -> bool:
    """Whether a live process builds in the temp ``folder`` (its owner file says which)."""
    try:
        doc = json.loads((folder / OWNER_FILE).read_text())
        pid, start = doc["pid"], doc["start"]
    except (OSError, ValueError, KeyError, TypeError):
        # no owner file (yet): a folder being created now, or a leftover of an older mixprec
        return _age(folder) < OWNERLESS_GRACE_SECONDS
    if doc.get("host", socket.gethostname()) != socket.gethostname():
        return _age(folder) < OTHER_HOST_GRACE_SECONDS  # its pid means nothing here
    return start is not None and process_start(pid) == start


def clean_temp_runs(ws: Workspace) -> list[Path]:
    """Remove the temp run folders (``runs/.tmp-<id>``) that no live process is building: leftovers of a
    build or a server that was killed. Called before each build and when a job manager starts."""
    removed = []
    for folder in ws.runs.glob(f"{TMP_PREFIX}*"):
        if folder.is_dir() and not owned_by_live_process(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


# --- temp work: in the workspace, claimed by its process, swept once that process is gone -------------
TEMP_PREFIX = "mixprec-"


def clean_temp_folders(root: Workspace | str | os.PathLike) -> list[Path]:
    """Remove the folders in ``root`` (a workspace: its ``tmp/``; or a model's ``external/<sha>/tmp``) that no
    live process owns (:func:`owned_by_live_process`): the temp work of a process that was killed. Files are
    left alone (an external model's spill files are swept by age, ``core.model.external.sweep_tmp``)."""
    root = root.tmp if isinstance(root, Workspace) else Path(root)
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for folder in entries:
        if folder.is_dir() and not folder.is_symlink() and not owned_by_live_process(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class TempFolder:
    """A temp folder in ``root`` (a workspace's ``tmp/``, or a folder given: a model's ``external/<sha>/tmp``
    beside its data files, so that links to them are hard links) with an owner file naming this process; removed
    by :meth:`cleanup` (or at the end of a ``with`` block, which gives its path as a str, as
    ``tempfile.TemporaryDirectory`` does). Making one first removes the folders in ``root`` whose process is gone
    (:func:`clean_temp_folders`): what a killed calibration or search left is swept at the next start."""

    def __init__(self, root: Workspace | str | os.PathLike, prefix: str = TEMP_PREFIX):
        root = root.tmp if isinstance(root, Workspace) else Path(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            clean_temp_folders(root)
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        except OSError as e:
            raise write_error(root / prefix, e) from e
        try:
            _write_owner(self.path)
        except OSError as e:
            shutil.rmtree(self.path, ignore_errors=True)
            raise write_error(self.path / OWNER_FILE, e) from e

    @property
    def name(self) -> str:
        return str(self.path)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> str:
        return str(self.path)

    def __exit__(self, *exc) -> None:
        self.cleanup()


# --- processes that die with the process they work for ------------------------------------------------
PR_SET_PDEATHSIG = 1  # linux/prctl.h
OWNER_WATCH_SECONDS = 0.5


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that started it) exits
    (Linux ``prctl(PR_SET_PDEATHSIG)``); False where that cannot be done (then :func:`exit_when_gone` alone
    watches). A parent already gone (this process is no longer the child of ``parent``, default: the parent
    it had when called) sends ``sig`` at once: the kernel only signals a death after the call."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def exit_when_gone(pid: int, start: str | None, sentinel: int | None = None, code: int = 1) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit(code)``, whatever its main thread is doing) once
    the process ``pid`` (started at ``start``, :func:`process_start`: a reused pid does not pass for it) is gone,
    or once ``sentinel`` (a file descriptor that becomes readable when the owner dies, e.g. a multiprocessing
    parent sentinel) is ready. The fallback of :func:`die_with_parent`, for a process whose parent is not the one
    it works for (a trial worker forked by multiprocessing's forkserver)."""
    def watch():
        while True:
            if sentinel is not None:
                ready = wait_ready([sentinel], timeout=OWNER_WATCH_SECONDS)
            else:
                time.sleep(OWNER_WATCH_SECONDS)
                ready = False
            if ready or (start is not None and process_start(pid) != start):
                os._exit(code)

    t = threading.Thread(target=watch, name=f"exit-when-{pid}-is-gone", daemon=True)
    t.start()
    return t


def detach_output(log: str | os.PathLike | None = None) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, and so ``sys.stdout`` and C libraries'
    output) at ``log`` (appended), or at /dev/null: a helper process must not hold its parent's stdout, else a
    pipeline reading the parent waits for the helper too (and a killed parent's output never ends)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    fd = os.open(str(log) if log else os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
