"""The results store: where each stored result lives in the workspace, under which key, and
how it is read back as its typed record. Pages, the CLI and jobs save and load through here.

Layout (under the workspace root)::

    rankings/<key>.json     a cumulative Ranking or an isolated / leave-one-out Sensitivity
                            (key: model, calibration data, evaluation data, method and mode)
    searches/<key>.json     a SearchResult (key: as above, plus the budget and the smoothing)
    runs/<id>/              a build (core.runs writes it): policy.json, metrics.json, per_layer.csv, …
    models/<sha256>.onnx    uploaded models;  data/<sha256>.npz  uploaded data

Loading gives the record, None if it was never computed, or a MixprecError that says what to do
when the stored document is of an older or foreign format (never a silent patch)."""
from __future__ import annotations

import json
from pathlib import Path

from .data import load_npz
from .errors import MixprecError
from .model import model_from_bytes
from .policy import Policy, policy_from_text
from .project import Project
from .runs import POLICY_FILE, RunResult, list_runs, load_run, load_run_per_layer, run_dir
from .search import SearchResult
from .sensitivity import Ranking, Sensitivity
from .workspace import Workspace, atomic_write_bytes, atomic_write_json, sha256_bytes

__all__ = ["ranking_key", "project_ranking_key", "ranking_path", "save_ranking", "load_ranking", "save_sensitivity",
           "load_sensitivity", "cached_ranking", "search_path", "save_search", "load_search", "run_dir", "list_runs", "load_run",
           "load_run_per_layer", "run_policy", "last_built_policy", "store_upload", "RunResult"]


# --- keys and paths ------------------------------------------------------------------------------
def ranking_key(model_sha256: str, calib_sha256: str, eval_sha256: str, method: str) -> str:
    """Rankings are stored per model, calibration data, evaluation data and calibration method."""
    return sha256_bytes(f"{model_sha256}|{calib_sha256}|{eval_sha256}|{method}".encode())[:32]


def project_ranking_key(project: Project, method: str = "minmax", mode: str = "cumulative") -> str:
    """Key of a stored analysis of ``project``: the cumulative (Polygraphy) ranking, an
    ``isolated`` / ``leave-one-out`` sensitivity, or any other analysis named by ``mode``."""
    return ranking_key(project.model.sha256, project.calib_data.sha256, project.eval_data.sha256,
                       method if mode == "cumulative" else f"{mode}:{method}")


def ranking_path(ws: Workspace, key: str) -> Path:
    return ws.sub("rankings") / f"{key}.json"


def search_path(ws: Workspace, project: Project, budget: str, smooth: bool) -> Path:
    """Where the search of this model, data, budget (normalised, ``str(Budget)``) and smoothing is stored."""
    key = f"{budget}|smooth={bool(smooth)}|target={project.target}"  # the target decides the search's objective
    return ws.sub("searches") / f"{project_ranking_key(project, key, 'search')}.json"


