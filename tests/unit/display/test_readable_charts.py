"""Issue 23 §9 and the smaller chart faults: charts that read at a glance — short layer names with the full name on
hover, bars sorted by time whatever their precision, the reformat overhead in view, simulated FP16 hatched in
the A-vs-B chart, a Pareto y range that outliers do not stretch and one "fails the budget" legend entry, a
legend that leaves the x ticks alone, labels of nearby points that do not sit on each other."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.backends.base import PER_LAYER_COLUMNS
from core.estimate.predict import PREDICTION_COLUMNS

FUSED = [f"/encoder/layer.{i}/intermediate/dense/MatMul/x0/DequantizeLinear + /encoder/layer.{i}/intermediate/dense/"
         f"MatMul + /encoder/layer.{i}/intermediate/dense/Add + /encoder/layer.{i}/intermediate/intermediate_act_fn/Div"
         f" + /encoder/layer.{i}/intermediate/intermediate_act_fn/Erf" for i in range(3)]


def _estimate_table() -> pd.DataFrame:
    rows = [(FUSED[0], [FUSED[0].split(" + ")[1], FUSED[0].split(" + ")[2]], "int8", 0.004, False, "transformer"),
            ("Reformatting CopyNode for Input Tensor 0 to /encoder/layer.1/attention/self/query/MatMul", [], "fp16",
             0.001, True, "reformat"),
            (FUSED[1], [FUSED[1].split(" + ")[1]], "fp16", 0.009, False, "transformer"),
            ("/embeddings/LayerNorm/Add_1", ["/embeddings/LayerNorm/Add_1"], "fp32", 0.006, False, "elementwise"),
            (FUSED[2], [FUSED[2].split(" + ")[1]], "int8", 0.007, False, "transformer"),
            ("/encoder/layer.2/output/dense/MatMul_output_0/Cast_fp32", [], "fp32", 0.0005, True, "reformat")]
    return pd.DataFrame(rows, columns=PREDICTION_COLUMNS)


def _bars(fig):
    return [t for t in fig.data if t.type == "bar"]


def _by_category(fig) -> dict:
    """Each drawn y category → its x value, over every bar trace."""
    return {y: x for t in _bars(fig) for y, x in zip(t.y, t.x)}


def test_estimate_chart_short_names_full_name_on_hover_sorted_by_time_reformats_visible():
    from core.display.charts import plot_estimate_layers

    table = _estimate_table()
    fig = plot_estimate_layers(table, "NVIDIA T4", "fit on the fixture engines", context="for 1×128, policy p")
    names = [y for t in _bars(fig) for y in t.y]
    assert max(len(n) for n in names) <= 48 and len(set(names)) == len(names)  # short, and still apart
    assert all(" + " not in n for n in names)
    full = {c[0]: c for t in _bars(fig) for c in t.customdata}
    for raw in table["engine_layer"]:  # the whole name, as it is (customdata[0]) and drawn on hover
        assert raw in full
        hover = full[raw][4].replace("<br>", "")
        assert hover.replace("&gt;", ">") == raw or hover.endswith("more") or raw.replace(" + ", " +") in hover
    assert all("%{customdata[4]}" in t.hovertemplate for t in _bars(fig))
    # bottom to top: the categories in time order, whatever precision each bar has
    order = list(fig.layout.yaxis.categoryarray)
    x = _by_category(fig)
    layers = [c for c in order if not c.startswith("all ")]
    assert [x[c] for c in layers] == sorted(x[c] for c in layers)
    assert fig.layout.yaxis.categoryorder == "array" and fig.layout.yaxis.automargin
    # the reformat overhead: its own bar (the sum of every predicted reformat) and the title's figures
    summary = next(t for t in _bars(fig) if t.name.startswith("all 2 predicted reformats"))
    assert list(summary.x) == pytest.approx([0.0015]) and summary.marker.pattern.shape in ("/", ("/",))
    assert order[-1] == summary.y[0]  # drawn on top, where it is seen
    assert "reformats 0.0015 ms" in fig.layout.title.text and "5.5 %" in fig.layout.title.text
    assert "for 1×128, policy p" in fig.layout.title.text and "NVIDIA T4" in fig.layout.title.text


def test_short_layer_names():
    from core.display.charts import short_layer_name, short_layer_names

    assert short_layer_name("/conv1/Conv") == "/conv1/Conv"
    s = short_layer_name(FUSED[0])
    assert s.startswith("…/") and s.endswith("dense/MatMul +4") and len(s) <= 48  # the DequantizeLinear is not it
    assert short_layer_name("Reformatting CopyNode for Input Tensor 0 to /conv2/Conv") == "reformat → /conv2/Conv"
    assert len(short_layer_name("x" * 300)) <= 48
    same = short_layer_names(["/a/b/c/d/e/f/g/h/i/j/k/l/m/n/MatMul_1", "/z/b/c/d/e/f/g/h/i/j/k/l/m/n/MatMul_1"])
    assert len(set(same)) == 2


def test_single_run_per_layer_chart_sorted_by_time_not_grouped_by_precision():
    from core.display.charts import plot_run_layers

    rows = [("/a", "MatMul", "/a", "int8", 0.5, 50.0, False), ("/b", "MatMul", "/b", "fp16", 0.4, 40.0, False),
            ("/c", "Conv", "/c", "int8", 0.3, 30.0, False), ("/d", "Add", "/d", "fp32", 0.2, 20.0, False),
            ("/e", "Conv", "/e", "int8", 0.1, 10.0, False)]
    fig = plot_run_layers(pd.DataFrame(rows, columns=PER_LAYER_COLUMNS))
    assert fig.layout.yaxis.categoryorder == "array"
    assert list(fig.layout.yaxis.categoryarray) == ["/e", "/d", "/c", "/b", "/a"]  # the slowest on top


def test_layer_comparison_hatches_fp16_simulated_on_the_cpu():
    """A vs B: an FP16 MatMul on ONNX Runtime's CPU is float32 compute; its bar is cross-hatched as in the
    single-run chart, its own legend entry says so, a real float16 kernel and a TensorRT run are not."""
    from core.display.charts import SIMULATED_FP16, plot_layer_comparison
    from core.display.tables import layer_comparison

    a = pd.DataFrame([("/mm", "MatMulInteger", "/mm", "int8", 0.4, 40.0, False),
                      ("/ln", "LayerNormalization", "/ln", "fp16", 0.2, 20.0, False)], columns=PER_LAYER_COLUMNS)
    b = pd.DataFrame([("/mm", "MatMul", "/mm", "fp16", 0.7, 70.0, False),
                      ("/ln", "LayerNormalization", "/ln", "fp16", 0.2, 20.0, False)], columns=PER_LAYER_COLUMNS)
    df = layer_comparison(a, b)
    assert df["simulated_b"].tolist() == [True, False] and not df["simulated_a"].any()
    fig = plot_layer_comparison(df, "A: int8", "B: fp16")
    bars = {t.name: t for t in _bars(fig)}
    shape_b = dict(zip(bars["B: fp16"].y, bars["B: fp16"].marker.pattern.shape))
    assert shape_b == {"/mm": "x", "/ln": ""} and set(bars["A: int8"].marker.pattern.shape) == {""}
    assert any(t.name == SIMULATED_FP16 for t in fig.data) and "not FP16 time" in fig.layout.title.text
    trt = plot_layer_comparison(layer_comparison(a, b, "tensorrt", "tensorrt"), "A", "B")
    assert all(set(t.marker.pattern.shape or ()) <= {""} for t in _bars(trt))
    assert SIMULATED_FP16 not in {t.name for t in trt.data}


@pytest.fixture
def candidates():
    from core.search import CANDIDATE_COLUMNS, pareto_flags

    rng = np.random.default_rng(0)
    quality = np.concatenate([0.99 + 0.008 * rng.random(20), [0.2, 0.35]])  # two outliers far below
    est_ms = np.concatenate([5 + 5 * rng.random(20), [1.0, 1.5]])
    rows = [(i, "minmax", 6, i, q, ms, 0.1, 1.0, 2, q >= 0.995, False, "", "", ms * 0.9, ms * 1.1)
            for i, (q, ms) in enumerate(zip(quality, est_ms))]
    df = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)
    df["pareto"] = pareto_flags(quality, est_ms)
    return df


def test_pareto_robust_y_range_and_one_fails_entry(candidates):
    from core.display.charts import plot_pareto
    from core.search import Budget

    budget = Budget.parse("cosine_mean>=0.995")
    fig = plot_pareto(candidates, chosen=3, budget=budget)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert len(names) == len(set(names)) and names.count("fails the budget") == 1
    lo, hi = fig.layout.yaxis.range
    assert lo > 0.9 and hi < 1.01 and lo < 0.995 < hi  # the outliers do not stretch it; the budget is inside
    assert lo < candidates["quality"].iloc[:20].min() and hi > candidates["quality"].iloc[:20].max()
    assert "2 candidates outside the y range" in fig.layout.title.text
    fails = next(t for t in fig.data if t.name == "fails the budget")  # the verdict of the search (meets_budget)
    assert len(fails.x) == int((~candidates["meets_budget"]).sum())
    flipped = plot_pareto(candidates.assign(quality=1 - candidates["quality"]), budget=Budget.parse("kl_div<=0.005"))
    r0, r1 = flipped.layout.yaxis.range
    assert r0 > r1 and r0 < 0.1  # lower is better: the axis is reversed, and still robust


def test_sensitivity_compare_legend_below_the_x_axis_title():
    from core.display.charts import plot_sensitivity_compare
    from core.sensitivity import SENSITIVITY_COLUMNS

    for n in (3, 20):
        names = [f"/l{i}/MatMul" for i in range(n)]
        iso = pd.DataFrame([(i + 1, nm, "MatMul", 10, "isolated", "minmax", 0.99, 0.01 * (n - i), 30.0)
                            for i, nm in enumerate(names)], columns=SENSITIVITY_COLUMNS)
        fig = plot_sensitivity_compare(None, iso, top_n=n)
        legend, margin = fig.layout.legend, fig.layout.margin
        plot_h = fig.layout.height - margin.t - margin.b
        assert legend.yanchor == "top" and -legend.y * plot_h >= 60  # under the ticks and the axis title, in px
        assert margin.b >= -legend.y * plot_h + 25  # and inside the figure


def test_quality_vs_latency_labels_do_not_overlap():
    from core.display.charts import plot_quality_vs_latency
    from tests.unit.display.test_charts import _runs_table

    runs = _runs_table(4)
    fig = plot_quality_vs_latency(runs)
    pos = list(fig.data[0].textposition)
    xs = list(fig.data[0].x)
    by_x = [p for _, p in sorted(zip(xs, pos))]
    assert all(a != b for a, b in zip(by_x, by_x[1:]))  # neighbours in latency alternate above / below
    many = plot_quality_vs_latency(_runs_table(9).assign(latency_median_ms=12.0))
    assert many.data[0].mode == "markers" and "%{customdata[3]}" in many.data[0].hovertemplate  # names on hover


def test_run_latency_says_the_shapes_of_each_run():
    from core.display.charts import plot_run_latency
    from tests.unit.display.test_charts import _runs_table

    runs = _runs_table(2).assign(input_shapes=["1×3×640×640", "1×3×224×224"])
    fig = plot_run_latency(runs)
    assert "for %{customdata[3]}" in fig.data[0].hovertemplate and {c[3] for c in fig.data[0].customdata} == \
        {"1×3×640×640", "1×3×224×224"}
    assert "runs at other shapes" in fig.layout.title.text
    assert "other shapes" not in plot_run_latency(runs.assign(input_shapes="1×3×640×640")).layout.title.text
