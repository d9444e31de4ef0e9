"""Precision page, bulk actions: by op type, by name (regex), the top-k most sensitive → FP16,
reset to the defaults."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.errors import MixprecError
from core.inventory import PRECISIONS
from core.policy_edit import select_layers, set_precision, top_sensitive
from core.project import Project
from ui import common as ui

NO_RANKING = MixprecError("there is no sensitivity ranking for this model and data yet",
                          "run the ranking on the Sensitivity page first")


def apply(p: Project, names: list[str], precision: str, what: str) -> None:
    """Set ``names`` to ``precision`` in the session's policy; the outcome is flashed (``what``
    is Markdown, user text in it escaped by the caller)."""
    new, skipped = set_precision(ui.policy(p), p.layers, names, precision)
    ui.set_policy(p, new)
    ui.flash(f"{what}: {len(names) - len(skipped)} layer(s) → {precision.upper()}"
             + (f"; {len(skipped)} not INT8-eligible, left as they were" if skipped else ""))


def section(p: Project, ranking: pd.DataFrame | None) -> None:
    """``ranking``: the stored cumulative ranking table, or None."""
    with st.expander("Bulk actions", expanded=True):
        b1, b2, b3 = st.columns(3)
        with b1:
            _by_type(p)
        with b2:
            _by_name(p)
        with b3:
            _top_k(p, ranking)
        if st.button("Reset to defaults", key="reset"):
            ui.set_policy(p, p.default_policy())
            ui.flash("Reset: LayerNorm, Softmax and embeddings FP16; eligible layers INT8")


def _by_type(p: Project) -> None:
    with st.form("by_type"):
        ops = st.multiselect("Op types", sorted({l.op_type for l in p.layers}), key="bulk_ops")
        prec = st.selectbox("Precision", PRECISIONS, key="bulk_ops_prec")
        if st.form_submit_button("Set by op type", key="apply_ops") and ops:
            apply(p, select_layers(p.layers, op_types=ops), prec, f"op types {ui.md(', '.join(ops))}")


def _by_name(p: Project) -> None:
    with st.form("by_regex"):
        regex = st.text_input("Layer name (regular expression)", key="bulk_regex",
                              placeholder=r"layer\.5/output/dense/MatMul$")
        prec = st.selectbox("Precision", PRECISIONS, index=1, key="bulk_regex_prec")
        if st.form_submit_button("Set by name", key="apply_regex") and regex:
            try:
                apply(p, select_layers(p.layers, regex=regex), prec, ui.code(f"/{regex}/"))
            except MixprecError as e:
                st.error(ui.md(e))


def _top_k(p: Project, ranking: pd.DataFrame | None) -> None:
    with st.form("top_k"):
        n = max(1, sum(l.eligible for l in p.layers))
        k = st.number_input("k", 1, n, min(3, n), key="bulk_k")  # a model with fewer than 3 eligible layers too
        st.caption("The k most sensitive eligible layers (cosine drop) → FP16." if ranking is not None
                   else "Needs a ranking: run it on the Sensitivity page.")
        if st.form_submit_button("Top-k → FP16", key="apply_topk"):
            if ranking is None or ranking.empty:
                st.error(str(NO_RANKING))
                return
            try:
                apply(p, top_sensitive(ranking, int(k)), "fp16", f"top {k} most sensitive")
            except MixprecError as e:
                st.error(ui.md(e))
