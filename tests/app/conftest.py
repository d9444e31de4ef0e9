"""Fixtures of the Streamlit AppTest files: a fresh workspace per test (MIXPREC_WORKSPACE)."""
from __future__ import annotations

import pytest

from core.workspace import Workspace


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path))
    return Workspace(tmp_path)
