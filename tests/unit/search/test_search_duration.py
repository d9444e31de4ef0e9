"""Issue 23 §8: a search counts its trials over every pool it opens, in its stage text (where the job list reads
its time left), and a quick search (one calibration method, no put-back pass) runs fewer of them and says so
(core.search.duration, core.search.searcher)."""
from __future__ import annotations

import pytest

from core.jobs import search_params
from core.jobs.params import SearchParams
from core.search.progress import trials_in
from core.project import open_project
from core.search import SearchConfig, search
from core.search.duration import (CountedPool, TrialCount, expected_text, expected_trials, per_trial_seconds,
                                  variant_trials)
from core.search.searcher import QUICK_NOTE


def _run(project, budget="cosine_mean>=0.999", **config):
    stages = []
    result = search(project, SearchConfig(budget, workers=1, verify=False, **config),
                    progress=lambda f, t: stages.append(t))
    counts = [trials_in(t) for t in stages if " of about " in t]
    return result, counts


def test_a_search_counts_every_trial_it_runs_and_ends_on_its_real_total(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    n = sum(l.eligible for l in p.layers)
    result, counts = _run(p, methods=("minmax", "entropy"))
    done = [d for d, _ in counts]
    assert done == sorted(done) and done[0] <= 1 and all(d <= t for d, t in counts)
    assert counts[0][1] == expected_trials(n, 2)  # what it expected before the first trial
    ran = 2 * (n + 1) + len(result.candidates)  # two isolated rankings, then every candidate of every variant
    assert counts[-1] == (ran, ran)
    # again: both rankings are stored now, and the count says they are not run
    _, again = _run(p, methods=("minmax", "entropy"))
    assert again[-1][0] == again[-1][1] == ran - 2 * (n + 1)


def test_a_quick_search_runs_fewer_trials_and_says_what_it_left_out(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    strict = "cosine_mean>=0.99999"  # layers fall back, so the put-back pass has something to try
    full, _ = _run(p, strict)
    quick, counts = _run(p, strict, methods=("minmax",), refine=False)
    minmax = full.candidates[full.candidates["method"] == "minmax"]
    assert len(quick.candidates) < len(minmax) and QUICK_NOTE not in full.message
    assert f"{QUICK_NOTE}: minmax calibration only; no put-back pass" in quick.message
    assert counts[-1][0] == len(quick.candidates)  # the ranking is stored: only the search's trials
    assert "no put-back pass" not in _run(p, strict, methods=("minmax",))[0].message


def test_the_quick_search_goes_with_the_job_params():
    params = search_params("m", methods=["entropy"], refine=False)
    assert SearchParams.from_params(params).methods == ["entropy"] and params["refine"] is False
    assert search_params("m")["methods"] is None and SearchParams.from_params({"model": "m"}).refine is True
    with pytest.raises(Exception, match="cannot be searched"):
        search_params("m", methods=["max"])


def test_expected_trials_and_time():
    assert expected_trials(10, 3) == 3 * 11 + 4 * variant_trials(10)
    assert expected_trials(10, 1, refine=False) == 11 + variant_trials(10, False) == 11 + 2 + 4
    assert expected_trials(10, 1, refine=False, ranked=1) == 6 and expected_trials(10, 1, smooth=True) == \
        2 * 11 + 2 * variant_trials(10)
    assert per_trial_seconds([(37.0, 37), (0, 5), (float("nan"), 3), ("x", 1), (10.0, 0)]) == 1.0
    assert per_trial_seconds([]) is None
    assert expected_text(600, 1.0).startswith("about 10 min (about 600 trials × 1.0 s")
    assert expected_text(600, None).startswith("expected time unknown")


def test_trial_count_and_counted_pool():
    count = TrialCount(0, 5)
    calls = []

    class Pool:
        where = "here"

        def evaluate(self, sets, progress=None, should_stop=None):
            for i, _ in enumerate(sets):
                progress((i + 1) / len(sets), f"trial {i + 1}/{len(sets)}")
            return [len(s) for s in sets]

    pool = CountedPool(Pool(), count.add)
    assert pool.evaluate([set(), {"a"}], lambda f, t: calls.append(t)) == [0, 1] and pool.where == "here"
    assert calls == ["trial 1/2", "trial 2/2"] and (count.done, count.total) == (2, 5)
    pool.evaluate([set()] * 5)
    assert (count.done, count.total) == (7, 7) and count.text() == "7 of about 7 trials"
    count.expect(-100)
    assert count.total == 7
