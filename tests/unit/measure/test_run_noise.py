"""Issue 23 §1 and §6, what a run records of itself: the shapes it was built at (said as 1×3×640×640), the GPU its
latency was measured on, and each interleaved pair's times, from which its speedup's 95 % interval is computed
(a bootstrap over the pairs); a run built before they were kept reads no interval, never a made-up one."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from core.backends.base import latency_from_pairs
from core.measure.runs import RUN_COLUMNS, RunResult, build_and_measure, shapes_text, speedup_interval
from core.store.runs import list_runs, load_run
from tests.unit.measure.test_runs import _run


def test_speedup_interval_from_the_pairs():
    rng = np.random.default_rng(1)
    cand = 1.0 + 0.02 * rng.standard_normal(60)
    quiet = speedup_interval(cand, 1.5 * cand)  # the reference always 1.5× the candidate: no spread at all
    assert quiet == pytest.approx((1.5, 1.5))
    noisy_ref = 1.5 * cand * np.exp(0.3 * rng.standard_normal(60))  # a busy machine
    lo, hi = speedup_interval(cand, noisy_ref)
    median = float(np.median(noisy_ref / cand))
    assert lo < median < hi and hi - lo > 0.1
    assert speedup_interval(cand, noisy_ref) == (lo, hi)  # seeded: the same run reads the same interval
    assert speedup_interval(cand[:4], noisy_ref[:4]) is None and speedup_interval([], []) is None
    assert speedup_interval([1.0] * 10, [1.0] * 9) is None


def test_latency_keeps_its_pairs_and_the_run_record_round_trips_them():
    lat = latency_from_pairs([0.001, 0.002, 0.0015, 0.001, 0.0012], [0.002, 0.003, 0.003, 0.002, 0.0024])
    assert lat.candidate_ms == pytest.approx((1.0, 2.0, 1.5, 1.0, 1.2)) and len(lat.reference_ms) == 5
    r = replace(_run(), latency=lat)
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["latency_ms"]["candidate_ms"] == pytest.approx([1.0, 2.0, 1.5, 1.0, 1.2])
    back = RunResult.from_json(doc)
    assert back.latency == lat and back.speedup_ci == r.speedup_ci and back.speedup_ci is not None
    row = back.row()
    assert list(row) == RUN_COLUMNS and (row["speedup_low"], row["speedup_high"]) == back.speedup_ci
    assert row["timed_pairs"] == 5 and row["input_shapes"] == "1×3×320×320"
    old = {**doc, "latency_ms": {k: v for k, v in doc["latency_ms"].items() if k not in ("candidate_ms", "reference_ms")}}
    before = RunResult.from_json(old)  # built before the pairs were kept
    assert before.latency.candidate_ms == () and before.speedup_ci is None
    assert math.isnan(before.row()["speedup_low"]) and before.row()["timed_pairs"] == 0


def test_shapes_text_and_the_measured_gpu():
    assert shapes_text({"images": [1, 3, 640, 640]}) == "1×3×640×640"
    assert shapes_text({"input_ids": [1, 128], "attention_mask": [1, 128]}) == "input_ids 1×128, attention_mask 1×128"
    assert shapes_text({}) == ""
    assert _run().measured_gpu == ""
    trt = replace(_run(), backend="tensorrt", latency_source="TensorRT 10.13 on NVIDIA T4, measured")
    assert trt.measured_gpu == "NVIDIA T4"


def test_a_build_stores_its_pair_times_and_interval(ws, tiny_cnn):
    r = build_and_measure(replace(tiny_cnn, ws=ws), tiny_cnn.default_policy(), iterations=8, profile_iterations=1)
    assert len(r.latency.candidate_ms) == len(r.latency.reference_ms) == 8
    stored = load_run(ws, r.run_id)
    assert stored.latency.candidate_ms == r.latency.candidate_ms and stored.speedup_ci is not None
    lo, hi = stored.speedup_ci
    assert lo <= r.latency.speedup <= hi
    row = list_runs(ws).iloc[0]
    assert row["timed_pairs"] == 8 and row["input_shapes"] == stored.shapes_label != ""
