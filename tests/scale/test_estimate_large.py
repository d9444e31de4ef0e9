"""The TensorRT estimate of the model over 2 GB (tests/fixtures/large_models.py): ``python -m core estimate``
in a child process whose peak RSS stays far below its 2.15 GB table."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from core.estimate.predict import PREDICTION_COLUMNS
from core.project import open_project
from core.workspace import Workspace
from tests.fixtures import ROOT
from tests.fixtures.large_models import RSS_LIMIT, big_model


# --- the model over 2 GB, through the CLI, in a child process with its peak RSS measured -------------
@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """The model over 2 GB (tests/fixtures/large_models.py), its workspace, and a policy JSON: emb FP32, fc1 INT8,
    fc2 FP16 (a policy that converts the 2.15 GB table itself is the compiler's concern, not the estimate's)."""
    path = big_model(tmp_path_factory.mktemp("big"))
    ws = tmp_path_factory.mktemp("big-ws")
    p = open_project(path, ws=Workspace(ws))
    policy = path.with_name("policy.json")
    policy.write_text(p.default_policy().with_layers({"emb": "fp32", "fc1": "int8", "fc2": "fp16"}).to_json())
    return path, ws, policy


def test_cli_estimates_the_model_over_2gb_in_bounded_memory(big):
    path, ws, policy = big
    assert sum(f.stat().st_size for f in path.parent.glob("*.bin")) > (2 << 30)
    out, err = path.with_name("estimate.json"), path.with_name("estimate.err")
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws), "MIXPREC_THREADS": "1"}
    with open(out, "wb") as fo, open(err, "wb") as fe:
        child = subprocess.Popen([sys.executable, "-m", "core", "estimate", str(path), "--policy", str(policy),
                                  "--gpu", "a100", "--json"], cwd=ROOT, env=env, stdout=fo, stderr=fe)
        _, status, usage = os.wait4(child.pid, 0)  # the rusage of this child alone
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, err.read_text()[-3000:]
    peak = usage.ru_maxrss * 1024
    assert peak < RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    doc = json.loads(out.read_text())
    assert doc["label"] == "estimate" and doc["gpu"]["key"] == "a100" and doc["columns"] == PREDICTION_COLUMNS
    rows = [dict(zip(PREDICTION_COLUMNS, r)) for r in doc["layers"]["rows"]]
    assert math.isfinite(doc["total_ms"]) and doc["total_ms"] == pytest.approx(sum(r["est_ms"] for r in rows))
    precisions = {n: r["precision"] for r in rows if r["layer_class"] == "conv_gemm" for n in r["onnx_nodes"]}
    assert precisions.get("fc1") == "int8" and precisions.get("fc2") == "fp16"
