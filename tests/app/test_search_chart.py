"""Streamlit AppTest of the Precision page's search result (ui/search_panel.py) as issue 23 saw it: the Pareto
chart names "fails the budget" once in its legend (the chart marks the failing candidates; the page used to add a
second trace of its own), and the front table shows both shares in percent (it mixed 0.9459, a fraction, with
18.3277, a percent)."""
from __future__ import annotations

import json

from tests.fixtures.apptest import ok, page, wait_all

MODEL = "sample:tiny-transformer"


def test_pareto_legend_says_fails_the_budget_once_and_the_front_is_in_percent(ws):
    at = ok(page("precision", model=MODEL))
    at.text_input(key="search_budget").input("cosine_mean>=0.99990").run()  # some of the 4 candidates fail it
    at.button(key="start_search").click().run()
    wait_all(ws)
    at.run()
    assert not at.exception
    chart = next(c for c in at.get("plotly_chart") if c.proto.id.endswith("pareto_chart"))
    names = [t.get("name") for t in json.loads(chart.proto.spec)["data"] if t.get("showlegend") is not False]
    assert names.count("fails the budget") == 1, names
    front = next(d.value for d in at.dataframe if "INT8 MAC share (%)" in d.value.columns)
    assert "reformat share (%)" in front.columns and "int8_mac_share" not in front.columns
    assert front["INT8 MAC share (%)"].max() > 1  # a percent (100.0), not the fraction 1.0
