"""core.display.charts charts (the search's, the runs', one run against another) and core.display.tables's display
tables: units, rounding, local times, axis ranges that fit, legends, user text drawn literally."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.display.charts import plot_pareto, plot_sensitivity_compare
from core.errors import MixprecError
from core.measure.metrics import Quality
from core.search import CANDIDATE_COLUMNS, Budget, SearchResult, pareto_flags
from core.sensitivity import SENSITIVITY_COLUMNS, Sensitivity, ranking_comparison
from core.store.results import load_search, save_search, search_path
from core.workspace import Workspace, atomic_write_json, take_notes

NAMES = [f"layer{i}/MatMul" for i in range(6)]


@pytest.fixture
def isolated():
    delta = [0.05, 0.04, 0.03, 0.02, 0.01, 0.0]
    rows = [(i + 1, n, "MatMul", 100 * (i + 1), "isolated", "minmax", 1 - d, d, 30.0) for i, (n, d) in
            enumerate(zip(NAMES, delta))]
    return pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)


@pytest.fixture
def cumulative():
    # the cumulative ranking also has non-eligible layers; it orders the eligible ones in reverse
    names = ["/Softmax"] + NAMES
    drop = [0.5] + [0.01 * (i + 1) for i in range(6)]
    return pd.DataFrame({"rank": range(1, 8), "name": names, "op_type": ["Softmax"] + ["MatMul"] * 6,
                         "cos_drop": drop, "added_cos_drop": drop})


def test_ranking_comparison_ranks_both_among_eligible_layers(cumulative, isolated):
    df = ranking_comparison(cumulative, isolated)
    assert df["name"].tolist() == NAMES and df["isolated_rank"].tolist() == [1, 2, 3, 4, 5, 6]
    assert df["cumulative_rank"].tolist() == [6, 5, 4, 3, 2, 1]
    alone = ranking_comparison(None, isolated)
    assert alone["cumulative_rank"].isna().all() and len(alone) == 6


def test_plot_sensitivity_compare(cumulative, isolated):
    fig = plot_sensitivity_compare(cumulative, isolated, top_n=4)
    assert len(fig.data) == 2 and {t.orientation for t in fig.data} == {"h"}
    left, right = fig.data
    assert list(left.y) == list(right.y) == NAMES[:4][::-1]  # the most harmful on its own on top
    assert list(left.x) == [0.02, 0.03, 0.04, 0.05] and list(right.x) == pytest.approx([0.04, 0.03, 0.02, 0.01])
    assert (left.xaxis, right.xaxis) == ("x", "x2")
    assert len(plot_sensitivity_compare(None, isolated, 10).data[0].y) == 6
    with pytest.raises(MixprecError, match="isolated sensitivity"):
        plot_sensitivity_compare(cumulative, cumulative)


@pytest.fixture
def candidates():
    quality = np.array([0.999, 0.998, 0.995, 0.990, 0.997, 0.985])
    est_ms = np.array([10.0, 8.0, 6.0, 5.0, 9.0, 7.0])
    rows = [(i, "minmax", 6 - i, i, q, ms, 0.1 * i, 1.0, i % 3, q >= 0.99, False, "", "", ms * 0.9, ms * 1.1)
            for i, (q, ms) in
            enumerate(zip(quality, est_ms))]
    df = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)
    df["pareto"] = pareto_flags(quality, est_ms)
    return df.drop(columns=["fallback"])


def test_plot_pareto_front_connected_and_chosen_marked(candidates):
    fig = plot_pareto(candidates, chosen=2, budget=Budget.parse("cosine_mean>=0.99"))
    others, front, fails, chosen = fig.data
    assert [t.name for t in fig.data] == ["other candidates", "Pareto front", "fails the budget", "chosen"]
    assert (list(fails.x), list(fails.y)) == ([7.0], [0.985]) and "open" in fails.marker.symbol  # the one below 0.99
    assert [c[6] for c in front.customdata] == ["meets the budget"] * 4 and fails.customdata[0][6] == "fails the budget"
    assert front.mode == "lines+markers" and list(front.x) == [5.0, 6.0, 8.0, 10.0]  # fastest first
    assert list(front.y) == [0.990, 0.995, 0.998, 0.999]
    assert sorted(others.x) == [7.0, 9.0]  # dominated: 9 ms @ 0.997 by 8 ms @ 0.998, 7 ms @ 0.985 by 6 ms
    assert (list(chosen.x), list(chosen.y)) == ([6.0], [0.995]) and chosen.marker.symbol == "star"
    assert [c[4] for c in front.customdata] == ["minmax"] * 4 and "reformat" in front.hovertemplate
    assert fig.layout.shapes[0].y0 == 0.99 and fig.layout.yaxis.title.text == "cosine_mean"
    assert len(plot_pareto(candidates).data) == 2  # no chosen point, no budget: no star, nothing fails
    flipped = plot_pareto(candidates, budget=Budget.parse("top1_drop<=1%"))
    assert flipped.layout.yaxis.range[0] > flipped.layout.yaxis.range[1]  # reversed: lower is better
    assert fig.layout.xaxis.range is None  # several latencies: Plotly fits them


def test_plot_pareto_one_latency_gets_a_range_around_it(candidates):
    """All candidates at one estimated latency: the x axis spans ±20 % of it, not Plotly's -0.5..1."""
    same = candidates.assign(est_ms=0.1956)
    fig = plot_pareto(same, chosen=0)
    assert tuple(fig.layout.xaxis.range) == pytest.approx((0.1956 * 0.8, 0.1956 * 1.2))


