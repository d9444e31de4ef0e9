"""The export bundle (core.export.export_bundle): every file a GPU user needs in one zip, with a
README on how to build, check, profile and import the reports; scripts that name only files the
bundle holds (or that they write); parts that cannot be made are left out with the reason."""
from __future__ import annotations

import io
import json
import re
import shlex
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.export import (BUNDLE_SCRIPTS, DEFAULT_TRT_VERSION, bundle_filename, export_bundle, fold_command,
                         legacy_script, trtexec_legacy_command, typed_script)
from core.project import open_project
from core.quant.policy import policy_from_text, uniform_policy
from core.workspace import Workspace

# node names with Markdown and HTML in them (and "*", which trtexec's name lists read as a wildcard)
MD_NAME = "<b>bold</b> **star** _under_ `tick`"
HTML_NAME = '![img](http://127.0.0.1:9/x.png) <img src="http://127.0.0.1:9/y.png"> $x$ :red[r]'
OUTPUTS = {"layers.json", "profile.json", "model.plan", "model.fp32-outputs.json"}  # what the scripts write


def odd_names_model(path: Path, input_name: str = "x") -> Path:
    """MatMul → Relu → MatMul with Markdown/HTML node names, a dynamic batch on input ``input_name``."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", [input_name, "w1"], ["h"], name=MD_NAME),
             helper.make_node("Relu", ["h"], ["r"], name="relu <i>x</i>"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name=HTML_NAME)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _text(bundle, name: str) -> str:
    return bundle.files[name].decode()


def _named_files(script: str) -> set[str]:
    """Every file name a script's commands mention (``--flag=file``, ``--flag file`` or an argument)."""
    names = set()
    for line in script.splitlines():
        if line.startswith("#") or not line.strip() or line.startswith(("set ", "cd ")):
            continue
        for tok in shlex.split(line):
            value = tok.split("=", 1)[-1]
            if value.endswith((".onnx", ".json", ".cache", ".py", ".plan")):
                names.add(value)
    return names


def _check_scripts(bundle) -> None:
    for script in BUNDLE_SCRIPTS.values():
        if script in bundle.files:
            text = _text(bundle, script)
            assert text.startswith("#!/usr/bin/env bash\nset -euo pipefail\n")
            missing = _named_files(text) - set(bundle.files) - OUTPUTS
            assert not missing, (script, missing)


def test_bundle_of_the_default_policy(tiny_cnn):
    """tiny-cnn's default policy (INT8 convolutions and an INT8 Gemm): everything is there; the ≤ 10.11
    build goes through the post-process script, the cache is still offered; the zip is the files."""
    pol = tiny_cnn.default_policy()
    bundle = export_bundle(tiny_cnn, pol, source="The session's policy")
    names = list(bundle.files)
    assert names[0] == "README.md" and not bundle.left_out
    assert set(names) == {"README.md", "policy.json", "model.mixprec.onnx", "model.named.onnx", "model.calib.cache",
                          "model.postprocess.py", "model.inputs.json", *BUNDLE_SCRIPTS.values()}
    assert policy_from_text(_text(bundle, "policy.json"), tiny_cnn.model, tiny_cnn.layers).sha256 == pol.sha256
    compiled = onnx.load_from_string(bundle.files["model.mixprec.onnx"])
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in compiled.graph.node}
    assert bundle.files["model.named.onnx"] == tiny_cnn.model.serialized()
    assert _text(bundle, "model.calib.cache").startswith("TRT-101100-EntropyCalibration2\n")
    assert "--trt-network-postprocess-script model.postprocess.py" in _text(bundle, BUNDLE_SCRIPTS["legacy"])
    assert json.loads(_text(bundle, "model.inputs.json"))
    _check_scripts(bundle)
    readme = _text(bundle, "README.md")
    for needed in ("bash build-trt-10.12.sh", "bash build-trt-10.11.sh", "bash check-polygraphy.sh",
                   "python -m core report layers.json profile.json", "Import TensorRT engine reports",
                   "trtexec --loadEngine=model.plan", "The session's policy", pol.sha256[:16],
                   f"fp32 {pol.precision_counts()['fp32']} · fp16 {pol.precision_counts()['fp16']}"):
        assert needed in readme, needed
    assert all(f"`{n}`" in readme for n in names)  # every file is explained
    assert "not needed by build-trt-10.11.sh here" in readme  # the cache, on the post-process route
    z = zipfile.ZipFile(io.BytesIO(bundle.zip()))
    assert z.namelist() == names and all(z.read(n) == bundle.files[n] for n in names)
    assert (z.getinfo(BUNDLE_SCRIPTS["typed"]).external_attr >> 16) & 0o111  # executable
    assert z.getinfo("model.mixprec.onnx").compress_type == zipfile.ZIP_STORED
    assert bundle.zip() == bundle.zip()  # the same export gives the same bytes
    assert bundle_filename(pol) == "sample_tiny-cnn.mixprec-export.zip"  # the model's name, file-safe
    assert bundle_filename(pol, "20260101-x") == "sample_tiny-cnn.20260101-x.mixprec-export.zip"


