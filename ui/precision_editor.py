"""Precision page, the per-layer table: one row per layer with a FP32/FP16/INT8 select (filtered
by op type), and the policy's summary metrics."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.inventory import PRECISIONS
from core.policy import Policy
from core.policy_edit import editor_table, policy_summary, set_precision
from core.project import Project
from ui import common as ui


def section(p: Project, ranking: pd.DataFrame | None) -> Policy:
    """The editor over the session's policy; edits are applied to it. Returns the policy."""
    pol = ui.policy(p)
    table = editor_table(p, pol, ranking)
    view_ops = st.multiselect("Show op types", sorted(table["op_type"].unique()), key="view_ops")
    view = table[table["op_type"].isin(view_ops)] if view_ops else table
    edited = st.data_editor(
        view, hide_index=True, height=420,
        key=f"editor-{st.session_state.get('editor_version', 0)}-{'|'.join(view_ops)}",
        disabled=[c for c in view.columns if c != "precision"],
        column_config={"precision": st.column_config.SelectboxColumn("precision", options=list(PRECISIONS),
                                                                     required=True),
                       "sensitivity": st.column_config.NumberColumn("sensitivity (cos drop)", format="%.5f"),
                       "macs": st.column_config.NumberColumn("MACs", format="compact")})
    changes = {n: v for n, v in zip(edited["name"], edited["precision"]) if pol.layers.get(n) != v}
    if not changes:
        return pol
    new = pol
    for precision in set(changes.values()):
        new, skipped = set_precision(new, p.layers, [n for n, v in changes.items() if v == precision], precision)
        if skipped:
            st.warning(f"INT8 is not available for {ui.md(', '.join(skipped))} (not MatMul/Gemm/Conv): "
                       "kept as before.")
    ui.set_policy(p, new, reset_editor=False)
    return new


def summary(p: Project, pol: Policy) -> dict:
    """Layers per precision and the INT8 share of MACs, as metrics; returns the summary."""
    s = policy_summary(p, pol)
    c = st.columns(4)
    for col, key in zip(c, ("fp32", "fp16", "int8")):
        col.metric(key.upper(), s[key])
    c[3].metric("INT8 share of MACs", f"{100 * s['int8_mac_share']:.1f}%")
    return s
