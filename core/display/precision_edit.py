"""Precision editing on the dashboard's Precision and Build pages: a sensitivity ranking turned into
per-layer scores (the one the user picks: cumulative, isolated or leave-one-out) and its top-k, one
filter over the layers (op types, a name, a pattern, precisions), the layers a Plotly chart selection
names, setting precisions, the per-layer precision table, summaries, diffs between policies, a run's
time per policy layer, and the two selectable charts (scores, per-layer latency) whose bars carry
their layer's name. Pure functions over core objects and tables, testable without Streamlit."""
from __future__ import annotations

import html
import re

import pandas as pd
import plotly.graph_objects as go

from core.display.charts import TEMPLATE, precision_color
from core.errors import MixprecError
from core.measure.runs import int8_mac_fraction
from core.model.inventory import PRECISIONS, Layer, can_be_int8
from core.project import Project
from core.quant.policy import Policy

RANKING_MODES = ("isolated", "cumulative", "leave-one-out")
RANKING_LABELS = {
    "isolated": "isolated: the cosine drop with only this layer INT8",
    "cumulative": "cumulative (Polygraphy): the cosine drop at this layer with every eligible layer INT8",
    "leave-one-out": "leave-one-out: the cosine gain when only this layer leaves INT8",
}
SCORE_COLUMNS = ["name", "op_type", "score"]
LATENCY_COLUMNS = ["name", "op_type", "built", "ms", "conversion_ms"]
EDITOR_COLUMNS = ["name", "op_type", "macs", "sensitivity", "eligible", "precision"]
DIFF_COLUMNS = ["name", "op_type", "built", "now"]


def ranked_layers(table: pd.DataFrame | None, mode: str) -> pd.DataFrame:
    """The INT8-eligible layers of a stored ranking table, most sensitive first, with their
    ``score`` (SCORE_COLUMNS): the cumulative ranking's ``cos_drop`` (RANK_COLUMNS), or an
    isolated / leave-one-out table's ``delta`` in its rank order (SENSITIVITY_COLUMNS)."""
    if mode not in RANKING_MODES:
        raise ValueError(f"unknown ranking mode {mode!r}")
    if table is None or table.empty:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    if mode == "cumulative":
        df = table[table["eligible"].astype(bool)].sort_values("cos_drop", ascending=False, kind="stable")
        score = df["cos_drop"]
    else:
        df = table.sort_values("rank", kind="stable")
        score = df["delta"]
    return pd.DataFrame({"name": df["name"].astype(str), "op_type": df["op_type"].astype(str),
                         "score": pd.to_numeric(score, errors="coerce")}).reset_index(drop=True)


def top_k(ranked: pd.DataFrame, k: int) -> list[str]:
    """The ``k`` most sensitive layers of :func:`ranked_layers` (fewer if it has fewer)."""
    return ranked["name"].head(max(0, int(k))).tolist()


def filter_table(table: pd.DataFrame, op_types=(), name: str = "", precisions=(),
                 regex: str | None = None) -> pd.DataFrame:
    """The one filter over layers: rows of a table with ``name`` and ``op_type`` columns (and
    ``precision`` when ``precisions`` are given) whose op type and precision are among those given
    (all when none), whose name contains ``name`` (case ignored, plain text) and matches ``regex``
    (``re.search``, case kept; a bad pattern is a MixprecError)."""
    pattern = _pattern(regex) if regex else None
    keep = pd.Series(True, index=table.index)
    if op_types:
        keep &= table["op_type"].isin(list(op_types))
    if precisions:
        keep &= table["precision"].isin(list(precisions))
    if name:
        keep &= table["name"].astype(str).str.contains(re.escape(name), case=False, regex=True)
    if pattern is not None:
        keep &= table["name"].astype(str).map(lambda n: pattern.search(n) is not None).astype(bool)
    return table[keep]


