"""The results store: under which key each stored result lives in the workspace (the folders are
``core.workspace``'s layout), and how it is read back as its typed record. Pages, the CLI and jobs
save and load through here; stored runs through ``core.store.runs``.

    rankings/<key>.json     a cumulative Ranking or an isolated / leave-one-out Sensitivity
                            (key: model, calibration data, evaluation data, method and mode). The isolated /
                            leave-one-out table is written once, where ``core.sensitivity.sensitivity``
                            computes it (it is the search's cache too); :func:`load_sensitivity` reads it
    searches/<key>.json     a SearchResult (key: as above, plus the budget and the smoothing, for the
                            TensorRT target the GPU of the estimate: ``search_gpu_tag``, and a network default
                            other than FP32, the search's base policy's). It names its isolated
                            table by its rankings/ key (``sensitivity_ref``) instead of holding a copy:
                            :func:`load_search` reads it from there
    models/<sha256>/<name>.onnx   uploaded models;  data/<sha256>/<name>.npz  uploaded data (by content,
                                  under the user's file name)
    gpus/<key>.json, gpu_calibrations/<key>.v<N>.json   GPUs the user describes, cost-model calibrations

Loading gives the record, or None if it was never computed or cannot be used: a stored document that
is corrupt (not JSON, fields missing) is removed, one of an older, newer or foreign format is left
alone, and either way a note says so (``core.workspace.take_notes``) and the result is computed again
— a damaged cache never fails the next build (never a silent patch either)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from core.errors import MixprecError
from core.estimate.cost import PARAMS_VERSION, CostParams
from core.estimate.gpus import FIXTURE_GPU, GPU, GPUS, custom_gpu, gpu as gpu_entry
from core.model.data import load_npz
from core.model.load import model_from_bytes
from core.measure.evaluation import MetricSpec
from core.project import Project
from core.search import SearchResult
from core.sensitivity import Ranking, Sensitivity, write_sensitivity
from core.sensitivity.runners import resolve_runner
from core.workspace import (Workspace, analysis_key, atomic_write_bytes, atomic_write_json, cache_note, discard_corrupt,
                            sha256_bytes, write_error)

__all__ = ["ranking_key", "project_ranking_key", "ranking_path", "save_ranking", "load_ranking", "save_sensitivity",
           "load_sensitivity", "cached_ranking", "search_path", "search_gpu_tag",
           "stored_search_path", "searched_gpu_name", "save_search", "load_search", "store_upload", "gpu_spec_path",
           "save_gpu_spec", "read_gpu_specs", "load_gpu_specs", "delete_gpu_spec", "resolve_gpu"]


# --- keys and paths ------------------------------------------------------------------------------
def ranking_key(model_sha256: str, calib_sha256: str, eval_sha256: str, method: str) -> str:
    """Rankings are stored per model, calibration data, evaluation data and calibration method."""
    return analysis_key(model_sha256, calib_sha256, eval_sha256, method)


def project_ranking_key(project: Project, method: str = "minmax", mode: str = "cumulative",
                        runner: str = "onnxruntime") -> str:
    """Key of a stored analysis of ``project``: the cumulative (Polygraphy) ranking, an
    ``isolated`` / ``leave-one-out`` sensitivity, or any other analysis named by ``mode``. A cumulative
    ranking is also keyed by its ``runner``: the one of the candidate's TensorRT engine (``tensorrt``) is
    another table than ONNX Runtime's (whose key is that of the rankings stored before runners existed)."""
    if mode == "cumulative" and runner != "onnxruntime":
        if runner not in ("tensorrt",):
            raise MixprecError(f"unknown ranking runner {runner!r}", "use onnxruntime or tensorrt")
        mode = f"cumulative@{runner}"
    return analysis_key(project.model.sha256, project.calib_data.sha256, project.eval_data.sha256, method, mode)


def ranking_path(ws: Workspace, key: str) -> Path:
    return ws.ranking_file(key)


def search_gpu_tag(g: GPU) -> str:
    """The GPU part of a stored search's key: a GPU table row's key; for a user's GPU (added in the
    workspace or a ``--gpu-spec``) its key and a hash of its figures (two specs may share a key)."""
    if GPUS.get(g.key) == g:
        return g.key
    return f"{g.key}~" + sha256_bytes(json.dumps(g.to_json(), sort_keys=True).encode())[:16]


