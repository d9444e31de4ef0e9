"""Policies: JSON round trip, validation against the model, TensorRT/Polygraphy exports."""
from __future__ import annotations

import json
import shlex
from dataclasses import replace
from types import SimpleNamespace

import pytest

from core.errors import MixprecError
from core.export import (DEFAULT_TRT_VERSION, compiled_onnx, polygraphy_command, trtexec_legacy_command,
                         trtexec_typed_command)
from core.quant.policy import POLICY_VERSION, Policy, migrate_v1, policy_from_dict, policy_from_text, uniform_policy


def test_default_policy_roundtrip(tiny_transformer):
    p = tiny_transformer.default_policy()
    doc = json.loads(p.to_json())
    assert doc["format"] == "mixprec.policy" and doc["version"] == POLICY_VERSION == 2
    assert doc["model"]["sha256"] == tiny_transformer.model.sha256
    assert set(doc["layers"]) == {l.name for l in tiny_transformer.layers}
    assert doc["calibration"]["data_sha256"] == tiny_transformer.calib_data.sha256
    back = policy_from_text(p.to_json(), tiny_transformer.model, tiny_transformer.layers)
    assert back == p and back.sha256 == p.sha256


def test_validation_lists_every_problem(tiny_transformer, tiny_cnn):
    doc = json.loads(tiny_transformer.default_policy().to_json())
    doc["layers"]["no/such/layer"] = "fp16"
    doc["layers"]["/attn/Softmax"] = "int4"
    doc["layers"]["/attn/Softmax_bad"] = "fp16"
    doc["layers"]["/embed/LayerNorm/LayerNormalization"] = "int8"
    with pytest.raises(MixprecError) as e:
        policy_from_dict(doc, tiny_transformer.model, tiny_transformer.layers)
    msg = str(e.value)
    for needle in ("unknown layer 'no/such/layer'", "bad precision 'int4'", "'/attn/Softmax_bad'",
                   "int8 on a LayerNormalization", "Fix:"):
        assert needle in msg
    with pytest.raises(MixprecError, match="model sha256"):
        policy_from_dict(doc | {"layers": {}}, tiny_cnn.model, tiny_cnn.layers)


def test_not_a_policy(tiny_cnn):
    with pytest.raises(MixprecError, match="not valid JSON"):
        policy_from_text("{nope", tiny_cnn.model, tiny_cnn.layers)
    with pytest.raises(MixprecError, match="not a mixprec policy"):
        policy_from_text('{"layers": {}}', tiny_cnn.model, tiny_cnn.layers)


def test_trtexec_exports_name_real_layers(minilm):
    pol = minilm.default_policy().with_layers({"/encoder/layer.3/output/dense/MatMul": "fp16"})
    legacy = trtexec_legacy_command(minilm.model, pol, "model.onnx", "calib.cache", minilm.input_shapes)
    for flag in ("--fp16", "--int8", "--precisionConstraints=obey", "--calib=calib.cache"):
        assert flag in legacy
    assert "/encoder/layer.3/output/dense/MatMul:fp16" in legacy
    assert "/encoder/layer.0/attention/self/query/MatMul:int8" in legacy
    assert "/encoder/layer.0/attention/output/LayerNorm/LayerNormalization:fp16" in legacy
    seq = minilm.input_shapes["input_ids"][1]
    assert f"--optShapes=input_ids:1x{seq},attention_mask:1x{seq},token_type_ids:1x{seq}" in legacy
    typed = trtexec_typed_command(minilm.model, "m.mixprec.onnx", minilm.input_shapes)
    assert "--stronglyTyped" in typed and "--onnx=m.mixprec.onnx" in typed and "--fp16" not in typed
    poly = polygraphy_command(minilm.model, "m.mixprec.onnx", minilm.input_shapes)
    assert poly.splitlines()[1].startswith("polygraphy run m.mixprec.onnx --trt --strongly-typed")
    assert f"input_ids:[1,{seq}]" in poly


