"""Issue 23 faults 3 and 7: trial workers die with the process they work for, and hold none of its output; temp
work lives in the workspace (``tmp/``) and what a killed process left there is swept at the next start.

The trials are held on purpose: a user metric (``--metric-file``) that, in a trial worker, writes the worker's pid
and never returns — a long trial, as a 640x640 model's is. Every wait is on a state (a pid file, a process gone, a
job's status, the end of a pipe), bounded by a generous deadline."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from core.jobs import JobManager, search_params
from core.measure.evaluation import MetricSpec
from core.project import open_project
from core.quant.calibration import calibrate
from core.workspace import OWNER_FILE, TempFolder, Workspace, clean_temp_folders, process_start
from tests.fixtures import ROOT
from tests.fixtures.owners import plant_owned_folders

WORKERS = 2
START_DEADLINE = 300.0  # a search's start on a loaded 2-core machine: imports, the sample, calibration, compile
GONE_DEADLINE = 60.0  # a worker's watch notices its owner's death within a second

HELD_METRIC = '''import multiprocessing as mp, os, time
from pathlib import Path

def score(reference, candidate, inputs):
    if mp.current_process().name == "MainProcess":
        return 1.0
    held = Path({held!r})
    held.mkdir(exist_ok=True)
    (held / f".{{os.getpid()}}").write_text("")
    os.replace(held / f".{{os.getpid()}}", held / str(os.getpid()))
    print("a trial worker's own output", flush=True)
    while True:
        time.sleep(3600)
'''


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    return process_start(pid) is None  # exited, or a zombie waiting to be reaped


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a CLI started with ``start_new_session``, and all it started)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


@pytest.fixture
def held(tmp_path):
    """The held metric file and the folder its workers write their pids to."""
    folder = tmp_path / "held"
    metric = tmp_path / "held_metric.py"
    metric.write_text(HELD_METRIC.format(held=str(folder)))
    return metric, folder


def _held_workers(folder: Path, proc=None, log: Path | None = None) -> list[int]:
    def ready():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended ({proc.returncode}) before its trials ran:\n"
                        + (log.read_text()[-3000:] if log else ""))
        pids = sorted(int(p.name) for p in folder.glob("[0-9]*")) if folder.is_dir() else []
        return pids if len(pids) >= WORKERS else None
    pids = _wait_for(ready, START_DEADLINE, f"{WORKERS} trial workers in their held trial")
    assert not any(_gone(p) for p in pids)
    return pids


def _system_temp_leftovers(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith("mixprec-"))


@pytest.fixture
def system_temp():
    """The children's system temp folder (``TMPDIR``), short: multiprocessing's forkserver puts its AF_UNIX socket
    there, and a socket path has at most 107 bytes (pytest's tmp_path under xdist can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="mxt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_cli_search_leaves_no_trial_worker_and_its_stdout_ends(tiny_cnn_ws, held, tmp_path, system_temp):
    """SIGKILL of ``python -m core search`` while its workers are in a trial: the workers die, the pipe of the CLI's
    stdout reaches its end (no process holds it), the trial data is in the workspace (not the system temp folder)
    and the next start sweeps it."""
    metric, folder = held
    tmpdir = system_temp
    log = tmp_path / "cli.stderr"
    env = {**os.environ, "MIXPREC_WORKSPACE": str(tiny_cnn_ws.root), "TMPDIR": str(tmpdir)}
    with open(log, "wb") as err:
        cli = subprocess.Popen([sys.executable, "-m", "core", "search", "sample:tiny-cnn", "--budget",
                                "cosine_mean>=0.9", "--workers", str(WORKERS), "--metric-file", str(metric)],
                               cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                               start_new_session=True)
    try:
        workers = _held_workers(folder, cli, log)
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        _wait_for(lambda: all(_gone(p) for p in workers), GONE_DEADLINE, f"the trial workers {workers} to die")
        out = []
        reader = threading.Thread(target=lambda: out.append(cli.stdout.read()), daemon=True)
        reader.start()
        reader.join(GONE_DEADLINE)
        assert not reader.is_alive(), f"the CLI's stdout is still held open by {_session(cli.pid)}"
        assert b"a trial worker's own output" not in out[0]  # the workers' output went to their log
        _wait_for(lambda: not _session(cli.pid), GONE_DEADLINE, "every process the CLI started to end")
    finally:
        if _session(cli.pid):
            os.killpg(cli.pid, signal.SIGKILL)  # the CLI's own process group: only what this test started
        cli.stdout.close()
    assert _system_temp_leftovers(tmpdir) == []
    stale = [p.name for p in tiny_cnn_ws.tmp.iterdir()]
    assert len(stale) == 1 and stale[0].startswith("mixprec-trials-"), stale
    JobManager(tiny_cnn_ws)  # the next start
    assert list(tiny_cnn_ws.tmp.iterdir()) == []


def _server(ws: Workspace, params: dict, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """A job server in a process of its own (the dashboard's, in short) that submits a search job."""
    (tmp_path / "params.json").write_text(json.dumps(params))
    server = subprocess.Popen([sys.executable, "-c", (
        "import json, sys, time; from pathlib import Path; from core.jobs import JobManager; "
        "from core.workspace import Workspace; m = JobManager(Workspace(Path(sys.argv[1]))); "
        "j = m.submit('search', json.loads(Path(sys.argv[2]).read_text()), queue='test'); "
        "print(j.id, flush=True); time.sleep(3600)"), str(ws.root), str(tmp_path / "params.json")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    return server, server.stdout.readline().strip()


def test_a_killed_server_and_a_restart_leave_no_trial_worker(tiny_cnn_ws, held, tmp_path):
    """The dashboard's server is SIGKILLed while its search job's workers are in a trial; the restarted server
    stops the orphaned job and its workers die with it; its temp work is swept."""
    metric, folder = held
    params = search_params("sample:tiny-cnn", budget="cosine_mean>=0.9", metrics=MetricSpec(metric_file=str(metric)))
    server, job_id = _server(tiny_cnn_ws, params, tmp_path)
    try:
        workers = _held_workers(folder, server)
        server.send_signal(signal.SIGKILL)
        server.wait()
        job = JobManager(tiny_cnn_ws).get(job_id)  # the restart
        assert job.status == "interrupted", job
        _wait_for(lambda: all(_gone(p) for p in workers), GONE_DEADLINE, f"the trial workers {workers} to die")
        _wait_for(lambda: not _session(server.pid), GONE_DEADLINE, "every process the server started to end")
    finally:
        if _session(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
        server.stdout.close()
    assert list(tiny_cnn_ws.tmp.iterdir()) == []


def test_a_cancelled_search_job_stops_its_workers_in_their_trial(tiny_cnn_ws, held):
    """Cancel while every worker is in a trial that does not end: the job is cancelled and its workers are gone
    (the pool is left at once on the cancel, running trials and all)."""
    metric, folder = held
    mgr = JobManager(tiny_cnn_ws)
    job = mgr.submit("search", search_params("sample:tiny-cnn", budget="cosine_mean>=0.9",
                                             metrics=MetricSpec(metric_file=str(metric))), queue="test-cancel")
    workers = []
    try:
        workers = _held_workers(folder)
        mgr.cancel(job.id)
        done = _wait_for(lambda: (lambda j: j if not j.active else None)(mgr.get(job.id)), GONE_DEADLINE,
                         "the job to end")
        assert done.status == "cancelled", done
        _wait_for(lambda: all(_gone(p) for p in workers), GONE_DEADLINE, f"the trial workers {workers} to die")
    finally:
        for pid in workers:  # what this test started, by pid, should it fail
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert list(tiny_cnn_ws.tmp.iterdir()) == []


_HELD_CALIBRATION = """import sys, time
from pathlib import Path
import core.quant.calibration as cal
from core.project import open_project
from core.workspace import Workspace

ws, flag = Workspace(Path(sys.argv[1])), Path(sys.argv[2])
made = cal._make_calibrator

def held(src, *args, **kw):  # the calibrator is made, its model copies written: hold here
    c = made(src, *args, **kw)
    flag.write_text(str(src))
    while True:
        time.sleep(3600)

cal._make_calibrator = held
p = open_project("sample:tiny-cnn", ws=ws)
cal.calibrate(p.model, p.calib_data, "minmax", ws)
"""


def test_a_killed_calibration_leaves_nothing_in_the_system_temp_folder(tiny_cnn_ws, tmp_path, system_temp):
    """A calibration's model copies are in the workspace's tmp/, never the system temp folder; killed, they are
    swept by the next calibration."""
    tmpdir, flag = system_temp, tmp_path / "calibrating"
    proc = subprocess.Popen([sys.executable, "-c", _HELD_CALIBRATION, str(tiny_cnn_ws.root), str(flag)], cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(tmpdir)}, start_new_session=True)
    try:
        src = Path(_wait_for(lambda: flag.is_file() and flag.read_text(), START_DEADLINE, "the calibration to start"))
        assert src.is_file() and tiny_cnn_ws.tmp in src.parents, src
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _system_temp_leftovers(tmpdir) == []
    stale = src.parent
    assert stale.name.startswith("mixprec-calib-") and stale.is_dir()
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    result = calibrate(p.model, p.calib_data, "minmax", tiny_cnn_ws)  # the next start
    assert not result.cache_hit and result.ranges
    assert not stale.exists() and list(tiny_cnn_ws.tmp.iterdir()) == []


def test_the_sweep_removes_only_temp_folders_whose_process_is_gone(tmp_path):
    ws = Workspace(tmp_path / "ws")
    folders = plant_owned_folders(ws.tmp, "mixprec-x-", "model.onnx")
    mine = TempFolder(ws, "mixprec-calib-")  # made: the stale ones go first
    assert {n for n, d in folders.items() if d.exists()} == {"live", "new-ownerless"}
    assert json.loads((mine.path / OWNER_FILE).read_text())["pid"] == os.getpid()
    with mine as path:
        assert Path(path).is_dir() and clean_temp_folders(ws) == []
    assert not mine.path.exists()
    old = time.time() - 3600
    os.utime(folders["new-ownerless"], (old, old))
    JobManager(ws)  # a manager's start-up sweeps too
    assert {n for n, d in folders.items() if d.exists()} == {"live"}


def test_a_worker_that_dies_is_named_with_its_last_output(tiny_cnn_ws, tmp_path):
    """The workers' output goes to the pool's log, not the caller's stdout: a worker that dies has its last lines
    quoted in the error."""
    from core.errors import MixprecError
    from core.sensitivity import sensitivity

    metric = tmp_path / "dying_metric.py"
    metric.write_text("import multiprocessing as mp, os\n\ndef score(reference, candidate, inputs):\n"
                      "    if mp.current_process().name != 'MainProcess':\n"
                      "        print('native abort: out of arena memory', flush=True)\n        os._exit(134)\n"
                      "    return 1.0\n")
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    with pytest.raises(MixprecError) as e:
        sensitivity(p, "isolated", workers=1, metrics=MetricSpec(metric_file=str(metric)))
    assert "worker process died" in str(e.value) and "native abort: out of arena memory" in str(e.value)
    assert list(tiny_cnn_ws.tmp.iterdir()) == []
