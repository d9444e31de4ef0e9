"""Fixtures of the Streamlit AppTest files: a fresh workspace per test (MIXPREC_WORKSPACE)."""
from __future__ import annotations

import pytest

from core.workspace import Workspace


@pytest.fixture(autouse=True)
def _stop_estimate_children():
    """Each test's workspace gets its own estimate child (ui.estimate_panel._service, cached per workspace):
    stop it after the test, so a long session does not keep one child per test alive."""
    yield
    from ui.estimate_panel import _service

    _service.clear()


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path))
    return Workspace(tmp_path)
