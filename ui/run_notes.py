"""Results page, what to know about a run's numbers: its quality warning (below the threshold,
with the worst layers or the way to find them), whether its quality was measured on generated
data, the input shapes it was built and measured at, and what measured its latency (and whether
that predicts its deployment target's)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.errors import MixprecError
from core.measure.runs import GENERATED_NOTE, latency_caveat, worst_int8_layers
from core.model.shapes import shape_text
from core.project import Project
from core.project import TARGET_LABELS
from core.store.runs import load_run, run_policy
from ui import results
from ui.session import code, md


def section(p: Project, run_id: str) -> None:
    try:
        run = load_run(p.ws, run_id)
    except MixprecError as e:
        st.error(md(e))
        return
    for w in run.warnings:
        st.warning(f"Run {md(run.label)}: {md(w)}")
    if run.warnings and not any("worst INT8 layers" in w for w in run.warnings):
        _ranked_now(p, run)
    notes = [f"latency {run.latency_label}"]
    if run.data_generated:
        notes.append(f"quality {GENERATED_NOTE} (give evaluation data on the Model page for numbers that hold)")
    if run.input_shapes:
        notes.append("input shapes " + ", ".join(f"{n}={shape_text(s)}" for n, s in run.input_shapes.items()))
    if notes:
        st.caption(f"Run {md(run.label)}: " + "; ".join(md(n) for n in notes))


def comparison(runs: pd.DataFrame, a: str, b: str) -> None:
    """Says what measured each compared run's latency (and when that does not predict its target's),
    and which of the two have their quality on generated data."""
    by_id = runs.set_index("run_id")
    for name, r in (("A", a), ("B", b)):
        row = by_id.loc[r]
        caveat = latency_caveat(row["target"], row["backend"])
        st.caption(f"Run {name} latency: {md(row['latency_source'])} · target "
                   f"{TARGET_LABELS.get(row['target'], md(row['target']))}" + (f". {caveat}" if caveat else ""))
    gen = by_id["data_generated"].to_dict()
    which = list(dict.fromkeys(r for r in (a, b) if bool(gen.get(r))))
    if which:
        both = "Both runs'" if len(which) == 2 or a == b else f"Run {'A' if which[0] == a else 'B'}'s"
        st.caption(f"{both} quality numbers are {GENERATED_NOTE}.")


def _ranked_now(p: Project, run) -> None:
    """A run built before its model was ranked: the worst INT8 layers of the ranking stored since."""
    ranking = results.ranking(p, run.calibration_method)
    if ranking is None:
        return
    try:
        worst = worst_int8_layers(ranking, run_policy(p, run.run_dir))
    except (OSError, MixprecError):
        return
    if worst:
        st.caption("The cumulative ranking stored since names these INT8 layers of this run as the worst: "
                   + ", ".join(code(n) for n in worst))