def test_search_front_from_a_stored_document(candidates, isolated, tiny_cnn, tmp_path):
    """The stored search gives back every evaluated candidate and the front (fastest first). A
    document of an older mixprec (a bare ``front`` list, before the search record) is not used:
    a note says so and that it is computed again (it used to be patched silently)."""
    ws, pol = Workspace(tmp_path), tiny_cnn.default_policy()
    q = Quality(0.995, 0.99, 30.0, 0.1, None, None, 8)
    sens = Sensitivity(isolated, "isolated", "minmax", q, 1.0, False)
    table = candidates.assign(fallback="")[CANDIDATE_COLUMNS]
    result = SearchResult(Budget.parse("cosine_mean>=0.99"), pol, True, None, None, "", table, sens,
                          variants={"minmax": pol})
    save_search(ws, tiny_cnn, result, smooth=False)
    back = load_search(ws, tiny_cnn, "cosine_mean>=0.99", False)
    assert len(back.candidates) == 6 and back.front["est_ms"].tolist() == [5.0, 6.0, 8.0, 10.0]
    assert load_search(ws, tiny_cnn, "cosine_mean>=0.99", True) is None  # never run
    old = {"front": candidates[candidates.pareto].to_dict(orient="records"), "budget": "cosine_mean>=0.99"}
    atomic_write_json(search_path(ws, tiny_cnn, "cosine_mean>=0.99", False), old)
    take_notes()
    assert load_search(ws, tiny_cnn, "cosine_mean>=0.99", False) is None  # not used: computed again, with a note
    (note,) = take_notes()
    assert "not a mixprec search document" in note and "computed again" in note


