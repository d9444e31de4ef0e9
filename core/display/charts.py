"""Plotly charts. Each function takes a table (a DataFrame with the fixed columns of the module
that made it) and returns a ``plotly.graph_objects.Figure``: data stays separate from plotting.

User text (layer, node, op type, run and model names, labels) is drawn literally: Plotly reads a
few HTML tags (``<b>``, ``<a href>``, ``<br>``…) and entities in every string it draws, so such text
goes through :func:`plot_text`. A chart of layers keeps each layer's raw name in ``customdata[0]``
(what a selection event should read), whatever it draws on the axis. Every chart has a title, axis
titles with units, a legend where colour carries meaning and axis ranges that fit its data."""
from __future__ import annotations

import html
import math
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.backends.reports import LAYER_COLUMNS, PCT_LABEL, PRECISION_COLUMNS, REFORMAT_COLUMNS, TYPE_COLUMNS
from core.display.tables import LAYER_COMPARE_COLUMNS, local_time, simulated_fp16  # noqa: F401 - charts' name too
from core.errors import MixprecError
from core.estimate.predict import PREDICTION_COLUMNS
from core.sensitivity import ranking_comparison

PRECISION_COLORS = {
    "FP32": "#4C78A8", "FP16": "#F58518", "BF16": "#E45756", "INT8": "#54A24B", "FP8": "#B279A2",
    "INT4": "#72B7B2", "FP4": "#EECA3B",
}
OTHER_COLOR = "#9D9D9D"
RUN_COLORS = ("#4C78A8", "#E45756")  # run A, run B
TEMPLATE = "plotly_white"
_BELOW = {"orientation": "h", "yanchor": "top", "y": -0.3, "x": 0}  # a legend under the x axis, not over a y axis


def precision_color(precision: str) -> str:
    return PRECISION_COLORS.get(str(precision).upper(), OTHER_COLOR)


def plot_text(text) -> str:
    """User text as Plotly draws it literally: ``&``, ``<`` and ``>`` as entities (Plotly turns
    them back into the characters), so ``<b>``, ``<a href=…>`` or ``<br>`` in a name stay text."""
    return html.escape(str(text), quote=False)


def _texts(values) -> list[str]:
    return [plot_text(v) for v in values]


def _check(df: pd.DataFrame, columns: list[str], table: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MixprecError(f"The table to plot is not a {table} table: it lacks columns {missing}",
                           f"pass the {table} table from core.backends.reports")


def _titled(fig: go.Figure, title: str, x: str, y: str, **layout) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template=TEMPLATE, **layout)
    return fig


def fit_range(values, pad: float = 0.1, lo: float | None = None, hi: float | None = None,
              min_span: float = 0.0) -> list[float] | None:
    """An axis range around ``values`` (NaN and None ignored): ``pad`` of the span on each side,
    at least ``min_span`` wide (default: 2 % of the largest value; a single value gets a small
    range around it, not Plotly's ±1),
    clipped to ``[lo, hi]``. None when there is no finite value."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    a, b = min(finite), max(finite)
    span = max(b - a, min_span or abs(b) * 0.02, 1e-9)
    mid = (a + b) / 2
    a, b = min(a, mid - span / 2), max(b, mid + span / 2)
    a, b = a - pad * span, b + pad * span
    return [a if lo is None else max(lo, a), b if hi is None else min(hi, b)]


def robust_range(values, keep=(), k: float = 3.0, pad: float = 0.1) -> tuple[list[float] | None, int]:
    """An axis range that outliers do not stretch, and how many ``values`` fall outside it: the values
    within ``k`` interquartile ranges of the quartiles, and every one of ``keep`` (a threshold, a chosen
    point), ``pad`` of the span around them. With fewer than 4 values, or none far out, it fits them all."""
    finite = np.asarray([float(v) for v in values if v is not None and math.isfinite(float(v))])
    kept = [float(v) for v in keep if v is not None and math.isfinite(float(v))]
    if len(finite) >= 4:
        q1, q3 = np.percentile(finite, [25, 75])
        iqr = q3 - q1
        span = iqr if iqr > 0 else max(abs(float(np.median(finite))) * 0.01, 1e-9)
        inside = finite[(finite >= q1 - k * span) & (finite <= q3 + k * span)]
    else:
        inside = finite
    rng = fit_range([*inside, *kept], pad=pad)
    if rng is None:
        return None, 0
    return rng, int(((finite < rng[0]) | (finite > rng[1])).sum())


_REFORMAT_PREFIX = re.compile(r"^Reformatting CopyNode for (?:Input|Output) Tensor \d+ to ")
_QDQ = ("QuantizeLinear", "DequantizeLinear")
SHORT_NAME = 44  # at most this many characters of a layer's name on an axis (the full name is on hover)


def _tail(name: str, width: int) -> str:
    """The end of a path-like name in at most ``width`` characters: whole segments after "…/", else its ends."""
    if len(name) <= width:
        return name
    segs, out = name.strip("/").split("/"), ""
    for seg in reversed(segs):
        cand = f"{seg}/{out}" if out else seg
        if len(cand) + 2 > width:
            break
        out = cand
    if out:
        return "…/" + out
    half = (width - 1) // 2
    return name[:half] + "…" + name[-(width - 1 - half):]


def short_layer_name(name, nodes=None, width: int = SHORT_NAME) -> str:
    """A layer's name as an axis shows it: a TensorRT fusion (``A + B + C``) as its first compute node (not a
    Q/DQ) and how many more it fuses (``…/dense/MatMul +3``), a reformat as ``reformat → <its layer>``, a long
    path as its last segments (``…/attention/self/query/MatMul``). ``nodes``: the ONNX nodes it runs."""
    name = str(name)
    m = _REFORMAT_PREFIX.match(name)
    if m:
        return "reformat → " + short_layer_name(name[m.end():], None, max(12, width - 11))
    parts = [s for s in name.split(" + ") if s] or [name]
    compute = [s for s in parts if not s.endswith(_QDQ)] or parts
    head = compute[0]
    listed = [str(n) for n in nodes] if isinstance(nodes, (list, tuple)) else []
    if listed and head not in listed:
        head = listed[0]
    more = f" +{len(parts) - 1}" if len(parts) > 1 else ""
    return _tail(head, width - len(more)) + more


def short_layer_names(names, nodes=None) -> list[str]:
    """:func:`short_layer_name` of each name, kept apart: a short name two layers share gets " #2", " #3"…"""
    nodes = list(nodes) if nodes is not None else [None] * len(list(names))
    out, seen = [], {}
    for n, ns in zip(names, nodes):
        s = short_layer_name(n, ns)
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s} #{seen[s]}")
    return out


def _full_name(name, limit: int = 10) -> str:
    """A layer's whole name for a hover, drawn literally: one fused part per line (the first ``limit``)."""
    parts = str(name).split(" + ")
    shown = [plot_text(s) + (" +" if i < len(parts) - 1 else "") for i, s in enumerate(parts[:limit])]
    if len(parts) > limit:
        shown.append(f"… and {len(parts) - limit} more")
    return "<br>".join(shown)


