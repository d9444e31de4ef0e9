"""The analysis records round-trip through their JSON documents: a cumulative ranking, a
sensitivity table and a search result (small synthetic tables, no trials)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from core.errors import MixprecError
from core.measure.metrics import Quality
from core.search import CANDIDATE_COLUMNS, FRONT_COLUMNS, Budget, SearchResult
from core.sensitivity import RANK_COLUMNS, SENSITIVITY_COLUMNS, Ranking, Sensitivity

Q = Quality(0.995, 0.98, float("inf"), 0.1, 0.9, None, 8)


def _through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc, allow_nan=False))  # what the store writes and reads


def _ranking() -> Ranking:
    t = pd.DataFrame([(1, "/a/MatMul", "MatMul", "int8", True, 100, 0.9, 0.1, 0.05, 20.0, 0.3),
                      (2, "/b/Add", "Add", "", False, 0, 0.99, 0.01, -0.01, float("inf"), 0.0)],
                     columns=RANK_COLUMNS)
    return Ranking(t, "cos_drop", 8, 1.5, None, "entropy")


def _sensitivity() -> Sensitivity:
    t = pd.DataFrame([(1, "/a/MatMul", "MatMul", 100, "isolated", "minmax", 0.97, 0.02, 31.5),
                      (2, "/b/MatMul", "MatMul", 50, "isolated", "minmax", 0.99, 0.0, float("inf"))],
                     columns=SENSITIVITY_COLUMNS)
    return Sensitivity(t, "isolated", "minmax", Q, 2.0, False)


def _same_frame(a: pd.DataFrame, b: pd.DataFrame):
    """Same columns and values; same dtypes but for text (object or pandas' str, both text)."""
    for c in a.columns:
        if pd.api.types.is_string_dtype(a[c]):
            assert pd.api.types.is_string_dtype(b[c]), (c, b[c].dtype)
        else:
            assert a[c].dtype == b[c].dtype, (c, a[c].dtype, b[c].dtype)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_ranking_round_trips_with_its_dtypes():
    r = _ranking()
    back = Ranking.from_json(_through_json(r.to_json()))
    _same_frame(back.table, r.table)
    assert back.table.eligible.dtype == bool and back.table.eligible.tolist() == [True, False]
    assert (back.metric, back.samples, back.seconds, back.calibration_cache_hit, back.method) == \
        ("cos_drop", 8, 1.5, None, "entropy")


def test_sensitivity_round_trips():
    s = _sensitivity()
    back = Sensitivity.from_json(_through_json(s.to_json()))
    _same_frame(back.table, s.table)
    assert back.baseline == Q and back.baseline.snr_db == float("inf")
    assert (back.mode, back.method, back.seconds, back.cache_hit) == ("isolated", "minmax", 2.0, False)


def _search(project) -> SearchResult:
    eligible = [l.name for l in project.layers if l.eligible]
    base = project.default_policy()
    rows = []
    for k in range(len(eligible) + 1):
        int8 = eligible[:k]
        rows.append((k, "minmax", k, len(eligible) - k, 0.999 - 0.001 * k, 10.0 - k, k / len(eligible), 1.0, k % 2,
                     k < 3, True, ",".join(sorted(set(eligible) - set(int8))), ",".join(sorted(int8)),
                     9.0 - k, 11.0 - k))
    cands = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)
    cands.loc[1, "pareto"] = False
    policy = base.with_layers({n: ("int8" if n in eligible[:2] else "fp16") for n in eligible})
    return SearchResult(Budget.parse("cosine_mean>=0.997"), policy, True, None, Q, "meets it", cands,
                        _sensitivity(), None, 3.0, {"latency_model_s": 1.0}, {"minmax": base}, 2)


REF = "0123456789abcdef0123456789abcdef"  # a rankings/ key (core.workspace.analysis_key)


def test_search_result_round_trips(tiny_cnn):
    """Format 3: the document names the isolated table by its rankings/ key instead of holding a copy;
    from_json gives the reference (the store reads the table: test_workspace_layout)."""
    from dataclasses import replace

    r = replace(_search(tiny_cnn), sensitivity_ref=REF)
    doc = _through_json(r.to_json())
    assert doc["kind"] == "search" and doc["format_version"] == SearchResult.FORMAT_VERSION == 3
    assert doc["chosen"] == 2 and doc["sensitivity_ref"] == REF and "sensitivity" not in doc  # no copy
    back = SearchResult.from_json(doc, tiny_cnn.model, tiny_cnn.layers)
    assert back.sensitivity is None and back.sensitivity_ref == REF
    _same_frame(back.candidates, r.candidates)
    assert back.candidates.pareto.dtype == bool and back.candidates.meets_budget.dtype == bool
    assert (back.budget, back.policy, back.variants, back.holdout, back.chosen) == \
        (r.budget, r.policy, r.variants, r.holdout, 2)
    assert (back.met_on_dev, back.met_on_holdout, back.message, back.seconds, back.timings, back.run) == \
        (True, None, "meets it", 3.0, {"latency_model_s": 1.0}, None)
    assert back.policy_for(2) == r.policy
    # the front: FRONT_COLUMNS, fastest first, without the candidate that is off the front
    assert list(back.front.columns) == FRONT_COLUMNS
    assert np.all(np.diff(back.front.est_ms.to_numpy()) > 0) and 1 not in set(back.front.candidate)
    assert back.front_policy(2) == r.policy
    with pytest.raises(MixprecError, match="not on the stored Pareto front") as e:
        back.front_policy(1)
    assert "pick one of the front's points: 0, 2, 3" in str(e.value)


