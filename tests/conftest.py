"""Shared pytest fixtures."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.fixtures")  # their asserts report as a test's do

from tests.fixtures import ROOT  # noqa: E402


@pytest.fixture(autouse=True)
def _estimates_in_the_page_run(monkeypatch):
    """AppTest does not run timed fragments: let its page runs wait for a new TensorRT estimate
    instead of drawing "estimating…" (the browser tests' servers keep the short default and poll)."""
    monkeypatch.setenv("MIXPREC_ESTIMATE_WAIT", "120")


@pytest.fixture(autouse=True)
def _no_notes_of_earlier_tests():
    """``core.workspace``'s notes are process-wide (taken by the CLI, a job or a page): a test starts with
    none, so one that asserts its own notes never sees an earlier test's (whichever ran before it on this
    worker)."""
    from core.workspace import take_notes

    take_notes()


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Streamlit's AppTest leaves the script it ran (app.py) as ``sys.modules['__main__']``;
    multiprocessing's spawn would then run app.py in every worker of a later test. Restore it."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def trt_reports_dir() -> Path:
    """Real trtexec reports (layer info + profile), in ``shared/`` beside the repo checkout."""
    return ROOT.parent / "shared" / "fixtures" / "trt-engine-reports"


# --- bundled samples (core/model/samples.py): built once per session into one shared temp workspace ---

@pytest.fixture(scope="session")
def samples_workspace(tmp_path_factory):
    """A session workspace holding the materialised samples (reuse it to avoid re-exporting MiniLM)."""
    from core.workspace import Workspace

    return Workspace(tmp_path_factory.mktemp("samples-ws"))


@pytest.fixture(scope="session")
def minilm_sample(samples_workspace):
    """SamplePaths of the minilm sample (torch export runs once per session, ~10 s)."""
    from core.model.samples import materialize_sample

    return materialize_sample("minilm", samples_workspace)


@pytest.fixture(scope="session")
def tiny_cnn_sample(samples_workspace):
    from core.model.samples import materialize_sample

    return materialize_sample("tiny-cnn", samples_workspace)


@pytest.fixture(scope="session")
def tiny_transformer_sample(samples_workspace):
    from core.model.samples import materialize_sample

    return materialize_sample("tiny-transformer", samples_workspace)


@pytest.fixture
def tiny_cnn_ws(tmp_path, tiny_cnn_sample):
    """A fresh workspace holding a copy of the tiny-cnn sample (its caches start empty)."""
    import shutil

    from core.workspace import Workspace

    ws = Workspace(tmp_path / "ws")
    shutil.copytree(tiny_cnn_sample.model.parent, ws.samples / tiny_cnn_sample.model.parent.name)
    return ws


# --- projects over the samples (core/project.py), sharing the session workspace ---

@pytest.fixture(scope="session")
def ws(samples_workspace):
    return samples_workspace


@pytest.fixture(scope="session")
def minilm(ws, minilm_sample):
    from core.project import open_project

    return open_project("sample:minilm", ws=ws)


@pytest.fixture(scope="session")
def tiny_cnn(ws, tiny_cnn_sample):
    from core.project import open_project

    return open_project("sample:tiny-cnn", ws=ws)


@pytest.fixture(scope="session")
def tiny_transformer(ws, tiny_transformer_sample):
    from core.project import open_project

    return open_project("sample:tiny-transformer", ws=ws)


# --- levels (issue 20 §7): the first folder under tests/ is the level, and a marker ----------------------
LEVELS = {"unit": "unit", "app": "app", "e2e": "e2e", "faults": "faults", "scale": "scale", "gpu": "tensorrt"}
SERIAL_LEVELS = ("e2e", "scale")  # each level's tests on one worker, one test at a time
# The longest worker groups start first, so that no long group starts last and runs alone at the end
# (whole-suite --durations on a fresh clone, 2 workers: e2e ≈ 600 s, test_search ≈ 830 s, test_precision
# ≈ 400 s on a loaded machine); the other groups keep pytest's order.
LONG_FIRST = ("unit/search/test_search.py", "e2e", "app/test_precision.py", "scale",
              "unit/estimate/test_structure_only.py", "unit/estimate/test_cost.py", "unit/estimate/test_predict.py",
              "unit/estimate/test_transformer.py", "faults/test_hostile.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark each test with its level (``pytest -m unit`` selects what ``pytest tests/unit`` runs)."""
    here = Path(__file__).resolve().parent
    for item in items:
        parts = Path(item.path).resolve().relative_to(here).parts if here in Path(item.path).resolve().parents else ()
        if len(parts) > 1 and parts[0] in LEVELS:
            item.add_marker(getattr(pytest.mark, LEVELS[parts[0]]))
        item.add_marker(pytest.mark.xdist_group(_worker_group(parts)))
        item.stash[_GROUP] = _worker_group(parts)
    rank = {g: i for i, g in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.stash[_GROUP], len(rank)))  # stable: a file keeps its order


_GROUP = pytest.StashKey[str]()


def _worker_group(parts: tuple[str, ...]) -> str:
    """Which tests one pytest-xdist worker runs together (``./test.sh`` runs ``-n 2 --dist loadgroup``): each
    file stays on one worker (its module fixtures are built once), the browser tests share one worker (one
    dashboard and one Chromium per worker), and so do the scale tests (models over 2 GB and Ray clusters are
    not run two at a time on a 24 GiB machine)."""
    if parts and parts[0] in SERIAL_LEVELS:
        return parts[0]
    return "/".join(parts) or "tests"
