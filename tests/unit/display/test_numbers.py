"""Issue 23, numbers as a person reads them: a KL divergence to 4 significant digits (not 0.00124421334479979), the
search front with both shares in percent (not a fraction beside a percent), a slowdown said once."""
from __future__ import annotations

import math

import pandas as pd

from core.display.tables import front_table, metric_text, run_comparison_table
from core.measure.runs import speedup_text


def test_kl_and_perplexity_have_sensible_digits():
    assert metric_text("kl_div", 0.00124421334479979) == "0.001244"
    assert metric_text("perplexity", 25.46512345) == "25.47" and metric_text("kl_div", None) == "—"
    from tests.unit.display.test_charts import _runs_table

    runs = _runs_table(2).assign(kl_div=[0.00224421334479979, 0.00124421334479979], perplexity=[12.3456789, 12.0])
    a, b = runs["run_id"].iloc[1], runs["run_id"].iloc[0]
    cmp = run_comparison_table(runs, a, b)
    assert cmp.at["KL divergence (nats)", cmp.columns[0]] == "0.001244"
    assert cmp.at["KL divergence (nats)", "B vs A"] == "+0.001000" and cmp.at["perplexity", "B vs A"] == "+0.3457"
    assert not any("0.00124421334479979" in str(v) for v in cmp.values.ravel())


def test_front_table_shows_both_shares_in_percent():
    from core.search.result import FRONT_COLUMNS

    front = pd.DataFrame([(3, "minmax", 40, 0.99903620, 1.2345678, 1.1, 1.4, 0.9459, 18.3277, 4, True),
                          (7, "entropy", 44, 0.98876543, 1.01234, math.nan, math.nan, 1.0, 2.5, 2, False)],
                         columns=FRONT_COLUMNS)
    t = front_table(front, "cosine_mean")
    assert t["INT8 MAC share (%)"].tolist() == [94.6, 100.0] and t["reformat share (%)"].tolist() == [18.3, 2.5]
    assert "int8_mac_share" not in t.columns and "est_reformat_pct" not in t.columns
    assert t["cosine_mean (dev half)"].tolist() == [0.999036, 0.988765]
    assert t["estimated time (ms)"].tolist() == [1.235, 1.012] and t["meets budget"].tolist() == [True, False]
    assert "likely from (ms)" in t.columns and pd.isna(t["likely from (ms)"].iloc[1])
    no_band = front_table(front.drop(columns=["est_low_ms", "est_high_ms"]))
    assert "likely from (ms)" not in no_band.columns and "quality (dev half)" in no_band.columns


def test_a_slowdown_is_said_once():
    assert speedup_text(0.83) == ("1.20× slower than FP32", "down")
    assert speedup_text(1.5) == ("1.50× faster than FP32", "up")
    assert metric_text("speedup", 0.83) == "1.20× slower than FP32"
