"""The sidebar's compute fields in the jobs (core/jobs/params.py, kinds.py): the Ray address and the comparison
memory budget checked by the job builders and passed on by the runners."""
from __future__ import annotations

import pytest

from core.errors import MixprecError
from core.jobs import isolated_params, kinds, rank_params, search_params
from core.jobs.params import job_label, ray_param
from core.measure.evaluation import MetricSpec
from core.workspace import Workspace


# --- the job params and the child's runners ---------------------------------------------------
def test_builders_check_and_normalise_the_address_and_the_budget():
    assert isolated_params("m")["ray"] is None  # not given: the job's $MIXPREC_RAY_ADDRESS
    assert isolated_params("m", ray=" OFF ")["ray"] == "" and search_params("m", ray="Local")["ray"] == "local"
    assert ray_param("[::1]:6379") == "[::1]:6379" and ray_param("auto") == "auto"
    for bad in ("head", "head:0", "head:65536", "http://head:80", "a b:1", "ray://:1"):
        with pytest.raises(MixprecError, match="not a Ray cluster address"):
            isolated_params("m", ray=bad)
    assert rank_params("m", max_memory=" ")["max_memory"] is None
    assert rank_params("m", max_memory="40%")["max_memory"] == "40%"
    with pytest.raises(MixprecError, match="not a memory size"):
        rank_params("m", max_memory="-2G")
    assert job_label("search", {"ray": "local"}, "s") == "s · trials on a local Ray instance"
    assert job_label("isolated", {"ray": ""}, "iso") == "iso" and job_label("build", {"ray": "h:1"}, "b") == "b"


def test_the_runners_pass_the_address_and_the_budget_on(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(kinds, "_open", lambda p, ws, progress: "project")

    def fake_sensitivity(project, mode, method, workers, progress, ray, metrics=None):
        seen["sensitivity"] = (project, mode, ray)
        seen["metrics"] = metrics
        return "sens"

    def fake_rank(project, method, max_samples, progress, max_memory, runner):
        seen["rank"] = max_memory
        seen["runner"] = runner
        return "ranking"

    monkeypatch.setattr(kinds, "sensitivity", fake_sensitivity)
    monkeypatch.setattr(kinds, "rank_layers", fake_rank)
    monkeypatch.setattr(kinds, "search", lambda project, config, progress: seen.setdefault("search", config.ray))
    for name in ("sensitivity_file", "save_ranking", "save_search"):  # sensitivity() stores its own table
        monkeypatch.setattr(kinds, name, lambda *a, **k: tmp_path / "result.json")
    ws = Workspace(tmp_path)
    kinds.run_isolated(isolated_params("m", mode="leave-one-out", ray="h:6379"), ws, lambda f, t: None)
    kinds.run_search(search_params("m", ray="local"), ws, lambda f, t: None)
    kinds.run_rank(rank_params("m", max_memory="2G"), ws, lambda f, t: None)
    assert seen == {"sensitivity": ("project", "leave-one-out", "h:6379"), "search": "local", "rank": "2G",
                    "runner": "auto", "metrics": MetricSpec()}
    kinds.run_isolated({"model": "m"}, ws, lambda f, t: None)  # a record from before the field: no address
    assert seen["sensitivity"][2] is None and seen["metrics"].is_default
    # what quality is measured on (issue 22 §3) travels in the params
    kinds.run_isolated(isolated_params("m", metrics={"outputs": ["scores=output[...,4:]"]}), ws, lambda f, t: None)
    assert seen["metrics"] == MetricSpec(("scores=output[...,4:]",))
