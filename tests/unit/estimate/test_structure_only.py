"""The estimator compiles a policy structure-only (``compile_policy(..., structure_only=True)``: no
weight read, quantized or converted) so that an estimate after a toggle is fast on a loaded model
(issue 19 §7). Its predictions must be exactly those of a full compile: checked here on the MiniLM
sample and on ResNet-18 for several policies, at two batches."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import core.quant.compile as compile_mod
from core.errors import MixprecError
from core.estimate.cost import FITTED
from core.estimate.fusion import predicted, static_net
from core.estimate.gpus import gpu as gpu_entry
from core.estimate.predict import data_files, placeholder_calibration, predict, price
from core.model.external import location
from core.quant.compile import SHAPE_ONLY, compile_policy
from core.model.graph import LIGHT_FROM
from core.quant.policy import default_policy, uniform_policy

RESNET_SHAPES = {"input": (32, 3, 224, 224)}


_LAST_COMPILE: dict = {}  # (model, policy) -> its full compile: the last one (a policy is checked at two shapes)


def full_compile(model, policy):
    """The policy compiled with its weights quantized and converted (shape-free: made once for the shapes a
    test checks it at; shape inference works on a copy)."""
    key = (id(model), model.sha256, policy.sha256)
    if key not in _LAST_COMPILE:
        _LAST_COMPILE.clear()
        _LAST_COMPILE[key] = compile_policy(model, policy, placeholder_calibration(model, policy), target="trt")
    return _LAST_COMPILE[key]


@pytest.fixture(autouse=True, scope="module")
def _forget_the_last_compile():
    yield
    _LAST_COMPILE.clear()


def full_compile_prediction(model, policy, shapes, gpu):
    """What :func:`core.estimate.predict.predict` computed before the structure-only compile: the
    policy compiled with its weights quantized and converted, shape inference on that model."""
    compiled = full_compile(model, policy)
    layers, notes = predicted(static_net(compiled.proto, shapes, data_files(compiled)))
    table = price(layers, gpu_entry(gpu), FITTED, True, {n.name for n in model.proto.graph.node})
    return table, float(table.est_ms.sum()), notes


@pytest.fixture(scope="module")
def resnet(resnet18_b32):
    return resnet18_b32


def minilm_policies(p):
    d = p.default_policy()
    mm = [l.name for l in p.layers if l.op_type == "MatMul" and d.layers[l.name] == "int8"]
    return {"default": d, "fp16": uniform_policy(p.model, p.layers, "fp16"),
            "fp32": uniform_policy(p.model, p.layers, "fp32"), "int8": uniform_policy(p.model, p.layers, "int8"),
            "one toggle": d.with_layers({mm[3]: "fp16"}), "two toggles": d.with_layers({mm[0]: "fp32", mm[7]: "fp16"}),
            "smoothed": d.with_smoothing({mm[2]: 0.5, mm[5]: 0.8}), "fp16 default": p.default_policy("fp16")}


def resnet_policies(model, layers):
    fp16 = uniform_policy(model, layers, "fp16")
    residual = fp16.with_layers({l.name: "int8" for l in layers if l.op_type in ("Conv", "Gemm", "Add")})
    return {"fp32": uniform_policy(model, layers, "fp32"), "fp16": fp16,
            "int8-conv": fp16.with_layers({l.name: "int8" for l in layers if l.op_type in ("Conv", "Gemm")}),
            "int8-conv-residual": residual, "int8 everywhere": uniform_policy(model, layers, "int8"),
            "default": default_policy(model, layers),
            "one toggle": residual.with_layers({"/layer3/layer3.1/conv1/Conv": "fp16"})}


def assert_same_prediction(model, policy, shapes, gpu, what):
    got = predict(model, policy, shapes, gpu)
    table, total, notes = full_compile_prediction(model, policy, shapes, gpu)
    assert got.layers.equals(table), f"{what}: the predicted engine differs from the full compile's"
    assert got.total_ms == total and got.notes == notes, what


def test_minilm_predictions_are_those_of_a_full_compile(minilm):
    batch8 = {k: (8, *v[1:]) for k, v in minilm.input_shapes.items()}
    for name, policy in minilm_policies(minilm).items():
        for shapes in (minilm.input_shapes, batch8):
            assert_same_prediction(minilm.model, policy, shapes, "a100", f"minilm {name} {shapes}")
    assert_same_prediction(minilm.model, minilm.default_policy(), minilm.input_shapes, "t4", "minilm on t4")


def test_resnet18_predictions_are_those_of_a_full_compile(resnet):
    model, layers = resnet
    for name, policy in resnet_policies(model, layers).items():
        assert_same_prediction(model, policy, RESNET_SHAPES, "a100", f"resnet18 {name}")
    policy = resnet_policies(model, layers)["int8-conv-residual"]
    assert_same_prediction(model, policy, {"input": (1, 3, 224, 224)}, "t4", "resnet18 batch 1 on t4")


def _weights(proto):
    return {t.name: (t.data_type, tuple(t.dims)) for t in proto.graph.initializer}


def test_structure_only_compile_is_the_full_compile_without_weight_values(minilm):
    """Same nodes (ops, names, inputs, outputs, attributes) and the same initializers (names, types,
    dims); the large ones carry no values (references to SHAPE_ONLY); small ones are the same values
    except weight scales, which are ones."""
    policy = minilm_policies(minilm)["smoothed"]
    calib = placeholder_calibration(minilm.model, policy)
    full = compile_policy(minilm.model, policy, calib, target="trt")
    light = compile_policy(minilm.model, policy, calib, target="trt", structure_only=True)
    assert [n.SerializeToString() for n in light.proto.graph.node] == \
        [n.SerializeToString() for n in full.proto.graph.node]
    assert _weights(light.proto) == _weights(full.proto)
    assert [i.SerializeToString() for i in light.proto.graph.input] == \
        [i.SerializeToString() for i in full.proto.graph.input]
    shape_only = [t for t in light.proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert shape_only and all(location(t) == SHAPE_ONLY and not t.raw_data for t in shape_only)
    assert {t.data_type for t in shape_only} >= {onnx.TensorProto.INT8, onnx.TensorProto.FLOAT16}
    assert light.proto.ByteSize() < full.proto.ByteSize() / 50
    values = {t.name: numpy_helper.to_array(t) for t in full.proto.graph.initializer}
    for t in light.proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            v = numpy_helper.to_array(t)
            assert v.shape == values[t.name].shape and v.dtype == values[t.name].dtype, t.name
            if not t.name.endswith(("_scale", "smooth_inv_scale")):
                assert np.array_equal(v, values[t.name]), t.name
    assert light.structure_only and not full.structure_only
    with pytest.raises(MixprecError, match="structure-only"):
        light.save(Path("/nonexistent/never-written.onnx"))
    with pytest.raises(MixprecError, match="structure-only"):
        light.serialized()


def test_the_estimate_reads_and_converts_no_weight(resnet, monkeypatch):
    """A prediction quantizes no weight of LIGHT_FROM bytes or more (small ones, such as ResNet-18's
    first convolution, keep their values) and never reads a ShapeOnly one (both raise here)."""
    model, layers = resnet
    quantized, real = [], compile_mod._weight_quant

    def small_only(w, axis):
        if w.nbytes >= LIGHT_FROM:
            raise AssertionError("a weight was quantized for an estimate")
        quantized.append(w.shape)
        return real(w, axis)

    monkeypatch.setattr(compile_mod, "_weight_quant", small_only)
    pred = predict(model, resnet_policies(model, layers)["int8-conv-residual"], RESNET_SHAPES, "a100")
    assert pred.total_ms > 0 and (pred.layers.precision == "int8").any()
    assert sorted(quantized) == [(64, 3, 7, 7), (128, 64, 1, 1)], quantized  # conv1, layer2's downsample
    with pytest.raises(AssertionError, match="quantized"):
        compile_policy(model, resnet_policies(model, layers)["int8-conv"],
                       placeholder_calibration(model, uniform_policy(model, layers, "int8")), target="trt")
    shape_only = compile_mod.ShapeOnly("w", (4, 3), np.float32)
    assert shape_only.shape == [4, 3] and shape_only.dtype == np.float32
    with pytest.raises(MixprecError, match="no values"):
        shape_only.load()
