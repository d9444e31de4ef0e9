"""Quality metrics: the streaming accumulator agrees with the one-shot functions, a Quality
survives JSON (an infinite SNR included), and the LLM metrics (KL divergence of softmaxed logits,
next-token agreement, perplexity) match hand computations."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from core.measure.metrics import (Quality, StreamingError, cosine_rows, kl_rows, looks_like_vocab_logits, quality, snr_db,
                                  token_metrics)
from core.model.samples import IGNORE_LABEL


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


def test_kl_by_hand():
    ref = np.log(np.array([[0.5, 0.25, 0.25]]))
    cand = np.log(np.array([[0.25, 0.5, 0.25]]))
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    assert kl_rows(ref, cand)[0] == pytest.approx(expected, rel=1e-12)
    assert kl_rows(ref + 7.0, cand - 3.0)[0] == pytest.approx(expected, rel=1e-12)  # shift-invariant
    assert kl_rows(ref, ref)[0] == pytest.approx(0.0, abs=1e-15)


def test_token_metrics_by_hand():
    # one sample, 3 positions, vocabulary 4
    ref = np.log(np.array([[[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]]))
    cand = np.log(np.array([[[0.7, 0.1, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]]))
    labels = np.array([[0, 2, IGNORE_LABEL]])
    m = token_metrics([ref], [cand], labels)
    assert m["top1_agreement"] == pytest.approx(2 / 3)  # position 1: argmax 1 vs 0
    assert m["kl_div"] == pytest.approx(kl_rows(ref[0], cand[0]).sum() / 3, rel=1e-12)
    assert m["perplexity"] == pytest.approx(math.exp(-(math.log(0.7) + math.log(0.2)) / 2), rel=1e-12)
    assert m["fp32_perplexity"] == pytest.approx(math.exp(-(math.log(0.7) + math.log(0.1)) / 2), rel=1e-12)
    assert (m["top1_accuracy"], m["fp32_top1_accuracy"]) == (0.5, 0.5)
    assert "perplexity" not in token_metrics([ref], [cand], None)
    uniform = np.zeros((2, 5, 32))
    assert token_metrics([uniform], [uniform], np.ones((2, 5), np.int64))["perplexity"] == pytest.approx(32.0)


def test_quality_picks_llm_metrics_for_vocabulary_logits():
    rng = np.random.default_rng(0)
    ref = [rng.normal(size=(4, 6, 50)) for _ in range(2)]  # two batches of [batch, seq, vocab]
    cand = [r + 0.3 * rng.normal(size=r.shape) for r in ref]
    labels = rng.integers(0, 50, (8, 6))
    q = quality(ref, cand, "logits", labels)
    whole_ref, whole_cand = np.concatenate(ref), np.concatenate(cand)
    assert q.top1_agreement == pytest.approx(np.mean(whole_ref.argmax(-1) == whole_cand.argmax(-1)))
    assert q.kl_div == pytest.approx(kl_rows(whole_ref, whole_cand).mean(), rel=1e-10)
    assert q.perplexity > 0 and q.fp32_perplexity > 0 and q.knn5_overlap is None
    assert q.top1_accuracy == pytest.approx(np.mean(whole_cand.argmax(-1) == labels))
    assert quality(ref, ref, "logits", labels).kl_div == pytest.approx(0.0, abs=1e-12)
    hidden = quality(ref, cand, "last_hidden_state")  # hidden states are not logits
    assert hidden.kl_div is None and hidden.perplexity is None
    assert looks_like_vocab_logits(np.zeros((1, 2, 5000))) and not looks_like_vocab_logits(np.zeros((1, 2, 50)))
    two_d = quality([ref[0][:, 0]], [cand[0][:, 0]], "logits")  # classifier logits get kl_div too
    assert two_d.kl_div == pytest.approx(kl_rows(ref[0][:, 0], cand[0][:, 0]).mean()) and two_d.perplexity is None


def test_quality_with_llm_fields_round_trips_through_json():
    q = Quality(1.0, 1.0, float("inf"), 0.0, 0.9, None, 4, 0.5, 0.75, 0.004, 21.5, 20.4)
    doc = json.loads(json.dumps(q.to_dict(), allow_nan=False))
    assert Quality.from_dict(doc) == q
    assert Quality.from_dict({k: v for k, v in doc.items() if k not in ("kl_div", "perplexity")}).kl_div is None


def _one_shot(ref_outputs, cand_outputs, labels=None):
    """quality()'s fields as the one-shot formulas give them (float64 copies of every output at once)."""
    r = np.concatenate([np.asarray(o, np.float64).reshape(len(o), -1) for o in ref_outputs])
    c = np.concatenate([np.asarray(o, np.float64).reshape(len(o), -1) for o in cand_outputs])
    cos = cosine_rows(r, c)
    out = {"cosine_mean": cos.mean(), "cosine_min": cos.min(), "snr_db": snr_db(r, c),
           "max_abs": float(np.max(np.abs(r - c))), "samples": len(r)}
    if np.ndim(ref_outputs[0]) == 2:
        out.update(top1_agreement=float(np.mean(r.argmax(1) == c.argmax(1))), kl_div=float(kl_rows(r, c).mean()))
        if labels is not None:
            out.update(top1_accuracy=float(np.mean(c.argmax(1) == labels)),
                       fp32_top1_accuracy=float(np.mean(r.argmax(1) == labels)))
    return out


@pytest.mark.parametrize("shape, chunk", [((7, 10), 64), ((5, 3, 40), 200), ((9, 2, 4, 4), 100)])
def test_quality_in_chunks_is_the_one_shot_quality(monkeypatch, shape, chunk):
    import core.measure.metrics as metrics

    rng = np.random.default_rng(1)
    ref = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
    cand = [(r + 0.05 * rng.normal(size=r.shape)).astype(np.float32) for r in ref]
    labels = rng.integers(0, shape[-1], 3 * shape[0]) if len(shape) == 2 else None
    want = _one_shot(ref, cand, labels)
    monkeypatch.setattr(metrics, "CHUNK_BYTES", chunk)  # a few samples (or one) per step
    got = quality(ref, cand, labels=labels).to_dict()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_vocabulary_quality_takes_chunks_not_float64_copies_of_the_batch(monkeypatch):
    """Issue 21 §2: quality() on a batch of 151,936-wide logits allocated several float64 copies of it
    (9 GB on the 0.5B decoder's 16 × 64 positions); now a few positions at a time."""
    import tracemalloc

    import core.measure.metrics as metrics

    monkeypatch.setattr(metrics, "CHUNK_BYTES", 1 << 20)
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(4, 16, 32000)).astype(np.float32)  # 8.2 MB; float64 copies of it: 16 MB each
    cand = ref + np.float32(0.01)
    labels = rng.integers(0, 32000, (4, 16))
    tracemalloc.start()
    q = quality([ref], [cand], "logits", labels)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert q.kl_div is not None and q.perplexity is not None and q.top1_agreement == 1.0
    assert peak < 2 * ref.nbytes  # less than one float64 copy of the batch: bounded by the chunk (1 MiB)
    per_position = np.asarray(token_metrics([ref], [cand], labels)["kl_div"])
    assert q.kl_div == pytest.approx(float(per_position), rel=1e-12)