def _sorted_categories(fig: go.Figure, categories: list[str]) -> None:
    """The y axis in the given order (bottom to top), whatever trace each bar is in (Plotly would group them)."""
    fig.update_yaxes(categoryorder="array", categoryarray=list(categories), automargin=True)


def plot_layer_latency(layers_df: pd.DataFrame) -> go.Figure:
    """Mean time per run of each engine layer, in engine order, one bar trace per precision.
    Reformat layers are hatched."""
    _check(layers_df, LAYER_COLUMNS, "layers")
    df = layers_df.reset_index(drop=True)
    fig = go.Figure()
    for precision, rows in df.groupby("precision", sort=False):
        fig.add_trace(go.Bar(
            name=plot_text(precision), x=rows.index.tolist(), y=rows["time_ms"].tolist(),
            marker={"color": precision_color(precision),
                    "pattern": {"shape": ["/" if r else "" for r in rows["is_reformat"]]}},
            customdata=list(zip(rows["name"], _texts(rows["name"]), _texts(rows["layer_type"]), rows["pct"])),
            hovertemplate="%{customdata[1]}<br>%{customdata[2]}<br>%{y:.4f} ms"
                          f" (%{{customdata[3]:.1f}} {PCT_LABEL})<extra>{plot_text(precision)}</extra>"))
    return _titled(fig, "Per-layer latency (hatched: reformat layers)",
                   "Engine layer (execution order)", "Mean time per run (ms)",
                   legend_title_text="Precision")


def plot_latency_by_type(df: pd.DataFrame) -> go.Figure:
    """Time per LayerType, from ``latency_by_type`` (TYPE_COLUMNS)."""
    _check(df, TYPE_COLUMNS, "latency-by-type")
    fig = go.Figure(go.Bar(
        x=_texts(df["layer_type"]), y=df["time_ms"].tolist(),
        text=[f"{n} layers · {p:.1f}%" for n, p in zip(df["layers"], df["pct"])],
        hovertemplate=f"%{{x}}<br>%{{y:.4f}} ms<br>%{{text}} {PCT_LABEL}<extra></extra>"))
    return _titled(fig, "Latency by layer type", "Layer type", "Time per run (ms, sum over layers)")


