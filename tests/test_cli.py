"""``python -m core``: JSON output, exit codes, exports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from conftest import run_model

ROOT = Path(__file__).resolve().parents[1]


def cli(ws, *args, check=True):
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws.root)}
    p = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_inspect_minilm_json(ws, minilm):
    doc = json.loads(cli(ws, "inspect", "sample:minilm", "--json").stdout)
    layers = doc["layers"]
    mm = [l for l in layers if l["op_type"] == "MatMul"]
    assert len(mm) == 48 and all(l["eligible"] and l["default_precision"] == "int8" for l in mm)
    fp16 = {l["op_type"] for l in layers if l["default_precision"] == "fp16"}
    assert fp16 == {"LayerNormalization", "Softmax", "Gather"}
    assert doc["model"]["sha256"] == minilm.model.sha256 and doc["model"]["opset"] == 17


def test_errors_exit_2_without_traceback(ws, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage" * 10)
    for args in (["inspect", str(tmp_path / "missing.onnx")], ["inspect", str(bad)],
                 ["build", "sample:tiny-cnn", "--policy", str(tmp_path / "nope.json")]):
        p = cli(ws, *args, check=False)
        assert p.returncode == 2, args
        errors = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
        assert "Traceback" not in p.stderr and len(errors) == 1 and "Fix:" in errors[0]
        assert p.stderr.strip().splitlines()[-1] == errors[0]


def test_build_json_has_every_field(ws, tiny_transformer):
    doc = json.loads(cli(ws, "build", "sample:tiny-transformer", "--json", "--iterations", "10").stdout)
    for path in ("latency_ms.median", "latency_ms.p95", "speedup", "reformat.count", "reformat.ms", "reformat.pct",
                 "quality.cosine_mean", "quality.cosine_min", "quality.snr_db", "precision_counts",
                 "int8_mac_fraction", "per_layer", "run_dir"):
        node = doc
        for key in path.split("."):
            assert key in node, path
            node = node[key]
    assert Path(doc["run_dir"]).is_dir() and doc["per_layer"][0]["ms"] >= 0
    assert doc["backend"] == "onnxruntime" and "TensorRT not chosen" in doc["backend_reason"]


def test_export_roundtrip_and_onnx(ws, tmp_path, tiny_transformer):
    pol = tmp_path / "p.json"
    cli(ws, "export", "sample:tiny-transformer", "--format", "json", "--out", str(pol))
    doc = json.loads(pol.read_text())
    doc["layers"]["/ffn/up/MatMul"] = "fp16"
    pol.write_text(json.dumps(doc))
    out = tmp_path / "m.onnx"
    cli(ws, "export", "sample:tiny-transformer", "--policy", str(pol), "--format", "onnx", "--out", str(out))
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    y = run_model(model, tiny_transformer.eval_data.batches(1)[:2])
    assert y.shape == (2, 32)
    cmd = tmp_path / "trt.sh"
    cli(ws, "export", "sample:tiny-transformer", "--policy", str(pol), "--format", "trtexec", "--out", str(cmd))
    text = cmd.read_text()
    assert "/ffn/up/MatMul:fp16" in text and "/attn/q/MatMul:int8" in text
    assert (tmp_path / "trt.calib.cache").read_text().startswith("TRT-")
    assert (tmp_path / "trt.named.onnx").is_file()
    typed = tmp_path / "typed.sh"
    cli(ws, "export", "sample:tiny-transformer", "--policy", str(pol), "--format", "trtexec-typed", "--out", str(typed))
    assert "--stronglyTyped" in typed.read_text() and (tmp_path / "typed.mixprec.onnx").is_file()


def test_sample_command_writes_files(ws, tmp_path):
    doc = json.loads(cli(ws, "sample", "tiny-cnn", "--out", str(tmp_path / "s"), "--json").stdout)
    for key in ("model", "calib", "eval"):
        assert Path(doc[key]).is_file()


@pytest.mark.parametrize("fixture,count,pct", [("a100-resnet-qat", 12, 25.4), ("a100-resnet-fp16", 2, 8.7)])
def test_report_command(ws, trt_reports_dir, fixture, count, pct):
    doc = json.loads(cli(ws, "report", str(trt_reports_dir / f"{fixture}.graph.json"),
                         str(trt_reports_dir / f"{fixture}.profile.json"), "--json").stdout)
    assert doc["reformat"]["count"] == count and round(doc["reformat"]["pct"], 1) == pct


def test_rank_json_is_clean_stdout(ws, tiny_cnn):
    doc = json.loads(cli(ws, "rank", "sample:tiny-cnn", "--json", "--samples", "4").stdout)
    assert doc["samples"] == 4 and len(doc["layers"]) == len(tiny_cnn.layers)
    assert doc["layers"][0]["rank"] == 1


def test_trt_profile_flag_parses_and_reaches_the_backend(ws, tmp_path):
    from core.backends.tensorrt import TensorRTBackend, profile_shapes
    from core.cli import parse_trt_profiles
    from core.errors import MixprecError

    prof = parse_trt_profiles(["input_ids=1x16:1x64:16x128"])
    assert prof == {"input_ids": ((1, 16), (1, 64), (16, 128))}
    assert profile_shapes({"input_ids": (1, 64)}, prof)["input_ids"][2] == (16, 128)
    assert TensorRTBackend(profiles=prof, workspace_bytes=1 << 30).profiles == prof
    with pytest.raises(MixprecError, match="INPUT=MIN:OPT:MAX"):
        parse_trt_profiles(["input_ids=1x16:1x64"])
    p = cli(ws, "build", "sample:tiny-cnn", "--backend", "tensorrt", "--trt-profile", "image=1x3x32x32:1x3x32x32:4x3x32x32",
            check=False)
    assert p.returncode == 2 and "TensorRT backend cannot run here" in p.stderr
    # the search says so before any trial runs
    p = cli(ws, "search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.99", "--backend", "tensorrt", check=False)
    assert p.returncode == 2 and "TensorRT backend cannot run here" in p.stderr and "Traceback" not in p.stderr
    assert not (ws.root / "search").exists() or not any((ws.root / "search").rglob("isolated*"))
