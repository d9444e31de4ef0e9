"""Shared pytest fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def trt_reports_dir() -> Path:
    """Real trtexec reports (layer info + profile), in ``shared/`` beside the repo checkout."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "trt-engine-reports"


# --- bundled samples (core/samples.py): built once per session into one shared temp workspace ---

@pytest.fixture(scope="session")
def samples_workspace(tmp_path_factory):
    """A session workspace holding the materialised samples (reuse it to avoid re-exporting MiniLM)."""
    from core.workspace import Workspace

    return Workspace(tmp_path_factory.mktemp("samples-ws"))


@pytest.fixture(scope="session")
def minilm_sample(samples_workspace):
    """SamplePaths of the minilm sample (torch export runs once per session, ~10 s)."""
    from core.samples import materialize_sample

    return materialize_sample("minilm", samples_workspace)


@pytest.fixture(scope="session")
def tiny_cnn_sample(samples_workspace):
    from core.samples import materialize_sample

    return materialize_sample("tiny-cnn", samples_workspace)


@pytest.fixture(scope="session")
def tiny_transformer_sample(samples_workspace):
    from core.samples import materialize_sample

    return materialize_sample("tiny-transformer", samples_workspace)
