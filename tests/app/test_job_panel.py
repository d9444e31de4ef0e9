"""Issue 23 on the job list (ui/job_panel.py): the time left from the trials done, one line per job without
repeats, run labels as text (a URL is no link), damaged job records shown instead of a crash, and the owner
of a job still able to cancel it after a reload."""
from __future__ import annotations

import os
import time

from streamlit.testing.v1 import AppTest

from core.jobs import Job, JobManager
from core.jobs.record import project_owner
from core.workspace import atomic_write_json
from tests.fixtures.apptest import APP, ok, page


def _record(ws, **fields) -> Job:
    job = Job(**({"id": "20250101-000000-00000001", "kind": "isolated", "label": "isolated x", "queue": "rank",
                  "params": {}, "status": "running", "server_pid": os.getpid()} | fields))
    atomic_write_json(ws.jobs / f"{job.id}.json", job.__dict__)
    return job


def _progress_texts(at: AppTest) -> list[str]:
    return [p.proto.text for p in at.get("progress")]


def test_a_running_job_says_about_how_long_it_has_left(ws):
    _record(ws, stage="isolated: trial 4/10", started=time.time() - 120)
    at = ok(page("build_and_results"))
    (text,) = _progress_texts(at)
    assert "trial 4/10" in text and "about 3 min left" in text  # 120 s for 4 trials: 180 s for the other 6
    _record(ws, stage="isolated: trial 1/10", started=time.time() - 120)  # one trial: too early to say
    assert "left" not in _progress_texts(ok(page("build_and_results")))[0]


def test_job_lines_say_kind_and_queue_once(ws):
    _record(ws, kind="rank", queue="rank", label="rank tiny")
    _record(ws, id="20250101-000000-00000002", kind="build", queue="build-onnxruntime", label="b", status="done",
            finished=time.time())
    at = ok(page("build_and_results"))
    lines = [m.value for m in at.main.markdown if "**running**" in m.value or "**done**" in m.value]
    assert any(line.endswith("rank · **running**") for line in lines), lines
    assert not any("rank · `rank`" in line for line in lines)
    assert any("build · `build-onnxruntime` · **done**" in line for line in lines)


def test_a_url_in_a_run_label_is_text_not_a_link(ws):
    label = "see https://example.com/x and www.example.org [here](http://evil.example)"
    _record(ws, label=label)
    at = ok(page("build_and_results"))
    (line,) = [m.value for m in at.main.markdown if "**running**" in m.value]
    assert line.startswith(f"`{label}`")  # a code span: no autolink, no Markdown link


def test_a_damaged_job_record_is_shown_not_a_crash(ws):
    _record(ws, label="fine")
    bad = {"id": "20250101-000000-00000009", "kind": "build", "label": ["x"], "queue": "q", "params": "no",
           "status": "running", "progress": "30 %", "created": "yesterday", "notes": 5}
    atomic_write_json(ws.jobs / f"{bad['id']}.json", bad)
    at = page("build_and_results")
    assert not at.exception
    assert any("damaged record" in m.value for m in at.main.markdown)
    assert any("job record is damaged" in e.value and "progress" in e.value for e in at.error)
    assert [b for b in at.button if b.key == f"cancel-{bad['id']}"] == []  # not active: nothing to cancel


def test_the_owner_cancels_its_job_after_a_reload(ws):
    at = ok(page("precision"))
    project = at.query_params["project"]
    at.button(key="rebuild").click().run()
    mgr = JobManager.for_workspace(ws)
    built = mgr.get(at.query_params["job"])
    assert built.owner == project_owner(project) == at.session_state["owner_token"]
    mgr.wait(built.id, 180)
    sleeper = mgr.submit("sleep", {"steps": 100, "seconds": 120.0}, label="long", owner=built.owner)
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload: a new session on the same URL
    reloaded.query_params.update({"model": "sample:tiny-cnn", "project": project, "job": built.id})
    reloaded.run()
    ok(reloaded.switch_page("views/build_and_results.py").run())
    assert not reloaded.button(key=f"cancel-{sleeper.id}").disabled
    other = ok(page("build_and_results"))  # another project's session: not its job
    assert other.button(key=f"cancel-{sleeper.id}").disabled
    reloaded.button(key=f"cancel-{sleeper.id}").click().run()
    reloaded.button(key=f"cancel-{sleeper.id}-confirm").click().run()
    assert mgr.wait(sleeper.id, 30).status == "cancelled"
