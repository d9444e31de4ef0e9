"""The stored runs: listing them, reading one back (its document, per-layer table and policy), and
the newest policy built for a model. A build writes its run (``core.measure.runs.build_and_measure``,
in the folder ``core.workspace`` names: ``runs/<id>/``); here it is read.

A run that cannot be read is never fatal: the list skips it with a note; reading it by id is a
MixprecError that says what to do (pick another, or build again); a per-layer table that cannot be
read is left out with a note."""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pandas as pd

from core.errors import MixprecError
from core.measure.runs import RUN_COLUMNS, RunResult
from core.project import Project
from core.quant.policy import Policy, policy_from_text
from core.workspace import METRICS_FILE, PER_LAYER_FILE, POLICY_FILE, Workspace, cache_note

__all__ = ["run_dir", "load_run", "list_runs", "load_run_per_layer", "run_policy", "last_built_policy"]


def run_dir(ws: Workspace, run_id: str) -> Path:
    """The directory of a stored run: ``runs/<id>/``."""
    return ws.run_dir(run_id)


def load_run(ws: Workspace, run_id: str) -> RunResult:
    """The stored run ``run_id`` (with its per-layer table); a MixprecError if it is missing or
    not a run of this format."""
    path = run_dir(ws, run_id)
    if str(run_id).startswith(".") or "/" in str(run_id):
        raise MixprecError(f"there is no run {run_id!r} in {ws.runs}", "pick a run from the list of runs")
    try:
        doc = json.loads((path / METRICS_FILE).read_text())
    except OSError as e:
        raise MixprecError(f"there is no run {run_id!r} in {ws.runs}", "pick a run from the list of runs") from e
    except (ValueError, RecursionError) as e:
        raise MixprecError(f"the metrics of run {run_id} are not valid JSON", "delete the run and build again") from e
    result = RunResult.from_json(doc)
    per_layer = result.per_layer
    if (path / PER_LAYER_FILE).is_file():
        try:
            per_layer = load_run_per_layer(path)
        except (OSError, ValueError) as e:  # pandas' parser errors are ValueErrors
            cache_note(f"the per-layer table of run {run_id} is unreadable ({type(e).__name__}); it is left out")
    return replace(result, run_dir=path, per_layer=per_layer)


# The row of each metrics file read, by its path, while its (inode, size, mtime) stay the same: a run's
# files are written once (its folder renamed in), and a row costs a bootstrap of its speedup interval,
# which every page run listing the runs paid for every run (issue 23 fault 10). Entries of files no
# longer listed are dropped at each listing of their folder.
_ROWS: dict[str, tuple[tuple, dict]] = {}
_ROWS_LOCK = threading.Lock()


def _run_row(p: Path) -> dict:
    st = p.stat()
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _ROWS_LOCK:
        hit = _ROWS.get(str(p))
    if hit is not None and hit[0] == stamp:
        return dict(hit[1])
    row = RunResult.from_json(json.loads(p.read_text())).row()
    with _ROWS_LOCK:
        _ROWS[str(p)] = (stamp, dict(row))
    return row


def list_runs(ws: Workspace | None = None, model_sha256: str | None = None) -> pd.DataFrame:
    """All stored runs (newest first) as a table with ``RUN_COLUMNS``."""
    ws = ws or Workspace.default()
    rows, seen = [], set()
    for p in ws.runs.glob(f"*/{METRICS_FILE}"):
        if p.parent.name.startswith("."):
            continue  # a build in progress (runs/.tmp-<id>) or another hidden folder: not a run
        seen.add(str(p))
        try:
            row = _run_row(p)
        except (OSError, ValueError, RecursionError, TypeError, KeyError, AttributeError, MixprecError) as e:
            cache_note(f"the run {p.parent.name} is skipped: its metrics are unreadable "
                       f"({e.what if isinstance(e, MixprecError) else type(e).__name__})")
            continue  # a damaged or foreign run is skipped, never fatal
        if not model_sha256 or row["model_sha256"] == model_sha256:
            rows.append(row)
    prefix = str(ws.runs) + "/"
    with _ROWS_LOCK:
        for k in [k for k in _ROWS if k.startswith(prefix) and k not in seen]:
            del _ROWS[k]
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return df.sort_values("created", ascending=False, ignore_index=True)


def load_run_per_layer(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / PER_LAYER_FILE
    if not path.is_file():
        raise MixprecError(f"run {Path(run_dir).name} has no per-layer table", "rebuild the policy")
    return pd.read_csv(path, keep_default_na=False)


def run_policy(project: Project, run: str | Path) -> Policy:
    """The policy a stored run was built from (``run``: its directory), validated against ``project``."""
    path = Path(run) / POLICY_FILE
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise MixprecError(f"the run {Path(run).name} has no readable policy ({type(e).__name__})",
                           "pick another run, or delete this one and build again") from e
    return policy_from_text(text, project.model, project.layers, source=path.name)


def last_built_policy(project: Project) -> Policy | None:
    """The policy of the newest stored run of this model, or None."""
    runs = list_runs(project.ws, project.model.sha256)
    for run_id in runs["run_id"]:
        try:
            return run_policy(project, run_dir(project.ws, run_id))
        except (OSError, MixprecError):
            continue
    return None
