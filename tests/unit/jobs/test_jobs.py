"""Background jobs: real child processes on the tiny samples, crashes, cancel, queue order, restart."""
from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from core.errors import MixprecError
from core.jobs import Job, JobManager, build_params, isolated_params, rank_params, search_params
from core.jobs.params import BuildParams, SearchParams
from core.project import open_project
from core.store.results import load_ranking, load_sensitivity
from core.workspace import Workspace, atomic_write_json


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path)


@pytest.fixture
def mgr(ws):
    return JobManager(ws)


def test_build_job_done_with_metrics(ws, mgr):
    project = open_project("sample:tiny-cnn", ws=ws)
    policy = project.default_policy()
    job = mgr.submit("build", build_params("sample:tiny-cnn", policy.to_json(), backend="onnxruntime"),
                     label="default")
    assert job.queue == "build-onnxruntime"
    done = mgr.wait(job.id, 120)
    assert done.status == "done", done.error
    metrics = json.loads(open(done.result_path).read())
    assert metrics["policy_sha256"] == policy.sha256
    assert done.progress == 1.0 and done.started and done.finished >= done.started
    assert done.child_pid and done.child_pid != done.server_pid


def test_rank_job_stores_ranking_by_model_data_and_method(ws, mgr):
    project = open_project("sample:tiny-cnn", ws=ws)
    assert load_ranking(ws, project, "minmax") is None
    done = mgr.wait(mgr.submit("rank", rank_params("sample:tiny-cnn")).id, 120)
    assert done.status == "done", done.error
    ranking = load_ranking(ws, project, "minmax")
    table = ranking.table
    assert table is not None and len(table) > 0 and "cos_drop" in table.columns
    assert table["eligible"].dtype == bool and ranking.method == "minmax"  # stored as JSON with its dtypes
    eligible = {l.name: l.eligible for l in project.layers}
    assert table["eligible"].tolist() == [eligible[n] for n in table["name"]]
    assert load_ranking(ws, project, "entropy") is None


def test_isolated_job_stores_its_table_beside_the_cumulative_one(ws, mgr):
    project = open_project("sample:tiny-transformer", ws=ws)
    job = mgr.submit("isolated", isolated_params("sample:tiny-transformer"))
    assert job.queue == "rank"  # analyses share one queue, builds are not blocked
    done = mgr.wait(job.id, 120)
    assert done.status == "done", done.error
    table = load_sensitivity(ws, project, "minmax", "isolated").table
    assert table["rank"].tolist() == list(range(1, 9)) and set(table["mode"]) == {"isolated"}
    assert load_ranking(ws, project) is None
    assert load_sensitivity(ws, project, "minmax", "leave-one-out") is None


def test_search_params_normalise_and_check_the_budget():
    assert search_params("m", budget=" top1_drop <= 0.5% ")["budget"] == "top1_drop<=0.005"
    with pytest.raises(MixprecError, match="cannot read the budget"):
        search_params("m", budget="cosine>0.9")


def test_params_defaults_are_defined_once():
    """The builders write every field, the runners read them back with their dataclass (a job
    record of an older mixprec that lacks a field gets the same default)."""
    params = search_params("m")
    assert SearchParams.from_params(params) == SearchParams("m", budget="cosine_mean>=0.99")
    assert SearchParams.from_params({"model": "m", "budget": "snr_db>=30"}).workers == params["workers"] == 2
    assert BuildParams.from_params(build_params("m", "{}", label="x") | {"unknown": 1}).label == "x"


def test_user_error_in_job_carries_message(ws, mgr):
    other = open_project("sample:tiny-transformer", ws=ws).default_policy().to_json()
    done = mgr.wait(mgr.submit("build", build_params("sample:tiny-cnn", other)).id, 120)
    assert done.status == "failed"
    assert "does not fit the model" in done.error and "Fix:" in done.error


@pytest.mark.parametrize("how,expect", [("abort", "signal 6"), ("kill9", "likely out of memory"),
                                        ("exit", "exited with code 7")])
def test_native_crash_fails_job_and_manager_survives(mgr, how, expect):
    crashed = mgr.wait(mgr.submit("crash", {"how": how}, queue="test").id, 60)
    assert crashed.status == "failed" and expect in crashed.error
    after = mgr.wait(mgr.submit("sleep", {"seconds": 0.1, "steps": 2}, queue="test").id, 60)
    assert after.status == "done"


def test_cancel_running_and_queued(mgr):
    running = mgr.submit("sleep", {"seconds": 60, "steps": 60}, queue="test")
    queued = mgr.submit("sleep", {"seconds": 60, "steps": 60}, queue="test")
    deadline = time.monotonic() + 60
    while mgr.get(running.id).status != "running" or mgr.get(running.id).progress == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert mgr.queue_position(queued.id) == 0
    assert mgr.cancel(queued.id).status == "cancelled"
    mgr.cancel(running.id)
    job = mgr.wait(running.id, 30)
    assert job.status == "cancelled" and job.progress < 1 and not job.result_path  # stopped, not run to its end
    assert mgr.get(queued.id).started is None