def select_layers(layers: list[Layer], op_types=None, regex: str | None = None) -> list[str]:
    """Names of the layers whose op type is in ``op_types`` (if given) and whose name matches
    ``regex`` (``re.search``, if given): :func:`filter_table` over the layers."""
    table = pd.DataFrame({"name": [l.name for l in layers], "op_type": [l.op_type for l in layers]}, dtype=object)
    return filter_table(table, op_types or (), regex=regex)["name"].tolist()


def _pattern(regex: str) -> re.Pattern:
    try:
        return re.compile(regex)
    except re.error as e:
        raise MixprecError(f"the name pattern {regex!r} is not a valid regular expression ({e})",
                           "escape special characters, e.g. layer\\.5/output") from e


def names_from_points(points, known) -> list[str]:
    """The layer names a Plotly selection (``event.selection.points``) names, in order, once
    each: a point's ``customdata[0]`` (the charts of this module put the layer name there), else
    its category (``y`` of a horizontal bar, ``x`` otherwise); names not in ``known`` are dropped."""
    known = set(known)
    out: list[str] = []
    for pt in points or []:
        if not isinstance(pt, dict):
            continue
        custom = pt.get("customdata")
        cands = [custom[0] if isinstance(custom, (list, tuple)) and custom else custom, pt.get("y"), pt.get("x")]
        name = next((str(c) for c in cands if isinstance(c, str) and c in known), None)
        if name is not None and name not in out:
            out.append(name)
    return out


def set_precision(policy: Policy, layers: list[Layer], names, precision: str) -> tuple[Policy, list[str]]:
    """Set ``names`` to ``precision``; INT8 is applied only to layers that can be INT8 (eligible, or a
    placement Add/pooling/Concat), FP16/INT8 not to layers inside control flow; the others are
    returned as skipped."""
    if precision not in PRECISIONS:
        raise MixprecError(f"unknown precision {precision!r}", "use fp32, fp16 or int8")
    eligible = {l.name for l in layers if can_be_int8(l)}
    names = list(names)
    fixed = {l.name for l in layers if l.subgraph is not None}  # inside control flow: always fp32
    skipped = [n for n in names if (precision == "int8" and n not in eligible) or (precision != "fp32" and n in fixed)]
    return policy.with_layers({n: precision for n in names if n not in skipped}), skipped


def editor_table(project: Project, policy: Policy, ranking: pd.DataFrame | None) -> pd.DataFrame:
    """One row per layer (EDITOR_COLUMNS), ``sensitivity`` = cosine drop under all-INT8."""
    sens = dict(zip(ranking["name"], ranking["cos_drop"])) if ranking is not None else {}
    rows = [(l.name, l.op_type, l.macs, sens.get(l.name), l.eligible, policy.layers.get(l.name, "fp32"))
            for l in project.layers]
    return pd.DataFrame(rows, columns=EDITOR_COLUMNS)


def policy_summary(project: Project, policy: Policy) -> dict:
    """Layer counts per precision and the INT8 share of the eligible MACs (``int8_mac_share``)."""
    return {**policy.precision_counts(), "int8_mac_share": int8_mac_fraction(project, policy)}


def policy_diff(before: Policy | None, after: Policy, layers: list[Layer]) -> pd.DataFrame:
    """Layers whose precision differs between two policies (DIFF_COLUMNS)."""
    old = before.layers if before else {}
    rows = [(l.name, l.op_type, old.get(l.name, "—"), after.layers.get(l.name))
            for l in layers if old.get(l.name) != after.layers.get(l.name)]
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)


