"""Isolated sensitivity, search under a budget, Pareto front."""
from __future__ import annotations

import numpy as np
import pytest

from core.errors import MixprecError
from core.search import Budget, SearchConfig, SearchResult, pareto_flags, search
from core.sensitivity import sensitivity

FFN_DOWN = {f"/encoder/layer.{i}/output/dense/MatMul" for i in range(6)}


def test_budget_parsing():
    b = Budget.parse("cosine_mean>=0.99")
    assert (b.metric, b.op, b.value) == ("cosine_mean", ">=", 0.99)
    assert Budget.parse("top1_drop<=0.5%").value == pytest.approx(0.005)
    for bad in ("cosine>=0.9", "cosine_mean<=0.99", "snr_db>30", ""):
        with pytest.raises(MixprecError, match="budget"):
            Budget.parse(bad)


def test_pareto_flags_by_hand():
    q = np.array([0.99, 0.98, 0.97, 0.99, 0.95])
    ms = np.array([10.0, 8.0, 9.0, 12.0, 5.0])
    assert pareto_flags(q, ms).tolist() == [True, True, False, False, True]


def test_isolated_sensitivity_tiny_is_cached(tiny_transformer):
    a = sensitivity(tiny_transformer, "isolated", workers=1)
    assert len(a.table) == 8 and (np.diff(a.table.delta.to_numpy()) <= 0).all()
    assert a.table.delta.max() > 0 and not a.cache_hit
    b = sensitivity(tiny_transformer, "isolated", workers=1)
    assert b.cache_hit and b.table.name.tolist() == a.table.name.tolist()
    assert np.allclose(b.table.delta, a.table.delta, rtol=1e-12, atol=0)
    loo = sensitivity(tiny_transformer, "leave-one-out", workers=1)
    assert set(loo.table.name) == set(a.table.name) and loo.mode == "leave-one-out"


def test_minilm_isolated_ranking_puts_ffn_down_on_top(minilm):
    s = sensitivity(minilm, "isolated", workers=2)
    assert len(s.table) == 48
    # the top of the ranking is FFN down-projections (measured: layers 0-3 at ranks 1-4; the
    # down-projections of layers 4 and 5 hurt less on their own: ranks 9 and 14)
    assert set(s.table.head(4).name) <= FFN_DOWN, s.table.head(8)
    delta = s.table.set_index("name").delta
    # and they are the most harmful of the eight MatMul kinds of a layer, on average and at worst
    kinds = {k: {n.replace("output/dense/MatMul", v) for n in FFN_DOWN} for k, v in {
        "down": "output/dense/MatMul", "up": "intermediate/dense/MatMul", "query": "attention/self/query/MatMul",
        "key": "attention/self/key/MatMul", "value": "attention/self/value/MatMul",
        "scores": "attention/self/MatMul", "context": "attention/self/MatMul_1",
        "attn_out": "attention/output/dense/MatMul"}.items()}
    assert set().union(*kinds.values()) == set(s.table.name)
    means = {k: delta[list(v)].mean() for k, v in kinds.items()}
    worst = {k: delta[list(v)].max() for k, v in kinds.items()}
    assert max(means, key=means.get) == "down" and max(worst, key=worst.get) == "down", means


def test_search_meets_budget_on_holdout_and_front_is_nondominated(minilm):
    r = search(minilm, SearchConfig("cosine_mean>=0.99", workers=2))
    assert r.met_on_dev and r.met_on_holdout, r.message
    assert r.holdout.cosine_mean >= 0.99 and r.run is not None
    counts = r.policy.precision_counts()
    assert counts["int8"] >= 30  # most MatMuls stay INT8
    c = r.candidates
    front = c[c.pareto]
    for row in front.itertuples():
        dominated = (c.quality >= row.quality) & (c.est_ms <= row.est_ms) & \
            ((c.quality > row.quality) | (c.est_ms < row.est_ms))
        assert not dominated.any()


def test_unmeetable_budget_says_so(tiny_cnn):
    r = search(tiny_cnn, SearchConfig("snr_db>=200", workers=1, verify=False))
    assert not r.met_on_dev and r.message.startswith("NO policy meets snr_db>=200")
    assert r.policy.precision_counts()["int8"] >= 0 and len(r.candidates) > 0


def test_front_policies_are_usable(tiny_transformer):
    import json

    r = search(tiny_transformer, SearchConfig("cosine_mean>=0.999", workers=1, verify=False))
    doc = json.loads(json.dumps(r.to_json()))  # what a job stores
    stored = SearchResult.from_json(doc, tiny_transformer.model, tiny_transformer.layers)
    front = stored.candidates[stored.candidates.pareto]
    for row in front.to_dict(orient="records"):
        pol = stored.front_policy(row["candidate"])
        int8 = {n for n, p in pol.layers.items() if p == "int8"}
        assert int8 == set(filter(None, row["int8_layers"].split(","))) and pol.model_sha256 == r.policy.model_sha256
        assert r.policy_for(row["candidate"]) == pol
    with pytest.raises(MixprecError, match="not on the stored Pareto front"):
        stored.front_policy(10_000)


