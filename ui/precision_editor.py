"""Precision page, the per-layer table: filters (op type, name, precision), row selection synced
with the working selection (ui.layer_picker), one click to set the selection to FP32 / FP16 /
INT8, each row's precision a button that moves it on (FP32 → FP16 → INT8 → FP32: an edit in the table
itself, not a read-only cell), undo / redo of policy edits, the boundaries each layer's neighbours force,
and the policy's summary metrics."""
from __future__ import annotations

import hashlib
from functools import partial

import pandas as pd
import streamlit as st

from core.display.precision_edit import editor_table, filter_table, policy_summary
from core.model.inventory import PRECISIONS
from core.model.placement import boundaries
from core.project import Project
from core.quant.policy import Policy, next_precision
from ui import bulk_actions, draft, session
from ui.layer_picker import EDIT_VERSION, SEL, TABLE_VERSION, RankingChoice, selection, set_selection
from ui.session import md

ROW_PX, HEADER_PX, ROWS_SHOWN = 35, 38, 20


# --- undo / redo -----------------------------------------------------------------------------
def _undo(p: Project) -> None:
    what = draft.undo(p)
    if what:
        session.flash(f"Undone: {md(what)}")


def _redo(p: Project) -> None:
    what = draft.redo(p)
    if what:
        session.flash(f"Redone: {md(what)}")


def history(p: Project) -> None:
    """Undo and Redo of policy edits (each names the edit), and what the autosave did."""
    d = draft.current(p)
    c1, c2, c3 = st.columns([1, 1, 6])
    c1.button("Undo", key="undo", icon=":material/undo:", disabled=d.undo_what is None, on_click=_undo, args=(p,),
              help=f"Undo: {d.undo_what}" if d.undo_what else "Nothing to undo")
    c2.button("Redo", key="redo", icon=":material/redo:", disabled=d.redo_what is None, on_click=_redo, args=(p,),
              help=f"Redo: {d.redo_what}" if d.redo_what else "Nothing to redo")
    text, failed = draft.autosave_status(p)
    if failed:
        c3.warning(text)
    else:
        c3.caption(text)


# --- the table ---------------------------------------------------------------------------------
def _picked_in_table(key: str, names: tuple[str, ...]) -> None:
    """The table's ``on_select``: ``names`` are its rows as drawn (the rows the ticks index)."""
    rows = (st.session_state.get(key) or {}).get("selection", {}).get("rows", [])
    set_selection([names[i] for i in rows if 0 <= i < len(names)], source="table")


def _select_shown(names: tuple[str, ...]) -> None:
    set_selection(list(names))


def _edited() -> None:
    """The by-name multiselect's ``on_change``: its value is the selection already; the table is drawn anew."""
    set_selection(st.session_state.get(SEL) or [], source="edit")


def _to_selection(p: Project, precision: str) -> None:
    names = selection(p)
    if names:
        bulk_actions.apply(p, names, precision, f"{len(names)} selected layer(s)")


PRECISION_CLICK = "layer_table:precision"  # the table's precision buttons (a ButtonColumn's click state)


def _precision_clicked(p: Project, names: tuple[str, ...]) -> None:
    """A precision button's ``on_click``: that row's layer moves to its next precision (``next_precision``),
    one undoable edit that says what changed. ``names``: the table's rows as drawn (the click's row indexes them)."""
    click = st.session_state.get(PRECISION_CLICK)
    row = click.get("row") if click is not None else None
    if not isinstance(row, int) or not 0 <= row < len(names):
        return
    layer = next((l for l in p.layers if l.name == names[row]), None)
    if layer is None:
        return
    now = draft.policy(p).layers.get(layer.name, "fp32")
    bulk_actions.apply(p, [layer.name], next_precision(layer, now), layer.name)


def _boundary_counts(p: Project, pol: Policy) -> tuple[pd.DataFrame, dict[str, int]]:
    """``core.model.placement.boundaries`` of the draft, and how many each layer has (kept while the model and
    the draft's layers are the same)."""
    def compute():
        df = boundaries(p.model, p.layers, pol)
        return df, df.groupby("layer").size().to_dict() if not df.empty else {}
    return session.memo("boundaries", (p.model.sha256, tuple(sorted(pol.layers.items()))), compute)


