"""Issue 23 §1 and §6 in the display tables: every run says the shapes and the policy its numbers are for; runs of
the same policy (same content hash) are marked as such in the history, the pickers and the comparison, with
each speedup's 95 % interval and what a gap between two of them means."""
from __future__ import annotations

import math

from core.display.tables import (interval_text, run_comparison_table, run_context, run_history, run_title,
                                 same_policy_note)
from tests.unit.display.test_charts import _runs_table


def _runs(n=3, same=(0, 1), ci=((1.31, 1.62), (1.70, 2.10), (1.0, 1.1))):
    runs = _runs_table(n).sort_values("created", ignore_index=True)  # oldest first: run 0, run 1, …
    runs["policy_sha256"] = [("aa" * 32) if i in same else f"{i:02d}" * 32 for i in range(n)]
    runs["speedup"] = [1.48, 1.93, 1.05][:n]
    runs["speedup_low"], runs["speedup_high"] = [c[0] for c in ci[:n]], [c[1] for c in ci[:n]]
    runs["timed_pairs"] = 30
    runs["input_shapes"] = ["1×3×640×640", "1×3×640×640", "1×3×224×224"][:n]
    return runs.sort_values("created", ascending=False, ignore_index=True)


def test_history_marks_runs_of_the_same_policy_and_shows_the_interval():
    runs = _runs()
    hist = run_history(runs).set_index("label")
    assert hist.at["run 0", "policy"] == hist.at["run 1", "policy"] == "aaaaaaaa · 2 runs"
    assert hist.at["run 2", "policy"] == "02020202"
    assert hist.at["run 0", "vs FP32, 95 % interval"] == "1.31–1.62× (30 pairs)"
    assert hist.at["run 2", "input shapes"] == "1×3×224×224"
    older = run_history(runs.assign(speedup_low=math.nan, speedup_high=math.nan, timed_pairs=0))
    assert set(older["vs FP32, 95 % interval"]) == {"not kept (an older run)"}


def test_pickers_name_the_shared_policy():
    runs = _runs()
    ids = dict(zip(runs["label"], runs["run_id"]))
    assert run_title(runs, ids["run 0"]).endswith("· policy aaaaaaaa, 2 runs")
    assert "policy" not in run_title(runs, ids["run 2"])


def test_comparison_of_the_same_policy_says_so_and_how_noisy():
    runs = _runs()
    ids = dict(zip(runs["label"], runs["run_id"]))
    a, b = ids["run 0"], ids["run 1"]
    cmp = run_comparison_table(runs, a, b)
    assert cmp.at["policy (content hash)", "B vs A"] == "same policy"
    assert cmp.at["vs FP32, 95 % interval", cmp.columns[0]] == "1.31–1.62× (30 pairs)"
    assert cmp.at["input shapes", "B vs A"] == "same shapes"
    note = same_policy_note(runs, a, b)
    assert "same policy (content hash aaaaaaaa)" in note and "1.48×" in note and "1.93×" in note
    assert "do not overlap" in note and "idle machine" in note  # 1.31–1.62 against 1.70–2.10
    overlapping = _runs(ci=((1.3, 1.8), (1.7, 2.1), (1.0, 1.1)))
    assert "overlap: the gap is measurement noise" in same_policy_note(overlapping, a, b)
    other = run_comparison_table(runs, a, ids["run 2"])
    assert other.at["policy (content hash)", "B vs A"] == "another policy"
    assert other.at["input shapes", "B vs A"] == "other shapes: latencies not comparable"
    assert same_policy_note(runs, a, ids["run 2"]) == ""
    three = _runs(same=(0, 1, 2))
    assert "The 3 runs of this policy range 1.05–1.93×" in same_policy_note(three, a, b)


def test_run_context_says_shapes_policy_and_source():
    row = _runs().iloc[0]
    assert run_context(row) == f"for 1×3×224×224, policy run 2 (02020202), ONNX Runtime CPU, measured"
    assert "shapes not recorded" in run_context(row.copy().drop("input_shapes"))
    assert interval_text(1.2, 1.5) == "1.20–1.50×"