def test_uniform_int8_only_on_eligible(tiny_cnn):
    p = uniform_policy(tiny_cnn.model, tiny_cnn.layers, "int8")
    by = {l.name: l for l in tiny_cnn.layers}
    assert all((prec == "int8") == by[n].eligible for n, prec in p.layers.items())


# ---------------------------------------------------------------------------- issue 11, section 2 (export bugs)

def test_legacy_command_has_int8_and_calib_only_with_int8_layers(tiny_cnn):
    """Bug 1: ``--calib`` without a written cache makes trtexec calibrate on random data."""
    fp16 = uniform_policy(tiny_cnn.model, tiny_cnn.layers, "fp16")
    cmd = trtexec_legacy_command(tiny_cnn.model, fp16, "m.onnx", "c.cache", tiny_cnn.input_shapes)
    assert "--calib" not in cmd and "--int8" not in cmd and "--fp16" in cmd
    int8 = tiny_cnn.default_policy()
    assert "--calib=c.cache" in trtexec_legacy_command(tiny_cnn.model, int8, "m.onnx", "c.cache", tiny_cnn.input_shapes)
    no_cache = trtexec_legacy_command(tiny_cnn.model, int8, "m.onnx", None, tiny_cnn.input_shapes)
    assert "--calib" not in no_cache


def test_calibration_cache_header_names_the_target_tensorrt(tiny_cnn):
    """Bug 1: the header was hard-coded to TRT-100100 (10.1.0); TensorRT rejects another version's cache."""
    from core.quant.calibration import calibrate, trt_calibration_cache, trt_version_number

    calib = calibrate(tiny_cnn.model, tiny_cnn.calib_data, "minmax", tiny_cnn.ws)
    assert trt_calibration_cache(calib, "10.8.0.43").splitlines()[0] == "TRT-100800-EntropyCalibration2"
    assert trt_calibration_cache(calib, DEFAULT_TRT_VERSION).startswith("TRT-101100-EntropyCalibration2\n")
    assert trt_version_number("10.14.1") == 101401  # NV_TENSORRT_VERSION: major*10000 + minor*100 + patch
    with pytest.raises(MixprecError, match="TensorRT version"):
        trt_calibration_cache(calib, "8.6")


def test_tf32_is_explicit_in_the_exported_commands(tiny_cnn):
    """Bug 4: mixprec builds with TF32 off, trtexec defaults it on."""
    pol, m, shapes = tiny_cnn.default_policy(), tiny_cnn.model, tiny_cnn.input_shapes
    for cmd in (trtexec_legacy_command, lambda *a, **k: trtexec_typed_command(a[0], "c.onnx", a[4], **k)):
        assert "--noTF32" in shlex.split(cmd(m, pol, "m.onnx", "c.cache", shapes))
        assert "--noTF32" not in shlex.split(cmd(m, pol, "m.onnx", "c.cache", shapes, tf32=True))
    assert "--tf32" not in polygraphy_command(m, "c.onnx", shapes)
    assert "--tf32" in shlex.split(polygraphy_command(m, "c.onnx", shapes, tf32=True).splitlines()[1])


def test_polygraphy_command_compares_with_fp32_outputs_at_explicit_tolerance(tiny_cnn):
    """Bug 2: ONNX Runtime ran the compiled model, at Polygraphy's default 1e-5 tolerances."""
    ref, run = polygraphy_command(tiny_cnn.model, "c.onnx", tiny_cnn.input_shapes, reference_onnx="orig.onnx",
                                  inputs="in.json", outputs="fp32.json", atol=0.25).splitlines()
    assert shlex.split(ref) == ["polygraphy", "run", "orig.onnx", "--onnxrt", "--load-inputs", "in.json",
                                "--save-outputs", "fp32.json"]
    args = shlex.split(run)
    assert args[:3] == ["polygraphy", "run", "c.onnx"] and "--onnxrt" not in args
    for flag, value in (("--load-inputs", "in.json"), ("--load-outputs", "fp32.json"), ("--atol", "0.25"),
                        ("--rtol", "0")):
        assert args[args.index(flag) + 1] == value