def test_queue_is_fifo_one_at_a_time(mgr):
    ids = [mgr.submit("sleep", {"seconds": 0.3, "steps": 3, "tag": str(i)}, queue="test").id for i in range(4)]
    other = mgr.submit("sleep", {"seconds": 0.3, "steps": 3}, queue="other")
    jobs = [mgr.wait(i, 120) for i in ids]
    assert all(j.status == "done" for j in jobs)
    for a, b in zip(jobs, jobs[1:]):
        assert a.finished <= b.started  # one at a time, in submission order
    assert mgr.wait(other.id, 60).status == "done"
    assert mgr.wait(other.id).started < jobs[-1].finished  # another queue runs alongside
    assert [j.id for j in mgr.jobs()][:5] == [other.id, *reversed(ids)]


def _dead_pid() -> int:
    p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    p.start()
    p.join()
    return p.pid


def test_restart_marks_orphaned_jobs_interrupted(ws):
    pid = _dead_pid()
    for status in ("running", "queued"):
        job = Job(id=f"old-{status}", kind="build", label="x", queue="build-onnxruntime", params={},
                  status=status, stage="building", server_pid=pid)
        atomic_write_json(ws.jobs / f"{job.id}.json", job.__dict__)
    mgr = JobManager(ws)
    for status in ("running", "queued"):
        job = mgr.get(f"old-{status}")
        assert job.status == "interrupted" and job.finished and str(pid) in job.error
    assert not any(j.active for j in mgr.jobs())


def test_restart_stops_the_orphaned_child_only(ws):
    import subprocess
    import sys

    job = Job(id="orphan", kind="sleep", label="x", queue="test", params={}, status="running",
              server_pid=_dead_pid())
    atomic_write_json(ws.jobs / "orphan.json", job.__dict__)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "core.jobs", str(ws.jobs / "orphan.json")])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job.child_pid = child.pid
    atomic_write_json(ws.jobs / "orphan.json", job.__dict__)
    try:
        JobManager(ws)
        assert child.wait(10) == -9
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_only_the_owner_cancels_unless_admin(mgr, monkeypatch):
    """Issue 13 §9: a job belongs to the session that submitted it; others see it but cannot cancel it,
    unless the server runs with MIXPREC_ADMIN=1. A job without an owner is everyone's."""
    monkeypatch.delenv("MIXPREC_ADMIN", raising=False)
    mine = mgr.submit("sleep", {"seconds": 60, "steps": 60}, queue="owners", owner="session-a")
    queued = mgr.submit("sleep", {"seconds": 60, "steps": 60}, queue="owners", owner="session-a")
    assert mgr.get(mine.id).owner == "session-a" and mine.id in [j.id for j in mgr.jobs()]  # everyone sees it
    for other in ("session-b", None, ""):
        with pytest.raises(MixprecError, match="belongs to another session.*MIXPREC_ADMIN=1"):
            mgr.cancel(queued.id, owner=other)
    deadline = time.monotonic() + 60  # the supervisor starts the first job (then the second is first in line)
    while mgr.get(mine.id).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mgr.get(mine.id).status == "running"
    assert mgr.get(queued.id).status == "queued" and mgr.queue_position(queued.id) == 0
    monkeypatch.setenv("MIXPREC_ADMIN", "1")
    assert mgr.cancel(queued.id, owner="session-b").status == "cancelled"
    monkeypatch.delenv("MIXPREC_ADMIN")
    mgr.cancel(mine.id, owner="session-a")
    assert mgr.wait(mine.id, 30).status == "cancelled"
    anyone = mgr.submit("sleep", {"seconds": 60, "steps": 60}, queue="owners2")
    assert mgr.cancel(anyone.id, owner="session-b").status in ("cancelled", "queued", "running")
    assert mgr.wait(anyone.id, 30).status == "cancelled"


def test_a_job_records_the_notes_of_its_child(ws, mgr):
    """A corrupt cache the child recomputed is noted in the job record (the page shows it)."""
    project = open_project("sample:tiny-cnn", ws=ws)
    first = mgr.wait(mgr.submit("build", build_params("sample:tiny-cnn", project.default_policy().to_json(),
                                                      backend="onnxruntime")).id, 120)
    assert first.status == "done", first.error
    for cache in ws.calib.glob("*.json"):
        cache.write_text("{corrupt")
    again = mgr.wait(mgr.submit("build", build_params("sample:tiny-cnn", project.default_policy().to_json(),
                                                      backend="onnxruntime")).id, 120)
    assert again.status == "done", again.error
    assert any("cached calibration" in n and "computed again" in n for n in again.notes), again.notes


def test_children_are_niced_from_spawn():
    """Issue 13 §10: the supervisor lowers a child's priority right after spawning it (its imports
    run niced too), and never raises it."""
    import os
    import subprocess as sp
    import sys

    from core.jobs.manager import CHILD_NICENESS, lower_priority

    child = sp.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        lower_priority(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == CHILD_NICENESS >= 10
        lower_priority(child.pid)  # idempotent: not cumulative like os.nice
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == CHILD_NICENESS
    finally:
        child.kill()
        child.wait()
