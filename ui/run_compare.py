"""Results page, two runs side by side: their metrics (columns named by the runs' labels, with
units), a per-layer chart of A against B (time and precision) and the layers whose precision differs."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.display.charts import plot_layer_comparison
from core.display.precision_edit import policy_diff
from core.display.tables import layer_comparison, run_columns, run_comparison_table, run_title
from core.errors import MixprecError
from core.project import Project
from core.store.runs import load_run_per_layer, run_dir, run_policy
from ui import run_notes
from ui.session import md


def section(p: Project, runs: pd.DataFrame) -> None:
    """Pick runs A and B (default: the one before the newest, and the newest)."""
    ids = list(runs["run_id"])
    st.subheader("Compare two runs")
    a_col, b_col = st.columns(2)
    title = {r: run_title(runs, r) for r in ids}
    a = a_col.selectbox("Run A", ids, index=1, format_func=title.get, key="cmp_a")
    b = b_col.selectbox("Run B", ids, index=0, format_func=title.get, key="cmp_b")
    st.dataframe(run_comparison_table(runs, a, b))
    run_notes.comparison(runs, a, b)
    col_a, col_b = run_columns(runs, a, b)
    try:
        layers = layer_comparison(load_run_per_layer(run_dir(p.ws, a)), load_run_per_layer(run_dir(p.ws, b)))
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