def test_top1_drop_budget_uses_labels(tiny_cnn, tmp_path):
    from dataclasses import replace

    from conftest import run_model
    from core.data import load_npz
    from core.runs import build_and_measure

    ev = tiny_cnn.eval_data
    pred = run_model(tiny_cnn.model.proto, ev.batches(1)).argmax(1)
    labels = pred.copy()
    labels[-4:] = (labels[-4:] + 1) % 10  # FP32 is right on all but the last 4 samples
    path = tmp_path / "eval.npz"
    np.savez(path, **ev.arrays, labels=labels)
    labelled = replace(tiny_cnn, eval_data=load_npz(path, tiny_cnn.model))
    r = build_and_measure(labelled, tiny_cnn.default_policy(), iterations=5, profile_iterations=2)
    n = ev.num_samples
    assert r.quality.fp32_top1_accuracy == pytest.approx((n - 4) / n)
    b = Budget.parse("top1_drop<=0.5%")
    assert b.value_of(r.quality) == pytest.approx(r.quality.fp32_top1_accuracy - r.quality.top1_accuracy)
    res = search(labelled, SearchConfig("top1_drop<=0.5%", workers=1))
    assert res.met_on_dev and res.met_on_holdout and res.holdout.top1_accuracy is not None


def test_budget_metric_must_apply(tiny_transformer):
    with pytest.raises(MixprecError, match="does not apply"):
        search(tiny_transformer, SearchConfig("top1_drop<=1%", workers=1, verify=False))


def test_tensorrt_target_without_tensorrt_searches_mac_share_not_cpu_latency(tiny_cnn):
    """Target TensorRT where TensorRT does not run, objective ``mac_share`` (the fallback when the
    TensorRT estimate cannot be made; ``auto`` picks the estimate, tests/test_estimate_predict.py):
    the search ranks candidates by INT8 MAC share, then fewest boundaries (not by the CPU latency
    estimate), and its verdict says so."""
    from dataclasses import replace

    from core.metrics import Quality
    from core.search.result import Candidate
    from core.search.searcher import MAC_SHARE_NOTE, _preference, search_objective

    assert search_objective("auto", "tensorrt", "onnxruntime") == "trt_estimate"
    assert search_objective("mac_share", "tensorrt", "onnxruntime") == "mac_share"
    assert search_objective("auto", "tensorrt", "tensorrt") == "latency"
    assert search_objective("auto", "onnxruntime", "onnxruntime") == "latency"
    assert search_objective("latency", "tensorrt", "onnxruntime") == "latency"
    with pytest.raises(MixprecError, match="unknown search objective"):
        search_objective("speed", "tensorrt", "onnxruntime")
    q = Quality(0.995, 0.99, 30.0, 0.1, None, None, 8)
    fast = Candidate("minmax", frozenset({"a"}), q, 1.0, 0.4, 0.0, True, boundaries=2)
    more_int8 = Candidate("minmax", frozenset({"a", "b"}), q, 1.5, 0.9, 0.0, True, boundaries=3)
    fewer_edges = Candidate("minmax", frozenset({"a", "c"}), q, 1.6, 0.9, 0.0, True, boundaries=1)
    b = Budget.parse("cosine_mean>=0.99")
    assert min([fast, more_int8, fewer_edges], key=_preference(b)) is fast
    assert min([fast, more_int8, fewer_edges], key=_preference(b, "mac_share")) is fewer_edges

    config = SearchConfig("cosine_mean>=0.99", methods=("minmax",), workers=1, verify=False, objective="mac_share")
    r = search(replace(tiny_cnn, target="tensorrt"), config)
    assert MAC_SHARE_NOTE in r.message and "does not optimise CPU latency" in r.message
    c = r.candidates
    chosen = c.set_index("candidate").loc[r.chosen]
    assert chosen.int8_mac_share == c[c.meets_budget].int8_mac_share.max()
    on_cpu = search(replace(tiny_cnn, target="onnxruntime"), replace(config, objective="auto"))
    assert MAC_SHARE_NOTE not in on_cpu.message


def test_a_calibration_method_that_cannot_run_is_skipped_and_said(tiny_cnn, monkeypatch):
    """A model whose activations break the histogram calibrators (the zoo's light DenseNet: 'Too
    many bins for data range') still searches with MinMax; the verdict says which method was
    skipped and why. The first method failing is an error."""
    import core.search.searcher as searcher

    real = searcher.calibrate

    def calibrate(model, ds, settings, ws=None, progress=None):
        if getattr(settings, "method", settings) == "entropy":
            raise MixprecError("entropy calibration cannot build its histograms", "use --calibration minmax")
        return real(model, ds, settings, ws, progress)

    monkeypatch.setattr(searcher, "calibrate", calibrate)
    r = search(tiny_cnn, SearchConfig("cosine_mean>=0.9", methods=("minmax", "entropy"), workers=1, verify=False))
    assert "entropy calibration skipped: entropy calibration cannot build its histograms" in r.message
    assert set(r.variants) == {"minmax"}
    with pytest.raises(MixprecError, match="cannot build its histograms"):
        search(tiny_cnn, SearchConfig("cosine_mean>=0.9", methods=("entropy",), workers=1, verify=False))


def test_histogram_failure_in_calibration_is_a_clear_error(tiny_cnn, monkeypatch, tmp_path):
    """ORT's histogram calibrators raise numpy's ValueError on activations too wide for finite bins;
    mixprec turns it into a MixprecError that names the method and the fix."""
    from onnxruntime.quantization import calibrate as ort_calibrate

    from core.calibration import calibrate
    from core.workspace import Workspace

    def boom(self, *a, **k):
        raise ValueError("Too many bins for data range. Cannot create 2048 finite-sized bins.")

    monkeypatch.setattr(ort_calibrate.HistogramCollector, "collect", boom)
    with pytest.raises(MixprecError, match="percentile calibration cannot build its histograms.*minmax"):
        calibrate(tiny_cnn.model, tiny_cnn.calib_data, "percentile", Workspace(tmp_path))
