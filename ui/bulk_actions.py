"""Precision page, bulk actions: the network default (FP32 / FP16: the precision of the layers the
policy does not set otherwise, as ``--network-default`` sets it), everything that is not INT8 → FP16, by
op type, by name (regex), the top-k most sensitive layers of the ranking the page uses → FP16, and reset
to the defaults (after a confirmation). Every action is one undoable edit of the draft, and says what it
changed ("102 layers FP32 → FP16")."""
from __future__ import annotations

import streamlit as st

from core.display.precision_edit import policy_diff, select_layers, set_precision, top_k
from core.errors import MixprecError
from core.model.inventory import PRECISIONS
from core.project import Project
from core.quant.policy import NETWORK_DEFAULTS, change_summary, with_network_default
from ui import draft, session
from ui.session import md

NO_RANKING = MixprecError("there is no sensitivity ranking for this model and data yet",
                          "run the ranking on the Sensitivity page first")


def apply(p: Project, names: list[str], precision: str, what: str) -> None:
    """Set ``names`` to ``precision`` in the session's policy, as one undoable edit; the outcome (what
    changed: "2 layers FP32 → FP16, 1 INT8 → FP16") is flashed. ``what`` is plain text (it is escaped here)."""
    before = draft.policy(p)
    new, skipped = set_precision(before, p.layers, names, precision)
    w = draft.set_policy(p, new, what=f"{what}: {len(names) - len(skipped)} layer(s) → {precision.upper()}")
    # layers another tab changed meanwhile (a bulk action changes only layers): its values stay, and
    # draft.CONFLICT says so
    conflicts = w.conflicts if w is not None else ()
    if conflicts:
        new = new.with_layers({n: before.layers[n] for n in conflicts})
    done = len(names) - len(skipped) - len(conflicts)
    changed = change_summary(before, new)
    if conflicts and not done:
        return  # nothing of this action was applied: the conflict note alone speaks (no success message)
    if changed == "no layer changed" and done:
        changed += f": {'it was' if done == 1 else 'they were'} {precision.upper()} already"
    session.flash(f"{md(what)}: {done} layer(s) → {precision.upper()} — {changed}"
                  + (f"; {len(skipped)} {'not INT8-eligible' if precision == 'int8' else 'inside control flow (FP32)'}, "
                     "left as they were" if skipped else "")
                  + (f"; {len(conflicts)} not applied: another tab changed {'it' if len(conflicts) == 1 else 'them'} "
                     "meanwhile (see the note)" if conflicts else "")
                  + (". You can undo it." if changed[0].isdigit() else ""))


def not_int8_to_fp16(p: Project) -> None:
    """Every layer that is not INT8 → FP16 (layers inside control flow stay FP32): one undoable edit."""
    pol = draft.policy(p)
    apply(p, [l.name for l in p.layers if pol.layers.get(l.name) == "fp32" and l.subgraph is None], "fp16",
          "everything not INT8")


ND_WIDGET = "network_default"  # the network-default radio; written only when the draft's differs from it


def set_network_default(p: Project, value: str | None = None) -> None:
    """The radio's ``on_change`` (or a direct call with ``value``): the draft under the network default picked,
    as ``--network-default`` makes it (``core.quant.policy.with_network_default``), one undoable edit."""
    value = value or st.session_state.get(ND_WIDGET)
    before = draft.policy(p)
    if value not in NETWORK_DEFAULTS or value == before.network_default:
        return
    new = with_network_default(before, p.model, p.layers, value)
    draft.set_policy(p, new, what=f"network default {value.upper()}")
    said = change_summary(before, new)  # "network default FP32 → FP16; 102 layers FP32 → FP16"
    session.flash(f"{said[0].upper()}{said[1:]}. You can undo it.")


def _network_default(p: Project) -> None:
    pol = draft.policy(p)
    if st.session_state.get(ND_WIDGET) != pol.network_default:  # the draft's (after an undo, another tab's edit)
        st.session_state[ND_WIDGET] = pol.network_default
    left = sum(1 for l in p.layers if l.default_precision == "default" and pol.layers.get(l.name) == "fp32")
    c1, c2 = st.columns([2, 3])
    c1.radio("Network default", NETWORK_DEFAULTS, key=ND_WIDGET, horizontal=True, format_func=str.upper,
             on_change=set_network_default, args=(p,),
             help="The precision of the layers the policy does not set otherwise (bias Adds, activations, "
                  "reshapes…), as `--network-default` sets it on the command line. A TensorRT build with "
                  "`--fp16 --int8` runs them in FP16.")
    fp32 = sum(1 for l in p.layers if pol.layers.get(l.name) == "fp32" and l.subgraph is None)
    c2.caption(f"{left} layer(s) at the network default are FP32 now." if left else
               "No layer at the network default is FP32.")
    c2.button(f"Everything not INT8 → FP16 ({fp32} FP32 layer(s))", key="not_int8_fp16", on_click=not_int8_to_fp16,
              args=(p,), disabled=fp32 == 0,
              help="Every FP32 layer becomes FP16 (INT8 layers stay; layers inside control flow stay FP32).")


def section(p: Project, rank) -> None:
    """``rank``: the page's ``ui.layer_picker.RankingChoice``, or None when nothing is ranked."""
    with st.expander("Bulk actions", expanded=True):
        _network_default(p)
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
    before = draft.policy(p)
    draft.set_policy(p, p.default_policy(), what="reset to the defaults")
    session.flash("Reset: LayerNorm, Softmax and embeddings FP16; eligible layers INT8; the rest FP32 — "
                  f"{change_summary(before, p.default_policy())}")


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