def layer_latency(per_layer: pd.DataFrame, layers: list[Layer]) -> pd.DataFrame:
    """A run's per-layer table (PER_LAYER_COLUMNS, one row per engine node) summed per policy layer
    (LATENCY_COLUMNS, slowest first): ``ms`` includes the layer's own precision conversions, which
    are also given alone in ``conversion_ms``; ``built`` is the precision it was built with."""
    ops = {l.name: l.op_type for l in layers}
    df = per_layer[per_layer["layer"].astype(str).isin(ops.keys())].copy()
    if df.empty:
        return pd.DataFrame(columns=LATENCY_COLUMNS)
    reformat = df["is_reformat"].astype(str).str.lower().isin(("true", "1"))
    df["conversion_ms"] = df["ms"].where(reformat, 0.0)
    g = df.groupby("layer", sort=False).agg(ms=("ms", "sum"), conversion_ms=("conversion_ms", "sum"),
                                             built=("precision", "first"))
    out = pd.DataFrame({"name": g.index.astype(str), "op_type": [ops[n] for n in g.index],
                        "built": g["built"].astype(str).values, "ms": g["ms"].values,
                        "conversion_ms": g["conversion_ms"].values})
    return out.sort_values("ms", ascending=False, kind="stable", ignore_index=True)[LATENCY_COLUMNS]


def _bars(df: pd.DataFrame, x: str, precision: dict[str, str], hover: str, extra: list[str]) -> go.Figure:
    """Horizontal bars, one trace per draft precision (the legend), the first row on top. Each
    bar's customdata is ``[name, name as shown, op_type, precision, *extra]``: the raw name for
    the selection, the escaped one for the axis and the hover (Plotly reads tags in text)."""
    df = df.iloc[::-1]
    prec = df["name"].map(lambda n: str(precision.get(n, "fp32")).upper())
    order = [p for p in ("FP32", "FP16", "INT8") if p in set(prec)] + sorted(set(prec) - {"FP32", "FP16", "INT8"})
    fig = go.Figure()
    for p in order:
        rows = df[prec == p]
        fig.add_trace(go.Bar(
            y=[html.escape(n) for n in rows["name"]], x=rows[x].tolist(), orientation="h", name=p,
            marker={"color": precision_color(p)},
            customdata=[[n, html.escape(n), html.escape(o), p, *vals]
                        for n, o, *vals in rows[["name", "op_type", *extra]].itertuples(index=False)],
            hovertemplate="%{customdata[1]}<br>%{customdata[2]} · draft %{customdata[3]}<br>" + hover
                          + "<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=[html.escape(n) for n in df["name"]])
    return fig


def _layout(fig: go.Figure, title: str, xlabel: str, n: int) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=xlabel, template=TEMPLATE,  # Streamlit sets click/drag modes
                      legend_title_text="Draft precision", height=max(360, 90 + 22 * n),
                      barmode="overlay")
    fig.update_yaxes(automargin=True)
    return fig


def plot_layer_scores(ranked: pd.DataFrame, precision: dict[str, str], mode: str, top: int = 30) -> go.Figure:
    """The ``top`` most sensitive layers of :func:`ranked_layers` as selectable bars, coloured by
    the draft's precision (``precision``: layer → fp32/fp16/int8)."""
    df = ranked.head(top)
    fig = _bars(df, "score", precision, "score %{x:.4g}", [])
    what = "cosine gain" if mode == "leave-one-out" else "cosine drop"
    return _layout(fig, f"Top {len(df)} layers of the {mode} ranking ({what}) · select bars to edit them",
                   f"{what.capitalize()} vs FP32 ({mode})", len(df))


def plot_layer_latency(lat: pd.DataFrame, precision: dict[str, str], run_label: str, source: str,
                       top: int = 30) -> go.Figure:
    """The ``top`` slowest policy layers of a run (:func:`layer_latency`) as selectable bars,
    coloured by the draft's precision; the hover says what each was built with."""
    df = lat.head(top)
    fig = _bars(df, "ms", precision, "%{x:.4f} ms per inference, built %{customdata[4]}"
                                     "<br>of which conversions %{customdata[5]:.4f} ms", ["built", "conversion_ms"])
    return _layout(fig, f"Top {len(df)} slowest layers of run {html.escape(run_label)} · select bars to edit them",
                   f"Time per inference (ms, {html.escape(source)}; with the layer's own conversions)", len(df))
