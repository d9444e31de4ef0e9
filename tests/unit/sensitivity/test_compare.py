"""Polygraphy layer-wise ranking."""
from __future__ import annotations

import numpy as np

from core.sensitivity import RANK_COLUMNS, rank_layers


def test_rank_minilm(minilm):
    r = rank_layers(minilm, max_samples=8)
    t = r.table
    assert list(t.columns) == RANK_COLUMNS and r.samples == 8
    assert len(t) == len(minilm.layers)
    assert (np.diff(t.cos_drop.to_numpy()) <= 1e-12).all()  # most sensitive first
    assert t.iloc[0].cos_drop > 0.01 and t.cos_drop.min() >= -1e-9
    elig = t[t.eligible]
    assert len(elig) == 48 and set(elig.precision) == {"int8"}
    # the FFN down-projections add more error than they inherit more often than any other MatMul kind
    added = elig.set_index("name").added_cos_drop
    down = added[[n for n in added.index if n.endswith("/output/dense/MatMul")]]
    query = added[[n for n in added.index if n.endswith("/attention/self/query/MatMul")]]
    assert down.mean() > query.mean()


def test_rank_fp32_candidate_has_no_drift(tiny_cnn):
    from core.quant.policy import uniform_policy

    r = rank_layers(tiny_cnn, policy=uniform_policy(tiny_cnn.model, tiny_cnn.layers, "fp32"), max_samples=4)
    assert np.allclose(r.table.cosine, 1.0) and (r.table.max_abs == 0).all()
