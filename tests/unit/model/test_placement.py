"""INT8 placement beyond MAC layers (issue 11 §1, core/model/placement.py): residual Add, pooling and Concat
as policy choices, compiled as TensorRT fuses them, with calibration, boundaries, the switchable
model and the search covering them. The ResNet-18 structure is in tests/unit/quant/test_resnet_structure.py."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from core.model.inventory import can_be_int8, require_eligible
from core.quant.calibration import calibrate_policy
from core.quant.compile import compile_policy
from tests.fixtures.nets import branchy_onnx
from core.model.placement import BOUNDARY_COLUMNS, boundaries
from core.project import open_project
from core.quant.policy import policy_from_dict
from core.sensitivity import sensitivity
from core.sensitivity.isolated import switchable_model
from core.workspace import Workspace

PLACED = ("/Concat", "/MaxPool", "/Add", "/GlobalAveragePool")


@pytest.fixture(scope="module")
def branchy(tmp_path_factory):
    """conv → two conv branches → Concat → MaxPool → conv + residual Add → Relu → GAP → fc (tests.fixtures.nets)."""
    tmp = tmp_path_factory.mktemp("branchy")
    (tmp / "branchy.onnx").write_bytes(branchy_onnx(batch=2))
    return open_project(str(tmp / "branchy.onnx"), ws=Workspace(tmp / "ws"))


def _producers(proto):
    return {o: n for n in proto.graph.node for o in n.output}


def _run(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def test_defaults_by_pattern(branchy):
    by = {l.name: l for l in branchy.layers}
    assert {n: (by[n].placement, by[n].default_precision, by[n].eligible) for n in PLACED} == {
        "/Concat": ("concat", "int8", True), "/MaxPool": ("pooling", "int8", True), "/Add": ("add", "int8", True),
        "/GlobalAveragePool": ("pooling", "int8", True)}
    assert "Conv+Add+Relu" in by["/Add"].default_reason and "shared scale" in by["/Concat"].default_reason
    assert by["/Relu"].placement == "" and not can_be_int8(by["/Relu"])
    assert set(PLACED) <= {l.name for l in require_eligible("branchy", branchy.layers, "search")}
    frame = branchy.inventory()
    assert "placement" in frame.columns and frame.set_index("name").at["/Add", "placement"] == "add"


def test_calibration_covers_the_placements(branchy):
    calib = calibrate_policy(branchy.model, branchy.calib_data, branchy.default_policy(), branchy.layers, branchy.ws)
    by = {l.name: l for l in branchy.layers}
    needed = {t for n in PLACED for t in by[n].inputs}
    assert needed <= set(calib.ranges), needed - set(calib.ranges)


def test_compiled_placement_and_numerics(branchy):
    """trt target: the Add's skip input is dequantized and its conv input is not; the Concat's inputs
    share one scale, the largest range; the pooling reads a DequantizeLinear. ORT runs both targets
    close to FP32."""
    pol = branchy.default_policy()
    calib = calibrate_policy(branchy.model, branchy.calib_data, pol, branchy.layers, branchy.ws)
    trt = compile_policy(branchy.model, pol, calib, target="trt").proto
    prod = _producers(trt)
    nodes = {n.name: n for n in trt.graph.node}
    add = nodes["/Add"]
    assert [prod[i].op_type for i in add.input] == ["Conv", "DequantizeLinear"]
    assert prod[prod[add.input[1]].input[0]].input[0] == "/MaxPool_output_0"  # the skip is quantized
    concat = nodes["/Concat"]
    dqs = [prod[i] for i in concat.input]
    assert [d.op_type for d in dqs] == ["DequantizeLinear"] * 2
    inits = {t.name: t for t in trt.graph.initializer}
    scales = {float(numpy_helper.to_array(inits[d.input[1]])) for d in dqs}
    amax = max(calib.amax(t) for t in ("/Relu_1_output_0", "/Relu_2_output_0"))
    assert len(scales) == 1 and scales.pop() == pytest.approx(amax / 127.0, rel=1e-6)
    for pool in ("/MaxPool", "/GlobalAveragePool"):
        assert prod[nodes[pool].input[0]].op_type == "DequantizeLinear"
    feeds = branchy.eval_data.batches(2)
    ref = _run(branchy.model.proto, feeds)
    for target in ("trt", "ort"):
        out = _run(compile_policy(branchy.model, pol, calib, target=target).proto, feeds)
        cos = (out * ref).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() > 0.99 and not np.allclose(out, ref), target


def test_placements_off_leave_no_qdq_on_them(branchy):
    pol = branchy.default_policy().with_layers(dict.fromkeys(PLACED, "fp32"))
    calib = calibrate_policy(branchy.model, branchy.calib_data, pol, branchy.layers, branchy.ws)
    proto = compile_policy(branchy.model, pol, calib, target="trt").proto
    prod = _producers(proto)
    for n in proto.graph.node:
        if n.name in PLACED:
            assert all(prod[i].op_type != "DequantizeLinear" for i in n.input if i in prod), n.name


def test_boundaries(branchy):
    pol = branchy.default_policy()
    df = boundaries(branchy.model, branchy.layers, pol)
    assert list(df.columns) == BOUNDARY_COLUMNS and df.empty  # one INT8 region (FP32 Relus fuse into it)
    df = boundaries(branchy.model, branchy.layers, pol.with_layers({"/Add": "fp16"}))
    rows = {(r.layer, r.neighbour, r.direction): r for r in df.itertuples()}
    assert rows[("/Add", "/mix/Conv", "in")].neighbour_precision == "int8"
    assert rows[("/Add", "/MaxPool", "in")].tensor == "/MaxPool_output_0"
    assert rows[("/mix/Conv", "/Add", "out")].neighbour_precision == "fp16"
    assert "INT8 → FP16" in rows[("/MaxPool", "/Add", "out")].reason
    # the Relu after the FP16 Add is FP32 now (not fused into an INT8 layer): FP16→FP32, then FP32→INT8
    assert rows[("/Relu_3", "/Add", "in")].neighbour_precision == "fp16"
    assert rows[("/GlobalAveragePool", "/Relu_3", "in")].neighbour_precision == "fp32"
    assert {r.layer for r in df.itertuples()} == {"/Add", "/mix/Conv", "/MaxPool", "/Relu_3", "/GlobalAveragePool"}
    # an FP16 Relu between INT8 convs is a boundary on both sides
    df = boundaries(branchy.model, branchy.layers, pol.with_layers({"/Relu": "fp16"}))
    assert {(r.layer, r.neighbour) for r in df.itertuples() if r.layer == "/Relu"} == \
        {("/Relu", "/stem/Conv"), ("/Relu", "/left/Conv"), ("/Relu", "/right/Conv")}


def test_minilm_boundaries_and_residuals_stay_float(minilm):
    """MiniLM's default keeps every residual Add float (no DequantizeLinear feeds one in the trt
    model); its boundaries include the FP16 LayerNorm before each INT8 query projection."""
    pol = minilm.default_policy()
    residuals = [l.name for l in minilm.layers if l.placement == "add"]
    assert residuals and all(pol.layers[n] == "fp32" for n in residuals)
    # the format-2 defaults are the format-1 defaults on MiniLM: its default result is unchanged
    empty = {"format": "mixprec.policy", "model": {"sha256": minilm.model.sha256}, "layers": {}}
    assert policy_from_dict({**empty, "version": 1}, minilm.model, minilm.layers).layers == \
        policy_from_dict({**empty, "version": 2}, minilm.model, minilm.layers).layers == pol.layers
    calib = calibrate_policy(minilm.model, minilm.calib_data, pol, minilm.layers, minilm.ws)
    proto = compile_policy(minilm.model, pol, calib, target="trt").proto
    prod = _producers(proto)
    adds = [n for n in proto.graph.node if n.name in residuals]
    assert len(adds) == len(residuals)
    assert all(prod[i].op_type != "DequantizeLinear" for n in adds for i in n.input if i in prod)
    df = boundaries(minilm.model, minilm.layers, pol)
    q = df[df.layer == "/encoder/layer.0/attention/self/query/MatMul"]
    assert ("/embeddings/LayerNorm/LayerNormalization", "in", "fp16") in \
        set(zip(q.neighbour, q.direction, q.neighbour_precision))


def test_switchable_model_and_sensitivity_flip_placements(branchy):
    """The isolated sensitivity (the search's first step) measures each placement layer on its own
    through the switchable model: switching the Add alone changes the output."""
    s = sensitivity(branchy, "isolated", workers=1)
    assert set(PLACED) <= set(s.table.name)
    assert s.table.set_index("name").loc[list(PLACED), "cosine"].between(0.5, 1.0).all()
    pol = branchy.default_policy()
    calib = calibrate_policy(branchy.model, branchy.calib_data, pol, branchy.layers, branchy.ws)
    sw = switchable_model(branchy, pol, calib, "minmax")
    assert set(PLACED) <= set(sw.switches)
    sess = ort.InferenceSession(sw.path, providers=["CPUExecutionProvider"])
    feed = branchy.eval_data.batches(2)[0]
    flags = {v: np.array(False) for v in sw.switches.values()}
    off = sess.run(None, {**feed, **flags})[0]
    on = sess.run(None, {**feed, **flags, sw.switches["/Add"]: np.array(True)})[0]
    assert not np.allclose(on, off)


def test_search_flips_placements(branchy):
    """The search treats INT8-default placement layers like any eligible layer: its candidates keep
    the residual Add INT8 in some and fall it back in others, and each candidate policy compiles
    under TensorRT's rules."""
    from core.search import SearchConfig, search

    r = search(branchy, SearchConfig("cosine_mean>=0.999999", workers=1, verify=False, methods=("minmax",)))
    c = r.candidates
    int8_sets = [set(filter(None, s.split(","))) for s in c.int8_layers]
    assert any("/Add" in s for s in int8_sets) and any("/Add" not in s and s for s in int8_sets)
    row = next(i for i, s in zip(c.candidate, int8_sets) if "/Add" not in s and "/mix/Conv" in s)
    pol = r.policy_for(int(row))
    assert pol.layers["/Add"] == "fp16" and pol.layers["/mix/Conv"] == "int8"
    calib = calibrate_policy(branchy.model, branchy.calib_data, pol, branchy.layers, branchy.ws)
    compile_policy(branchy.model, pol, calib, target="trt")  # passes assert_trt_rules
