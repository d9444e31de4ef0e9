"""Precision page, choosing layers: the sensitivity ranking the page uses (picked by the user,
named wherever it is used), the working selection of layers (``sel_layers``) and the two charts
to select on (click, box or lasso: Plotly selection events), the ranking's scores and the last
run's per-layer latency. The table and the one-click precision buttons are in precision_editor."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import pandas as pd
import streamlit as st

from core.display.precision_edit import (RANKING_LABELS, RANKING_MODES, layer_latency, names_from_points,
                                         plot_layer_latency, plot_layer_scores, ranked_layers)
from core.project import Project
from core.quant.policy import CALIB_METHODS, Policy
from core.sensitivity.runners import resolve_runner
from core.store.results import project_ranking_key, ranking_path
from core.store.runs import list_runs, load_run_per_layer, run_dir
from ui import draft, results
from ui.session import md

SEL = "sel_layers"  # the working selection: layer names, set by the charts, the table or by name (its widget's key)
# Bumped when the selection changes other than by the table / by the multiselect: those widgets are then drawn
# anew (another widget id) showing it. Never written at every run: a value the server sets for a widget is undone
# by any request the browser sent before that answer arrived (a job list's or the estimate's poll, a click), which
# carries the widget's older value; under a new id, such a value lands on a widget that is no longer drawn.
TABLE_VERSION = "sel_layers:table"
EDIT_VERSION = "sel_layers:edit"
SELECT_MODES = ("points", "box", "lasso")


@dataclass(frozen=True)
class RankingChoice:
    """The stored ranking the page uses: its ``mode`` (cumulative / isolated / leave-one-out),
    calibration ``method`` and its eligible layers, most sensitive first (``ranked``, SCORE_COLUMNS)."""
    mode: str
    method: str
    ranked: pd.DataFrame

    @property
    def label(self) -> str:
        """Plain text naming the ranking, e.g. ``isolated ranking (minmax)``."""
        return f"{self.mode} ranking ({self.method})"


def _stored(p: Project) -> list[str]:
    """``mode:method`` of every stored ranking of this model and data, the preferred first: isolated,
    then cumulative, then leave-one-out; the draft's calibration method first within each."""
    first = draft.policy(p).calibration.method
    methods = sorted(CALIB_METHODS, key=lambda m: (m != first, CALIB_METHODS.index(m)))
    return [f"{mode}:{m}" for mode in RANKING_MODES for m in methods
            if ranking_path(p.ws, project_ranking_key(p, m, mode, runner=resolve_runner("auto"))).is_file()]


def pick_ranking(p: Project) -> RankingChoice | None:
    """The ranking selector (key ``rank_choice``); None (and a note) when nothing is ranked yet."""
    options = _stored(p)
    if not options:
        st.caption("No sensitivity ranking of this model and data yet: run one on the **Sensitivity** page to "
                   "see it here, select layers on it and use Top-k.")
        return None
    if st.session_state.get("rank_choice") not in options:
        st.session_state.pop("rank_choice", None)
    choice = st.selectbox("Sensitivity ranking used on this page (chart, table, Top-k)", options, key="rank_choice",
                          format_func=lambda o: f"{RANKING_LABELS[o.split(':')[0]]} ({o.split(':')[1]})",
                          persist_state="session")
    mode, method = choice.split(":")
    stored = results.ranking(p, method) if mode == "cumulative" else results.sensitivity(p, method, mode)
    return RankingChoice(mode, method, ranked_layers(stored.table if stored is not None else None, mode))


# --- the working selection ------------------------------------------------------------------
def selection(p: Project) -> list[str]:
    """The selected layers of this model (names no longer in the model are dropped)."""
    known = {l.name for l in p.layers}
    return [n for n in st.session_state.get(SEL, []) if n in known]


def set_selection(names: list[str], source: str | None = None) -> None:
    """Replace the selection (in a callback, or before the selection widgets are drawn). ``source``: the widget
    it came from, ``"table"`` or ``"edit"`` (the multiselect), which already shows it; the others are drawn anew."""
    st.session_state[SEL] = list(dict.fromkeys(names))
    for version, own in ((TABLE_VERSION, "table"), (EDIT_VERSION, "edit")):
        if source != own:
            st.session_state[version] = st.session_state.get(version, 0) + 1


def _picked_on_chart(key: str, known: tuple[str, ...]) -> None:
    event = st.session_state.get(key)
    points = event["selection"]["points"] if event else []
    set_selection(names_from_points(points, known))


def _chart(fig, key: str, known: list[str]) -> None:
    st.plotly_chart(fig, key=key, on_select=partial(_picked_on_chart, key, tuple(known)), selection_mode=SELECT_MODES)


def charts(p: Project, pol: Policy, rank: RankingChoice | None) -> None:
    """The two charts to select layers on; a selection replaces the working selection."""
    with st.expander("Select layers on a chart", expanded=True):
        which = st.radio("Chart", ["Sensitivity", "Per-layer latency of the last run"], horizontal=True,
                         key="pick_chart", label_visibility="collapsed", persist_state="session")
        st.caption("Click a bar (shift-click adds more), or pick Box or Lasso Select in the chart's toolbar and drag "
                   "over bars: they become the selection, which the buttons under the table set to FP32, FP16 or "
                   "INT8 in one click. Double-click the chart to clear it.")
        known = [l.name for l in p.layers]
        if which == "Sensitivity":
            if rank is None:
                st.info("No ranking to draw yet: run one on the Sensitivity page.")
            elif rank.ranked.empty:
                st.info(f"The {rank.label} has no INT8-eligible layer.")
            else:
                n = len(rank.ranked)
                top = st.number_input("Layers shown", 1, n, min(30, n), key="pick_top")
                _chart(plot_layer_scores(rank.ranked, pol.layers, rank.mode, int(top)), "sens_pick_chart", known)
            return
        _latency_chart(p, pol, known)


def _latency_chart(p: Project, pol: Policy, known: list[str]) -> None:
    runs = list_runs(p.ws, p.model.sha256)
    if runs.empty:
        st.info("No run of this model yet: press **Rebuild** below, then select its slowest layers here.")
        return
    last = runs.iloc[0]
    try:
        lat = layer_latency(load_run_per_layer(run_dir(p.ws, last["run_id"])), p.layers)
    except Exception as e:  # noqa: BLE001 - a damaged run must not break the page
        st.error(md(e))
        return
    if lat.empty:
        st.info("The last run's profile names none of this model's layers.")
        return
    _chart(plot_layer_latency(lat, pol.layers, str(last["label"]), str(last["latency_source"])), "lat_pick_chart",
           known)
