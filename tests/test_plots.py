"""core.plots charts of the search: isolated vs cumulative sensitivity, and the Pareto front."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import MixprecError
from core.metrics import Quality
from core.plots import plot_pareto, plot_sensitivity_compare
from core.search import CANDIDATE_COLUMNS, Budget, SearchResult, pareto_flags
from core.sensitivity import SENSITIVITY_COLUMNS, Sensitivity, ranking_comparison
from core.store import load_search, save_search, search_path
from core.workspace import Workspace, atomic_write_json

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
    rows = [(i, "minmax", 6 - i, i, q, ms, 0.1 * i, 1.0, i % 3, q >= 0.99, False, "", "") for i, (q, ms) in
            enumerate(zip(quality, est_ms))]
    df = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)
    df["pareto"] = pareto_flags(quality, est_ms)
    return df.drop(columns=["fallback"])


def test_plot_pareto_front_connected_and_chosen_marked(candidates):
    fig = plot_pareto(candidates, chosen=2, budget=Budget.parse("cosine_mean>=0.99"))
    others, front, chosen = fig.data
    assert [t.name for t in fig.data] == ["other candidates", "Pareto front", "chosen"]
    assert front.mode == "lines+markers" and list(front.x) == [5.0, 6.0, 8.0, 10.0]  # fastest first
    assert list(front.y) == [0.990, 0.995, 0.998, 0.999]
    assert sorted(others.x) == [7.0, 9.0]  # dominated: 9 ms @ 0.997 by 8 ms @ 0.998, 7 ms @ 0.985 by 6 ms
    assert (list(chosen.x), list(chosen.y)) == ([6.0], [0.995]) and chosen.marker.symbol == "star"
    assert [c[4] for c in front.customdata] == ["minmax"] * 4 and "reformat" in front.hovertemplate
    assert fig.layout.shapes[0].y0 == 0.99 and fig.layout.yaxis.title.text == "cosine_mean"
    assert len(plot_pareto(candidates).data) == 2  # no chosen point: no star
    flipped = plot_pareto(candidates, budget=Budget.parse("top1_drop<=1%"))
    assert flipped.layout.yaxis.autorange == "reversed"


def test_search_front_from_a_stored_document(candidates, isolated, tiny_cnn, tmp_path):
    """The stored search gives back every evaluated candidate and the front (fastest first). A
    document of an older mixprec (a bare ``front`` list, before the search record) is refused
    with a message that says to search again (it used to be patched silently)."""
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
    with pytest.raises(MixprecError, match="not a mixprec search document") as e:
        load_search(ws, tiny_cnn, "cosine_mean>=0.99", False)
    assert "compute it again" in str(e.value)


def test_per_layer_chart_marks_fp16_simulated_on_the_cpu():
    """On the ORT backend an FP16 MatMul is simulated (no float16 CPU kernel): its own cross-hatched
    trace, and the title says its time is not FP16 time; a real float16 LayerNormalization, a Cast
    (a conversion) and every node on TensorRT are not marked."""
    from core.backends.base import PER_LAYER_COLUMNS
    from core.plots import SIMULATED_FP16, plot_run_layers, simulated_fp16

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
