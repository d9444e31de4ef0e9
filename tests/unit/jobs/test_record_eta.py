"""Issue 23: a job record with fields of the wrong type is shown as failed, never crashes a reader
(core.jobs.record.Job.from_dict); the ETA of a long job from its trials (core.search.progress); the owner token of a
project's jobs (core.jobs.record.project_owner)."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from core.jobs import Job, JobManager
from core.jobs.record import project_owner
from core.search.progress import eta_seconds, eta_text, minutes_text, overall_text, trials_in
from core.workspace import Workspace, atomic_write_json

GOOD = {"id": "20250101-000000-abcd1234", "kind": "search", "label": "search x", "queue": "rank",
        "params": {"model": "m"}, "status": "running", "progress": 0.3, "stage": "isolated: trial 3/10",
        "created": 1000.0, "started": 1010.0, "finished": None, "error": "", "result_path": "", "server_pid": 1,
        "child_pid": 2, "exit_code": None, "owner": "o", "notes": []}


def test_a_good_record_reads_as_it_was_written():
    job = Job.from_dict(GOOD | {"a_newer_field": 1})
    assert asdict(job) == GOOD and not job.damaged and job.active
    assert Job.from_dict({"id": "x", "kind": "build", "label": "", "queue": "q", "params": {}}).status == "queued"


@pytest.mark.parametrize("field, value", [
    ("progress", "abc"), ("progress", None), ("progress", float("nan")), ("created", "yesterday"),
    ("started", [1]), ("finished", True), ("params", ["model"]), ("notes", "a note"), ("notes", [1, 2]),
    ("label", 123), ("status", "exploded"), ("status", 5), ("server_pid", "1"), ("child_pid", 1.5),
    ("stage", {"x": 1}), ("id", None), ("kind", 7)])
def test_a_field_of_the_wrong_type_marks_the_record_failed(field, value):
    job = Job.from_dict(GOOD | {field: value})
    assert job.damaged and job.status == "failed" and not job.active
    assert f"{field}: {value!r}"[:40] in job.error and "damaged" in job.error
    # whatever the record held, what the job panel reads works
    assert isinstance(job.elapsed, float) and job.elapsed >= 0 and 0.0 <= job.progress <= 1.0
    assert isinstance(job.params, dict) and job.id and job.kind and isinstance(job.label, str)
    assert job.eta_seconds() is None and all(isinstance(n, str) for n in job.notes)


@pytest.mark.parametrize("doc", [[], ["kind"], "kind", 5, None, {"kind": "build"}, {}])
def test_not_a_record_at_all_is_a_damaged_job(doc):
    job = Job.from_dict(doc)
    assert job.damaged and job.status == "failed" and job.id.startswith("damaged-") and job.created == 0.0


def test_the_manager_lists_damaged_records_beside_good_ones(tmp_path):
    ws = Workspace(tmp_path)
    mgr = JobManager(ws)
    done = GOOD | {"id": "20250101-000000-00000001", "status": "done", "finished": 1020.0, "server_pid": 0}
    atomic_write_json(ws.jobs / f"{done['id']}.json", done)
    atomic_write_json(ws.jobs / "20250101-000000-00000002.json", GOOD | {"id": "20250101-000000-00000002",
                                                                        "progress": "30 %", "status": "done"})
    (ws.jobs / "20250101-000000-00000003.json").write_text(json.dumps(["kind"]))
    jobs = {j.id: j for j in mgr.jobs()}
    assert jobs[done["id"]].status == "done" and not jobs[done["id"]].damaged
    assert jobs["20250101-000000-00000002"].damaged and "progress: '30 %'" in jobs["20250101-000000-00000002"].error
    assert sum(j.damaged for j in jobs.values()) == 2


def test_trials_are_read_from_the_stage_the_overall_count_first():
    assert trials_in("isolated (minmax): isolated: trial 3/37") == (3, 37)
    assert trials_in("isolated (minmax): isolated: trial 3/37 · 40 of about 160 trials") == (40, 160)
    assert trials_in(f"searching with entropy calibration · {overall_text(170, 160)}") == (170, 170)
    assert trials_in("opening the model") is None and trials_in(None) is None and trials_in("trial 3/") is None


def test_eta_is_elapsed_per_trial_times_the_trials_left():
    assert eta_seconds(540.0, 30, 100) == pytest.approx(540 / 30 * 70)  # 9 min for 30 %: 21 min left
    assert eta_seconds(60.0, 1, 10) is None  # one trial says little: the first also started the workers
    assert eta_seconds(60.0, 2, 10) == pytest.approx(240.0) and eta_seconds(60.0, 1, 10, min_trials=1) == 540.0
    assert eta_seconds(60.0, 10, 10) == 0.0 and eta_seconds(60.0, 0, 10, min_trials=0) is None
    assert eta_seconds(float("nan"), 5, 10) is None and eta_seconds(-1, 5, 10) is None
    assert eta_seconds("x", 5, 10) is None and eta_seconds(60.0, 5, 0) is None


def test_eta_words():
    assert eta_text(None) == "" and eta_text(20) == "less than a minute left"
    assert eta_text(540 / 30 * 70) == "about 21 min left" and eta_text(89) == "about 1 min left"
    assert minutes_text(7260) == "about 2 h 1 min" and minutes_text(7200) == "about 2 h"


def test_a_running_job_says_its_eta_from_its_trials():
    job = Job.from_dict(GOOD | {"stage": "isolated: trial 4/10", "started": 1000.0})
    assert job.eta_seconds(now=1120.0) == pytest.approx(120 / 4 * 6)
    assert Job.from_dict(GOOD | {"stage": "isolated: trial 1/10"}).eta_seconds(now=2000.0) is None
    assert Job.from_dict(GOOD | {"status": "done"}).eta_seconds(now=2000.0) is None
    assert Job.from_dict(GOOD | {"stage": "fitting the latency model"}).eta_seconds(now=2000.0) is None


def test_the_project_owner_token_is_the_projects_alone():
    assert project_owner("0123456789ab") == project_owner("0123456789ab") != project_owner("0123456789ac")
    assert len(project_owner("0123456789ab")) == 32 and "0123456789ab" not in project_owner("0123456789ab")
