"""Quality metrics: the streaming accumulator agrees with the one-shot functions, and a
Quality survives JSON (an infinite SNR included)."""
from __future__ import annotations

import json

import numpy as np

from core.metrics import Quality, StreamingError, cosine_rows, quality, snr_db


def test_streaming_error_matches_the_one_shot_metrics():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(6, 4, 5)).astype(np.float32)
    cand = (ref + 0.01 * rng.normal(size=ref.shape)).astype(np.float32)
    acc = StreamingError()
    for i in range(len(ref)):  # one sample at a time, as the cumulative ranking feeds it
        acc.add(ref[i:i + 1], cand[i:i + 1])
    r, c = ref.astype(np.float64).reshape(6, -1), cand.astype(np.float64).reshape(6, -1)
    assert acc.n == 6 and np.isclose(acc.cosine, cosine_rows(r, c).mean(), rtol=1e-12, atol=0)
    assert np.isclose(acc.snr_db, snr_db(r, c), rtol=1e-12) and acc.max_abs == float(np.max(np.abs(r - c)))
    q = quality([ref], [cand])
    assert np.isclose(acc.cosine, q.cosine_mean, rtol=1e-12, atol=0) and np.isclose(acc.snr_db, q.snr_db, rtol=1e-12)
    same = StreamingError()
    same.add(ref, ref)
    assert same.cosine == 1.0 and same.snr_db == float("inf") and same.max_abs == 0.0
    zero = StreamingError()
    zero.add(np.zeros((2, 3)), np.zeros((2, 3)))  # both zero: cosine 1 by convention
    assert zero.cosine == 1.0


def test_quality_round_trips_through_json():
    q = Quality(1.0, 1.0, float("inf"), 0.0, None, 0.8, 4, 0.5, 0.75)
    doc = json.loads(json.dumps(q.to_dict(), allow_nan=False))
    assert doc["snr_db"] == "inf" and Quality.from_dict(doc) == q
