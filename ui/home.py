"""The home page: what mixprec does and where each step lives."""
from __future__ import annotations

import streamlit as st

from ui import job_panel


def page(infos) -> None:
    st.markdown(
        "Load a model, see which layers are sensitive to INT8, choose FP32 / FP16 / INT8 per layer, "
        "rebuild, and compare what each choice costs in latency, reformat overhead and quality. "
        "Then export the precision policy.")
    for info in infos:
        st.page_link(info.script, label=f"{info.title}: {info.summary}", icon=info.icon)
    job_panel.show(limit=5)
