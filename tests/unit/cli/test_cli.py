"""``python -m core``: JSON output, exit codes, exports."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.fixtures.cli import cli_in_process, cli_process
from tests.fixtures.models import run_model


@pytest.fixture
def cli(ws, capfd, monkeypatch):
    """``python -m core`` on the session workspace: in this process (``tests.fixtures.cli``: main() with its
    environment, stdout and stderr captured at the file descriptors, the exit code the process would end with; no
    child that imports torch and onnxruntime at each run), or in a child (``process=True``: the entry point)."""
    def run(*args, check=True, process=False):
        env = {"MIXPREC_WORKSPACE": str(ws.root)}
        p = cli_process(args, env) if process else cli_in_process(capfd, monkeypatch, args, env)
        if check:
            assert p.returncode == 0, p.stderr
        return p
    return run


def test_inspect_minilm_json(cli, minilm):
    doc = json.loads(cli("inspect", "sample:minilm", "--json").stdout)
    layers = doc["layers"]
    mm = [l for l in layers if l["op_type"] == "MatMul"]
    assert len(mm) == 48 and all(l["eligible"] and l["default_precision"] == "int8" for l in mm)
    fp16 = {l["op_type"] for l in layers if l["default_precision"] == "fp16"}
    assert fp16 == {"LayerNormalization", "Softmax", "Gather"}
    assert doc["model"]["sha256"] == minilm.model.sha256 and doc["model"]["opset"] == 17


def test_errors_exit_2_without_traceback(cli, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage" * 10)
    for args in (["inspect", str(tmp_path / "missing.onnx")], ["inspect", str(bad)],
                 ["build", "sample:tiny-cnn", "--policy", str(tmp_path / "nope.json")]):
        p = cli(*args, check=False, process=True)  # the real process: its exit code, no traceback
        assert p.returncode == 2, args
        errors = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
        assert "Traceback" not in p.stderr and len(errors) == 1 and "Fix:" in errors[0]
        assert p.stderr.strip().splitlines()[-1] == errors[0]


def test_build_json_has_every_field(cli, tiny_transformer):
    doc = json.loads(cli("build", "sample:tiny-transformer", "--json", "--iterations", "10").stdout)
    for path in ("latency_ms.median", "latency_ms.p95", "speedup", "reformat.count", "reformat.ms", "reformat.pct",
                 "quality.cosine_mean", "quality.cosine_min", "quality.snr_db", "precision_counts",
                 "int8_mac_fraction", "per_layer", "run_dir"):
        node = doc
        for key in path.split("."):
            assert key in node, path
            node = node[key]
    assert Path(doc["run_dir"]).is_dir() and doc["per_layer"][0]["ms"] >= 0
    assert doc["backend"] == "onnxruntime" and "TensorRT not chosen" in doc["backend_reason"]


def test_export_roundtrip_and_onnx(cli, tmp_path, tiny_transformer):
    pol = tmp_path / "p.json"
    cli("export", "sample:tiny-transformer", "--format", "json", "--out", str(pol))
    doc = json.loads(pol.read_text())
    doc["layers"]["/ffn/up/MatMul"] = "fp16"
    pol.write_text(json.dumps(doc))
    out = tmp_path / "m.onnx"
    cli("export", "sample:tiny-transformer", "--policy", str(pol), "--format", "onnx", "--out", str(out))
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    y = run_model(model, tiny_transformer.eval_data.batches(1)[:2])
    assert y.shape == (2, 32)
    cmd = tmp_path / "trt.sh"
    cli("export", "sample:tiny-transformer", "--policy", str(pol), "--format", "trtexec", "--out", str(cmd))
    text = cmd.read_text()  # INT8 MatMuls: built through Polygraphy and the post-process script (issue 11, bug 1)
    script = (tmp_path / "trt.postprocess.py").read_text()
    assert "'/ffn/up/MatMul': 'fp16'" in script and "'/attn/q/MatMul': 'int8'" in script
    assert "--trt-network-postprocess-script trt.postprocess.py" in text and "--calib" not in text
    assert not (tmp_path / "trt.calib.cache").exists()
    assert (tmp_path / "trt.named.onnx").is_file()
    typed = tmp_path / "typed.sh"
    cli("export", "sample:tiny-transformer", "--policy", str(pol), "--format", "trtexec-typed", "--out", str(typed))
    assert "--stronglyTyped" in typed.read_text() and (tmp_path / "typed.mixprec.onnx").is_file()


def test_export_trtexec_for_int8_gemm_ships_a_postprocess_script(cli, tmp_path):
    """Issue 11, bug 1: trtexec cannot range the weight Constants the parser makes for INT8 Gemm (tiny-cnn's
    /fc/Gemm), so the build goes through Polygraphy with a shipped post-process script; the cache header
    follows --trt-version, and a TensorRT without the legacy APIs is refused."""
    cmd = tmp_path / "cnn.sh"
    cli("export", "sample:tiny-cnn", "--format", "trtexec", "--out", str(cmd), "--trt-version", "10.8")
    text = cmd.read_text()
    build = next(l for l in text.splitlines() if l.startswith("polygraphy convert"))
    for arg in ("cnn.named.onnx", "--precision-constraints obey", "--trt-network-postprocess-script cnn.postprocess.py",
                "--trt-config-postprocess-script cnn.postprocess.py"):
        assert arg in build
    assert "--int8" not in build  # Polygraphy's --int8 adds a calibrator on random data
    assert any(l.startswith("trtexec --loadEngine=model.plan") for l in text.splitlines())
    script = (tmp_path / "cnn.postprocess.py").read_text()
    compile(script, "cnn.postprocess.py", "exec")
    assert "'/fc/Gemm': 'int8'" in script and "def postprocess(network)" in script
    assert not (tmp_path / "cnn.calib.cache").exists()  # not used on this route
    pol = tmp_path / "conv-only.json"  # INT8 convolutions only: trtexec builds it with the calibration cache
    cli("export", "sample:tiny-cnn", "--format", "json", "--out", str(pol))
    doc = json.loads(pol.read_text())
    doc["layers"]["/fc/Gemm"] = "fp16"
    pol.write_text(json.dumps(doc))
    cli("export", "sample:tiny-cnn", "--policy", str(pol), "--format", "trtexec", "--out", str(cmd),
        "--trt-version", "10.8")
    text = cmd.read_text()
    assert (tmp_path / "cnn.calib.cache").read_text().startswith("TRT-100800-EntropyCalibration2\n")
    assert "--calib=cnn.calib.cache" in text and "--noTF32" in text and "/fc/Gemm:fp16" in text
    p = cli("export", "sample:tiny-cnn", "--format", "trtexec", "--out", str(cmd), "--trt-version", "10.12",
            check=False)
    assert p.returncode == 2 and "--format trtexec-typed" in p.stderr


def test_export_polygraphy_compares_against_fp32_and_passes(cli, tmp_path):
    """Issue 11, bug 2: the Polygraphy export compares with FP32 ONNX Runtime outputs of the original at a
    tolerance measured for the policy. Run here with ONNX Runtime standing in for TensorRT: it passes
    at the exported tolerance and fails at Polygraphy's defaults (which is what the old export used)."""
    out = tmp_path / "poly.sh"
    cli("export", "sample:tiny-cnn", "--format", "polygraphy", "--out", str(out))
    lines = [l for l in out.read_text().splitlines() if l.startswith("polygraphy run")]
    assert len(lines) == 2 and "poly.named.onnx --onnxrt" in lines[0] and "--load-outputs" in lines[1]
    assert "tolerance: 2 x the max abs error" in out.read_text()
    exe = str(Path(sys.executable).parent / "polygraphy")

    def run(line):
        args = [a for a in shlex.split(line)[1:]]
        return subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    assert run(lines[0]).returncode == 0
    args = shlex.split(lines[1])
    cut = args.index("--load-inputs")  # ONNX Runtime instead of TensorRT: drop --trt, --strongly-typed, shapes
    onnxrt = shlex.join([*args[:3], "--onnxrt", *args[cut:]])
    assert run(onnxrt).returncode == 0, run(onnxrt).stdout
    atol = args.index("--atol")
    assert run(shlex.join([*args[:3], "--onnxrt", *args[cut:atol]])).returncode != 0


