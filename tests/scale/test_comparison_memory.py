"""The comparison memory budget at scale (issue 14 §3): a model with big activations ranked in its own process,
whose peak the budget bounds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import ROOT
from tests.fixtures.models import wide_model

MiB = 1 << 20


def _rank_cli(ws: Path, model: Path, *extra) -> dict:
    """``rank --json`` in its own process, so its peak memory is its own."""
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws)}
    p = subprocess.run([sys.executable, "-m", "core", "rank", str(model), "--data", str(model.with_name("calib.npz")),
                        "--eval", str(model.with_name("eval.npz")), "--samples", "2", "--json", *extra], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_budget_bounds_the_peak_of_a_model_with_big_activations(tmp_path):
    model = wide_model(tmp_path)
    ws = tmp_path / "ws"
    full = _rank_cli(ws, model, "--max-memory", "64G")
    small = _rank_cli(ws, model, "--max-memory", "96M")
    assert full["memory"]["chunks"] == 1 and small["memory"]["chunks"] >= 4
    # one pass keeps all 24 marked 4 MiB outputs of both models alive: ~200 MiB on top
    assert full["memory"]["added_bytes"] > 150 * MiB
    assert small["memory"]["added_bytes"] <= 96 * MiB, small["memory"]
    assert small["memory"]["peak_bytes"] < full["memory"]["peak_bytes"]
    a = {r["name"]: r for r in full["layers"]}
    for r in small["layers"]:
        assert r["cosine"] == pytest.approx(a[r["name"]]["cosine"], abs=1e-6)