def _read(path: Path, what: str) -> dict | None:
    """The JSON document at ``path``; None if there is none; a MixprecError if it is unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise MixprecError(f"cannot read the stored {what} {path.name}: {e.strerror}",
                           "check the workspace folder's permissions") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise MixprecError(f"the stored {what} {path.name} is not valid JSON",
                           f"delete {path} and compute it again") from e


def _record(from_json, doc: dict, path: Path, what: str):
    """``from_json(doc)``; a document of the right kind and format that is damaged (a field missing
    or of the wrong type) is a MixprecError, never a traceback."""
    try:
        return from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise MixprecError(f"the stored {what} {path.name} is damaged ({type(e).__name__}: {e})",
                           f"delete {path} and compute it again") from e


def _legacy_csv(path: Path, what: str) -> None:
    """Rankings were stored as CSV before they had a record: say so instead of ignoring it."""
    old = path.with_suffix(".csv")
    if old.is_file():
        raise MixprecError(f"the stored {what} is in the CSV format of an older mixprec, which this version "
                           "does not read", "compute it again (the new result replaces the old file)")


# --- rankings and sensitivity tables ---------------------------------------------------------------
def save_ranking(ws: Workspace, project: Project, ranking: Ranking) -> Path:
    path = ranking_path(ws, project_ranking_key(project, ranking.method))
    atomic_write_json(path, ranking.to_json())
    path.with_suffix(".csv").unlink(missing_ok=True)
    return path


def load_ranking(ws: Workspace, project: Project, method: str = "minmax") -> Ranking | None:
    """The stored cumulative ranking of ``project`` and ``method``, or None if it was never computed."""
    path = ranking_path(ws, project_ranking_key(project, method))
    doc = _read(path, "ranking")
    if doc is None:
        _legacy_csv(path, "ranking")
        return None
    return _record(Ranking.from_json, doc, path, "ranking")


def cached_ranking(project: Project, method: str = "minmax") -> Ranking | None:
    """The stored cumulative ranking a run's quality warning names layers from; None when there is
    none or it cannot be read (a warning is no place to fail)."""
    try:
        return load_ranking(project.ws, project, method)
    except MixprecError:
        return None


def save_sensitivity(ws: Workspace, project: Project, sens: Sensitivity) -> Path:
    path = ranking_path(ws, project_ranking_key(project, sens.method, sens.mode))
    atomic_write_json(path, sens.to_json())
    path.with_suffix(".csv").unlink(missing_ok=True)
    return path


def load_sensitivity(ws: Workspace, project: Project, method: str = "minmax",
                     mode: str = "isolated") -> Sensitivity | None:
    """The stored isolated / leave-one-out sensitivity, or None if it was never computed."""
    path = ranking_path(ws, project_ranking_key(project, method, mode))
    doc = _read(path, f"{mode} sensitivity")
    if doc is None:
        _legacy_csv(path, f"{mode} sensitivity")
        return None
    return _record(Sensitivity.from_json, doc, path, f"{mode} sensitivity")


# --- searches ------------------------------------------------------------------------------------
def save_search(ws: Workspace, project: Project, result: SearchResult, smooth: bool) -> Path:
    return atomic_write_json(search_path(ws, project, str(result.budget), smooth), result.to_json())


def load_search(ws: Workspace, project: Project, budget: str, smooth: bool) -> SearchResult | None:
    """The stored search for this (normalised) budget and smoothing, or None if it was never run."""
    path = search_path(ws, project, budget, smooth)
    doc = _read(path, "search")
    return None if doc is None else _record(lambda d: SearchResult.from_json(d, project.model, project.layers), doc,
                                            path, "search")


# --- runs (written by core.runs.build_and_measure) -----------------------------------------------
def run_policy(project: Project, run: str | Path) -> Policy:
    """The policy a stored run was built from (``run``: its directory), validated against ``project``."""
    path = Path(run) / POLICY_FILE
    return policy_from_text(path.read_text(), project.model, project.layers, source=path.name)


def last_built_policy(project: Project) -> Policy | None:
    """The policy of the newest stored run of this model, or None."""
    runs = list_runs(project.ws, project.model.sha256)
    for run_id in runs["run_id"]:
        try:
            return run_policy(project, run_dir(project.ws, run_id))
        except (OSError, MixprecError):
            continue
    return None


# --- uploads -------------------------------------------------------------------------------------
def store_upload(ws: Workspace, data: bytes, filename: str, kind: str, model=None) -> Path:
    """Validate an uploaded ``model`` (ONNX) or ``data`` (.npz, checked against ``model``) and
    store it in the workspace by content hash: ``models/<sha256>.onnx`` or ``data/<sha256>.npz``."""
    sha = sha256_bytes(data)
    if kind == "model":
        path = ws.models / f"{sha}.onnx"
        model_from_bytes(data, path, name=Path(filename).stem)
    elif kind == "data":
        load_npz(data, model, name=filename)
        path = ws.sub("data") / f"{sha}.npz"
    else:
        raise ValueError(kind)
    if not path.exists():
        atomic_write_bytes(path, data)
    return path
