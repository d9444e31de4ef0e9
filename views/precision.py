"""Precision: bulk actions, a search under a budget, one row per layer with a FP32/FP16/INT8
select and the policy's summary, then the diff and Rebuild (each a component in ui/)."""
import streamlit as st

from ui import bulk_actions, precision_editor, rebuild, search_panel
from ui import common as ui

p = ui.project()
ranking = ui.ranking(p)
table = ranking.table if ranking is not None else None
summary = st.container()  # drawn above the actions, filled once the table's edits are in
bulk_actions.section(p, table)
search_panel.section(p)
ui.show_flash()
pol = precision_editor.section(p, table)
with summary:
    counts = precision_editor.summary(p, pol)
rebuild.section(p, pol, counts)
