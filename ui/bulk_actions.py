"""Precision page, bulk actions: by op type, by name (regex), the top-k most sensitive layers of
the ranking the page uses → FP16, and reset to the defaults (after a confirmation). Every action
is one undoable edit of the draft."""
from __future__ import annotations

import streamlit as st

from core.display.precision_edit import policy_diff, select_layers, set_precision, top_k
from core.errors import MixprecError
from core.model.inventory import PRECISIONS
from core.project import Project
from ui import draft, session
from ui.session import md

NO_RANKING = MixprecError("there is no sensitivity ranking for this model and data yet",
                          "run the ranking on the Sensitivity page first")


def apply(p: Project, names: list[str], precision: str, what: str) -> None:
    """Set ``names`` to ``precision`` in the session's policy, as one undoable edit; the outcome is
    flashed. ``what`` is plain text (it is escaped here)."""
    new, skipped = set_precision(draft.policy(p), p.layers, names, precision)
    done = len(names) - len(skipped)
    draft.set_policy(p, new, what=f"{what}: {done} layer(s) → {precision.upper()}")
    session.flash(f"{md(what)}: {done} layer(s) → {precision.upper()}"
                  + (f"; {len(skipped)} not INT8-eligible, left as they were" if skipped else ""))


def section(p: Project, rank) -> None:
    """``rank``: the page's ``ui.layer_picker.RankingChoice``, or None when nothing is ranked."""
    with st.expander("Bulk actions", expanded=True):
        b1, b2, b3 = st.columns(3)
        with b1:
            _by_type(p)
        with b2:
            _by_name(p)
        with b3:
            _top_k(p, rank)
        changed = len(policy_diff(p.default_policy(), draft.policy(p), p.layers))
        session.confirmed("reset", "Reset to defaults",
                          f"Reset every layer to the defaults? {changed} layer(s) of your draft differ from them. "
                          "You can undo it.", "Yes, reset", _reset, (p,),
                          disabled=draft.policy(p).sha256 == p.default_policy().sha256)


# Each action runs in its button's on_click (the form's values are in the session state by then): at the start of
# the run that carries the click, so neither a newer request nor a rerun above the form can lose it.
ERROR = "bulk_actions:error"  # a bad regular expression, shown under its form at the next drawing


def _reset(p: Project) -> None:
    draft.set_policy(p, p.default_policy(), what="reset to the defaults")
    session.flash("Reset: LayerNorm, Softmax and embeddings FP16; eligible layers INT8")


def _by_type(p: Project) -> None:
    with st.form("by_type"):
        st.multiselect("Op types", sorted({l.op_type for l in p.layers}), key="bulk_ops")
        st.selectbox("Precision", PRECISIONS, key="bulk_ops_prec")
        st.form_submit_button("Set by op type", key="apply_ops", on_click=_set_by_type, args=(p,))


def _set_by_type(p: Project) -> None:
    ops, prec = st.session_state.get("bulk_ops") or [], st.session_state.get("bulk_ops_prec") or PRECISIONS[0]
    if ops:
        apply(p, select_layers(p.layers, op_types=ops), prec, f"op types {', '.join(ops)}")


def _by_name(p: Project) -> None:
    with st.form("by_regex"):
        st.text_input("Layer name (regular expression)", key="bulk_regex",
                      placeholder=r"layer\.5/output/dense/MatMul$")
        st.selectbox("Precision", PRECISIONS, index=1, key="bulk_regex_prec")
        st.form_submit_button("Set by name", key="apply_regex", on_click=_set_by_name, args=(p,))
        if st.session_state.get(ERROR):
            st.error(st.session_state.pop(ERROR))


def _set_by_name(p: Project) -> None:
    regex, prec = st.session_state.get("bulk_regex") or "", st.session_state.get("bulk_regex_prec") or PRECISIONS[1]
    if not regex:
        return
    try:
        apply(p, select_layers(p.layers, regex=regex), prec, f"/{regex}/")
    except MixprecError as e:
        st.session_state[ERROR] = md(e)


def _top_k(p: Project, rank) -> None:
    if rank is None:
        st.caption("**Top-k → FP16** needs a sensitivity ranking: run one on the Sensitivity page.")
        return
    n = len(rank.ranked)
    if n == 0:
        st.caption(f"**Top-k → FP16**: the {md(rank.label)} has no INT8-eligible layer.")
        return
    with st.form("top_k"):
        st.number_input(f"k (1–{n})", 1, n, min(3, n), key="bulk_k")  # 1 or 2 eligible layers too
        st.caption(f"The k most sensitive layers of the **{md(rank.label)}** → FP16 "
                   "(pick another ranking above the table).")
        st.form_submit_button("Top-k → FP16", key="apply_topk", on_click=_set_top_k, args=(p, rank, min(3, n)))


def _set_top_k(p: Project, rank, default: int) -> None:
    k = int(st.session_state.get("bulk_k") or default)
    apply(p, top_k(rank.ranked, k), "fp16", f"top {k} of the {rank.label}")