def _metrics_key(metrics) -> str:
    """The key part of what quality is measured on (``core.measure.evaluation.MetricSpec`` or its JSON; "" for
    the default: the first float output, as every search stored before)."""
    spec = metrics if isinstance(metrics, MetricSpec) else MetricSpec.from_json(metrics) if metrics else None
    key = spec.key if spec is not None else ""
    return f"|metrics={key}" if key else ""


def _network_default_key(network_default: str | None) -> str:
    """The key part of the search's network default ("" for FP32, as every search stored before)."""
    return f"|network_default={network_default}" if network_default and network_default != "fp32" else ""


def search_path(ws: Workspace, project: Project, budget: str, smooth: bool, gpu: str | GPU | None = None,
                metrics=None, network_default: str | None = None) -> Path:
    """Where the search of this model, data, budget (normalised, ``str(Budget)``) and smoothing is stored;
    for the TensorRT target (its objective: the TensorRT time estimated on a GPU) also keyed by ``gpu``
    (a :class:`GPU`, or a key / name :func:`resolve_gpu` places), so each GPU's search is kept. Without a
    GPU: the key of searches stored before the GPU was part of it (``load_search`` reads it as a fallback).
    ``metrics``: what quality is measured on (a search on another output or slice is another search);
    ``network_default``: the base policy's (an FP16-default search is another search; None: FP32)."""
    key = f"{budget}|smooth={bool(smooth)}|target={project.target}"  # the target decides the search's objective
    if gpu is not None and project.target == "tensorrt":
        key += f"|gpu={search_gpu_tag(gpu if isinstance(gpu, GPU) else resolve_gpu(ws, gpu))}"
    key += _metrics_key(metrics) + _network_default_key(network_default)
    return ws.search_file(project_ranking_key(project, key, "search"))


def stored_search_path(ws: Workspace, project: Project, budget: str, smooth: bool,
                       gpu: str | GPU | None = None, metrics=None, network_default: str | None = None) -> Path:
    """The file ``load_search`` reads for these arguments: the GPU's own key (no GPU: the search job's
    default, ``FIXTURE_GPU``), else (when only that is stored) the key of a search stored before the GPU
    was part of it."""
    path = search_path(ws, project, budget, smooth, FIXTURE_GPU if gpu is None else gpu, metrics, network_default)
    if _metrics_key(metrics) or _network_default_key(network_default):
        return path
    old = search_path(ws, project, budget, smooth)
    return old if path != old and not path.is_file() and old.is_file() else path


