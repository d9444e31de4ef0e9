"""Results page, two runs side by side: their metrics (columns named by the runs' labels, with
units), whether they are the same policy and how noisy their speedups are, a per-layer chart of A against B
(time and precision; FP16 simulated on the CPU cross-hatched) and the layers whose precision differs."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.display.charts import plot_layer_comparison
from core.display.precision_edit import policy_diff
from core.display.tables import layer_comparison, run_columns, run_comparison_table, run_title, same_policy_note
from core.errors import MixprecError
from core.project import Project
from core.store.runs import load_run_per_layer, run_dir, run_policy
from ui import run_notes
from ui.session import fragment_rerun, md


PICKED, NEWEST = "cmp:picked", "cmp:newest"  # the (A, B) the user picked (None: follow the newest two runs)


def _follow_the_newest(ids: list[str]) -> None:
    """When a new run lands, A and B become the one before the newest and the newest, unless the user picked
    a pair (whose runs still exist); a picked run that was deleted since falls back to the newest two."""
    s = st.session_state
    picked = s.get(PICKED)
    if picked is not None and not all(r in ids for r in picked):
        picked = s[PICKED] = None
    if s.get(NEWEST) != ids[0] or any(s.get(k) not in ids for k in ("cmp_a", "cmp_b")):
        s[NEWEST] = ids[0]
        s["cmp_a"], s["cmp_b"] = picked or (ids[1], ids[0])


def _picked(ids: list[str]) -> None:
    s = st.session_state
    if fragment_rerun():  # a job list's poll carries the pickers' values as the browser had them: stale
        s["cmp_a"], s["cmp_b"] = s.get(PICKED) or (ids[1], ids[0])
        return
    pair = (s.get("cmp_a"), s.get("cmp_b"))
    s[PICKED] = None if pair == (ids[1], ids[0]) else pair


def section(p: Project, runs: pd.DataFrame) -> None:
    """Pick runs A and B (default: the one before the newest, and the newest)."""
    ids = list(runs["run_id"])
    st.subheader("Compare two runs")
    a_col, b_col = st.columns(2)
    title = {r: run_title(runs, r) for r in ids}
    _follow_the_newest(ids)
    a = a_col.selectbox("Run A", ids, format_func=title.get, key="cmp_a", on_change=_picked, args=(ids,),
                        persist_state="session")
    b = b_col.selectbox("Run B", ids, format_func=title.get, key="cmp_b", on_change=_picked, args=(ids,),
                        persist_state="session")
    st.dataframe(run_comparison_table(runs, a, b))
    same = same_policy_note(runs, a, b)  # one policy measured twice: how noisy the figure is
    if same:
        st.info(same, icon=":material/content_copy:")
    by_id = runs.set_index("run_id")
    if str(by_id.at[a, "input_shapes"] or "") != str(by_id.at[b, "input_shapes"] or ""):
        st.warning(md(f"A and B were built at other shapes (A {by_id.at[a, 'input_shapes'] or 'not recorded'}, "
                      f"B {by_id.at[b, 'input_shapes'] or 'not recorded'}): their latencies are not comparable."),
                   icon=":material/warning:")
    run_notes.comparison(runs, a, b)
    col_a, col_b = run_columns(runs, a, b)
    try:
        layers = layer_comparison(load_run_per_layer(run_dir(p.ws, a)), load_run_per_layer(run_dir(p.ws, b)),
                                  by_id.at[a, "backend"], by_id.at[b, "backend"])
        top = min(30, len(layers))
        st.plotly_chart(plot_layer_comparison(layers, col_a, col_b, top=top), key="compare_layers_chart")
    except (OSError, MixprecError) as e:
        st.error(md(e))
    try:
        diff = policy_diff(run_policy(p, run_dir(p.ws, a)), run_policy(p, run_dir(p.ws, b)), p.layers)
    except (OSError, MixprecError) as e:
        st.error(md(e))
        return
    st.caption(f"{len(diff)} layer(s) differ in precision between A and B")
    st.dataframe(diff.rename(columns={"built": col_a, "now": col_b}), hide_index=True)
