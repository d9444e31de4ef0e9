"""Numbers as a person reads them: units, sensible rounding and local times; the run history, two
runs side by side (columns named by the runs' labels) and one run's layers against another's, as
display tables. Pure functions over the tables of ``core.measure.runs`` and ``core.backends``; the pages
show what they return."""
from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from core.measure.runs import speedup_text
from core.project import TARGET_LABELS
from core.quant.compile import ORT_CPU_FP16_KERNELS

LAYER_COMPARE_COLUMNS = ["layer", "op_type", "precision_a", "ms_a", "precision_b", "ms_b", "delta_ms", "changed",
                         "simulated_a", "simulated_b"]  # simulated_*: FP16 computed in float32 (simulated_fp16)
# The run history as shown: (column of core.measure.runs.RUN_COLUMNS, heading with its unit, decimals, "sig" for 4
# significant digits, or None for text).
HISTORY_COLUMNS = [
    ("created", "created (local time)", None), ("label", "label", None), ("policy_sha256", "policy", None),
    ("speedup", "vs FP32", None), ("speedup_low", "vs FP32, 95 % interval", None), ("input_shapes", "input shapes", None),
    ("latency_median_ms", "median (ms)", "sig"), ("latency_p95_ms", "p95 (ms)", "sig"),
    ("fp32_median_ms", "FP32 median (ms)", "sig"), ("cosine_mean", "cosine mean", 4), ("cosine_min", "cosine min", 4),
    ("snr_db", "SNR (dB)", 1), ("max_abs", "max abs error", None), ("reformat_count", "reformats", 0),
    ("reformat_ms", "reformat time (ms)", "sig"), ("reformat_pct", "reformat share (%)", 1),
    ("n_fp32", "FP32 layers", 0), ("n_fp16", "FP16 layers", 0), ("n_int8", "INT8 layers", 0),
    ("int8_mac_fraction", "INT8 MAC share (%)", 1), ("build_seconds", "build (s)", 1),
    ("data_generated", "on generated data", None), ("latency_source", "latency source", None),
    ("target", "target", None), ("backend", "backend", None), ("warnings", "warnings", None),
    ("run_id", "run id", None),
]
# Two runs side by side: (column, row label); the value's unit comes from :func:`metric_text`.
COMPARE_ROWS = [
    ("created", "created (local time)"), ("backend", "backend"), ("target", "deployment target"),
    ("latency_source", "latency source"), ("latency_median_ms", "median latency"), ("latency_p95_ms", "p95 latency"),
    ("fp32_median_ms", "FP32 median latency"), ("speedup", "vs FP32"), ("speedup_low", "vs FP32, 95 % interval"),
    ("input_shapes", "input shapes"), ("policy_sha256", "policy (content hash)"), ("reformat_count", "reformat nodes"),
    ("reformat_ms", "reformat time"), ("reformat_pct", "reformat share"), ("cosine_mean", "cosine (mean)"),
    ("cosine_min", "cosine (min)"), ("snr_db", "SNR"), ("max_abs", "max abs error"),
    ("top1_agreement", "top-1 agreement"), ("kl_div", "KL divergence (nats)"), ("perplexity", "perplexity"),
    ("knn5_overlap", "top-5 neighbour overlap"), ("n_fp32", "FP32 layers"),
    ("n_fp16", "FP16 layers"), ("n_int8", "INT8 layers"), ("int8_mac_fraction", "INT8 share of MACs"),
    ("build_seconds", "build time"), ("data_generated", "quality on generated data"), ("warnings", "warnings"),
    ("run_id", "run id"),
]
_MS = {"latency_median_ms", "latency_p95_ms", "fp32_median_ms", "reformat_ms"}
_FRACTION = {"top1_agreement", "knn5_overlap", "int8_mac_fraction"}  # 0..1, shown as %
_COUNT = {"reformat_count", "n_fp32", "n_fp16", "n_int8"}
_SIGNIFICANT = {"kl_div", "perplexity"}  # 4 significant digits (a KL of 0.00124421334479979 reads 0.001244)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def local_time(epoch) -> str:
    """Epoch seconds as this machine's local time, ``2026-12-01 09:50:52 CET``; "—" for none."""
    if _missing(epoch):
        return "—"
    return datetime.fromtimestamp(float(epoch)).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def significant(value: float, digits: int = 4, max_decimals: int | None = None) -> str:
    """``value`` with ``digits`` significant digits in fixed notation (25.465 → ``25.47``,
    0.018754 → ``0.01875``), at most ``max_decimals`` decimals; integers of more digits are kept whole."""
    if _missing(value):
        return "—"
    v = float(value)
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:.{decimals if max_decimals is None else min(decimals, max_decimals)}f}"


