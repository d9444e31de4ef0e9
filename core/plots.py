"""Plotly charts. Each function takes a table (a DataFrame with the fixed columns of the module
that made it) and returns a ``plotly.graph_objects.Figure``: data stays separate from plotting."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .compile import ORT_CPU_FP16_KERNELS
from .errors import MixprecError
from .reports import LAYER_COLUMNS, PCT_LABEL, PRECISION_COLUMNS, REFORMAT_COLUMNS, TYPE_COLUMNS
from .sensitivity import ranking_comparison

PRECISION_COLORS = {
    "FP32": "#4C78A8", "FP16": "#F58518", "BF16": "#E45756", "INT8": "#54A24B", "FP8": "#B279A2",
    "INT4": "#72B7B2", "FP4": "#EECA3B",
}
OTHER_COLOR = "#9D9D9D"
TEMPLATE = "plotly_white"


def precision_color(precision: str) -> str:
    return PRECISION_COLORS.get(str(precision).upper(), OTHER_COLOR)


def _check(df: pd.DataFrame, columns: list[str], table: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MixprecError(f"The table to plot is not a {table} table: it lacks columns {missing}",
                           f"pass the {table} table from core.reports")


def _titled(fig: go.Figure, title: str, x: str, y: str, **layout) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template=TEMPLATE, **layout)
    return fig


def plot_layer_latency(layers_df: pd.DataFrame) -> go.Figure:
    """Mean time per run of each engine layer, in engine order, one bar trace per precision.
    Reformat layers are hatched."""
    _check(layers_df, LAYER_COLUMNS, "layers")
    df = layers_df.reset_index(drop=True)
    fig = go.Figure()
    for precision, rows in df.groupby("precision", sort=False):
        fig.add_trace(go.Bar(
            name=precision, x=rows.index.tolist(), y=rows["time_ms"].tolist(),
            marker={"color": precision_color(precision),
                    "pattern": {"shape": ["/" if r else "" for r in rows["is_reformat"]]}},
            customdata=rows[["name", "layer_type", "pct"]].values.tolist(),
            hovertemplate="%{customdata[0]}<br>%{customdata[1]}<br>%{y:.4f} ms"
                          f" (%{{customdata[2]:.1f}} {PCT_LABEL})<extra>{precision}</extra>"))
    return _titled(fig, "Per-layer latency (hatched: reformat layers)",
                   "Engine layer (execution order)", "Mean time per run (ms)",
                   legend_title_text="Precision")


def plot_latency_by_type(df: pd.DataFrame) -> go.Figure:
    """Time per LayerType, from ``latency_by_type`` (TYPE_COLUMNS)."""
    _check(df, TYPE_COLUMNS, "latency-by-type")
    fig = go.Figure(go.Bar(
        x=df["layer_type"].tolist(), y=df["time_ms"].tolist(),
        text=[f"{n} layers · {p:.1f}%" for n, p in zip(df["layers"], df["pct"])],
        hovertemplate=f"%{{x}}<br>%{{y:.4f}} ms<br>%{{text}} {PCT_LABEL}<extra></extra>"))
    return _titled(fig, "Latency by layer type", "Layer type", "Time per run (ms, sum over layers)")


def plot_precision_distribution(df: pd.DataFrame) -> go.Figure:
    """Layer count and time share per precision, from ``precision_distribution`` (PRECISION_COLUMNS)."""
    _check(df, PRECISION_COLUMNS, "precision-distribution")
    colors = [precision_color(p) for p in df["precision"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Layers", f"Time ({PCT_LABEL})"))
    for col, y in ((1, "layers"), (2, "pct")):
        fig.add_trace(go.Bar(x=df["precision"].tolist(), y=df[y].tolist(), name=y,
                             marker={"color": colors}, showlegend=False), row=1, col=col)
        fig.update_xaxes(title_text="Precision", row=1, col=col)
    fig.update_yaxes(title_text="Layer count", row=1, col=1)
    fig.update_yaxes(title_text=PCT_LABEL, row=1, col=2)
    fig.update_layout(title="Precision distribution", template=TEMPLATE)
    return fig


def plot_reformat_overhead(df: pd.DataFrame) -> go.Figure:
    """Reformat time against the rest, per run, from ``reformat_table`` (REFORMAT_COLUMNS)."""
    _check(df, REFORMAT_COLUMNS, "reformat")
    runs = df["run"].tolist()
    fig = go.Figure([
        go.Bar(name="Reformat layers", x=runs, y=df["ms"].tolist(), marker={"color": "#E45756"},
               text=[f"{c} · {p:.1f}%" for c, p in zip(df["count"], df["pct"])],
               hovertemplate=f"%{{x}}: %{{y:.4f}} ms in reformats<br>%{{text}} {PCT_LABEL}"
                             "<extra></extra>"),
        go.Bar(name="Other layers", x=runs, y=(df["total_ms"] - df["ms"]).tolist(),
               marker={"color": OTHER_COLOR}),
    ])
    return _titled(fig, "Reformat overhead (label: reformat layers · share of per-layer sum)",
                   "Run", "Time per run (ms, per-layer sum)", barmode="stack")


# --- dashboard charts: runs (core.runs.RUN_COLUMNS), rankings (core.sensitivity.RANK_COLUMNS),
# --- per-layer run tables (core.backends PER_LAYER_COLUMNS) and the inventory ------------------
RUN_PLOT_COLUMNS = ["run_id", "created", "label", "latency_median_ms", "latency_p95_ms", "fp32_median_ms",
                    "reformat_count", "reformat_ms", "reformat_pct", "cosine_mean", "cosine_min", "snr_db",
                    "n_fp32", "n_fp16", "n_int8"]


def run_names(runs: pd.DataFrame) -> list[str]:
    """Chart label of each run: its label and the end of its id (ids are unique, labels not)."""
    return [f"{label} · {rid[-6:]}" for label, rid in zip(runs["label"], runs["run_id"])]


def _runs(runs: pd.DataFrame) -> pd.DataFrame:
    _check(runs, RUN_PLOT_COLUMNS, "runs")
    return runs.sort_values("created", ignore_index=True)


def _is_all_fp16(runs: pd.DataFrame) -> pd.Series:
    return (runs["n_fp32"] == 0) & (runs["n_int8"] == 0)


def plot_run_latency(runs: pd.DataFrame) -> go.Figure:
    """Median latency per run with a whisker up to p95, against the FP32 baseline (measured
    interleaved in every run) and the newest all-FP16 run, if any."""
    df = _runs(runs)
    source = df["latency_source"] if "latency_source" in df.columns else pd.Series("", index=df.index)
    fig = go.Figure(go.Bar(
        x=run_names(df), y=df["latency_median_ms"].tolist(), name="median", marker={"color": "#72B7B2"},
        error_y={"type": "data", "symmetric": False, "array": (df["latency_p95_ms"] - df["latency_median_ms"]).tolist(),
                 "arrayminus": [0] * len(df)},
        customdata=source.tolist(),
        hovertemplate="%{x}<br>median %{y:.3f} ms<br>%{customdata}<extra>whisker: p95</extra>"))
    if len(df):
        fig.add_hline(y=float(df["fp32_median_ms"].median()), line_dash="dash", line_color=PRECISION_COLORS["FP32"],
                      annotation_text="FP32 baseline (median)", annotation_position="top left")
    fp16 = df[_is_all_fp16(df)]
    if len(fp16):
        fig.add_hline(y=float(fp16["latency_median_ms"].iloc[-1]), line_dash="dot",
                      line_color=PRECISION_COLORS["FP16"], annotation_text="all-FP16 run",
                      annotation_position="bottom left")
    sources = sorted(set(source) - {""})
    return _titled(fig, "Latency per run (bar: median, whisker: p95)"
                   + (f"<br><sup>{' / '.join(sources)}</sup>" if sources else ""), "Run", "Latency (ms)")


def plot_run_reformat(runs: pd.DataFrame) -> go.Figure:
    """Reformat overhead per run (count, ms, % of the per-layer sum), via ``plot_reformat_overhead``."""
    df = _runs(runs)
    pct = df["reformat_pct"].astype(float)
    table = pd.DataFrame({"run": run_names(df), "count": df["reformat_count"], "elided": 0,
                          "ms": df["reformat_ms"], "pct": pct,
                          "total_ms": (df["reformat_ms"] / (pct / 100.0)).where(pct > 0, df["reformat_ms"])})
    return plot_reformat_overhead(table[REFORMAT_COLUMNS])


def plot_run_quality(runs: pd.DataFrame) -> go.Figure:
    """Cosine similarity to FP32 (mean and min) per run, with SNR on a second axis."""
    df = _runs(runs)
    names = run_names(df)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for col, color in (("cosine_mean", "#4C78A8"), ("cosine_min", "#9ECAE9")):
        fig.add_trace(go.Bar(x=names, y=df[col].tolist(), name=col.replace("_", " "), marker={"color": color},
                             text=[f"{v:.4f}" for v in df[col]], textposition="outside"), secondary_y=False)
    fig.add_trace(go.Scatter(x=names, y=df["snr_db"].tolist(), name="SNR (dB)", mode="markers+lines",
                             marker={"color": "#E45756"}), secondary_y=True)
    lo = float(df["cosine_min"].min()) if len(df) else 0.9
    fig.update_yaxes(title_text="Cosine similarity to FP32", range=[min(lo, 0.99) - 0.01, 1.005], secondary_y=False)
    fig.update_yaxes(title_text="SNR (dB)", secondary_y=True)
    fig.update_layout(title="Quality per run (held-out data)", xaxis_title="Run", template=TEMPLATE,
                      barmode="group")
    return fig


def plot_quality_vs_latency(runs: pd.DataFrame) -> go.Figure:
    """Every run of the model as a point: median latency against mean cosine (up-left is better)."""
    df = _runs(runs)
    fig = go.Figure(go.Scatter(
        x=df["latency_median_ms"].tolist(), y=df["cosine_mean"].tolist(), mode="markers+text",
        text=run_names(df), textposition="top center",
        customdata=df[["n_fp32", "n_fp16", "n_int8"]].values.tolist(),
        hovertemplate="%{text}<br>%{x:.3f} ms · cosine %{y:.4f}<br>"
                      "fp32 %{customdata[0]} · fp16 %{customdata[1]} · int8 %{customdata[2]}<extra></extra>",
        marker={"size": 12, "color": df["n_int8"].tolist(), "colorscale": "Greens", "showscale": True,
                "colorbar": {"title": "INT8 layers"}, "line": {"width": 1, "color": "#333"}}))
    return _titled(fig, "Quality vs latency (all runs of this model)", "Median latency (ms)",
                   "Cosine similarity to FP32 (mean)")


SIMULATED_FP16 = "FP16 (simulated on CPU)"  # the legend entry of FP16 nodes ORT's CPU provider computes in float32
SIMULATED_NOTE = "FP16 simulated on the CPU (float32 compute, fp16 rounding): its time is not FP16 time"


def simulated_fp16(per_layer: pd.DataFrame, backend: str = "onnxruntime") -> pd.Series:
    """Which nodes of a run's per-layer table are FP16 layers simulated on the CPU: on the ONNX
    Runtime backend, every FP16 compute node whose op has no float16 CPU kernel
    (``core.compile.ORT_CPU_FP16_KERNELS``); precision conversions are not layers."""
    if backend != "onnxruntime":
        return pd.Series(False, index=per_layer.index)
    real = per_layer["op_type"].astype(str).map(lambda op: any(k in op for k in ORT_CPU_FP16_KERNELS))
    reformat = per_layer["is_reformat"].astype(str).str.lower().isin(("true", "1"))
    return (per_layer["precision"].astype(str).str.lower() == "fp16") & ~reformat & ~real


def plot_run_layers(per_layer: pd.DataFrame, top: int = 30, backend: str = "onnxruntime") -> go.Figure:
    """The ``top`` slowest nodes of one run (ms per inference), coloured by their layer's precision.
    FP16 nodes simulated on the CPU (:func:`simulated_fp16`) are their own cross-hatched trace,
    ``SIMULATED_FP16``, and the title says their time is not FP16 time."""
    _check(per_layer, ["name", "op_type", "precision", "ms", "pct", "is_reformat"], "per-layer run")
    df = per_layer.sort_values("ms", ascending=False).head(top).iloc[::-1]
    sim = simulated_fp16(df, backend)
    prec = df["precision"].replace("", "other").str.upper().where(~sim, SIMULATED_FP16)
    fig = go.Figure()
    for p in dict.fromkeys(prec):
        rows = df[prec == p]
        shapes = ["x" if p == SIMULATED_FP16 else "/" if r else "" for r in rows["is_reformat"]]
        fig.add_trace(go.Bar(
            y=rows["name"].tolist(), x=rows["ms"].tolist(), orientation="h", name=p,
            marker={"color": precision_color("FP16" if p == SIMULATED_FP16 else p), "pattern": {"shape": shapes}},
            customdata=rows[["op_type", "pct"]].values.tolist(),
            hovertemplate=f"%{{y}}<br>%{{customdata[0]}} · %{{x:.4f}} ms (%{{customdata[1]:.1f}} {PCT_LABEL})"
                          + ("<br>" + SIMULATED_NOTE if p == SIMULATED_FP16 else "") + f"<extra>{p}</extra>"))
    title = f"Per-layer latency of the run: top {len(df)} nodes (hatched: precision conversions)"
    if sim.any():
        title += f"<br><sup>cross-hatched: {int(sim.sum())} {SIMULATED_NOTE}</sup>"
    return _titled(fig, title, "Mean time per inference (ms)", "", height=max(400, 22 * len(df)),
                   legend_title_text="Precision")


def plot_ranking(ranking: pd.DataFrame, metric: str = "cos_drop", top: int = 20) -> go.Figure:
    """The ``top`` most sensitive layers under ``metric`` as horizontal bars, coloured by precision."""
    _check(ranking, ["name", "op_type", "precision", metric], "ranking")
    df = ranking.sort_values(metric, ascending=metric == "snr_db", kind="stable").head(top).iloc[::-1]
    labels = {"cos_drop": "Cosine drop vs FP32", "added_cos_drop": "Added cosine drop (this layer only)",
              "snr_db": "SNR (dB, lower = more sensitive)", "max_abs": "Max abs error"}
    fig = go.Figure(go.Bar(
        y=df["name"].tolist(), x=df[metric].tolist(), orientation="h",
        marker={"color": [precision_color(p) for p in df["precision"]]},
        customdata=df[["op_type", "precision"]].values.tolist(),
        hovertemplate="%{y}<br>%{customdata[0]} (%{customdata[1]})<br>%{x:.4g}<extra></extra>"))
    return _titled(fig, f"Top {len(df)} most sensitive layers (all eligible layers INT8)",
                   labels.get(metric, metric), "", height=max(400, 24 * len(df)))


def plot_op_types(inventory: pd.DataFrame) -> go.Figure:
    """Layer count and MACs per op type, from ``Project.inventory()``."""
    _check(inventory, ["op_type", "macs"], "inventory")
    g = inventory.groupby("op_type").agg(layers=("op_type", "size"), macs=("macs", "sum"))
    g = g.sort_values("layers", ascending=False)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Layers", "MACs"))
    fig.add_trace(go.Bar(x=g.index.tolist(), y=g["layers"].tolist(), showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=g.index.tolist(), y=g["macs"].tolist(), showlegend=False,
                         marker={"color": PRECISION_COLORS["INT8"]}), row=1, col=2)
    fig.update_layout(title="Layers and MACs by op type", template=TEMPLATE)
    return fig


# --- search: isolated vs cumulative sensitivity (core.sensitivity.COMPARE_COLUMNS), Pareto front
# --- of the evaluated candidates (core.search.CANDIDATE_COLUMNS) -----------------------------
def plot_sensitivity_compare(cumulative_df: pd.DataFrame | None, isolated_df: pd.DataFrame, top_n: int = 20) -> go.Figure:
    """The ``top_n`` layers most harmful on their own (isolated cosine drop, left) next to their
    cosine drop when every eligible layer is INT8 (cumulative, right), on a shared layer axis."""
    _check(isolated_df, ["rank", "name", "op_type", "delta"], "isolated sensitivity")
    df = ranking_comparison(cumulative_df, isolated_df).head(top_n).iloc[::-1]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=("On its own (isolated)", "Cumulative (all eligible INT8)"))
    for col, x, rank, color in ((1, "isolated_delta", "isolated_rank", PRECISION_COLORS["INT8"]),
                                (2, "cos_drop", "cumulative_rank", PRECISION_COLORS["FP32"])):
        fig.add_trace(go.Bar(
            y=df["name"].tolist(), x=df[x].tolist(), orientation="h", name=x.replace("_", " "),
            marker={"color": color}, customdata=df[["op_type", rank]].values.tolist(),
            hovertemplate="%{y}<br>%{customdata[0]} · rank %{customdata[1]}<br>%{x:.4g}<extra></extra>"),
            row=1, col=col)
        fig.update_xaxes(title_text="Cosine drop vs FP32", row=1, col=col)
    fig.update_layout(title=f"Top {len(df)} layers by isolated sensitivity, against their cumulative drop",
                      template=TEMPLATE, showlegend=False, height=max(400, 24 * len(df)))
    return fig


PARETO_COLUMNS = ["candidate", "method", "n_int8", "quality", "est_ms", "int8_mac_share", "est_reformat_pct",
                  "boundaries", "pareto"]


def plot_pareto(candidates_df: pd.DataFrame, chosen: int | None = None, budget=None, basis: str = "") -> go.Figure:
    """Quality against estimated latency of every evaluated candidate; the non-dominated ones
    highlighted and connected, ``chosen`` (a candidate id) starred. ``budget`` (a
    ``core.search.Budget``) names the y axis, draws its threshold and flips the axis when lower
    is better. ``basis`` says what the latency estimate rests on (on the x axis)."""
    _check(candidates_df, PARETO_COLUMNS, "candidates")
    df = candidates_df.sort_values("est_ms")
    front = df["pareto"].astype(bool)
    fig = go.Figure()
    for rows, name, style in ((df[~front], "other candidates", {"mode": "markers", "marker": {"color": OTHER_COLOR}}),
                              (df[front], "Pareto front", {"mode": "lines+markers", "marker": {
                                  "color": PRECISION_COLORS["INT8"], "size": 10}}),
                              (df[df["candidate"] == chosen], "chosen", {"mode": "markers", "marker": {
                                  "color": "#E45756", "size": 18, "symbol": "star"}})):
        if name == "chosen" and rows.empty:
            continue
        fig.add_trace(go.Scatter(
            x=rows["est_ms"].tolist(), y=rows["quality"].tolist(), name=name, **style,
            customdata=rows[["candidate", "n_int8", "int8_mac_share", "est_reformat_pct", "method",
                             "boundaries"]].values.tolist(),
            hovertemplate="candidate %{customdata[0]} · %{customdata[4]} calibration<br>%{x:.3f} ms · %{y:.5f}<br>"
                          "%{customdata[1]} layers INT8 · %{customdata[2]:.0%} of eligible MACs INT8<br>"
                          "reformat %{customdata[3]:.1f}% · %{customdata[5]} INT8/FP16 boundaries<extra></extra>"))
    metric = budget.metric if budget is not None else "quality"
    if budget is not None:
        fig.add_hline(y=budget.value, line_dash="dash", line_color="#E45756", annotation_text=f"budget {budget}")
        if budget.op == "<=":
            fig.update_yaxes(autorange="reversed")
    return _titled(fig, f"Pareto front: {int(front.sum())} of {len(df)} candidates (quality on the dev half)",
                   f"Estimated latency (ms{', ' + basis if basis else ''})", metric, legend_title_text="")
