"""Structure of a ResNet-18 default policy (issue 11 §4): ResNet-18 built with torch.nn in torchvision's
layout (tests/fixtures/nets.py), exported at 32 × 3 × 224 × 224, and compiled for TensorRT. Every residual Add
has its skip input quantized (a DequantizeLinear feeds it) and its conv input not, which is the
placement the real A100 engine ``a100-resnet-qat-residual`` fuses into ``Conv + Add + Relu`` INT8
convolutions. The boundaries the placement leaves are checked against the Reformat layers of the three
real INT8 engines of ``shared/fixtures/trt-engine-reports``."""
from __future__ import annotations

import json
from collections import Counter

import onnx
import pytest

from core.quant.calibration import calibrate_policy
from core.quant.compile import compile_policy
from tests.fixtures.nets import resnet18, resnet18_onnx
from core.model.placement import RESIDUAL_INT8, boundaries
from core.project import open_project
from core.workspace import Workspace

TORCHVISION_RESNET18_PARAMS = 11_689_512  # torchvision.models.resnet18(): sum(p.numel() for p in m.parameters())


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resnet18")
    (tmp / "resnet18.onnx").write_bytes(resnet18_onnx(batch=32))
    return open_project(str(tmp / "resnet18.onnx"), ws=Workspace(tmp / "ws"))


@pytest.fixture(scope="module")
def compiled(resnet):
    pol = resnet.default_policy()
    calib = calibrate_policy(resnet.model, resnet.calib_data, pol, resnet.layers, resnet.ws)
    return compile_policy(resnet.model, pol, calib, target="trt").proto


def test_torchvision_layout():
    m = resnet18()
    keys = set(m.state_dict())
    for k in ("conv1.weight", "bn1.running_var", "layer1.0.conv2.weight", "layer2.0.downsample.0.weight",
              "layer2.0.downsample.1.running_mean", "layer4.1.bn2.bias", "fc.weight", "fc.bias"):
        assert k in keys, k
    assert sum(p.numel() for p in m.parameters()) == TORCHVISION_RESNET18_PARAMS
    assert not any(k.startswith(("layer1.0.downsample", "layer1.1.downsample")) for k in keys)


def test_export(resnet):
    assert resnet.input_shapes == {"input": (32, 3, 224, 224)}
    ops = Counter(n.op_type for n in resnet.model.proto.graph.node)
    # BatchNormalization is folded into the convs by the eval-mode export
    assert ops == {"Conv": 20, "Relu": 17, "Add": 8, "MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    assert resnet18_onnx(batch=2, seed=0) == resnet18_onnx(batch=2, seed=0)  # deterministic
    assert resnet18_onnx(batch=2, seed=0) != resnet18_onnx(batch=2, seed=1)


def test_default_policy_places_residual_adds_and_pooling_in_int8(resnet):
    by = {l.name: l for l in resnet.layers}
    adds = [l for l in resnet.layers if l.op_type == "Add"]
    assert len(adds) == 8 and all(l.placement == "add" and l.default_precision == "int8" and l.eligible
                                  and l.default_reason == RESIDUAL_INT8 for l in adds)
    for pool in ("/maxpool/MaxPool", "/avgpool/GlobalAveragePool"):
        assert by[pool].placement == "pooling" and by[pool].default_precision == "int8"
    pol = resnet.default_policy()
    assert {pol.layers[l.name] for l in adds} == {"int8"}


def _skip_tensor(add: onnx.NodeProto) -> str:
    """The skip input of a torchvision BasicBlock's Add: the block input, or the downsample conv's output."""
    conv2 = [t for t in add.input if "/conv2/" in t]
    assert len(conv2) == 1, add.input
    return next(t for t in add.input if t not in conv2)


def test_every_residual_add_has_its_skip_input_dequantized(resnet, compiled):
    producer = {o: n for n in compiled.graph.node for o in n.output}
    consumers = {}
    for n in compiled.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    originals = {n.name: n for n in resnet.model.proto.graph.node if n.op_type == "Add"}
    adds = [n for n in compiled.graph.node if n.name in originals]
    assert len(adds) == 8
    for add in adds:
        skip = _skip_tensor(originals[add.name])
        kinds = {producer[t].op_type: t for t in add.input}
        assert set(kinds) == {"Conv", "DequantizeLinear"}, (add.name, kinds)
        dq = producer[kinds["DequantizeLinear"]]
        q = producer[dq.input[0]]
        assert q.op_type == "QuantizeLinear" and q.input[0] == skip, (add.name, q.input[0], skip)
        assert "/conv2/Conv" in producer[kinds["Conv"]].name  # the Add fuses into the block's conv2
        # Conv + Add + Relu writes INT8: the Relu's output is read only by QuantizeLinear nodes
        relu = [c for c in consumers[add.output[0]]]
        assert [c.op_type for c in relu] == ["Relu"]
        assert {c.op_type for c in consumers[relu[0].output[0]]} == {"QuantizeLinear"}, add.name
    # a downsample block quantizes the downsample output as its skip (as the fixture engine does)
    down = originals["/layer2/layer2.0/Add"]
    assert _skip_tensor(down) == "/layer2/layer2.0/downsample/downsample.0/Conv_output_0"
    # one QuantizeLinear per block input, shared by the next conv1 and the next skip
    shared = producer[next(i for i in compiled.graph.node if i.name == "/layer1/layer1.1/Add").input[1]]
    q = producer[shared.input[0]]
    assert sum(1 for c in consumers[q.output[0]] if c.op_type == "DequantizeLinear") == 2


def _fixture_q_reformats(trt_reports_dir, name: str) -> int:
    """QuantizeLinear layers that TensorRT had to run on their own (Reformat), except the network
    input's: each is a float tensor on its way into an INT8 layer."""
    layers = json.loads((trt_reports_dir / f"{name}.graph.json").read_text())["Layers"]
    return sum(1 for l in layers if l["LayerType"] == "Reformat" and l["Name"].startswith("QuantizeLinear_")
               and l["Inputs"][0]["Name"] != "input.1")


def _float_to_int8_tensors(resnet, policy) -> int:
    df = boundaries(resnet.model, resnet.layers, policy)
    into = df[(df.direction == "in") & (df.neighbour_precision != "int8")]
    return into[into.layer.map(lambda n: policy.layers[n] == "int8").astype(bool)].tensor.nunique()


@pytest.mark.parametrize("fixture,adds,maxpool,gap", [
    ("a100-resnet-qat", "fp32", "fp32", "fp32"),                 # INT8 convs only: 1.096 ms
    ("a100-resnet-qat-residual", "int8", "int8", "fp32"),        # + residual Q/DQ: 0.731 ms
    ("a100-resnet-qat-residual-qgap", "int8", "int8", "int8"),   # + GAP input Q/DQ: 0.673 ms (the default)
])
def test_boundaries_match_the_real_engines(resnet, trt_reports_dir, fixture, adds, maxpool, gap):
    """For the placement of each real A100 INT8 engine, the float→INT8 boundaries that
    core.model.placement.boundaries finds are the QuantizeLinear reformats TensorRT built (9, 1 and 0)."""
    base = resnet.default_policy()
    pol = base.with_layers({**{l.name: adds for l in resnet.layers if l.op_type == "Add"},
                            "/maxpool/MaxPool": maxpool, "/avgpool/GlobalAveragePool": gap})
    expected = _fixture_q_reformats(trt_reports_dir, fixture)
    assert _float_to_int8_tensors(resnet, pol) == expected
    if fixture.endswith("qgap"):
        assert pol == base and expected == 0 and boundaries(resnet.model, resnet.layers, pol).empty
