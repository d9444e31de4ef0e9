"""Precision: undo/redo, the ranking the page uses, bulk actions, a search under a budget, the
charts to select layers on, the table of every layer (filters, row selection, one click to set
the selection's precision, boundaries) and the policy's summary, then the diff and Rebuild (each
a component in ui/). Every edit is one undoable step of the project's draft, autosaved."""
import streamlit as st

from ui import (bulk_actions, draft, estimate_panel, layer_picker, precision_editor, rebuild, saved_project,
                search_panel, session)

p = saved_project.project()
summary = st.container()  # drawn above the actions, filled once the page's edits are in
history = st.container()  # undo / redo, likewise: they name the edits made further down
rank = layer_picker.pick_ranking(p)
bulk_actions.section(p, rank)
search_panel.section(p)
session.show_flash()
pol = draft.policy(p)
layer_picker.charts(p, pol, rank)
st.subheader("Layers")
pol = precision_editor.section(p, pol, rank)
with summary:
    counts = precision_editor.summary(p, pol)
with history:
    precision_editor.history(p)
estimate_panel.section(p, pol)
rebuild.section(p, pol, counts)
