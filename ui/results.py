"""Stored results of the session's project (records from ``core.store.results``), each read once
per file version: the cumulative ranking, the isolated / leave-one-out sensitivity, a search. A
document of another format is shown as an error, never raised."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from core.errors import MixprecError
from core.project import Project
from core.sensitivity.runners import resolve_runner
from core.store import results as store
from ui.session import md


def _stored(load, *args):
    try:
        return load(*args)
    except MixprecError as e:
        st.error(md(e))
        return None


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file, or None if it is missing: results are written atomically (rename),
    so a new document always has a new stamp."""
    try:
        st_ = path.stat()
    except OSError:
        return None
    return st_.st_mtime_ns, st_.st_size


@st.cache_data(show_spinner=False, max_entries=64)
def _load_cached(kind: str, path: str, stamp, model_sha256: str, calib_sha256: str, _p: Project, *args):
    """A stored result read once per file version (``stamp``) and model/data sha256, not per page run."""
    load = {"ranking": store.load_ranking, "sensitivity": store.load_sensitivity, "search": store.load_search}[kind]
    return load(_p.ws, _p, *args)


def _stored_file(kind: str, path: Path, p: Project, *args):
    stamp = _stamp(path)
    if stamp is None:
        return None
    return _stored(_load_cached, kind, str(path), stamp, p.model.sha256, p.calib_data.sha256, p, *args)


def ranking(p: Project, method: str = "minmax"):
    """The stored cumulative ``Ranking`` of this model, data and method, or None."""
    path = store.ranking_path(p.ws, store.project_ranking_key(p, method, runner=resolve_runner("auto")))
    return _stored_file("ranking", path, p, method)


def sensitivity(p: Project, method: str = "minmax", mode: str = "isolated"):
    """The stored isolated / leave-one-out ``Sensitivity``, or None."""
    path = store.ranking_path(p.ws, store.project_ranking_key(p, method, mode))
    return _stored_file("sensitivity", path, p, method, mode)


def search_result(p: Project, budget: str, smooth: bool, gpu=None, metrics=None, network_default: str = "fp32"):
    """The stored ``SearchResult`` of this budget, smoothing, (TensorRT target) GPU of the estimate (a ``GPU``),
    metric spec (``MetricSpec.to_json``; None: the first float output) and network default (the draft's), or None."""
    return _stored_file("search", store.stored_search_path(p.ws, p, budget, smooth, gpu, metrics, network_default), p,
                        budget, smooth, gpu, metrics, network_default)