def test_bundle_int8_convolutions_use_the_cache_and_version(tiny_cnn):
    """INT8 only on convolutions: the ≤ 10.11 script is trtexec with --calib on the bundled cache,
    whose header follows the TensorRT version asked for."""
    pol = tiny_cnn.default_policy().with_layers({"/fc/Gemm": "fp16"})
    bundle = export_bundle(tiny_cnn, pol, trt_version="10.8")
    legacy = _text(bundle, BUNDLE_SCRIPTS["legacy"])
    assert "--calib=model.calib.cache" in legacy and "--onnx=model.named.onnx" in legacy
    assert "model.postprocess.py" not in bundle.files
    assert _text(bundle, "model.calib.cache").startswith("TRT-100800-EntropyCalibration2\n")
    assert "header TRT-100800-EntropyCalibration2" in legacy
    assert "written for TensorRT 10.8" in _text(bundle, "README.md")
    assert legacy == legacy_script(tiny_cnn, pol, "model", "10.8")  # what the page offers before compiling
    _check_scripts(bundle)


def test_bundle_without_int8_has_no_cache(tiny_cnn):
    pol = uniform_policy(tiny_cnn.model, tiny_cnn.layers, "fp16")
    bundle = export_bundle(tiny_cnn, pol)
    assert "model.calib.cache" not in bundle.files and "model.postprocess.py" not in bundle.files
    legacy = _text(bundle, BUNDLE_SCRIPTS["legacy"])
    assert "--int8" not in legacy and "--calib" not in legacy
    assert _text(bundle, BUNDLE_SCRIPTS["typed"]) == typed_script(tiny_cnn, "model")
    _check_scripts(bundle)


def test_bundle_leaves_out_what_cannot_be_made_and_says_why(tmp_path):
    """An input name trtexec's shape lists cannot express (a ','): the trtexec scripts are left out,
    the README says which and why, and the rest (policy, compiled ONNX, Polygraphy check) is there.
    Markdown in the node names stays literal in the README."""
    p = open_project(str(odd_names_model(tmp_path / "odd.onnx", input_name="x,y")), ws=Workspace(tmp_path / "ws"))
    bundle = export_bundle(p, p.default_policy(), source="Run **bold** <img src=x>")
    assert BUNDLE_SCRIPTS["typed"] not in bundle.files and BUNDLE_SCRIPTS["legacy"] not in bundle.files
    assert {"policy.json", "model.mixprec.onnx", BUNDLE_SCRIPTS["polygraphy"]} <= set(bundle.files)
    assert len(bundle.left_out) == 2 and all("input names" in n for n in bundle.left_out)
    readme = _text(bundle, "README.md")
    assert "## Left out" in readme and "build-trt-10.12.sh" in readme.split("## Left out")[1]
    assert "bash build-trt-10.12.sh" not in readme  # not offered when it is not there
    assert r"Run \*\*bold\*\* \<img src=x>" in readme and not re.search(r"(?<!\\)[<*]", readme.split("## Files")[0])
    _check_scripts(bundle)


def test_fold_command_shortens_long_lists_only(tiny_transformer):
    """The page shows commands folded: one flag per line, and a long --layerPrecisions list cut to
    its first entries and a count; short flags are kept whole."""
    pol = tiny_transformer.default_policy()
    cmd = trtexec_legacy_command(tiny_transformer.model, pol, "model.named.onnx", "model.calib.cache",
                                 tiny_transformer.input_shapes)
    folded = fold_command(cmd, width=60)
    n = len(pol.layers)
    assert f"({n} entries; all of them in the script)" in folded and folded.count("entries;") == 2  # precisions, types
    lines = folded.splitlines()
    assert lines[0] == "trtexec \\" and all(len(l) <= 60 + 60 for l in lines)
    assert "    --onnx=model.named.onnx \\" in lines and "    --calib=model.calib.cache \\" in lines
    assert len(folded) < len(cmd) / 2
    script = legacy_script(tiny_transformer, pol, "model", DEFAULT_TRT_VERSION)  # comments kept, bash set-up not
    shown = fold_command(script)
    assert shown.startswith("# TensorRT <= 10.11") and "set -euo" not in shown and "#!" not in shown
    poly = fold_command('polygraphy run model.onnx --trt --trt-min-shapes \'x:[1,16]\' \'m:[1,8]\' --atol 0.05')
    assert poly.splitlines() == ["polygraphy run model.onnx \\", "    --trt \\",
                                 "    --trt-min-shapes 'x:[1,16]' 'm:[1,8]' \\", "    --atol 0.05"]


@pytest.mark.parametrize("fmt", ["trtexec-typed", "trtexec"])
def test_cli_export_scripts_are_runnable_bash(tiny_cnn, tmp_path, fmt):
    """``python -m core export`` writes the same scripts as the bundle (a bash header, run from their folder)."""
    from core.export import export_policy

    out = export_policy(tiny_cnn, tiny_cnn.default_policy(), fmt, tmp_path / "b.sh")
    text = out.read_text()
    assert text.startswith("#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")\"")
    assert not (_named_files(text) - {p.name for p in tmp_path.iterdir()} - OUTPUTS)
