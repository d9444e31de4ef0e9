"""Issue 23 §8 and the Search expander on the Precision page (ui/search_panel.py): the full or a quick search
with the time each is expected to take (unknown until a trial of the model was timed), the quick search's
job and stored result, and the panel kept open while a search of the model runs."""
from __future__ import annotations

import os

from core.jobs import Job, JobManager
from core.workspace import atomic_write_json
from tests.fixtures.apptest import captions_text, ok, page, shown, wait_all

MODEL = "sample:tiny-transformer"


def _search_expander(at):
    return next(e for e in at.expander if e.label == "Search under a budget")


def test_expected_time_is_unknown_until_trials_were_timed_then_the_quick_search_runs(ws):
    at = ok(page("precision", model=MODEL))
    kind = at.radio(key="search_kind")
    assert kind.value == "full" and kind.options[1].startswith("Quick: minmax calibration only")
    assert "Expected time unknown: no trial of this model has been timed yet" in captions_text(at)
    mgr = JobManager.for_workspace(ws)
    at.switch_page("views/sensitivity.py").run()
    at.button(key="run_isolated").click().run()  # times 9 trials of this model
    wait_all(ws)
    at.switch_page("views/precision.py").run()
    text = captions_text(ok(at))
    assert "Expected: full search" in text and "the time per trial measured on this model" in text
    assert "quick search" in text and "Expected time unknown" not in text
    at.radio(key="search_kind").set_value("quick").run()
    assert at.button(key="start_search").label == "Start the quick search"
    at.button(key="start_search").click().run()
    job = next(j for j in mgr.jobs(kind="search"))
    assert job.params["methods"] == ["minmax"] and job.params["refine"] is False and job.label.startswith("quick ")
    wait_all(ws)
    at.run()
    verdicts = [shown(s) for s in ok(at).success] + [shown(w) for w in at.warning]
    assert any("Quick search: minmax calibration only; no put-back pass" in v for v in verdicts)
    assert not [b for b in at.button if b.key == "start_search"]  # the quick search is stored
    at.radio(key="search_kind").set_value("full").run()  # the full one is not: it can be started
    assert at.button(key="start_search").label == "Start the search"
    assert any("is a quick one" in i.value for i in ok(at).info)


def test_the_search_panel_stays_open_while_a_search_of_the_model_runs(ws):
    assert not _search_expander(ok(page("precision", model=MODEL))).proto.expanded
    job = Job(id="20250101-000000-00000001", kind="search", label="search", queue="rank",
              params={"model": MODEL}, status="running", stage="isolated: trial 3/9", server_pid=os.getpid())
    atomic_write_json(ws.jobs / f"{job.id}.json", job.__dict__)
    at = ok(page("precision", model=MODEL))
    assert _search_expander(at).proto.expanded  # a reload shows it running
    assert not _search_expander(ok(page("precision"))).proto.expanded  # another model's page: not its search
    atomic_write_json(ws.jobs / f"{job.id}.json", job.__dict__ | {"status": "done", "stage": "done"})
    assert _search_expander(ok(at.run())).proto.expanded  # it ended while this session looked: the result shows
    assert not _search_expander(ok(page("precision", model=MODEL))).proto.expanded  # a new session: as before


def test_the_search_starts_from_the_drafts_network_default_and_is_kept_per_default(ws):
    """Issue 23 §7: a search started from the dashboard starts from the draft's network default (the job carries it),
    and a stored FP32-default search is not shown for an FP16-default draft: that one is searched on its own."""
    from core.project import open_project
    from tests.fixtures.apptest import policy_key

    model = "sample:tiny-cnn"
    mgr = JobManager.for_workspace(ws)
    at = ok(page("precision", model=model))
    assert "Starts from the draft's network default, FP32" in captions_text(at)
    at.radio(key="search_kind").set_value("quick").run()
    at.button(key="start_search").click().run()
    wait_all(ws)
    (first,) = mgr.jobs(kind="search")
    assert first.params["network_default"] == "fp32"
    at.run()
    assert not [b for b in ok(at).button if b.key == "start_search"]  # the FP32 search is stored and shown
    at.radio(key="network_default").set_value("fp16").run()
    assert "Starts from the draft's network default, FP16" in captions_text(ok(at))
    start = at.button(key="start_search")  # the FP32 search is not the FP16 draft's
    assert any("Not searched yet for this budget" in i.value and "network default FP16" in i.value for i in at.info)
    start.click().run()
    job = next(j for j in mgr.jobs(kind="search") if j.id != first.id)
    assert job.params["network_default"] == "fp16" and "network default FP16" in job.label
    wait_all(ws)
    at.run()
    verdicts = [shown(s) for s in ok(at).success] + [shown(w) for w in at.warning]
    assert any("Network default FP16: every layer the search does not make INT8 is FP16" in v for v in verdicts)
    assert not [b for b in at.button if b.key == "start_search"]
    p = open_project(model, ws=ws)
    assert at.session_state[policy_key(ws, model)].network_default == "fp16" and p.target == "tensorrt"


def test_the_expected_trials_count_only_the_rankings_of_the_searchs_own_base(ws):
    """A stored isolated ranking is measured on the FP32-default policy; a search from the draft's FP16 network
    default measures its own, so its expected trials do not count that one as stored (they did: the time was
    short by a ranking's trials)."""
    import re

    from core.project import open_project

    p = open_project(MODEL, ws=ws)
    n = sum(1 for l in p.layers if l.eligible)

    def quick_trials(at) -> int:
        text = captions_text(at)
        m = re.search(r"quick (?:search [^(]*\(|one )about (\d+)", text)
        assert m, text
        return int(m[1])

    at = ok(page("precision", model=MODEL))
    unranked = quick_trials(at)
    at.switch_page("views/sensitivity.py").run()
    at.button(key="run_isolated").click().run()  # minmax, on the FP32 default
    wait_all(ws)
    at.switch_page("views/precision.py").run()
    assert quick_trials(ok(at)) == unranked - (n + 1)  # its ranking is stored: not measured again
    at.radio(key="network_default").set_value("fp16").run()
    assert ok(at).radio(key="network_default").value == "fp16"
    assert quick_trials(at) == unranked  # from FP16 the search ranks again
