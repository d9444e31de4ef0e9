"""Policy editing: bulk selections, setting precisions, the per-layer precision table, summaries,
diffs between policies and runs side by side. Pure functions over core objects (the dashboard's
Precision and Build pages call them), testable without Streamlit."""
from __future__ import annotations

import re

import pandas as pd

from core.errors import MixprecError
from core.measure.runs import int8_mac_fraction
from core.model.inventory import PRECISIONS, Layer, can_be_int8
from core.project import Project
from core.quant.policy import Policy

EDITOR_COLUMNS = ["name", "op_type", "macs", "sensitivity", "eligible", "precision"]
DIFF_COLUMNS = ["name", "op_type", "built", "now"]


def select_layers(layers: list[Layer], op_types=None, regex: str | None = None) -> list[str]:
    """Names of the layers whose op type is in ``op_types`` (if given) and whose name matches
    ``regex`` (``re.search``, if given)."""
    try:
        pattern = re.compile(regex) if regex else None
    except re.error as e:
        raise MixprecError(f"the name pattern {regex!r} is not a valid regular expression ({e})",
                           "escape special characters, e.g. layer\\.5/output") from e
    return [l.name for l in layers
            if (not op_types or l.op_type in op_types) and (pattern is None or pattern.search(l.name))]


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