def ms_text(value) -> str:
    """A time in milliseconds, 4 significant digits down to 0.01 µs: ``12.96 ms``, ``0.01875 ms``."""
    return "—" if _missing(value) else f"{significant(value, max_decimals=5)} ms"


def metric_text(column: str, value) -> str:
    """One value of a run (a ``core.measure.runs.RUN_COLUMNS`` column) with its unit and rounding."""
    if column == "speedup":
        return speedup_text(None if _missing(value) else float(value))[0]
    if column == "snr_db" and _missing(value):
        return "∞ (outputs identical)"
    if _missing(value) or value == "":
        return "—"
    if column == "created":
        return local_time(value)
    if column in _MS:
        return ms_text(value)
    if column in _FRACTION:
        return f"{100 * float(value):.1f} %"
    if column in _COUNT:
        return str(int(value))
    if column == "reformat_pct":
        return f"{float(value):.1f} % of per-layer time"
    if column in ("cosine_mean", "cosine_min"):
        return f"{float(value):.4f}"
    if column == "snr_db":
        return f"{float(value):.1f} dB"
    if column == "max_abs":
        return f"{float(value):.3g}"
    if column in _SIGNIFICANT:
        return significant(value)
    if column == "build_seconds":
        return f"{float(value):.1f} s"
    if column == "data_generated":
        return "yes" if bool(value) else "no"
    if column == "target":
        return TARGET_LABELS.get(str(value), str(value))
    return str(value)


def policy_hash(sha256) -> str:
    """A policy's content hash as shown: its first 8 hex digits (two runs of one policy show the same)."""
    return str(sha256 or "")[:8] or "—"


def policy_runs(runs: pd.DataFrame) -> pd.Series:
    """How many runs of ``runs`` were built from the same policy as each (by its content hash), by run id."""
    counts = runs.groupby("policy_sha256")["run_id"].transform("size")
    return pd.Series(counts.to_numpy(), index=runs["run_id"].to_numpy())


def _text(value) -> str:
    return "" if _missing(value) else str(value)


def interval_text(low, high, pairs=None) -> str:
    """A speedup's 95 % interval: ``1.31–1.62× (30 pairs)``; "not kept (an older run)" without the pair times."""
    if _missing(low) or _missing(high):
        return "not kept (an older run)"
    n = "" if _missing(pairs) or not pairs else f" ({int(pairs)} pairs)"
    return f"{float(low):.2f}–{float(high):.2f}×{n}"


def run_context(row, source: bool = True) -> str:
    """What a run's numbers are for, said beside them: ``for 1×3×640×640, policy int8=40 … (3f2a1c9e), ONNX
    Runtime CPU, measured`` (``row``: a row of ``list_runs``; ``source=False``: without what measured it)."""
    shapes = _text(row.get("input_shapes"))
    return (f"for {shapes or 'shapes not recorded'}, policy {row['label']} ({policy_hash(row['policy_sha256'])})"
            + (f", {row['latency_source']}" if source else ""))


def run_title(runs: pd.DataFrame, run_id: str) -> str:
    """How a run is named in a picker: its label, local time and the end of its id, and, when another run was
    built from the same policy, the policy's hash and how many runs it has."""
    row = runs.set_index("run_id").loc[run_id]
    n = int(policy_runs(runs).get(run_id, 1))
    same = f" · policy {policy_hash(row['policy_sha256'])}, {n} runs" if n > 1 else ""
    return f"{row['label']} · {local_time(row['created'])} · {run_id[-6:]}{same}"


