"""The search's latency model: edges between eligible layers, fitting on real ORT profiles,
island costs, and the premise that contiguous INT8 saves a QuantizeLinear in real ORT."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from core.backends import select_backend
from core.measure.metrics import Quality
from core.model.inventory import tensor_shapes
from core.quant.calibration import calibrate
from core.search import Budget, Candidate, fusable_edges, latency_model, preference_key, to_wall_clock


@pytest.fixture(scope="module")
def tt_latency(tiny_transformer):
    base = tiny_transformer.default_policy()
    calib = calibrate(tiny_transformer.model, tiny_transformer.calib_data, base.calibration, tiny_transformer.ws)
    return latency_model(tiny_transformer, base, calib)


def test_edges_follow_data_movement_only(tiny_transformer, tiny_cnn):
    shapes = tensor_shapes(tiny_transformer.model, tiny_transformer.input_shapes)
    edges = {(e.producer, e.consumer) for e in fusable_edges(tiny_transformer.model, tiny_transformer.layers, shapes)}
    # AV reaches the output projection through Transpose/Reshape. q/k/v pass their bias Add, and
    # LayerNorm, Softmax and GELU are compute: no edge across them (as in MiniLM).
    assert edges == {("/attn/MatMul_1", "/attn/out/MatMul")}
    cnn_shapes = tensor_shapes(tiny_cnn.model, tiny_cnn.input_shapes)
    cnn = fusable_edges(tiny_cnn.model, tiny_cnn.layers, cnn_shapes)
    assert ("/conv1/Conv", "/conv2/Conv") in {(e.producer, e.consumer) for e in cnn}  # across Relu
    e = next(e for e in cnn if e.consumer == "/conv2/Conv")
    assert e.tensor == "/relu1/Relu_output_0" and e.numel == int(np.prod(cnn_shapes[e.tensor]))


def test_fit_on_real_profiles_is_exact_at_both_ends(tt_latency, tiny_transformer):
    lat = tt_latency
    eligible = {l.name for l in tiny_transformer.layers if l.eligible}
    assert lat.estimate(eligible)[0] == pytest.approx(lat.wall.int8_total_ms, rel=1e-9)
    assert lat.estimate(set())[0] == pytest.approx(lat.wall.fp16_total_ms, rel=1e-9)
    assert lat.wall.fp16_total_ms > 0 and lat.wall.int8_total_ms > 0 and lat.fp32_total_ms > 0
    # measured from the profiles' conversion nodes (on the tiny model the wall-clock correction may
    # leave them at zero: a per-node overhead larger than a tiny Cast)
    assert lat.profiled.q_ms_per_element > 0 and lat.profiled.cast_ms_per_element > 0
    assert lat.wall.q_ms_per_element >= 0 and lat.wall.cast_ms_per_element >= 0
    assert 0 < lat.estimate(eligible)[1] < 100 and 0 < lat.estimate(set())[1] < 100
    # the reformat share follows the raw profiles, as builds report it
    assert lat.estimate(set())[1] == pytest.approx(100 * lat.profiled.fp16_reformat_ms / lat.profiled.fp16_total_ms)


def test_profiles_brought_to_wall_clock(tiny_transformer, tt_latency):
    import pandas as pd

    prof = pd.DataFrame({"name": ["a", "b", "c"], "ms": [1.0, 0.5, 0.1], "is_reformat": [False, False, True]})
    slower = to_wall_clock(prof, 1.0)  # profiler overhead: 0.2 ms per node, the small node stops at zero
    assert slower.ms.tolist() == pytest.approx([0.8, 0.3, 0.0])
    faster = to_wall_clock(prof, 1.9)  # time between nodes the profile does not see: added per node
    assert faster.ms.tolist() == pytest.approx([1.1, 0.6, 0.2]) and to_wall_clock(prof, None) is prof


def test_islands_cost_conversions(tt_latency):
    lat = tt_latency
    island = {"/attn/out/MatMul"}  # INT8 consumer of an FP16 AV MatMul: a separate QuantizeLinear
    pair = {"/attn/out/MatMul", "/attn/MatMul_1"}  # contiguous: the Q fuses into the producer
    assert (lat.boundaries(island), lat.boundaries(pair), lat.boundaries(set())) == (1, 0, 0)
    numel = next(e.numel for e in lat.edges if e.consumer == "/attn/out/MatMul")
    assert numel == 16 * 32  # [1, 16 tokens, 32]
    assert lat.island_ms(island) == pytest.approx(lat.wall.q_ms_per_element * numel)
    assert lat.island_ms(pair) == 0.0
    lone_av = {"/attn/MatMul_1"}  # INT8 producer, FP16 consumer: the consumer rounds its input to fp16
    assert lat.boundaries(lone_av) == 1
    assert lat.island_ms(lone_av) == pytest.approx(2 * lat.wall.cast_ms_per_element * numel)


def _optimized_ops(project, policy, tmp_path):
    be, _ = select_backend("onnxruntime")
    calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws)
    eng = be.build(project.model, policy, calib, tmp_path, project.input_shapes)
    return onnx.load(str(eng.artifact_path)).graph.node


def test_contiguous_int8_fuses_the_quantize_in_real_ort(tiny_transformer, tmp_path):
    """The premise of the edge model, on ORT's real optimizer: with AV and the output projection
    both INT8 the projection's QuantizeLinear is fused into AV (QLinearMatMul); with AV in FP16
    it stays a separate node."""
    base = tiny_transformer.default_policy()
    both = _optimized_ops(tiny_transformer, base, tmp_path / "both")
    assert any(n.op_type == "QLinearMatMul" for n in both)
    assert not any(n.op_type == "QuantizeLinear" and n.name.startswith("/attn/out/MatMul") for n in both)
    island = _optimized_ops(tiny_transformer, base.with_layers({"/attn/MatMul_1": "fp16"}), tmp_path / "island")
    assert not any(n.op_type == "QLinearMatMul" for n in island)
    # ORT moves the projection's QuantizeLinear across Transpose/Reshape onto AV's output: a node of its own
    assert "/attn/MatMul_1_output_0_q" in {n.name for n in island if n.op_type == "QuantizeLinear"}


def _cand(ms, boundaries, cos):
    q = Quality(cos, cos, 30.0, 0.1, None, None, 64)
    return Candidate("minmax", frozenset(), q, ms, 0.5, 1.0, True, boundaries)


def test_preference_equal_time_fewer_boundaries_then_quality():
    key = preference_key(Budget.parse("cosine_mean>=0.99"))
    cands = [_cand(5.0, 3, 0.999), _cand(5.0001, 1, 0.995), _cand(5.0, 1, 0.996), _cand(4.0, 5, 0.991)]
    assert min(cands, key=key) is cands[3]  # faster wins outright
    assert sorted(cands[:3], key=key) == [cands[2], cands[1], cands[0]]  # same time: fewer boundaries, then quality
