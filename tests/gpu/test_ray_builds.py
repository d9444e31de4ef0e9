"""Engine builds over the GPUs of a Ray instance, on a GPU box with TensorRT (the scheduling without GPUs is
tested in tests/scale/test_ray.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.jobs.distributed_builds import build_policies
from core.project import open_project
from core.workspace import Workspace

ray = pytest.importorskip("ray", reason="Ray is not installed (scripts/setup.sh installs it)")


@pytest.mark.tensorrt
def test_engine_builds_on_real_gpus(tmp_path):
    """On a GPU box with TensorRT: candidate engines built over its GPUs by a local Ray instance."""
    pytest.importorskip("tensorrt", reason="TensorRT not installed")
    from core.backends import tensorrt_available

    ok, why = tensorrt_available()
    if not ok:
        pytest.skip(why)
    ws = Workspace(tmp_path)
    p = open_project("sample:tiny-cnn", ws=ws)
    builds = build_policies("sample:tiny-cnn", [p.default_policy(), p.default_policy("fp16")], "local", ws)
    assert all(b.gpus for b in builds)
    for b in builds:
        assert json.loads(Path(b.metrics_path).read_text())["backend"] == "tensorrt"