def same_policy_note(runs: pd.DataFrame, a: str, b: str) -> str:
    """When runs ``a`` and ``b`` were built from the same policy (same content hash): that they are, their
    speedups with their 95 % intervals, the range over every run of that policy, and what a gap between them
    means; "" for two policies."""
    by_id = runs.set_index("run_id")
    ra, rb = by_id.loc[a], by_id.loc[b]
    if a == b or ra["policy_sha256"] != rb["policy_sha256"]:
        return ""
    group = runs[runs["policy_sha256"] == ra["policy_sha256"]]
    each = "; ".join(f"{k} {float(r['speedup']):.2f}× (95 % interval {interval_text(r.get('speedup_low'), r.get('speedup_high'), r.get('timed_pairs'))})"
                     for k, r in (("A", ra), ("B", rb)))
    text = (f"A and B are the same policy (content hash {policy_hash(ra['policy_sha256'])}), measured twice: "
            f"vs FP32, {each}.")
    if len(group) > 2:
        sp = pd.to_numeric(group["speedup"], errors="coerce")
        text += f" The {len(group)} runs of this policy range {sp.min():.2f}–{sp.max():.2f}×."
    lows = [ra.get("speedup_low"), rb.get("speedup_low")]
    highs = [ra.get("speedup_high"), rb.get("speedup_high")]
    if any(_missing(v) for v in (*lows, *highs)):
        text += " The gap between them is measurement noise (one policy, one engine build): rebuild on an idle machine."
    elif max(lows) <= min(highs):
        text += " The intervals overlap: the gap is measurement noise."
    else:
        text += (" The intervals do not overlap: the machine's load changed between the two runs (the same "
                 "policy cannot be faster): rebuild both on an idle machine before reading a difference.")
    return text