def section(p: Project, pol: Policy, rank: RankingChoice | None) -> Policy:
    """Filters, the selectable table of every layer, the selection's precision buttons and the
    boundaries of the selected layers. Returns the policy (edits apply through callbacks)."""
    table = editor_table(p, pol, None)
    scores = dict(zip(rank.ranked["name"], rank.ranked["score"])) if rank is not None else {}
    table["sensitivity"] = table["name"].map(scores)
    bounds, counts = _boundary_counts(p, pol)
    table["boundaries"] = table["name"].map(counts).fillna(0).astype(int)
    f1, f2, f3 = st.columns([2, 2, 1])
    ops = f1.multiselect("Op type", sorted(table["op_type"].unique()), key="view_ops", persist_state="session")
    name = f2.text_input("Name contains", key="view_name", placeholder="e.g. layer.5/output", persist_state="session")
    precs = f3.multiselect("Precision", list(PRECISIONS), key="view_prec", persist_state="session")
    view = filter_table(table, ops, name.strip(), precs).reset_index(drop=True)
    sel = selection(p)
    if st.session_state.get(SEL) is not None and st.session_state[SEL] != sel:
        set_selection(sel)  # names of another model dropped before the widgets read them
    # the table's key: its filters and the selection's version (layer_picker.TABLE_VERSION); its ticks are set
    # once, when it is drawn anew, and are the browser's own after that
    key = (f"layer_table-{hashlib.sha1(repr((ops, name.strip(), precs, len(table))).encode()).hexdigest()[:10]}"
           f"-{st.session_state.get(TABLE_VERSION, 0)}")
    if key not in st.session_state:
        st.session_state[key] = {"selection": {"rows": [i for i, n in enumerate(view["name"]) if n in set(sel)],
                                               "columns": [], "cells": []}}
    shown = tuple(view["name"])
    hidden = len(set(sel) - set(view["name"]))
    st.caption(f"{len(view)} of {len(table)} layers shown · {len(sel)} selected"
               + (f" ({hidden} hidden by the filters)" if hidden else "")
               + (f" · sensitivity: the {rank.label}" if rank is not None else "")
               + " · boundaries: neighbours whose precision forces a conversion")
    _actions(p, shown, sel)
    view = view.assign(precision=view["precision"].str.upper())  # the buttons' labels
    st.dataframe(view, key=key, on_select=partial(_picked_in_table, key, shown), selection_mode="multi-row",
                 hide_index=True,
                 height=HEADER_PX + ROW_PX * max(1, min(ROWS_SHOWN, len(view))),
                 column_config={"sensitivity": st.column_config.NumberColumn(
                                    "sensitivity", format="%.5f",
                                    help=f"The {rank.label}" if rank is not None else "No ranking yet"),
                                "macs": st.column_config.NumberColumn("MACs", format="compact"),
                                "precision": st.column_config.ButtonColumn(
                                    "precision", type="secondary", key=PRECISION_CLICK,
                                    on_click=_precision_clicked, args=(p, shown),
                                    help="Click to change the layer's precision: FP32 → FP16 → INT8 (where it can be "
                                         "INT8) → FP32, one undoable edit. Or tick rows and use the buttons above."),
                                "eligible": st.column_config.CheckboxColumn("INT8-eligible")})
    with st.expander("Edit the selection by name"):
        names = [l.name for l in p.layers]
        # max_selections (above the number of layers: never reached) is part of the widget's id, so the version in
        # it draws the widget anew when the selection changed elsewhere (layer_picker.EDIT_VERSION)
        st.multiselect("Selected layers", names, key=SEL, default=None, on_change=_edited, persist_state="session",
                       max_selections=len(names) + 1 + st.session_state.get(EDIT_VERSION, 0) % 1000)
    _boundaries(bounds, sel)
    return pol


def _actions(p: Project, shown: tuple[str, ...], sel: list[str]) -> None:
    c = st.columns([1.2, 1, 0.9, 0.9, 0.9, 2])
    c[0].button("Select all shown", key="sel_all", on_click=_select_shown, args=(shown,), disabled=not shown)
    c[1].button("Clear selection", key="sel_clear", on_click=set_selection, args=([],), disabled=not sel)
    for col, prec in zip(c[2:5], PRECISIONS):
        col.button(f"→ {prec.upper()}", key=f"sel_{prec}", type="primary", disabled=not sel,
                   on_click=_to_selection, args=(p, prec), help=f"Set the {len(sel)} selected layer(s) to {prec.upper()}"
                   + (" (INT8-eligible ones only)" if prec == "int8" else ""))


def _boundaries(bounds: pd.DataFrame, sel: list[str]) -> None:
    shown = bounds[bounds["layer"].isin(sel)] if sel else bounds
    title = (f"Boundaries of the {len(sel)} selected layer(s): {len(shown)}" if sel
             else f"Boundaries: {len(bounds)} neighbour pair(s) whose precisions force a conversion")
    with st.expander(title, expanded=bool(sel) and 0 < len(shown) <= 30):
        st.caption("Per layer, each neighbour whose precision differs in a way TensorRT must convert (INT8 ↔ float, "
                   "FP16 ↔ FP32), with the tensor between them.")
        st.dataframe(shown, hide_index=True)


def summary(p: Project, pol: Policy) -> dict:
    """Layers per precision and the INT8 share of MACs, as metrics; returns the summary."""
    s = policy_summary(p, pol)
    c = st.columns(4)
    for col, key in zip(c, ("fp32", "fp16", "int8")):
        col.metric(key.upper(), s[key])
    c[3].metric("INT8 share of MACs", f"{100 * s['int8_mac_share']:.1f}%")
    return s