def _read(path: Path, what: str) -> dict | None:
    """The JSON document at ``path``; None if there is none, or (with a note) if it cannot be read or
    is not JSON (then it is removed: it is computed again)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        cache_note(f"cannot read the stored {what} {path.name} ({getattr(e, 'strerror', None) or e}); it is "
                   "computed again (check the workspace folder's permissions)")
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        discard_corrupt(path, what, f"not valid JSON: {type(e).__name__}")
        return None
    if not isinstance(doc, dict):
        discard_corrupt(path, what, f"a JSON {type(doc).__name__}, not a document")
        return None
    return doc


def _record(from_json, doc: dict, path: Path, what: str):
    """``from_json(doc)``, or None with a note: a document of an older, newer or foreign format is
    left in place (computing the result again replaces it), one of the right kind and format that is
    damaged (a field missing or of the wrong type) is removed."""
    try:
        return from_json(doc)
    except MixprecError as e:
        cache_note(f"the stored {what} {path.name} is not used: {e.what}; it is computed again")
        return None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        discard_corrupt(path, what, f"damaged: {type(e).__name__}: {e}")
        return None


def _legacy_csv(path: Path, what: str) -> None:
    """Rankings were stored as CSV before they had a record: say so instead of ignoring it."""
    old = path.with_suffix(".csv")
    if old.is_file():
        cache_note(f"the stored {what} is in the CSV format of an older mixprec, which this version does not read; "
                   "compute it again (the new result replaces the old file)")


# --- rankings and sensitivity tables ---------------------------------------------------------------
def save_ranking(ws: Workspace, project: Project, ranking: Ranking) -> Path:
    path = ranking_path(ws, project_ranking_key(project, ranking.method, runner=ranking.runner))
    atomic_write_json(path, ranking.to_json())
    path.with_suffix(".csv").unlink(missing_ok=True)
    return path


def load_ranking(ws: Workspace, project: Project, method: str = "minmax", runner: str = "auto") -> Ranking | None:
    """The stored cumulative ranking of ``project`` and ``method`` measured on ``runner`` (``auto``: the one
    a ranking computed now would use, :func:`core.sensitivity.runners.resolve_runner`; a ranking measured on
    TensorRT elsewhere reads without TensorRT), or None if it was never computed or cannot be used (a note says
    why)."""
    runner = resolve_runner(runner) if runner == "auto" else runner
    path = ranking_path(ws, project_ranking_key(project, method, runner=runner))
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
    """Store a table computed elsewhere where :func:`load_sensitivity` reads it, by the one writer
    (``core.sensitivity.write_sensitivity``). ``core.sensitivity.sensitivity`` stores what it computes
    itself: a job does not store it again."""
    return write_sensitivity(ranking_path(ws, project_ranking_key(project, sens.method, sens.mode)), sens)


def load_sensitivity(ws: Workspace, project: Project, method: str = "minmax",
                     mode: str = "isolated") -> Sensitivity | None:
    """The stored isolated / leave-one-out sensitivity (computed by a job, the CLI or a search, on the
    project's default policy and evaluation data), or None if it was never computed."""
    return _stored_sensitivity(ranking_path(ws, project_ranking_key(project, method, mode)), f"{mode} sensitivity")


def _stored_sensitivity(path: Path, what: str) -> Sensitivity | None:
    doc = _read(path, what)
    if doc is None:
        _legacy_csv(path, what)
        return None
    return _record(Sensitivity.from_json, doc, path, what)


_KEY = re.compile(r"[0-9a-f]{32}")  # core.workspace.analysis_key


def _referenced_sensitivity(ws: Workspace, result: SearchResult, path: Path) -> SearchResult:
    """``result`` (of the stored search at ``path``) with the isolated table its ``sensitivity_ref``
    names, read from rankings/; without it (None, with a note) when that document is gone or damaged:
    the search is still shown (its table is measured again by the next search or isolated analysis)."""
    ref = result.sensitivity_ref
    if result.sensitivity is not None or not ref:
        return result
    sens = _stored_sensitivity(ws.ranking_file(ref), "isolated sensitivity") if _KEY.fullmatch(ref) else None
    if sens is None:
        cache_note(f"the isolated sensitivity the stored search {path.name} refers to (rankings/{ref}.json) is "
                   "gone or cannot be used; the search is shown without it (an isolated analysis or a new "
                   "search measures it again)")
    return replace(result, sensitivity=sens)


# --- searches ------------------------------------------------------------------------------------
_LABEL_GPU = re.compile(r"estimated TensorRT ms on the (.+?) \(an estimate")


def searched_gpu_name(result: SearchResult) -> str | None:
    """The name of the GPU a TensorRT-estimate search estimated on (its latency label says), else None."""
    m = _LABEL_GPU.search(result.latency_label or "") if result.objective == "trt_estimate" else None
    return m.group(1) if m else None


def _result_gpu(ws: Workspace, result: SearchResult) -> GPU | None:
    """The GPU ``result`` estimated on, placed by the name in its label (a table row or a GPU saved in the
    workspace), or None."""
    name = searched_gpu_name(result)
    try:
        return resolve_gpu(ws, name) if name else None
    except MixprecError:
        return None


def save_search(ws: Workspace, project: Project, result: SearchResult, smooth: bool,
                gpu: str | GPU | None = None, metrics=None, network_default: str | None = None) -> Path:
    """Store ``result`` under its budget, smoothing, (TensorRT target) ``gpu`` — the GPU the search
    estimated on (the job's; when not given, the one its label names, if it can be placed) —, ``metrics`` and
    ``network_default`` (the search's; None: its policy's)."""
    g = gpu if gpu is not None else _result_gpu(ws, result)
    nd = network_default if network_default is not None else result.policy.network_default
    return atomic_write_json(search_path(ws, project, str(result.budget), smooth, g, metrics, nd), result.to_json())


def load_search(ws: Workspace, project: Project, budget: str, smooth: bool,
                gpu: str | GPU | None = None, metrics=None, network_default: str | None = None) -> SearchResult | None:
    """The stored search for this (normalised) budget, smoothing and (TensorRT target) GPU (default: a
    search job's, ``FIXTURE_GPU``), or None if it was never run. A search stored before the GPU was part of
    the key is used for the GPU it estimated on (by the name in its label) and for any GPU when it estimated
    on none; for another GPU it is None (that GPU's search is computed again and stored under its own key,
    the old one is kept). Its isolated sensitivity is read from the rankings/ document it names (format 3;
    formats 1 and 2 hold a copy): when that is gone or damaged the search loads without it, with a note.
    ``network_default``: the base policy's (None: FP32); a search from another network default is not this one."""
    gpu = FIXTURE_GPU if gpu is None else gpu  # a search job's default GPU (core.jobs.params.SearchParams)
    path = stored_search_path(ws, project, budget, smooth, gpu, metrics, network_default)
    doc = _read(path, "search")
    result = None if doc is None else _record(lambda d: SearchResult.from_json(d, project.model, project.layers),
                                              doc, path, "search")
    if result is not None and path != search_path(ws, project, budget, smooth, gpu, metrics, network_default):
        g = gpu if isinstance(gpu, GPU) else resolve_gpu(ws, gpu)  # read at the old key: whose search is it?
        name = searched_gpu_name(result)
        result = result if name is None or name == g.name else None
    return None if result is None else _referenced_sensitivity(ws, result, path)


# --- uploads -------------------------------------------------------------------------------------
UPLOAD_SUFFIX = {"model": ".onnx", "data": ".npz"}


def upload_name(filename: str, kind: str) -> str:
    """A safe file name for an upload that keeps the user's name: its last path part, characters
    other than letters, digits, ``._-`` and spaces replaced, at most 120 characters, with the kind's
    suffix (``model.onnx`` / ``data.npz`` when nothing is left)."""
    suffix = UPLOAD_SUFFIX[kind]
    base = re.split(r"[\\/]", str(filename or ""))[-1]
    stem = base[:-len(suffix)] if base.lower().endswith(suffix) else base
    stem = re.sub(r"[^\w.\- ]", "_", stem, flags=re.ASCII).strip(" .")[:120] or kind
    return stem + suffix


def _place(folder: Path, name: str, data: bytes) -> Path:
    """``folder/name`` holding ``data``: linked to a file of the same content already there, else written."""
    path = folder / name
    if path.is_file():
        return path
    same = next((p for p in folder.glob("*" + path.suffix) if p.is_file() and not p.name.startswith(".")), None)
    if same is not None:
        try:
            os.link(same, path)
            return path
        except FileExistsError:
            return path
        except OSError:
            pass  # a file system without hard links: write a copy
    return atomic_write_bytes(path, data)


def store_upload(ws: Workspace, data: bytes, filename: str, kind: str, model=None) -> Path:
    """Validate an uploaded ``model`` (ONNX) or ``data`` (.npz, checked against ``model``) and store it
    in the workspace by content hash, under the user's file name: ``models/<sha256>/<name>.onnx`` or
    ``data/<sha256>/<name>.npz``. The model loaded from it is named like the file (``LoadedModel.name``
    is the file's stem, as for a server path), so titles, jobs, runs, exports and errors show it."""
    if kind not in UPLOAD_SUFFIX:
        raise ValueError(kind)
    sha = sha256_bytes(data)
    name = upload_name(filename, kind)
    folder = ws.upload_dir(kind, sha)
    if kind == "model":
        model_from_bytes(data, folder / name, name=Path(name).stem)
    else:
        load_npz(data, model, name=name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(folder / name, e, len(data)) from e
    return _place(folder, name, data)


# --- cost-model calibrations per GPU (issue 12 §4) ------------------------------------------------
def gpu_calibration_path(ws: Workspace, gpu_name: str | GPU) -> Path:
    """Where the cost model calibrated on ``gpu_name`` is stored: keyed by the GPU's key (a table
    row, a GPU saved in this workspace, or a :class:`GPU` of a ``--gpu-spec``) and the parameters'
    format version (an older format is simply not found)."""
    key = gpu_name.key if isinstance(gpu_name, GPU) else resolve_gpu(ws, gpu_name).key
    return ws.gpu_calibration_file(key, PARAMS_VERSION)


def save_gpu_calibration(ws: Workspace, gpu_name: str | GPU, params: CostParams) -> Path:
    return atomic_write_json(gpu_calibration_path(ws, gpu_name), params.to_json())


def load_gpu_calibration(ws: Workspace, gpu_name: str | GPU) -> CostParams | None:
    """The stored calibration for ``gpu_name``; None when there is none or it cannot be read
    (corrupt, damaged or of another format): the estimate then falls back to the fixture fit."""
    path = gpu_calibration_path(ws, gpu_name)
    try:
        return CostParams.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, MixprecError):
        return None


# --- GPUs the user describes, saved in the workspace (issue 19 §4) ----------------------------------
# One file per GPU, gpus/<key>.json, holding the fields of a GPU table row (GPU.to_json). A file that
# is not valid (hand-edited, truncated) is skipped with a note, never fatal, and left in place: it is
# the user's data, not a cache.
def gpu_spec_path(ws: Workspace, key: str) -> Path:
    return ws.gpu_specs() / f"{key}.json"


def save_gpu_spec(ws: Workspace, spec: GPU | dict) -> GPU:
    """Validate the user's GPU (a :class:`GPU` or a spec document; ``core.estimate.gpus.custom_gpu``:
    a MixprecError names each field in error) and save it atomically; returns the GPU saved. Saving
    a key again replaces that GPU."""
    g = custom_gpu(spec, "the GPU")
    if g.key in GPUS:
        raise MixprecError(f"the GPU {g.key!r} is a row of the GPU table already", f"pick it as --gpu {g.key}")
    atomic_write_json(gpu_spec_path(ws, g.key), g.to_json())
    return g


def read_gpu_specs(ws: Workspace) -> tuple[dict[str, GPU], list[str]]:
    """The GPUs saved in the workspace by key, and a note for each file skipped (not readable, not
    JSON, not a valid GPU, or named after another key)."""
    folder = ws.gpu_specs(create=False)
    found: dict[str, GPU] = {}
    notes: list[str] = []
    try:
        paths = sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))
    except OSError as e:
        return {}, [f"cannot list the saved GPUs in {folder} ({e.strerror or e})"]
    for path in paths:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            g = custom_gpu(doc, f"the saved GPU {path.name}")
            if g.key != path.stem:
                raise MixprecError(f"the saved GPU {path.name} has the key {g.key!r}", "")
        except MixprecError as e:
            notes.append(f"{e.what}; it is skipped (fix or delete {path})")
            continue
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            notes.append(f"the saved GPU {path.name} is not readable JSON ({type(e).__name__}); it is skipped "
                         f"(fix or delete {path})")
            continue
        found[g.key] = g
    return found, notes


def load_gpu_specs(ws: Workspace) -> dict[str, GPU]:
    """The GPUs saved in the workspace by key; a file skipped is noted (``core.workspace.take_notes``)."""
    found, notes = read_gpu_specs(ws)
    for n in notes:
        cache_note(n)
    return found


def delete_gpu_spec(ws: Workspace, key: str) -> bool:
    """Remove the saved GPU ``key``; False if there was none."""
    if key in GPUS or not isinstance(key, str) or "/" in key or key.startswith("."):
        return False
    path = gpu_spec_path(ws, key)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise MixprecError(f"cannot delete the saved GPU {path} ({e.strerror or e})",
                           "check the workspace folder's permissions") from e
    return True


def resolve_gpu(ws: Workspace, name: str | GPU) -> GPU:
    """``name`` as a GPU: a :class:`GPU` as is, else a GPU saved in the workspace (by key or exact
    name), else the GPU table's row (``core.estimate.gpus.gpu``: keys and product names)."""
    if isinstance(name, GPU):
        return name
    return gpu_entry(name, load_gpu_specs(ws) if ws.gpu_specs(create=False).is_dir() else None)