def plot_precision_distribution(df: pd.DataFrame) -> go.Figure:
    """Layer count and time share per precision, from ``precision_distribution`` (PRECISION_COLUMNS)."""
    _check(df, PRECISION_COLUMNS, "precision-distribution")
    colors = [precision_color(p) for p in df["precision"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Layers", f"Time ({PCT_LABEL})"))
    for col, y, fmt in ((1, "layers", "%{y} layers"), (2, "pct", "%{y:.1f} %")):
        fig.add_trace(go.Bar(x=_texts(df["precision"]), y=df[y].tolist(), name=y,
                             marker={"color": colors}, showlegend=False,
                             hovertemplate=f"%{{x}}: {fmt}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="Precision", row=1, col=col)
    fig.update_yaxes(title_text="Layer count", row=1, col=1)
    fig.update_yaxes(title_text=PCT_LABEL, ticksuffix=" %", row=1, col=2)
    fig.update_layout(title="Precision distribution", template=TEMPLATE)
    return fig


def plot_reformat_overhead(df: pd.DataFrame) -> go.Figure:
    """Reformat time against the rest, per run, from ``reformat_table`` (REFORMAT_COLUMNS)."""
    _check(df, REFORMAT_COLUMNS, "reformat")
    runs = _texts(df["run"])
    fig = go.Figure([
        go.Bar(name="Reformat layers", x=runs, y=df["ms"].tolist(), marker={"color": "#E45756"},
               text=[f"{c} · {p:.1f}%" for c, p in zip(df["count"], df["pct"])],
               hovertemplate=f"%{{x}}: %{{y:.4f}} ms in reformats<br>%{{text}} {PCT_LABEL}"
                             "<extra></extra>"),
        go.Bar(name="Other layers", x=runs, y=(df["total_ms"] - df["ms"]).tolist(),
               marker={"color": OTHER_COLOR}, hovertemplate="%{x}: %{y:.4f} ms in other layers<extra></extra>"),
    ])
    return _titled(fig, "Reformat overhead<br><sup>bar label: reformat layers · share of the per-layer sum</sup>",
                   "Run", "Time per run (ms, per-layer sum)", barmode="stack", legend_title_text="")


# --- dashboard charts: runs (core.measure.runs.RUN_COLUMNS), rankings (core.sensitivity.RANK_COLUMNS),
# --- per-layer run tables (core.backends PER_LAYER_COLUMNS) and the inventory ------------------
RUN_PLOT_COLUMNS = ["run_id", "created", "label", "latency_median_ms", "latency_p95_ms", "fp32_median_ms",
                    "reformat_count", "reformat_ms", "reformat_pct", "cosine_mean", "cosine_min", "snr_db",
                    "n_fp32", "n_fp16", "n_int8"]


def run_names(runs: pd.DataFrame) -> list[str]:
    """Label of each run: its label and the end of its id (ids are unique, labels not). Raw text:
    charts draw it through :func:`plot_text`."""
    return [f"{label} · {rid[-6:]}" for label, rid in zip(runs["label"], runs["run_id"])]


def _runs(runs: pd.DataFrame) -> pd.DataFrame:
    _check(runs, RUN_PLOT_COLUMNS, "runs")
    return runs.sort_values("created", ignore_index=True)


def _run_axis(df: pd.DataFrame) -> list[str]:
    """The run axis of a per-run chart: each run's label and id end, drawn literally."""
    return _texts(run_names(df))


def _is_all_fp16(runs: pd.DataFrame) -> pd.Series:
    return (runs["n_fp32"] == 0) & (runs["n_int8"] == 0)


def plot_run_latency(runs: pd.DataFrame) -> go.Figure:
    """Median latency per run with a whisker up to p95, against the FP32 baseline (measured
    interleaved in every run) and the newest all-FP16 run, if any; each a legend entry."""
    df = _runs(runs)
    source = df["latency_source"] if "latency_source" in df.columns else pd.Series("", index=df.index)
    shapes = pd.Series([v if isinstance(v, str) and v else "shapes not recorded"
                        for v in (df["input_shapes"] if "input_shapes" in df.columns else [""] * len(df))],
                       index=df.index)
    x = _run_axis(df)
    fig = go.Figure(go.Bar(
        x=x, y=df["latency_median_ms"].tolist(), name="median (whisker: p95)", marker={"color": "#72B7B2"},
        error_y={"type": "data", "symmetric": False, "array": (df["latency_p95_ms"] - df["latency_median_ms"]).tolist(),
                 "arrayminus": [0] * len(df)},
        customdata=list(zip(df["latency_p95_ms"], _texts(source), df["created"].map(local_time), _texts(shapes))),
        hovertemplate="%{x}<br>median %{y:.3f} ms · p95 %{customdata[0]:.3f} ms<br>%{customdata[1]}"
                      "<br>for %{customdata[3]} · built %{customdata[2]}<extra></extra>"))
    lines = []
    if len(df):
        lines.append(("FP32 baseline", float(df["fp32_median_ms"].median()), "dash", PRECISION_COLORS["FP32"]))
    fp16 = df[_is_all_fp16(df)]
    if len(fp16):
        lines.append(("newest all-FP16 run", float(fp16["latency_median_ms"].iloc[-1]), "dot",
                      PRECISION_COLORS["FP16"]))
    for name, y, dash, color in lines:  # across the whole chart, and an entry of the legend (an hline has none)
        fig.add_hline(y=y, line_dash=dash, line_color=color)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{name}: {y:.3f} ms",
                                 line={"dash": dash, "color": color}, hoverinfo="skip"))
    sources = sorted(set(source) - {""})
    y_range = fit_range([*df["latency_p95_ms"], *df["latency_median_ms"], *(y for _, y, _, _ in lines)], pad=0.08)
    if y_range:  # bars start at 0; room above the highest whisker and line
        fig.update_yaxes(range=[0, max(y_range[1], 1e-6)])
    notes = [" / ".join(sources)] if sources else []
    if shapes.nunique() > 1:  # runs at other shapes: their latencies are not comparable, and the chart says so
        notes.append("runs at other shapes: " + ", ".join(dict.fromkeys(shapes)))
    return _titled(fig, "Latency per run (bar: median, whisker: p95)"
                   + (f"<br><sup>{plot_text(' · '.join(notes))}</sup>" if notes else ""), "Run", "Latency (ms)",
                   legend_title_text="", legend=_BELOW)


def plot_run_reformat(runs: pd.DataFrame) -> go.Figure:
    """Reformat overhead per run (count, ms, % of the per-layer sum), via ``plot_reformat_overhead``."""
    df = _runs(runs)
    pct = df["reformat_pct"].astype(float)
    table = pd.DataFrame({"run": run_names(df), "count": df["reformat_count"], "elided": 0,
                          "ms": df["reformat_ms"], "pct": pct,
                          "total_ms": (df["reformat_ms"] / (pct / 100.0)).where(pct > 0, df["reformat_ms"])})
    return plot_reformat_overhead(table[REFORMAT_COLUMNS])


def plot_run_quality(runs: pd.DataFrame) -> go.Figure:
    """Cosine similarity to FP32 (mean and min) per run, with SNR (dB) on a second axis; both
    axes fit the data (cosine never above 1)."""
    df = _runs(runs)
    names = _run_axis(df)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for col, color in (("cosine_mean", "#4C78A8"), ("cosine_min", "#9ECAE9")):
        fig.add_trace(go.Bar(x=names, y=df[col].tolist(), name=col.replace("_", " "), marker={"color": color},
                             text=[f"{v:.4f}" for v in df[col]], textposition="outside",
                             hovertemplate=f"%{{x}}<br>{col.replace('_', ' ')} %{{y:.4f}}<extra></extra>"),
                      secondary_y=False)
    snr = pd.to_numeric(df["snr_db"], errors="coerce")
    fig.add_trace(go.Scatter(x=names, y=snr.tolist(), name="SNR (dB)", mode="markers+lines",
                             marker={"color": "#E45756"}, hovertemplate="%{x}<br>SNR %{y:.1f} dB<extra></extra>"),
                  secondary_y=True)
    cos = [*df["cosine_mean"], *df["cosine_min"]]
    lo = min((float(v) for v in cos if v == v), default=0.99)
    # bars start at the axis bottom: room below the lowest bar, and above 1 for the value labels
    fig.update_yaxes(title_text="Cosine similarity to FP32", tickformat=".3f",
                     range=[max(0.0, min(lo, 0.999) - max(0.005, 0.15 * (1 - lo))), 1 + max(0.002, 0.1 * (1 - lo))],
                     secondary_y=False)
    fig.update_yaxes(title_text="SNR (dB)", tickformat=".1f", ticksuffix=" dB", range=fit_range(snr, 0.15, min_span=2),
                     showgrid=False, secondary_y=True)
    fig.update_layout(title="Quality per run (held-out data)", xaxis_title="Run", template=TEMPLATE,
                      barmode="group", legend_title_text="", legend=_BELOW)
    return fig


MAX_POINT_LABELS = 8  # more runs than this: a point's run is named on hover only


def plot_quality_vs_latency(runs: pd.DataFrame) -> go.Figure:
    """Every run of the model as a point: median latency against mean cosine (up-left is better).
    The axes fit the points (cosine up to 1 at most); the colour is the number of INT8 layers, on
    a scale from 0 that says so. Up to MAX_POINT_LABELS runs are labelled, neighbours in latency above and
    below their points in turn; more are named on hover only."""
    df = _runs(runs)
    names = _run_axis(df)
    n_int8 = df["n_int8"].astype(int)
    labelled = len(df) <= MAX_POINT_LABELS
    # neighbours in latency take turns above and below their points, so two close runs' labels do not overlap
    turn = pd.Series(range(len(df)), index=df.sort_values("latency_median_ms", kind="stable").index) % 2
    fig = go.Figure(go.Scatter(
        x=df["latency_median_ms"].tolist(), y=df["cosine_mean"].tolist(), mode="markers+text" if labelled else "markers",
        text=names if labelled else None, name="runs", cliponaxis=False,
        textposition=["top center" if turn[i] == 0 else "bottom center" for i in df.index] if labelled else None,
        customdata=[[*r, n] for r, n in zip(df[["n_fp32", "n_fp16", "n_int8"]].values.tolist(), names)],
        hovertemplate="%{customdata[3]}<br>%{x:.3f} ms · cosine %{y:.4f}<br>"
                      "fp32 %{customdata[0]} · fp16 %{customdata[1]} · int8 %{customdata[2]} layers<extra></extra>",
        marker={"size": 12, "color": n_int8.tolist(), "colorscale": "Greens", "showscale": True,
                "cmin": 0, "cmax": max(1, int(n_int8.max()) if len(df) else 1),
                "colorbar": {"title": {"text": "INT8 layers"}, "tickformat": "d"},
                "line": {"width": 1, "color": "#333"}}))
    x_range = fit_range(df["latency_median_ms"], pad=0.3, lo=0)  # room for the labels beside the points
    y_range = fit_range(df["cosine_mean"], pad=0.25, min_span=0.01)
    if y_range:
        y_range[1] = min(y_range[1], 1 + 0.25 * (y_range[1] - y_range[0]))  # room for the text, not to 1.5
    fig.update_xaxes(range=x_range)
    fig.update_yaxes(range=y_range, tickformat=".4f")
    return _titled(fig, "Quality vs latency (all runs of this model)"
                   + ("" if labelled else f"<br><sup>{len(df)} runs: hover a point for its run</sup>"),
                   "Median latency (ms)", "Cosine similarity to FP32 (mean)")


SIMULATED_FP16 = "FP16 (simulated on CPU)"  # the legend entry of FP16 nodes ORT's CPU provider computes in float32
SIMULATED_NOTE = "FP16 simulated on the CPU (float32 compute, fp16 rounding): its time is not FP16 time"


def plot_run_layers(per_layer: pd.DataFrame, top: int = 30, backend: str = "onnxruntime", context: str = "") -> go.Figure:
    """The ``top`` slowest nodes of one run (ms per inference), slowest on top whatever its precision,
    coloured by their layer's precision.
    FP16 nodes simulated on the CPU (:func:`simulated_fp16`) are their own cross-hatched trace,
    ``SIMULATED_FP16``, and the title says their time is not FP16 time; ``context`` (the run's shapes, policy
    and what measured it) is said under the title. ``customdata[0]`` is the
    node's name as it is, ``customdata[1]`` its policy layer."""
    _check(per_layer, ["name", "op_type", "precision", "ms", "pct", "is_reformat"], "per-layer run")
    df = per_layer.sort_values("ms", ascending=False).head(top).iloc[::-1]
    sim = simulated_fp16(df, backend)
    prec = df["precision"].replace("", "other").str.upper().where(~sim, SIMULATED_FP16)
    layer = df["layer"] if "layer" in df.columns else df["name"]
    fig = go.Figure()
    for p in dict.fromkeys(prec):
        rows, lay = df[prec == p], layer[prec == p]
        shapes = ["x" if p == SIMULATED_FP16 else "/" if r else "" for r in rows["is_reformat"]]
        fig.add_trace(go.Bar(
            y=_texts(rows["name"]), x=rows["ms"].tolist(), orientation="h", name=plot_text(p),
            marker={"color": precision_color("FP16" if p == SIMULATED_FP16 else p), "pattern": {"shape": shapes}},
            customdata=list(zip(rows["name"], lay.astype(str), _texts(rows["op_type"]), rows["pct"])),
            hovertemplate=f"%{{y}}<br>%{{customdata[2]}} · %{{x:.4f}} ms (%{{customdata[3]:.1f}} {PCT_LABEL})"
                          + ("<br>" + SIMULATED_NOTE if p == SIMULATED_FP16 else "")
                          + f"<extra>{plot_text(p)}</extra>"))
    _sorted_categories(fig, _texts(df["name"]))
    title = f"Per-layer latency of the run: top {len(df)} nodes, slowest on top (hatched: precision conversions)"
    notes = ([plot_text(context)] if context else []) + \
        ([f"cross-hatched: {int(sim.sum())} {SIMULATED_NOTE}"] if sim.any() else [])
    if notes:
        title += "<br><sup>" + "<br>".join(notes) + "</sup>"
    return _titled(fig, title, "Mean time per inference (ms)", "", height=max(400, 22 * len(df) + 20 * len(notes)),
                   legend_title_text="Precision", margin={"t": 90 + 20 * len(notes)})


RANK_LABELS = {"cos_drop": "Cosine drop vs FP32", "added_cos_drop": "Added cosine drop (this layer only)",
               "snr_db": "SNR (dB, lower = more sensitive)", "max_abs": "Max abs error"}


def plot_ranking(ranking: pd.DataFrame, metric: str = "cos_drop", top: int = 20) -> go.Figure:
    """The ``top`` most sensitive layers under ``metric`` as horizontal bars, one trace per
    precision of the ranking's candidate (the legend says which colour is which).
    ``customdata[0]`` is each layer's name as it is."""
    _check(ranking, ["name", "op_type", "precision", metric], "ranking")
    df = ranking.sort_values(metric, ascending=metric == "snr_db", kind="stable").head(top).iloc[::-1]
    fig = go.Figure()
    unit = " dB" if metric == "snr_db" else ""
    for precision in dict.fromkeys(df["precision"]):
        rows = df[df["precision"] == precision]
        fig.add_trace(go.Bar(
            y=_texts(rows["name"]), x=rows[metric].tolist(), orientation="h", name=plot_text(str(precision).upper()),
            marker={"color": precision_color(precision)},
            customdata=list(zip(rows["name"], _texts(rows["op_type"]))),
            hovertemplate=f"%{{y}}<br>%{{customdata[1]}}<br>{RANK_LABELS.get(metric, metric)}: %{{x:.4g}}{unit}"
                          f"<extra>{plot_text(str(precision).upper())}</extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=_texts(df["name"]))  # the ranking's order, not per trace
    return _titled(fig, f"Top {len(df)} most sensitive layers (cumulative: all eligible layers INT8)",
                   RANK_LABELS.get(metric, metric), "", height=max(400, 24 * len(df)),
                   legend_title_text="Precision in the ranking")


def plot_op_types(inventory: pd.DataFrame) -> go.Figure:
    """Layer count and MACs per op type, from ``Project.inventory()``."""
    _check(inventory, ["op_type", "macs"], "inventory")
    g = inventory.groupby("op_type").agg(layers=("op_type", "size"), macs=("macs", "sum"))
    g = g.sort_values("layers", ascending=False)
    ops = _texts(g.index)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Layers", "MACs"))
    fig.add_trace(go.Bar(x=ops, y=g["layers"].tolist(), showlegend=False,
                         hovertemplate="%{x}: %{y} layers<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=ops, y=g["macs"].tolist(), showlegend=False, marker={"color": PRECISION_COLORS["INT8"]},
                         hovertemplate="%{x}: %{y:.3s} MACs<extra></extra>"), row=1, col=2)
    fig.update_yaxes(title_text="Layer count", row=1, col=1)
    fig.update_yaxes(title_text="MACs per inference", tickformat="~s", row=1, col=2)
    fig.update_xaxes(title_text="Op type")
    fig.update_layout(title="Layers and MACs by op type", template=TEMPLATE)
    return fig


# --- search: isolated vs cumulative sensitivity (core.sensitivity.COMPARE_COLUMNS), Pareto front
# --- of the evaluated candidates (core.search.CANDIDATE_COLUMNS) -----------------------------
def plot_sensitivity_compare(cumulative_df: pd.DataFrame | None, isolated_df: pd.DataFrame, top_n: int = 20) -> go.Figure:
    """The ``top_n`` layers most harmful on their own (isolated cosine drop, left) next to their
    cosine drop when every eligible layer is INT8 (cumulative, right), on a shared layer axis.
    ``customdata[0]`` is each layer's name as it is."""
    _check(isolated_df, ["rank", "name", "op_type", "delta"], "isolated sensitivity")
    df = ranking_comparison(cumulative_df, isolated_df).head(top_n).iloc[::-1]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=("On its own (isolated)", "Cumulative (all eligible INT8)"))
    names = _texts(df["name"])
    for col, x, rank, color, label in (
            (1, "isolated_delta", "isolated_rank", PRECISION_COLORS["INT8"], "isolated: only this layer INT8"),
            (2, "cos_drop", "cumulative_rank", PRECISION_COLORS["FP32"], "cumulative: every eligible layer INT8")):
        fig.add_trace(go.Bar(
            y=names, x=df[x].tolist(), orientation="h", name=label,
            marker={"color": color}, customdata=list(zip(df["name"], _texts(df["op_type"]), df[rank])),
            hovertemplate="%{y}<br>%{customdata[1]} · rank %{customdata[2]}<br>cosine drop %{x:.4g}"
                          f"<extra>{label}</extra>"),
            row=1, col=col)
        fig.update_xaxes(title_text="Cosine drop vs FP32", row=1, col=col)
    # the legend under both x axes' ticks and titles (about 60 px under the plot), in pixels of the plot area: a
    # fraction of the figure would sit on the ticks of a short chart and far below a tall one
    top, below, legend_px = 80, 80, 50
    plot_h = max(250, 24 * len(df))
    fig.update_layout(title=f"Top {len(df)} layers by isolated sensitivity, against their cumulative drop",
                      template=TEMPLATE, height=plot_h + top + below + legend_px, legend_title_text="",
                      margin={"t": top, "b": below + legend_px},
                      legend={"orientation": "h", "yanchor": "top", "y": -below / plot_h, "x": 0})
    return fig


PARETO_COLUMNS = ["candidate", "method", "n_int8", "quality", "est_ms", "int8_mac_share", "est_reformat_pct",
                  "boundaries", "pareto"]


def _meets(budget, quality: pd.Series) -> pd.Series:
    """Which qualities meet ``budget`` (a ``core.search.Budget``: ``metric op value``)."""
    q = pd.to_numeric(quality, errors="coerce")
    return q <= budget.value if budget.op == "<=" else q >= budget.value


def _band_error(rows: pd.DataFrame) -> dict | None:
    """Error bars from ``est_low_ms``/``est_high_ms`` (a TensorRT estimate's band), or None without a band."""
    if not {"est_low_ms", "est_high_ms"} <= set(rows.columns) or rows.empty:
        return None
    x = rows["est_ms"].astype(float)
    lo, hi = pd.to_numeric(rows["est_low_ms"], errors="coerce"), pd.to_numeric(rows["est_high_ms"], errors="coerce")
    if not (lo.notna() & hi.notna()).any():
        return None
    return {"type": "data", "symmetric": False, "array": (hi - x).fillna(0.0).clip(lower=0.0).tolist(),
            "arrayminus": (x - lo).fillna(0.0).clip(lower=0.0).tolist(), "thickness": 1.2, "width": 3}


def plot_pareto(candidates_df: pd.DataFrame, chosen: int | None = None, budget=None, basis: str = "") -> go.Figure:
    """Quality against estimated latency of every evaluated candidate; the non-dominated ones
    highlighted and connected, ``chosen`` (a candidate id) starred. ``budget`` (a
    ``core.search.Budget``) names the y axis, draws its threshold, marks the candidates that fail
    it (an open ✕, "fails the budget" in the hover; the search's own verdict, ``meets_budget``, when the table
    has it: one legend entry) and flips the axis when lower is better. The y axis fits the candidates
    without their outliers (:func:`robust_range`; the budget and the chosen point always inside), and the title
    says how many it leaves out.
    ``basis`` says what the latency estimate rests on (on the x axis). With a TensorRT estimate's band
    (``est_low_ms``/``est_high_ms``), the front and the chosen point carry it as horizontal error bars."""
    _check(candidates_df, PARETO_COLUMNS, "candidates")
    df = candidates_df.sort_values("est_ms")
    front = df["pareto"].astype(bool)
    if budget is None:
        fails = pd.Series(False, index=df.index)
    elif "meets_budget" in df.columns:
        fails = ~df["meets_budget"].astype(str).str.lower().isin(("true", "1"))
    else:
        fails = ~_meets(budget, df["quality"])
    fig = go.Figure()
    for rows, name, style in ((df[~front], "other candidates", {"mode": "markers", "marker": {"color": OTHER_COLOR}}),
                              (df[front], "Pareto front", {"mode": "lines+markers", "marker": {
                                  "color": PRECISION_COLORS["INT8"], "size": 10}}),
                              (df[fails], "fails the budget", {"mode": "markers", "marker": {
                                  "color": "#E45756", "size": 12, "symbol": "x-thin-open",
                                  "line": {"width": 2, "color": "#E45756"}}}),
                              (df[df["candidate"] == chosen], "chosen", {"mode": "markers", "marker": {
                                  "color": "#E45756", "size": 18, "symbol": "star"}})):
        if name in ("chosen", "fails the budget") and rows.empty:
            continue
        verdict = ["fails the budget" if f else ("meets the budget" if budget is not None else "")
                   for f in fails[rows.index]]
        band = _band_error(rows) if name in ("Pareto front", "chosen") else None
        fig.add_trace(go.Scatter(
            x=rows["est_ms"].tolist(), y=rows["quality"].tolist(), name=name, **style,
            **({"error_x": band} if band else {}),
            customdata=[[*r, v] for r, v in zip(rows[["candidate", "n_int8", "int8_mac_share", "est_reformat_pct",
                                                      "method", "boundaries"]].values.tolist(), verdict)],
            hovertemplate="candidate %{customdata[0]} · %{customdata[4]} calibration<br>%{x:.3f} ms · %{y:.5f} "
                          "%{customdata[6]}<br>"
                          "%{customdata[1]} layers INT8 · %{customdata[2]:.0%} of eligible MACs INT8<br>"
                          "reformat %{customdata[3]:.1f}% · %{customdata[5]} INT8/FP16 boundaries<extra></extra>"))
    metric = budget.metric if budget is not None else "quality"
    xs = df["est_ms"].astype(float)
    if len(xs) and xs.max() - xs.min() <= 1e-12 * max(abs(xs.max()), 1.0):
        x = float(xs.iloc[0])  # one distinct latency: a range around it, not Plotly's -0.5..1 default
        fig.update_xaxes(range=[max(0.0, x * 0.8), x * 1.2] if x > 0 else [x - 1, x + 1])
    keep = [budget.value] if budget is not None else []
    keep += pd.to_numeric(df.loc[df["candidate"] == chosen, "quality"], errors="coerce").tolist()
    y_range, outside = robust_range(pd.to_numeric(df["quality"], errors="coerce"), keep)
    if budget is not None:
        fig.add_hline(y=budget.value, line_dash="dash", line_color="#E45756",
                      annotation_text=plot_text(f"budget {budget}"))
    if y_range is not None:  # lower is better: the axis is reversed (the better candidates on top)
        fig.update_yaxes(range=y_range[::-1] if budget is not None and budget.op == "<=" else y_range)
    title = f"Pareto front: {int(front.sum())} of {len(df)} candidates (quality on the dev half)"
    if outside:
        title += (f"<br><sup>{outside} candidate{'s' if outside > 1 else ''} outside the y range, far from the "
                  "others (autoscale shows them)</sup>")
    return _titled(fig, title, f"Estimated latency (ms{', ' + plot_text(basis) if basis else ''})",
                   plot_text(metric), legend_title_text="")


# --- two runs, layer by layer (core.display.tables.LAYER_COMPARE_COLUMNS) ---------------------------------
def plot_layer_comparison(df: pd.DataFrame, label_a: str = "A", label_b: str = "B", top: int = 30) -> go.Figure:
    """Run A against run B per policy layer, from ``core.display.tables.layer_comparison``: the ``top``
    slowest layers (in either run); left, each layer's time in A and in B (grouped bars, one
    colour per run); right, its precision in A and in B (one marker colour per precision, a
    diamond where it changed; its axis says A and B, the legend which run each is). ``customdata[0]``
    is each layer's name as it is."""
    _check(df, LAYER_COMPARE_COLUMNS, "layer comparison")
    rows = df.head(top).iloc[::-1]
    names = _texts(rows["layer"])
    a, b = plot_text(label_a), plot_text(label_b)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.78, 0.22], horizontal_spacing=0.02,
                        subplot_titles=("Time per inference (ms)", "Precision"))
    simulated = {k: (rows[k].astype(bool) if k in rows.columns else pd.Series(False, index=rows.index))
                 for k in ("simulated_a", "simulated_b")}
    for rank, run, color, ms, prec, sim in ((2, b, RUN_COLORS[1], "ms_b", "precision_b", "simulated_b"),  # B first:
                                            (1, a, RUN_COLORS[0], "ms_a", "precision_a", "simulated_a")):  # A on top
        fig.add_trace(go.Bar(
            y=names, x=rows[ms].tolist(), orientation="h", name=run, legendgroup="runs",
            marker={"color": color, "pattern": {"shape": ["x" if v else "" for v in simulated[sim]]}},
            legendgrouptitle_text="Run", legendrank=rank,
            customdata=list(zip(rows["layer"], _texts(rows["op_type"]), rows[prec].str.upper(), rows["delta_ms"])),
            hovertemplate=f"%{{y}}<br>%{{customdata[1]}} · {run}: %{{x:.4f}} ms at %{{customdata[2]}}"
                          "<br>B − A: %{customdata[3]:+.4f} ms<extra></extra>"), row=1, col=1)
    marks = pd.concat([pd.DataFrame({"layer": rows["layer"], "run": short, "label": run,
                                     "precision": rows[prec].astype(str), "changed": rows["changed"].astype(bool)})
                       for short, run, prec in (("A", a, "precision_a"), ("B", b, "precision_b"))], ignore_index=True)
    order = [k.lower() for k in PRECISION_COLORS]
    precisions = sorted(dict.fromkeys(marks["precision"]), key=lambda q: order.index(q) if q in order else len(order))
    for precision in precisions:  # one legend entry (a square) per precision, FP32 → FP16 → INT8 → …
        sel = marks[marks["precision"] == precision]
        label = plot_text(precision.upper() or "not in the run (fused or removed)")
        fig.add_trace(go.Scatter(
            y=_texts(sel["layer"]), x=sel["run"].tolist(), mode="markers", name=label, legendgroup=f"p:{label}",
            showlegend=False, marker={"color": precision_color(precision), "size": 11,
                                      "symbol": ["diamond" if c else "square" for c in sel["changed"]]},
            customdata=list(zip(sel["layer"], ["changed" if c else "same in A and B" for c in sel["changed"]],
                                sel["label"])),
            hovertemplate=f"%{{y}}<br>%{{customdata[2]}}: {label} (%{{customdata[1]}})<extra></extra>"), row=1, col=2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, legendgroup=f"p:{label}",
                                 legendgrouptitle_text="Precision" if precision == precisions[0] else None,
                                 legendrank=10, marker={"color": precision_color(precision), "size": 11,
                                                        "symbol": "square"}, hoverinfo="skip"), row=1, col=2)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="precision changed", legendrank=20,
                             marker={"color": OTHER_COLOR, "size": 11, "symbol": "diamond"}, hoverinfo="skip"),
                  row=1, col=2)
    n_sim = int(simulated["simulated_a"].sum() + simulated["simulated_b"].sum())
    if n_sim:  # the single-run chart's cross-hatch, and its legend entry
        fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", name=SIMULATED_FP16, legendrank=30,
                             marker={"color": "white", "line": {"color": "#333", "width": 1},
                                     "pattern": {"shape": "x", "fgcolor": "#333"}}, hoverinfo="skip"), row=1, col=1)
    fig.update_xaxes(title_text="ms", row=1, col=1)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=["A", "B"], title_text="run",
                     row=1, col=2)
    changed = int(df["changed"].sum())
    sim_note = f"<br>cross-hatched: {n_sim} bar(s) of {SIMULATED_NOTE}" if n_sim else ""
    return _titled(fig, f"Per layer, A against B: top {len(rows)} layers by time"
                   f"<br><sup>{changed} layer(s) change precision (diamonds); a layer's time includes its "
                   f"precision conversions{sim_note}</sup>", "", "", barmode="group", height=max(420, 30 * len(rows) + 30),
                   margin={"t": 135 if n_sim else 100})  # room for the title's third line above the subplot titles


