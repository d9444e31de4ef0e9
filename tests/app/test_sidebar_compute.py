"""The sidebar's compute fields (issue 14 §4, ui/cluster.py): the Ray cluster address the trials of the
isolated / leave-one-out sensitivity and of the search run on, and the rank's comparison memory
budget; both checked, kept with the project, and carried by the jobs into the child process
(core/jobs/params.py, kinds.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.jobs import JobManager
from core.sensitivity.distributed import RAY_ENV
from core.store.drafts import load_project
from core.workspace import Workspace
from tests.fixtures import ROOT

APP = str(ROOT / "app.py")
REFUSED = "127.0.0.1:1"  # a well-formed address where nothing listens: the child's connect fails at once


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path))
    monkeypatch.delenv(RAY_ENV, raising=False)
    return Workspace(tmp_path)


def page(name: str | None = None, model: str = "sample:tiny-transformer", query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if query:
        at.query_params.update(query)
    else:
        at.session_state["source"] = {"model": model, "data": None, "eval_data": None}
    at.run()
    if name:
        at.switch_page(f"views/{name}.py").run()
    return at


def no_exception(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown(el) -> str:
    """The text an element shows, without the escapes (ui.md) that keep user text literal."""
    return re.sub(r"\\(.)", r"\1", el.value)


def errors(at: AppTest) -> list[str]:
    return [shown(e) for e in at.error]


def stop(ws: Workspace, at: AppTest, job) -> None:
    """Cancel a job the session ``at`` started (the test needs only its params), and let it end."""
    mgr = JobManager.for_workspace(ws)
    mgr.cancel(job.id, at.session_state["owner_token"])
    assert mgr.wait(job.id, 60).status in ("cancelled", "failed")


def field(at: AppTest, key: str = "ray_address_field"):
    return at.sidebar.text_input(key=key)


def test_the_address_goes_with_the_isolated_job_into_the_child(ws):
    """The field's address is the job's ``ray`` param and label, and the child really uses it: its
    sensitivity tries that cluster (nothing listens there, so the job fails saying so)."""
    at = no_exception(page("sensitivity"))
    assert field(at).value == "" and any("local process pool" in c.value for c in at.sidebar.caption)
    field(at).input(f"  {REFUSED} ").run()
    no_exception(at)
    assert not errors(at)
    assert any(REFUSED in c.value and "Ray tasks on the cluster" in c.value for c in at.sidebar.caption)
    at.button(key="run_isolated").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.kind == "isolated" and job.params["ray"] == REFUSED
    assert job.label.endswith(f"trials on Ray {REFUSED}")
    done = JobManager.for_workspace(ws).wait(job.id, 180)
    assert done.status == "failed" and f"cannot connect to the Ray cluster at {REFUSED}" in done.error, done.error


def test_a_bad_address_is_an_error_and_the_app_goes_on(ws):
    at = no_exception(page("sensitivity"))
    field(at).input("http://head node").run()
    no_exception(at)
    assert len(errors(at)) == 1 and "is not a Ray cluster address" in errors(at)[0] and "Fix:" in errors(at)[0]
    assert at.sidebar.expander[0].proto.expanded  # the error is not hidden in a closed expander
    at.button(key="run_isolated").click().run()  # the page still works, on the last valid choice
    no_exception(at)
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.params["ray"] == "" and "trials on" not in job.label
    stop(ws, at, job)
    field(at).input("local").run()
    no_exception(at)
    # no address error now; the cancelled run is still the last run of this sensitivity (where it runs
    # does not change what it computes), so the page says so
    assert [e for e in errors(at) if "Ray" in e] == [] and errors(at) == ["The last run cancelled: cancelled by the user"]
    assert any("Ray instance each job starts" in c.value for c in at.sidebar.caption)


def test_the_address_is_saved_with_the_project_and_the_search_carries_it(ws):
    at = no_exception(page("precision", model="sample:tiny-cnn"))
    field(at).input("ray://head:10001").run()
    no_exception(at)
    project = at.query_params["project"]
    project = project[0] if isinstance(project, list) else project
    assert load_project(ws, project).settings["ray_address"] == "ray://head:10001"
    back = no_exception(page("precision", query={"project": project}))  # a reload of the project's URL
    assert field(back).value == "ray://head:10001"
    back.button(key="start_search").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    stop(ws, back, job)
    assert job.kind == "search" and job.params["ray"] == "ray://head:10001"
    assert "trials on Ray ray://head:10001" in job.label


def test_the_server_variable_is_the_default_and_clearing_it_means_local(ws, monkeypatch):
    monkeypatch.setenv(RAY_ENV, REFUSED)
    at = no_exception(page("sensitivity"))
    assert field(at).value == REFUSED and any(REFUSED in c.value for c in at.sidebar.caption)
    field(at).input("").run()
    at.button(key="run_isolated").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.params["ray"] == ""  # explicit: the child does not fall back to the variable it inherits
    done = JobManager.for_workspace(ws).wait(job.id, 180)
    assert done.status == "done", done.error
    no_exception(at.run())
    assert any("Trials ran on: local process pool (2 workers)" in shown(c) for c in at.caption)


def test_the_comparison_memory_budget_reaches_the_rank(ws):
    at = no_exception(page("sensitivity", model="sample:tiny-cnn"))
    mem = field(at, "compare_memory_field")
    mem.input("lots").run()
    assert any("is not a memory size" in e for e in errors(at))
    field(at, "compare_memory_field").input("64M").run()
    no_exception(at)
    assert not errors(at) and any("within 64.0 MiB" in c.value for c in at.sidebar.caption)
    at.button(key="run_rank").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.params["max_memory"] == "64M" and "comparison within 64M" in job.label
    done = JobManager.for_workspace(ws).wait(job.id, 180)
    assert done.status == "done", done.error
    assert json.loads(Path(done.result_path).read_text())["budget_bytes"] == 64 << 20


@pytest.fixture(scope="module")
def ray_head():
    """A one-node Ray cluster on this machine (two CPUs, a 100 MB object store); this process does
    not connect to it: the job's child process does."""
    pytest.importorskip("ray", reason="Ray is not installed (scripts/setup.sh installs it)")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 100 << 20,
                                                      "include_dashboard": False})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_a_dashboard_job_runs_its_trials_on_the_ray_cluster(ws, ray_head):
    """End to end: the sidebar's address, the isolated job's child, its trials as Ray tasks, and the
    Sensitivity page saying where they ran."""
    at = no_exception(page("sensitivity", model="sample:tiny-cnn"))
    field(at).input(ray_head.address).run()
    at.button(key="run_isolated").click().run()
    (job,) = JobManager.for_workspace(ws).jobs()
    assert job.params["ray"] == ray_head.address and job.label.endswith(f"trials on Ray {ray_head.address}")
    done = JobManager.for_workspace(ws).wait(job.id, 300)
    assert done.status == "done", done.error
    no_exception(at.run())
    assert any("Trials ran on: Ray cluster: 1 node, 2 CPUs" in shown(c) for c in at.caption), \
        [c.value for c in at.caption]