def _spec(name):
    return SimpleNamespace(name=name, dynamic_axes=(0,))


def test_trtexec_name_checks_follow_trtexec_parsing(tiny_cnn):
    """Bug 10: trtexec splits on the last ':' (so ':' is fine), but ',' splits entries, "'" quotes and '*'
    is --layerPrecisions' wildcard; input names in shape flags were not checked at all."""
    model = SimpleNamespace(inputs=[_spec("in:0")])
    ok = trtexec_legacy_command(model, Policy("m", "0" * 64, "fp32", {"scope:conv": "int8"}), "m.onnx", "c",
                                {"in:0": (1, 3)})
    assert "--layerPrecisions=scope:conv:int8" in ok and "--optShapes=in:0:1x3" in ok
    for bad in ("a,b", "a'b", "conv*"):
        with pytest.raises(MixprecError, match="trtexec") as e:
            trtexec_legacy_command(model, Policy("m", "0" * 64, "fp32", {bad: "fp16"}), "m.onnx", "c", {"in:0": (1, 3)})
        assert e.value.details == [bad]
    for bad in ("ids,mask", "it's"):
        with pytest.raises(MixprecError, match="input names") as e:
            trtexec_typed_command(SimpleNamespace(inputs=[_spec(bad)]), "c.onnx", {bad: (1, 3)})
        assert e.value.details == [bad]


def test_trt_target_export_requires_opset_13(tiny_cnn):
    """Bug 8: the trt target's per-channel DequantizeLinear (axis) needs opset >= 13; say so, and how."""
    old = replace(tiny_cnn, model=replace(tiny_cnn.model, opset=12))
    with pytest.raises(MixprecError, match="opset 12.*needs opset >= 13") as e:
        compiled_onnx(old, old.default_policy(), "trt")
    assert "onnx.version_converter" in e.value.fix


def test_legacy_int8_layers_output_fp32_like_the_typed_build(tiny_cnn):
    """Bug 6: under an fp16 network default INT8 layers output fp32 in the compiled (strongly typed)
    model but the network default in the legacy command; both now output fp32."""
    pol = tiny_cnn.default_policy("fp16")
    cmd = trtexec_legacy_command(tiny_cnn.model, pol, "m.onnx", "c.cache", tiny_cnn.input_shapes)
    outputs = dict(kv.rsplit(":", 1) for kv in cmd.split("--layerOutputTypes=")[1].split()[0].split(","))
    int8 = [n for n, p in pol.layers.items() if p == "int8"]
    assert int8 and all(outputs[n] == "fp32" for n in int8)
    assert {outputs[n] for n, p in pol.layers.items() if p == "fp16"} <= {"fp16"}


def test_an_unreadable_trt_version_in_an_export_names_the_flag(tiny_cnn, tmp_path):
    """A --trt-version the user mistyped is the user's to fix (not "reinstall TensorRT")."""
    from core.errors import MixprecError
    from core.export import export_policy

    with pytest.raises(MixprecError, match="cannot read the TensorRT version 'ten'.*--trt-version 10.11.0"):
        export_policy(tiny_cnn, tiny_cnn.default_policy(), "trtexec", tmp_path / "b.sh", trt_version="ten")


# --- format 2 (INT8 placement) and the migration of format-1 documents ---------------------------

@pytest.fixture(scope="module")
def golden_models(tmp_path_factory):
    """The models of tests/data/policy_v1_compiled.json, loaded (tests/fixtures/v1_golden.py)."""
    from tests.fixtures import v1_golden

    tmp = tmp_path_factory.mktemp("golden")
    return {name: v1_golden.load(name, data, tmp) for name, data in v1_golden.case_models().items()}


