"""Policies: JSON round trip, validation against the model, TensorRT/Polygraphy exports."""
from __future__ import annotations

import json

import pytest

from core.errors import MixprecError
from core.export import polygraphy_command, trtexec_legacy_command, trtexec_typed_command
from core.policy import policy_from_dict, policy_from_text, uniform_policy


def test_default_policy_roundtrip(tiny_transformer):
    p = tiny_transformer.default_policy()
    doc = json.loads(p.to_json())
    assert doc["format"] == "mixprec.policy" and doc["version"] == 1
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
    assert poly.startswith("polygraphy run m.mixprec.onnx --trt --strongly-typed --onnxrt")
    assert f"input_ids:[1,{seq}]" in poly


def test_uniform_int8_only_on_eligible(tiny_cnn):
    p = uniform_policy(tiny_cnn.model, tiny_cnn.layers, "int8")
    by = {l.name: l for l in tiny_cnn.layers}
    assert all((prec == "int8") == by[n].eligible for n, prec in p.layers.items())