def test_sample_command_writes_files(cli, tmp_path):
    doc = json.loads(cli("sample", "tiny-cnn", "--out", str(tmp_path / "s"), "--json").stdout)
    for key in ("model", "calib", "eval"):
        assert Path(doc[key]).is_file()


@pytest.mark.parametrize("fixture,count,pct", [("a100-resnet-qat", 12, 25.4), ("a100-resnet-fp16", 2, 8.7)])
def test_report_command(cli, trt_reports_dir, fixture, count, pct):
    doc = json.loads(cli("report", str(trt_reports_dir / f"{fixture}.graph.json"),
                         str(trt_reports_dir / f"{fixture}.profile.json"), "--json").stdout)
    assert doc["reformat"]["count"] == count and round(doc["reformat"]["pct"], 1) == pct


def test_report_command_says_the_model_match_and_the_gpu(cli, trt_reports_dir, tmp_path):
    """Issue 23 §4 on the command line: the report is matched to --model (a ResNet-18 with the fixture engine's
    node names: 23 of 23; the tiny CNN: 0 of 23, not its engine) and the GPU is read from --log where it says it,
    else the output says the report does not name it and how to give it."""
    from tests.fixtures.engine_reports import fixture_resnet18

    graph, profile = (str(trt_reports_dir / f"a100-resnet-fp32.{k}.json") for k in ("graph", "profile"))
    resnet = str(fixture_resnet18(tmp_path / "resnet18.onnx"))
    doc = json.loads(cli("report", graph, profile, "--model", resnet, "--json").stdout)
    assert doc["model_match"]["matched"] == doc["model_match"]["named"] == 23 and doc["model_match"]["enough"]
    assert doc["device"]["name"] == "" and doc["device"]["min_capability"] == [8, 0]
    text = cli("report", graph, profile, "--model", "sample:tiny-cnn").stdout
    assert "Model: 0 of 23 engine layers are layers of the model (sample:tiny-cnn)" in text and "is not of sample:tiny-cnn" in text
    assert "GPU: the report does not name its GPU" in text and "pass it with --log" in text
    log = tmp_path / "trtexec.log"
    log.write_text("[12/01/2026-10:00:00] [I] === Device Information ===\n"
                   "[12/01/2026-10:00:00] [I] Selected Device: NVIDIA A100-SXM4-40GB\n"
                   "[12/01/2026-10:00:00] [I] Compute Capability: 8.0\n")
    named = cli("report", graph, profile, "--log", str(log)).stdout
    assert "GPU: the report names its GPU: NVIDIA A100-SXM4-40GB" in named and "compute capability 8.0" in named
    assert "Model: not checked" in named
    bad = cli("report", graph, "--model", str(tmp_path / "missing.onnx"), check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_rank_json_is_clean_stdout(cli, tiny_cnn):
    doc = json.loads(cli("rank", "sample:tiny-cnn", "--json", "--samples", "4").stdout)
    assert doc["samples"] == 4 and len(doc["layers"]) == len(tiny_cnn.layers)
    assert doc["layers"][0]["rank"] == 1
    assert doc["runner"] == "onnxruntime"  # --runner auto, where TensorRT does not run


def test_rank_on_tensorrt_where_it_does_not_run_says_so(cli):
    from core.backends.tensorrt import tensorrt_available

    if tensorrt_available()[0]:
        pytest.skip("TensorRT runs here: tests/gpu rank on it")
    p = cli("rank", "sample:tiny-cnn", "--runner", "tensorrt", "--samples", "2", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "the ranking cannot run on TensorRT here" in p.stderr and "on onnxruntime" in p.stderr


def test_profile_flag_sets_the_shapes_and_the_exported_ranges(cli, tiny_transformer, tmp_path):
    """--profile INPUT=MIN:OPT:MAX (issue 22 §4): the project runs at OPT (the mask follows its named dims),
    inspect shows the profile, the export builds for min/opt/max; bad or conflicting profiles exit 2."""
    prof = ["--profile", "input_ids=1x8:2x16:8x32"]
    doc = json.loads(cli("inspect", "sample:tiny-transformer", *prof, "--json").stdout)
    assert doc["model"]["input_shapes"] == {"input_ids": [2, 16], "attention_mask": [2, 16]}
    assert doc["model"]["profiles"] == {"input_ids": [[1, 8], [2, 16], [8, 32]]}
    assert "profile input_ids: 1x8:2x16:8x32" in cli("inspect", "sample:tiny-transformer", *prof).stdout
    out = tmp_path / "model.sh"
    cli("export", "sample:tiny-transformer", *prof, "--format", "trtexec-typed", "--out", out)
    script = out.read_text().split()
    assert "--minShapes=input_ids:1x8,attention_mask:1x8" in script
    assert "--optShapes=input_ids:2x16,attention_mask:2x16" in script
    assert "--maxShapes=input_ids:8x32,attention_mask:8x32" in script
    for args, text in ((["--profile", "input_ids=1x8:2x16"], "bad --profile"),
                       (["--profile", "ids=1x8:2x16:8x32"], "input_ids, attention_mask"),
                       ([*prof, "--shape", "input_ids=2x32"], "--shape and --profile give an input two different"),
                       (["--profile", "input_ids=1x8:2x16:8x12"], "axis 1 is 8:16:12, not min <= opt <= max")):
        p = cli("inspect", "sample:tiny-transformer", *args, check=False)
        assert p.returncode == 2 and text in p.stderr and "Fix:" in p.stderr, args


def test_trt_profile_flag_parses_and_reaches_the_backend(cli, ws, tmp_path):
    from core.backends.tensorrt import TensorRTBackend, profile_shapes
    from core.cli.commands import parse_trt_profiles
    from core.errors import MixprecError

    prof = parse_trt_profiles(["input_ids=1x16:1x64:16x128"])
    assert prof == {"input_ids": ((1, 16), (1, 64), (16, 128))}
    assert profile_shapes({"input_ids": (1, 64)}, prof)["input_ids"][2] == (16, 128)
    assert TensorRTBackend(profiles=prof, workspace_bytes=1 << 30).profiles == prof
    with pytest.raises(MixprecError, match="INPUT=MIN:OPT:MAX"):
        parse_trt_profiles(["input_ids=1x16:1x64"])
    p = cli("build", "sample:tiny-cnn", "--backend", "tensorrt", "--trt-profile", "image=1x3x32x32:1x3x32x32:4x3x32x32",
            check=False)
    assert p.returncode == 2 and "TensorRT backend cannot run here" in p.stderr
    # the search says so before any trial runs
    p = cli("search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.99", "--backend", "tensorrt", check=False)
    assert p.returncode == 2 and "TensorRT backend cannot run here" in p.stderr and "Traceback" not in p.stderr
    assert not (ws.root / "search").exists() or not any((ws.root / "search").rglob("isolated*"))


def test_data_command_writes_the_npz_of_an_image_folder(cli, tmp_path):
    """``python -m core data MODEL --images DIR --recipe … --out``: the arrays core.model.data_import makes, the recipe
    beside them, one JSON document; a folder without images is one line and exit 2."""
    import numpy as np
    from PIL import Image

    from core.model.data_import import import_images, parse_recipe
    from core.model.load import load_model
    from core.model.shapes import resolve_input_shapes
    from core.workspace import Workspace
    from tests.fixtures.models import dynamic_cnn

    model_path = dynamic_cnn(tmp_path / "cnn.onnx")
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (12 + i, 20, 3), dtype=np.uint8)).save(
            tmp_path / "imgs" / f"{i}.png")
    recipe = "resize=letterbox,pad=114,channels=BGR,mean=0.485:0.456:0.406,std=0.229:0.224:0.225"
    p = cli("data", model_path, "--images", tmp_path / "imgs", "--recipe", recipe, "--shape", "images=1x3x16x24",
            "--out", tmp_path / "calib.npz", "--json")
    doc = json.loads(p.stdout)
    assert doc["num_samples"] == 3 and doc["shapes"] == {"images": [3, 3, 16, 24]} and doc["kind"] == "images"
    assert any("200–500" in n for n in doc["notes"]) and doc["recipe"]["channels"] == "BGR"
    model = load_model(str(model_path), Workspace(tmp_path / "ws"))
    want = import_images(tmp_path / "imgs", model, resolve_input_shapes(model, shapes={"images": (1, 3, 16, 24)}),
                         parse_recipe(recipe)).arrays["images"]
    with np.load(tmp_path / "calib.npz") as z:
        np.testing.assert_array_equal(z["images"], want)
    assert json.loads((tmp_path / "calib.recipe.json").read_text())["recipe"]["pad"] == 114
    (tmp_path / "empty").mkdir()
    bad = cli("data", model_path, "--images", tmp_path / "empty", "--out", tmp_path / "x.npz", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "Fix:" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "x.npz").exists()
    assert "key=value" in cli("data", "--help", check=False).stdout