def test_v1_policies_compile_to_the_same_model(golden_models):
    """Every format-1 document of the golden record (default, default with an FP16 network default,
    all-FP16, on models with residual Adds, pooling and a float Concat) loads through the migration
    and compiles node by node to what the format-1 compiler wrote, on both targets."""
    from tests.fixtures import v1_golden
    from core.quant.compile import compile_policy
    from core.model.inventory import build_inventory

    cases = json.loads(v1_golden.GOLDEN.read_text())
    assert len(cases) == 12
    for case, rec in cases.items():
        model = golden_models[rec["model"]]
        layers = build_inventory(model)
        assert rec["doc"]["version"] == 1
        pol = policy_from_dict(rec["doc"], model, layers)
        calib = v1_golden.synthetic_calib(model) if "int8" in pol.layers.values() else None
        for target in v1_golden.TARGETS:
            got = v1_golden.signature(compile_policy(model, pol, calib, target).proto)
            assert json.loads(json.dumps(got)) == rec["compiled"][target], f"{case} ({target}) compiles differently"


def test_v1_migration_keeps_format_1_meaning(golden_models):
    """A format-1 document that omits layers gets format-1 defaults (placement layers at the network
    default), the float Concat the precision it followed; the same document as format 2 gets the new
    pattern defaults (INT8 residual Add, pooling and Concat)."""
    from core.model.inventory import build_inventory

    model = golden_models["branchy"]
    layers = build_inventory(model)
    by = {l.name: l for l in layers}
    assert {n: by[n].placement for n in ("/Concat", "/MaxPool", "/Add", "/GlobalAveragePool")} == \
        {"/Concat": "concat", "/MaxPool": "pooling", "/Add": "add", "/GlobalAveragePool": "pooling"}
    convs = {l.name: "int8" for l in layers if l.op_type in ("Conv", "Gemm")}
    doc = {"format": "mixprec.policy", "version": 1, "model": {"name": "b", "sha256": model.sha256},
           "network_default": "fp16", "layers": convs}
    v1 = policy_from_dict(doc, model, layers)
    assert {n: v1.layers[n] for n in ("/Add", "/MaxPool", "/GlobalAveragePool", "/Relu_1")} == \
        {"/Add": "fp16", "/MaxPool": "fp16", "/GlobalAveragePool": "fp16", "/Relu_1": "fp16"}
    assert v1.layers["/Concat"] == "fp16"  # both inputs were FP16 Relus: it followed them
    fp32_relu = migrate_v1({**doc, "layers": {**convs, "/Relu_2": "fp32"}}, model, layers)
    assert fp32_relu["version"] == 2 and fp32_relu["layers"]["/Concat"] == "fp32"  # one input FP32
    v2 = policy_from_dict({**doc, "version": 2}, model, layers)
    assert {n: v2.layers[n] for n in ("/Add", "/MaxPool", "/GlobalAveragePool", "/Concat")} == \
        dict.fromkeys(("/Add", "/MaxPool", "/GlobalAveragePool", "/Concat"), "int8")
    with pytest.raises(MixprecError, match="version 3 is not supported"):
        policy_from_dict({**doc, "version": 3}, model, layers)


def test_int8_placement_is_a_policy_choice(minilm):
    """A transformer residual Add is float by default but may be set INT8 by hand; a bias Add or a
    LayerNorm may not."""
    inv = {l.name: l for l in minilm.layers}
    residual = "/encoder/layer.0/output/Add"
    assert inv[residual].placement == "add" and not inv[residual].eligible
    assert minilm.default_policy().layers[residual] == "fp32"
    doc = json.loads(minilm.default_policy().to_json())
    doc["layers"][residual] = "int8"
    assert policy_from_dict(doc, minilm.model, minilm.layers).layers[residual] == "int8"
    bias = "/encoder/layer.0/output/dense/Add"
    assert inv[bias].placement == ""
    doc["layers"][bias] = "int8"
    with pytest.raises(MixprecError) as e:
        policy_from_dict(doc, minilm.model, minilm.layers)
    assert any("int8 on a Add" in d and "placement" in d for d in e.value.details)