def test_per_layer_chart_marks_fp16_simulated_on_the_cpu():
    """On the ORT backend an FP16 MatMul is simulated (no float16 CPU kernel): its own cross-hatched
    trace, and the title says its time is not FP16 time; a real float16 LayerNormalization, a Cast
    (a conversion) and every node on TensorRT are not marked."""
    from core.backends.base import PER_LAYER_COLUMNS
    from core.display.charts import SIMULATED_FP16, plot_run_layers, simulated_fp16

    rows = [("/mm", "MatMul", "/mm", "fp16", 0.4, 40.0, False), ("/ln", "LayerNormalization", "/ln", "fp16", 0.2, 20.0,
            False), ("/cast", "Cast", "", "fp16", 0.1, 10.0, True), ("/q", "MatMul", "/q", "int8", 0.3, 30.0, False)]
    df = pd.DataFrame(rows, columns=PER_LAYER_COLUMNS)
    assert simulated_fp16(df).tolist() == [True, False, False, False]
    fig = plot_run_layers(df)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name[SIMULATED_FP16].y) == ["/mm"] and by_name[SIMULATED_FP16].marker.pattern.shape == ("x",)
    assert "/mm" not in by_name["FP16"].y and set(by_name["FP16"].y) == {"/ln", "/cast"}
    assert "not FP16 time" in fig.layout.title.text and "not FP16 time" in by_name[SIMULATED_FP16].hovertemplate
    trt = plot_run_layers(df, backend="tensorrt")
    assert SIMULATED_FP16 not in {t.name for t in trt.data} and "not FP16 time" not in trt.layout.title.text
    # a table read back from per_layer.csv has is_reformat as text
    assert simulated_fp16(df.astype({"is_reformat": str})).tolist() == [True, False, False, False]


# ---------------------------------------------------------------------------- honest presentation (issue 13 §4, §5)
def _runs_table(n: int = 2, label: str = "run") -> pd.DataFrame:
    from core.measure.runs import RUN_COLUMNS

    rows = []
    for i in range(n):
        rows.append({"run_id": f"20260101-00000{i}-abcde{i}", "created": 1767225600.0 + 60 * i, "model_name": "m",
                     "model_sha256": "s", "label": f"{label} {i}", "backend": "onnxruntime", "target": "tensorrt",
                     "latency_source": "ONNX Runtime CPU, measured", "policy_sha256": "p",
                     "latency_median_ms": 12.960790500073927 + i, "latency_p95_ms": 14.0 + i, "fp32_median_ms": 20.0,
                     "speedup": 1.5431 - 0.8 * i, "reformat_count": 3 + i, "reformat_ms": 0.25, "reformat_pct": 2.5,
                     "cosine_mean": 0.9817 - 0.001 * i, "cosine_min": 0.9488, "snr_db": 17.81923 + i,
                     "max_abs": 0.0123456, "top1_agreement": None, "knn5_overlap": 0.8, "n_fp32": 5, "n_fp16": 1,
                     "n_int8": 42 - i, "int8_mac_fraction": 0.9, "build_seconds": 3.21, "data_generated": False,
                     "warnings": ""})
    return pd.DataFrame(rows, columns=RUN_COLUMNS).sort_values("created", ascending=False, ignore_index=True)


def test_local_time_and_rounding():
    import time

    from core.display.tables import local_time, metric_text, significant

    t = 1767225600.0
    assert local_time(t).startswith(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)))
    assert local_time(None) == "—"
    assert significant(12.960790500073927) == "12.96" and significant(0.018754) == "0.01875"
    assert significant(1234.5678) == "1235" and significant(0.0) == "0"
    assert metric_text("latency_median_ms", 12.960790500073927) == "12.96 ms"
    assert metric_text("snr_db", 17.81923) == "17.8 dB" and metric_text("snr_db", None).startswith("∞")
    assert metric_text("int8_mac_fraction", 0.9) == "90.0 %" and metric_text("reformat_count", 3.0) == "3"
    assert metric_text("speedup", 0.78).endswith("slower than FP32") and metric_text("created", t) == local_time(t)
    assert metric_text("top1_agreement", None) == "—" and metric_text("target", "tensorrt") == "TensorRT (GPU)"