def test_json_stdout_carries_the_document_only(cli, tiny_cnn, monkeypatch):
    """Issue 23, fault 6: with --json, what a child process (a raylet, a trial worker) or a C library writes to
    fd 1 while the command runs goes to stderr; stdout is the JSON document alone."""
    import os

    from core.cli import commands

    real = commands.kv_cache

    def noisy(m):
        subprocess.run(["echo", "(raylet) [2026-12-03] worker died"], check=True)  # a child inheriting fd 1
        os.write(1, b"a C library's line on fd 1\n")
        print("a print of this process")
        return real(m)

    monkeypatch.setattr(commands, "kv_cache", noisy)
    p = cli("inspect", "sample:tiny-cnn", "--json")
    doc = json.loads(p.stdout)  # the whole of stdout parses: nothing else is on it
    assert doc["model"]["name"] and "raylet" in p.stderr and "C library" in p.stderr and "a print" in p.stderr
    p = cli("inspect", "sample:tiny-cnn")  # without --json stdout is the report, the child's line on it too
    assert "raylet" in p.stdout


def test_search_quick_from_the_fp16_network_default(cli, tmp_path):
    """Issue 23 §7/§8: ``search --quick`` is one calibration method (--calibration, default minmax) and no put-back
    pass; ``--network-default fp16`` starts it from the FP16 default, so no layer of its policy is FP32."""
    out = tmp_path / "policy.json"
    p = cli("search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.99", "--quick", "--calibration", "entropy",
            "--network-default", "fp16", "--workers", "1", "--out", str(out), "--json", check=False)
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["quick"] is True and doc["network_default"] == "fp16" and doc["methods"] == ["entropy"]
    assert "Quick search: entropy calibration only; no put-back pass" in doc["message"]
    assert "Network default FP16" in doc["message"]
    cands = doc["candidates"]
    assert {row[cands["columns"].index("method")] for row in cands["rows"]} == {"entropy"}
    policy = json.loads(out.read_text())
    assert policy["network_default"] == "fp16" and set(policy["layers"].values()) <= {"int8", "fp16"}
    # --calibration is the quick search's: without --quick it is one line and exit 2
    bad = cli("search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.99", "--calibration", "entropy", check=False)
    assert bad.returncode == 2 and "add --quick" in bad.stderr and "Traceback" not in bad.stderr
