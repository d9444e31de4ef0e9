"""Streamlit AppTest of the Sensitivity page (views/sensitivity.py): the ranking job and its stored result, the
isolated ranking beside the cumulative one."""
from __future__ import annotations

import json

from core.jobs import JobManager
from tests.fixtures.apptest import ok, page, wait_all


def test_sensitivity_rank_job_and_stored_result(ws):
    at = ok(page("sensitivity"))
    at.button(key="run_rank").click().run()
    wait_all(ws)
    at.run()
    ok(at)
    assert len(at.get("plotly_chart")) == 1 and len(at.dataframe) == 1
    at.radio(key="rank_metric").set_value("snr_db").run()
    ok(at)
    again = ok(page("sensitivity"))  # a new session: the stored ranking, no recomputation
    assert [b.key for b in again.main.button] == ["run_isolated"] and len(JobManager.for_workspace(ws).jobs()) == 1


def test_isolated_ranking_next_to_cumulative(ws):
    at = ok(page("sensitivity", model="sample:tiny-transformer"))
    at.button(key="run_rank").click().run()
    at.button(key="run_isolated").click().run()
    jobs = wait_all(ws)
    assert {j.kind for j in jobs} == {"rank", "isolated"} and {j.queue for j in jobs} == {"rank"}
    at.run()
    ok(at)
    charts = at.get("plotly_chart")
    assert len(charts) == 2 and len(at.dataframe) == 2 and not at.main.button  # the sidebar keeps "New project"
    both = at.dataframe[1].value
    assert list(both.columns[:5]) == ["name", "op_type", "macs", "isolated_rank", "isolated_delta"]
    assert both["isolated_rank"].tolist() == list(range(1, 9)) and sorted(both["cumulative_rank"]) == list(range(1, 9))
    fig = json.loads(charts[1].proto.spec)
    assert [t["xaxis"] for t in fig["data"]] == ["x", "x2"] and len(fig["data"][0]["y"]) == 8
    at.radio(key="iso_mode").set_value("leave-one-out").run()
    ok(at)
    assert at.button(key="run_isolated").label == "Run the leave-one-out ranking"  # not its heading again
    again = ok(page("sensitivity", model="sample:tiny-transformer"))  # stored: nothing to recompute
    assert not again.main.button and len(again.get("plotly_chart")) == 2


def test_the_cumulative_ranking_shows_eligible_layers_unless_asked(ws):
    """Issue 23: the cumulative top-N of non-eligible FP32 layers (their drop is inherited) is hidden by default."""
    at = ok(page("sensitivity"))
    at.button(key="run_rank").click().run()
    wait_all(ws)
    at.run()
    assert at.toggle(key="rank_eligible").value is True
    table = ok(at).dataframe[0].value
    assert len(table) and table["eligible"].all()
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert sum(len(t["y"]) for t in chart["data"]) == len(table)
    assert any("INT8-eligible layer(s) of" in c.value for c in at.caption)
    at.toggle(key="rank_eligible").set_value(False).run()
    every = ok(at).dataframe[0].value
    assert len(every) > len(table) and not every["eligible"].all()
    assert at.button(key="run_isolated").label == "Run the isolated ranking"