def test_run_history_and_comparison_have_units_labels_and_local_times():
    from core.display.tables import local_time, run_comparison_table, run_history

    runs = _runs_table()
    hist = run_history(runs)
    assert hist["created (local time)"].tolist() == [local_time(t) for t in runs["created"]]
    assert hist["median (ms)"].tolist() == [13.96, 12.96] and hist["SNR (dB)"].tolist() == [18.8, 17.8]
    assert hist["vs FP32"].iloc[1] == "1.54× faster than FP32" and hist["INT8 MAC share (%)"].iloc[0] == 90.0
    assert str(hist["reformats"].dtype) == "Int64"
    a, b = runs["run_id"].iloc[1], runs["run_id"].iloc[0]
    cmp = run_comparison_table(runs, a, b)
    assert list(cmp.columns) == ["A: run 0", "B: run 1", "B vs A"]  # named by the runs' labels
    assert cmp.at["median latency", "A: run 0"] == "12.96 ms" and cmp.at["created (local time)", "A: run 0"] == \
        local_time(runs["created"].iloc[1])
    assert cmp.at["median latency", "B vs A"] == "+1.000 ms (+7.7 %)" and cmp.at["INT8 layers", "B vs A"] == "-1"
    assert cmp.at["SNR", "B vs A"] == "+1.0 dB" and cmp.at["top-1 agreement", "A: run 0"] == "—"
    assert not any("12.960790500073927" in str(v) for v in cmp.values.ravel())
    same = run_comparison_table(runs.assign(label="same"), a, b)
    assert list(same.columns[:2]) == ["A: same", "B: same"]  # the letters keep equal labels apart


def test_quality_vs_latency_axes_fit_one_run():
    """A single run: the cosine axis stays near its value (not up to 1.5), the colour scale starts
    at 0 with integer ticks (not 41.6–42.4), the latency axis around the point."""
    from core.display.charts import plot_quality_vs_latency, plot_run_quality

    one = _runs_table(1)
    fig = plot_quality_vs_latency(one)
    lo, hi = fig.layout.yaxis.range
    assert lo < 0.9817 < hi <= 1.0 and hi - lo < 0.02
    x0, x1 = fig.layout.xaxis.range
    assert 0 <= x0 < 12.96 < x1 < 20
    marker = fig.data[0].marker
    assert (marker.cmin, marker.cmax) == (0, 42) and marker.colorbar.tickformat == "d"
    q = plot_run_quality(_runs_table(3))
    assert q.layout.yaxis2.tickformat == ".1f" and q.layout.yaxis2.ticksuffix == " dB"
    s0, s1 = q.layout.yaxis2.range
    assert s0 < 17.8 and 19.8 < s1 < 25
    c0, c1 = q.layout.yaxis.range
    assert c0 < 0.9488 and 1.0 <= c1 < 1.02


def test_run_latency_lines_are_in_the_legend():
    from core.display.charts import plot_run_latency

    fig = plot_run_latency(_runs_table(2))
    names = [t.name for t in fig.data]
    assert names[0].startswith("median") and any(n.startswith("FP32 baseline") for n in names)
    assert all(t.showlegend is not False for t in fig.data)
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.range[1] > 20  # the FP32 line is inside
    assert "built" in fig.data[0].hovertemplate


def test_user_text_is_drawn_literally_in_charts():
    """A label or layer name with HTML: Plotly would draw <b> bold and <a href> as a link; every
    chart escapes it, and keeps the raw name in customdata[0] for selection events."""
    from core.backends.base import PER_LAYER_COLUMNS
    from core.display.charts import plot_ranking, plot_run_latency, plot_run_layers, plot_run_quality, plot_text

    bad = '<b>x</b> <a href="http://127.0.0.1:9/">l</a> & co'
    assert plot_text(bad) == '&lt;b&gt;x&lt;/b&gt; &lt;a href="http://127.0.0.1:9/"&gt;l&lt;/a&gt; &amp; co'
    runs = _runs_table(2, label=bad)
    for fig in (plot_run_latency(runs), plot_run_quality(runs)):
        spec = fig.to_json()
        assert "<b>x" not in spec and "\\u003cb\\u003ex" not in spec and "&lt;b&gt;x" in spec
    per_layer = pd.DataFrame([(bad, "MatMul", bad, "int8", 0.5, 50.0, False)], columns=PER_LAYER_COLUMNS)
    fig = plot_run_layers(per_layer)
    assert list(fig.data[0].y) == [plot_text(bad)] and fig.data[0].customdata[0][0] == bad
    ranking = pd.DataFrame({"name": [bad, "/ok"], "op_type": ["<i>Op</i>", "MatMul"], "precision": ["int8", "fp16"],
                            "cos_drop": [0.2, 0.1]})
    fig = plot_ranking(ranking)
    assert [t.name for t in fig.data] == ["FP16", "INT8"] and fig.layout.legend.title.text  # a legend, by precision
    assert "<i>" not in fig.to_json().replace("<extra>", "") and fig.data[1].customdata[0][0] == bad


