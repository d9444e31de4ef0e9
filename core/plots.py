"""Plotly charts. Each function takes a table (a DataFrame with the fixed columns of the module
that made it) and returns a ``plotly.graph_objects.Figure``: data stays separate from plotting."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .errors import MixprecError
from .reports import LAYER_COLUMNS, PCT_LABEL, PRECISION_COLUMNS, REFORMAT_COLUMNS, TYPE_COLUMNS

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