ESTIMATE_NOTE = "estimate, not measured"


def plot_estimate_layers(layers: pd.DataFrame, gpu_name: str = "", basis: str = "", top: int = 30,
                         context: str = "") -> go.Figure:
    """The ``top`` slowest engine layers of a TensorRT estimate (``core.estimate.predict``'s
    PREDICTION_COLUMNS table), estimated ms each, slowest on top whatever its precision (one trace per
    precision); predicted reformat layers hatched, and on top one bar of every predicted reformat summed, so
    the overhead shows even when each is small. The axis names a layer short (:func:`short_layer_name`), the
    hover by its whole name. The title says it is an estimate, on which GPU, on what basis, and ``context``
    (the shapes and policy it is for). ``customdata[0]`` is the engine layer's name as it is,
    ``customdata[1]`` its ONNX nodes, ``customdata[4]`` its whole name as drawn on hover."""
    _check(layers, PREDICTION_COLUMNS, "TensorRT estimate")
    df = layers.sort_values("est_ms", ascending=False, kind="stable").head(top).iloc[::-1]
    total = float(layers["est_ms"].sum())
    reformat = layers["is_reformat"].astype(str).str.lower().isin(("true", "1"))
    ref_ms, n_ref = float(layers.loc[reformat, "est_ms"].sum()), int(reformat.sum())
    short = pd.Series(_texts(short_layer_names(df["engine_layer"], df["onnx_nodes"])), index=df.index)
    fig = go.Figure()
    prec = df["precision"].astype(str).replace("", "other").str.upper()
    for p in dict.fromkeys(prec):
        rows = df[prec == p]
        nodes = [", ".join(map(str, n)) if isinstance(n, (list, tuple)) else str(n) for n in rows["onnx_nodes"]]
        pct = [100.0 * v / total if total > 0 else 0.0 for v in rows["est_ms"]]
        hatched = rows["is_reformat"].astype(str).str.lower().isin(("true", "1"))
        fig.add_trace(go.Bar(
            y=short[rows.index].tolist(), x=rows["est_ms"].tolist(), orientation="h", name=plot_text(p),
            marker={"color": precision_color(p), "pattern": {"shape": ["/" if r else "" for r in hatched]}},
            customdata=list(zip(rows["engine_layer"], nodes, _texts(rows["layer_class"]), pct,
                                [_full_name(n) for n in rows["engine_layer"]])),
            hovertemplate=f"%{{customdata[4]}}<br>%{{customdata[2]}} · %{{x:.4f}} ms estimated (%{{customdata[3]:.1f}} "
                          f"% of the estimate)<extra>{plot_text(p)}</extra>"))
    categories = short.tolist()
    ref_pct = 100.0 * ref_ms / total if total > 0 else 0.0
    if n_ref:
        label = f"all {n_ref} predicted reformats (sum)"
        fig.add_trace(go.Bar(
            y=[label], x=[ref_ms], orientation="h", name=f"all {n_ref} predicted reformats, summed",
            marker={"color": OTHER_COLOR, "pattern": {"shape": "/"}}, customdata=[["", "", "reformat", ref_pct, label]],
            hovertemplate=f"%{{customdata[4]}}<br>{n_ref} precision/format conversions TensorRT would insert: "
                          "%{x:.4f} ms estimated "
                          f"({ref_pct:.1f} % of the estimate)<extra></extra>"))
        categories.append(label)
    _sorted_categories(fig, categories)
    on = f" on {plot_text(gpu_name)}" if gpu_name else ""
    overhead = (f"reformats {ref_ms:.3g} ms ({ref_pct:.1f} %) in {n_ref} layers" if n_ref
                else "no predicted reformats")
    title = (f"Estimated TensorRT time per engine layer{on}<br><sup>top {len(df)} of {len(layers)}, slowest on top; "
             f"hatched: predicted reformats ({overhead})<br>{ESTIMATE_NOTE}"
             + (f"; {plot_text(context)}" if context else "")
             + (f"<br>basis: {plot_text(basis)}" if basis else "") + "</sup>")
    x_range = fit_range([*df["est_ms"], ref_ms], lo=0.0)
    return _titled(fig, title, "Estimated time per inference (ms)", "", height=max(400, 24 * len(categories) + 230),
                   margin={"t": 130}, legend_title_text="Precision",
                   xaxis_range=[0.0, x_range[1]] if x_range else None)  # bars start at 0