def test_sensitivity_compare_has_a_legend(cumulative, isolated):
    fig = plot_sensitivity_compare(cumulative, isolated, top_n=3)
    assert fig.layout.showlegend is not False and [t.name.split(":")[0] for t in fig.data] == ["isolated", "cumulative"]


def test_layer_comparison_and_its_chart():
    """Two runs layer by layer: time of each policy layer (its nodes and conversions summed), its
    precision in each, and a chart with both runs named by their labels and a legend of precisions."""
    from core.backends.base import PER_LAYER_COLUMNS
    from core.display.charts import plot_layer_comparison
    from core.display.tables import LAYER_COMPARE_COLUMNS, layer_comparison

    a = pd.DataFrame([("/mm", "MatMulInteger", "/mm", "int8", 0.4, 40.0, False),
                      ("/mm/x0/QuantizeLinear", "QuantizeLinear", "/mm", "int8", 0.1, 10.0, True),
                      ("/ln", "LayerNormalization", "/ln", "fp16", 0.2, 20.0, False),
                      ("Shape", "Shape", "", "", 0.05, 5.0, False)], columns=PER_LAYER_COLUMNS)
    b = pd.DataFrame([("/mm", "MatMul", "/mm", "fp16", 0.7, 70.0, False),
                      ("/ln", "LayerNormalization", "/ln", "fp16", 0.2, 20.0, False)], columns=PER_LAYER_COLUMNS)
    df = layer_comparison(a, b)
    assert list(df.columns) == LAYER_COMPARE_COLUMNS and df["layer"].tolist() == ["/mm", "/ln"]  # slowest first
    mm = df.iloc[0]
    assert mm["ms_a"] == pytest.approx(0.5) and mm["ms_b"] == pytest.approx(0.7)  # with its QuantizeLinear
    assert (mm["precision_a"], mm["precision_b"], bool(mm["changed"])) == ("int8", "fp16", True)
    assert mm["op_type"] == "MatMulInteger" and not df.iloc[1]["changed"]
    fig = plot_layer_comparison(df, "A: <b>int8</b>", "B: fp16")
    runs = [t for t in fig.data if t.type == "bar" and t.x != (None,)]  # not the legend's cross-hatch entry
    bars = sorted(runs, key=lambda t: t.legendrank)
    assert [t.name for t in bars] == ["A: &lt;b&gt;int8&lt;/b&gt;", "B: fp16"]  # in the legend: A, then B
    assert list(bars[0].x) == pytest.approx([0.2, 0.5]) and list(bars[0].y) == ["/ln", "/mm"]  # the slowest on top
    marks = {t.name: t for t in fig.data if t.type == "scatter" and t.showlegend is False}
    assert set(marks) == {"INT8", "FP16"} and list(marks["INT8"].y) == ["/mm"]
    assert "diamond" in marks["INT8"].marker.symbol and bars[0].customdata[0][0] == "/ln"
    legend = [t.name for t in fig.data if t.type == "scatter" and t.showlegend is not False]
    assert legend == ["FP16", "INT8", "precision changed"]  # squares per precision (FP32, FP16, INT8…), the diamond
    assert "1 layer(s) change precision" in fig.layout.title.text