def test_a_search_without_a_reference_keeps_its_table(tiny_cnn):
    """A result not made by core.search.search (no rankings/ key) holds its table: stored nowhere else."""
    r = _search(tiny_cnn)
    doc = _through_json(r.to_json())
    assert "sensitivity_ref" not in doc
    back = SearchResult.from_json(doc, tiny_cnn.model, tiny_cnn.layers)
    _same_frame(back.sensitivity.table, r.sensitivity.table)
    assert back.sensitivity.baseline == Q and back.sensitivity_ref == ""
    with pytest.raises(KeyError):  # neither a reference nor a table: damaged (the store removes it)
        SearchResult.from_json({k: v for k, v in doc.items() if k != "sensitivity"}, tiny_cnn.model, tiny_cnn.layers)


def test_a_search_of_format_2_reads_its_embedded_table(tiny_cnn):
    """Searches stored before the reference (format 2) hold a copy of the isolated table: it is read."""
    from dataclasses import replace

    r = _search(tiny_cnn)
    doc = _through_json(replace(r, sensitivity_ref=REF).to_json())
    old = {k: v for k, v in doc.items() if k != "sensitivity_ref"} | {
        "format_version": 2, "sensitivity": _through_json(r.sensitivity.to_json())}
    back = SearchResult.from_json(old, tiny_cnn.model, tiny_cnn.layers)
    _same_frame(back.sensitivity.table, r.sensitivity.table)
    assert back.sensitivity_ref == "" and back.tie_note == "" and back.chosen == 2
    _same_frame(back.candidates, r.candidates)
    with pytest.raises(KeyError):  # a format-2 document without its table is damaged
        SearchResult.from_json({k: v for k, v in old.items() if k != "sensitivity"}, tiny_cnn.model, tiny_cnn.layers)


def test_a_search_of_format_1_reads_without_bands(tiny_cnn):
    """Searches stored before the estimate's band (format 1: no est_low_ms/est_high_ms, no tie_note)."""
    from core.records import frame_to_json

    r = _search(tiny_cnn)
    doc = _through_json(r.to_json())
    assert doc["format_version"] == 3 and doc["tie_note"] == ""
    old = {k: v for k, v in doc.items() if k != "tie_note"} | {
        "format_version": 1, "candidates": frame_to_json(r.candidates.drop(columns=["est_low_ms", "est_high_ms"]))}
    back = SearchResult.from_json(_through_json(old), tiny_cnn.model, tiny_cnn.layers)
    assert list(back.candidates.columns) == CANDIDATE_COLUMNS and back.candidates.est_high_ms.isna().all()
    assert back.tie_note == "" and back.chosen == 2 and list(back.front.columns) == FRONT_COLUMNS
    _same_frame(back.sensitivity.table, r.sensitivity.table)  # format 1 holds the table too


def test_other_format_versions_and_kinds_are_refused(tiny_cnn):
    doc = _search(tiny_cnn).to_json()
    with pytest.raises(MixprecError, match="older than this mixprec reads"):
        SearchResult.from_json(doc | {"format_version": 0}, tiny_cnn.model, tiny_cnn.layers)
    with pytest.raises(MixprecError, match="newer than this mixprec reads"):
        Ranking.from_json(_ranking().to_json() | {"format_version": 99})
    with pytest.raises(MixprecError, match="not a mixprec sensitivity document"):
        Sensitivity.from_json(_ranking().to_json())


def test_search_result_with_its_verifying_run_round_trips(tiny_cnn):
    from dataclasses import replace

    from core.measure.runs import build_and_measure

    run = build_and_measure(tiny_cnn, tiny_cnn.default_policy(), iterations=5, profile_iterations=2)
    r = replace(_search(tiny_cnn), run=run, met_on_holdout=True, holdout=run.quality)
    doc = _through_json(r.to_json())
    assert "per_layer" not in doc["run"]  # the run's own directory keeps its per-layer table
    back = SearchResult.from_json(doc, tiny_cnn.model, tiny_cnn.layers)
    assert back.run.row() == run.row() and back.holdout == run.quality and back.met_on_holdout is True
    assert back.run.per_layer.empty