def run_history(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``core.measure.runs.list_runs`` as shown: headings with units, rounded numbers, local
    times, the speedup in words (``vs FP32``), counts as integers, shares in %."""
    out = {}
    for col, heading, decimals in HISTORY_COLUMNS:
        s = runs[col]
        if col == "created":
            s = s.map(local_time)
        elif col == "speedup":
            s = s.map(lambda v: metric_text("speedup", v))
        elif col == "speedup_low":
            s = pd.Series([interval_text(lo, hi, n) for lo, hi, n in zip(runs["speedup_low"], runs["speedup_high"],
                                                                         runs["timed_pairs"])], index=runs.index)
        elif col == "policy_sha256":
            n = policy_runs(runs).to_numpy()
            s = pd.Series([policy_hash(h) + (f" · {k} runs" if k > 1 else "") for h, k in zip(s, n)], index=runs.index)
        elif col == "input_shapes":
            s = s.map(_text)
        elif col in ("int8_mac_fraction",):
            s = (100 * s.astype(float)).round(decimals)
        elif col == "max_abs":
            s = s.map(lambda v: metric_text("max_abs", v))
        elif col == "target":
            s = s.map(lambda v: metric_text("target", v))
        elif decimals == "sig":
            s = pd.to_numeric(s, errors="coerce").map(lambda v: float(significant(v, max_decimals=5)) if v == v else v)
        elif decimals == 0:
            s = s.astype("Int64")
        elif decimals is not None:
            s = pd.to_numeric(s, errors="coerce").astype(float).round(decimals)
        out[heading] = s.reset_index(drop=True)
    return pd.DataFrame(out, columns=[h for _, h, _ in HISTORY_COLUMNS])


def run_columns(runs: pd.DataFrame, a: str, b: str) -> tuple[str, str]:
    """The headings of runs ``a`` and ``b`` in a side-by-side table: ``A: <label>``, ``B: <label>``
    (the letters keep them apart when the labels are the same)."""
    labels = runs.set_index("run_id")["label"]
    return f"A: {labels[a]}", f"B: {labels[b]}"


def _change(column: str, va, vb) -> str:
    """B against A for a numeric metric: ``+1.234 ms (+5.1 %)``; "" for text or missing values."""
    if column not in _MS | _COUNT | _FRACTION | _SIGNIFICANT | {"cosine_mean", "cosine_min", "snr_db", "reformat_pct",
                                                                "speedup", "build_seconds", "max_abs"}:
        return ""
    if _missing(va) or _missing(vb):
        return ""
    va, vb = float(va), float(vb)
    if column in _COUNT:
        return f"{int(vb - va):+d}"
    d = vb - va
    if column in _MS:
        text = f"{'+' if d >= 0 else '-'}{significant(abs(d), max_decimals=5)} ms"
    elif column in _FRACTION:
        text = f"{100 * d:+.1f} points"
    elif column == "reformat_pct":
        text = f"{d:+.1f} points"
    elif column == "speedup":
        text = f"{d:+.2f}×"
    elif column in ("cosine_mean", "cosine_min"):
        text = f"{d:+.4f}"
    elif column == "snr_db":
        text = f"{d:+.1f} dB"
    elif column == "build_seconds":
        text = f"{d:+.1f} s"
    elif column in _SIGNIFICANT:
        text = f"{'+' if d >= 0 else '-'}{significant(abs(d))}"
    else:
        text = f"{d:+.3g}"
    if column in _MS and va:
        text += f" ({100 * d / va:+.1f} %)"
    return text


def run_comparison_table(runs: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Two runs side by side: one row per metric (with its unit), one column per run, named by its
    label (:func:`run_columns`), and ``B vs A`` for the numbers."""
    by_id = runs.set_index("run_id")
    col_a, col_b = run_columns(runs, a, b)
    rows = []
    for col, label in COMPARE_ROWS:
        va, vb = (a, b) if col == "run_id" else (by_id.at[a, col], by_id.at[b, col])
        if col == "speedup_low":
            ta, tb = (interval_text(by_id.at[r, "speedup_low"], by_id.at[r, "speedup_high"], by_id.at[r, "timed_pairs"])
                      for r in (a, b))
            rows.append((label, ta, tb, ""))
        elif col in ("input_shapes", "policy_sha256"):
            show = policy_hash if col == "policy_sha256" else (lambda v: _text(v) or "not recorded")
            same = "same policy" if col == "policy_sha256" else "same shapes"
            differ = "another policy" if col == "policy_sha256" else "other shapes: latencies not comparable"
            rows.append((label, show(va), show(vb), same if _text(va) == _text(vb) else differ))
        else:
            rows.append((label, metric_text(col, va), metric_text(col, vb), _change(col, va, vb)))
    return pd.DataFrame(rows, columns=["metric", col_a, col_b, "B vs A"]).set_index("metric")


def simulated_fp16(per_layer: pd.DataFrame, backend: str = "onnxruntime") -> pd.Series:
    """Which nodes of a run's per-layer table are FP16 layers simulated on the CPU: on the ONNX
    Runtime backend, every FP16 compute node whose op has no float16 CPU kernel
    (``core.quant.compile.ORT_CPU_FP16_KERNELS``); precision conversions are not layers."""
    if backend != "onnxruntime":
        return pd.Series(False, index=per_layer.index)
    real = per_layer["op_type"].astype(str).map(lambda op: any(k in op for k in ORT_CPU_FP16_KERNELS))
    reformat = per_layer["is_reformat"].astype(str).str.lower().isin(("true", "1"))
    return (per_layer["precision"].astype(str).str.lower() == "fp16") & ~reformat & ~real


def _per_layer(per_layer: pd.DataFrame, backend: str = "onnxruntime") -> pd.DataFrame:
    """One row per policy layer of a run's per-layer table: its time (its nodes and conversions
    summed), its precision and op type (those of the node named like the layer, else its first), and
    whether its FP16 compute is simulated on the CPU (:func:`simulated_fp16`: one of its nodes is)."""
    df = per_layer[per_layer["layer"].astype(str) != ""].copy()
    df["ms"] = pd.to_numeric(df["ms"], errors="coerce").fillna(0.0)
    df["own"] = df["name"].astype(str) == df["layer"].astype(str)
    df["simulated"] = simulated_fp16(df, backend)
    df = df.sort_values("own", ascending=False, kind="stable")
    g = df.groupby("layer", sort=False)
    return pd.DataFrame({"ms": g["ms"].sum(), "precision": g["precision"].first().astype(str),
                         "op_type": g["op_type"].first().astype(str), "simulated": g["simulated"].any()})


def layer_comparison(per_a: pd.DataFrame, per_b: pd.DataFrame, backend_a: str = "onnxruntime",
                     backend_b: str = "onnxruntime") -> pd.DataFrame:
    """The layers of two runs' per-layer tables (``core.backends.base.PER_LAYER_COLUMNS``) side by
    side (LAYER_COMPARE_COLUMNS): each layer's time in A and B (its nodes and their precision
    conversions), its precision in each, B − A, whether the precision changed, and whether its FP16
    is simulated on the CPU in each (``backend_a``/``backend_b``: the runs' backends); slowest
    (in either run) first. A layer one run does not have (e.g. a Relu ONNX Runtime fused into the
    INT8 conv before it) reads NaN ms and precision "", and is not counted as changed."""
    la, lb = _per_layer(per_a, backend_a), _per_layer(per_b, backend_b)
    names = list(dict.fromkeys([*la.index, *lb.index]))
    rows = []
    for n in names:
        pa = la.at[n, "precision"] if n in la.index else ""
        pb = lb.at[n, "precision"] if n in lb.index else ""
        ma = float(la.at[n, "ms"]) if n in la.index else float("nan")
        mb = float(lb.at[n, "ms"]) if n in lb.index else float("nan")
        op = la.at[n, "op_type"] if n in la.index else lb.at[n, "op_type"]
        sa = bool(la.at[n, "simulated"]) if n in la.index else False
        sb = bool(lb.at[n, "simulated"]) if n in lb.index else False
        rows.append((n, op, pa, ma, pb, mb, mb - ma, bool(pa and pb and pa != pb), sa, sb))
    df = pd.DataFrame(rows, columns=LAYER_COMPARE_COLUMNS)
    order = df[["ms_a", "ms_b"]].max(axis=1, skipna=True).fillna(0.0)
    return df.loc[order.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)


# --- the search's front (core.search.result.FRONT_COLUMNS) as shown -------------------------------------------
FRONT_HEADINGS = {  # column → heading with its unit; shares in percent, both of them
    "candidate": "#", "method": "calibration", "n_int8": "INT8 layers", "quality": "quality",
    "est_ms": "estimated time (ms)", "est_low_ms": "likely from (ms)", "est_high_ms": "likely to (ms)",
    "int8_mac_share": "INT8 MAC share (%)", "est_reformat_pct": "reformat share (%)",
    "boundaries": "INT8/FP16 boundaries", "meets_budget": "meets budget",
}


def front_table(front: pd.DataFrame, metric: str = "") -> pd.DataFrame:
    """The search's front as shown: headings with units (the quality column named by the budget's ``metric``),
    the INT8 MAC share in percent like the reformat share (the table mixed a fraction and a percent), times to
    4 significant digits, quality to 6 (candidates differ in the fifth decimal of a cosine). Numbers stay
    numbers (a column sorts); columns the front does not have are left out."""
    out = {}
    for col, heading in FRONT_HEADINGS.items():
        if col not in front.columns:
            continue
        v = front[col]
        if col == "int8_mac_share":
            v = (100 * pd.to_numeric(v, errors="coerce")).round(1)
        elif col == "est_reformat_pct":
            v = pd.to_numeric(v, errors="coerce").round(1)
        elif col.endswith("_ms"):
            v = pd.to_numeric(v, errors="coerce").map(lambda x: float(significant(x)) if x == x else x)
        elif col == "quality":
            v = pd.to_numeric(v, errors="coerce").map(lambda x: float(significant(x, 6)) if x == x else x)
            heading = f"{metric or heading} (dev half)"  # not a heading ui.tables rounds to 4 decimals
        elif col == "meets_budget":
            v = v.astype(str).str.lower().isin(("true", "1"))
        out[heading] = v.reset_index(drop=True)
    return pd.DataFrame(out)
