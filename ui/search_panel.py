"""Precision page, search under a quality budget: the budget, the search job, its Pareto front
and "Use this policy" for a front point."""
from __future__ import annotations

import streamlit as st

from core.errors import MixprecError
from core.jobs import search_params
from core.plots import plot_pareto
from core.project import Project
from core.runs import GENERATED_NOTE
from core.search import BUDGET_METRICS
from ui import common as ui


def section(p: Project) -> None:
    with st.expander("Search under a budget"):
        src = ui.source()
        s1, s2 = st.columns([3, 1])
        budget = s1.text_input("Quality budget", "cosine_mean>=0.99", key="search_budget",
                               help="METRIC>=VALUE, or top1_drop<=VALUE (e.g. 0.5%); METRIC: "
                                    + ", ".join(BUDGET_METRICS))
        smooth = s2.checkbox("SmoothQuant-style smoothing", key="search_smooth")
        try:
            params = search_params(src["model"], src["data"], src["eval_data"], budget, smooth, shapes=ui.shapes())
        except MixprecError as e:
            st.error(str(e))
            return
        result = ui.search_result(p, params["budget"], smooth)
        ui.job_button("search", params, f"search {params['budget']} · {p.model.name}", "Start the search",
                      "start_search", result is not None, "Not searched yet for this budget: the search chooses on "
                      "half of the evaluation data and verifies on the other half (MiniLM: a few minutes).")
        if result is not None:
            _result(p, result)


def _result(p: Project, result) -> None:
    """A stored ``SearchResult``: verdict, Pareto chart, the front and the front point to use."""
    met = result.met_on_dev and result.met_on_holdout is not False
    (st.success if met else st.warning)(ui.md(result.message))
    if result.run is not None and result.run.data_generated and GENERATED_NOTE not in result.message:
        st.caption(f"The search's quality numbers are {GENERATED_NOTE}.")  # a search stored before it said so
    st.plotly_chart(plot_pareto(result.candidates, result.chosen, result.budget), key="pareto_chart")
    front = result.front
    st.dataframe(front, hide_index=True)
    f1, f2 = st.columns([3, 1])
    points = {r.candidate: f"#{r.candidate}{' (chosen)' if r.candidate == result.chosen else ''}: "
              f"{r.n_int8} layers INT8, {r.method}, {r.est_ms:.3f} ms, {r.quality:.4f}" for r in front.itertuples()}
    pick = f1.selectbox("Front point", list(points), format_func=points.get, key="front_pick")
    f2.write("")
    if f2.button("Use this policy", type="primary", key="use_front"):
        try:
            ui.set_policy(p, result.front_policy(int(pick)))
            ui.flash(f"Front point #{pick} is now the current policy: Rebuild to measure it.", rerun=True)
        except MixprecError as e:
            st.error(str(e))
