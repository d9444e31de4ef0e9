"""Issue 13 §6, §7: every cache read survives corruption (the next build recomputes it, with a note);
faults end in clear errors with nothing half-written (a full disk names the workspace and the space
needed; temp run folders and temp files are removed; run listing ignores dot-folders; an orphan job's
real outcome is recorded)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import MixprecError
from core.jobs import Job, JobManager
from core.measure import runs as runs_mod
from core.measure.reference import REFERENCE_STAMPS
from core.measure.runs import build_and_measure
from core.project import open_project
from core.quant.calibration import calibrate, cache_key, channel_amax
from core.sensitivity import sensitivity, sensitivity_file
from core.store.results import load_search, search_path
from core.store.runs import last_built_policy, list_runs, load_run
from core.workspace import (METRICS_FILE, OWNER_FILE, Workspace, atomic_write_bytes, atomic_write_json, clean_temp_runs,
                            process_start, sweep_stale_temp, take_notes)
from tests.fixtures import ROOT
from tests.fixtures.owners import plant_owned_folders


def _build(ws, **kw):
    p = open_project("sample:tiny-cnn", ws=ws)
    return p, build_and_measure(p, p.default_policy(), backend="onnxruntime", warmup=1, iterations=3,
                                profile_iterations=1, **kw)


def _garble(path: Path, keep: int = 40) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep] + b"\x00garbage\xff" * 8)


def _notes_about(word: str) -> list[str]:
    return [n for n in take_notes() if word in n]


# --- §6: one test per cache kind ------------------------------------------------------------------
def test_corrupt_reference_outputs_are_recomputed(tiny_cnn_ws):
    p, first = _build(tiny_cnn_ws)
    cache = sorted((tiny_cnn_ws.root / "reference" / "onnxruntime").rglob("outputs-*.npz"))
    assert cache
    for path in cache:
        _garble(path)
    take_notes()
    _, again = _build(tiny_cnn_ws)
    assert _notes_about("FP32 reference outputs")
    assert again.quality.cosine_mean == pytest.approx(first.quality.cosine_mean, abs=1e-6)
    with np.load(cache[0], allow_pickle=False) as z:  # rewritten whole
        assert z.files


def test_corrupt_or_half_written_reference_engine_is_rebuilt(tiny_cnn_ws):
    p, first = _build(tiny_cnn_ws)
    ref = next((tiny_cnn_ws.root / "reference" / "onnxruntime").iterdir())
    assert (ref / REFERENCE_STAMPS).is_file()
    engine = ref / "reference-fp32.ort-optimized.onnx"
    _garble(engine, keep=100)  # as a build that ran out of space mid-write leaves it
    take_notes()
    _, again = _build(tiny_cnn_ws)
    assert _notes_about("reference engine file")
    assert engine.stat().st_size > 200 and again.quality.cosine_mean == pytest.approx(first.quality.cosine_mean)
    stamps = json.loads((ref / REFERENCE_STAMPS).read_text())["files"]
    assert stamps[engine.name]["size"] == engine.stat().st_size
    (ref / REFERENCE_STAMPS).unlink()  # files without a stamp (a build that died before it) are not trusted
    take_notes()
    _build(tiny_cnn_ws)
    assert _notes_about("reference engine file") and (ref / REFERENCE_STAMPS).is_file()


def test_corrupt_calibration_cache_is_recomputed(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    first = calibrate(p.model, p.calib_data, "minmax", tiny_cnn_ws)
    path = tiny_cnn_ws.calib / f"{cache_key(p.model.sha256, p.calib_data.sha256, 'minmax', 99.999)}.json"
    assert path == first.path and calibrate(p.model, p.calib_data, "minmax", tiny_cnn_ws).cache_hit
    for text in ("{broken", "[1, 2, 3]", json.dumps({**json.loads(path.read_text()), "ranges": {"x": [1]}})):
        path.write_text(text)
        take_notes()
        again = calibrate(p.model, p.calib_data, "minmax", tiny_cnn_ws)
        assert not again.cache_hit and again.ranges == first.ranges, text[:20]
        assert _notes_about("cached calibration"), text[:20]
    assert calibrate(p.model, p.calib_data, "minmax", tiny_cnn_ws).cache_hit  # rewritten whole
    _garble(path)
    _, run = _build(tiny_cnn_ws)  # the next build does not fail either
    assert run.calibration_cache_hit is False


def test_corrupt_channel_statistics_are_recomputed(tmp_path, tiny_transformer):
    ws = Workspace(tmp_path)
    tensors = sorted({l.inputs[0] for l in tiny_transformer.layers if l.op_type == "MatMul"})[:2]
    assert len(tensors) == 2
    first = channel_amax(tiny_transformer.model, tiny_transformer.calib_data, tensors, ws)
    (path,) = ws.calib.glob("channels-*.npz")
    _garble(path)
    take_notes()
    again = channel_amax(tiny_transformer.model, tiny_transformer.calib_data, tensors, ws)
    assert _notes_about("channel statistics")
    assert all(np.array_equal(first[t], again[t]) for t in tensors)
    with np.load(path, allow_pickle=False) as z:
        assert len(z.files) == len(tensors)


def test_corrupt_sensitivity_and_switchable_model_are_measured_again(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    first = sensitivity(p, "isolated", workers=1)
    folder = tiny_cnn_ws.root / "search" / p.model.sha256[:16]
    cache = sensitivity_file(p, "isolated")  # stored once, in rankings/
    assert cache.is_file() and not list(folder.glob("sensitivity-*.json"))
    (switch,) = folder.glob("switch-*.onnx")
    cache.write_text('{"kind": "sensitivity", "format_version": 1}')  # right kind, fields missing
    _garble(switch)
    take_notes()
    again = sensitivity(p, "isolated", workers=1)
    notes = take_notes()
    assert not again.cache_hit and any("isolated sensitivity" in n for n in notes)
    assert any("switchable model" in n for n in notes)
    assert again.table["name"].tolist() == first.table["name"].tolist()
    assert sensitivity(p, "isolated", workers=1).cache_hit


def test_corrupt_search_is_not_used(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    path = search_path(tiny_cnn_ws, p, "cosine_mean>=0.99", False)
    for text in ("\x00\x01 not json", '{"kind": "search", "format_version": 999}', "{}"):
        atomic_write_bytes(path, text.encode())
        take_notes()
        assert load_search(tiny_cnn_ws, p, "cosine_mean>=0.99", False) is None, text
        assert _notes_about("search"), text


def test_corrupt_runs_are_skipped_with_a_note_and_never_listed_from_dot_folders(tiny_cnn_ws):
    p, run = _build(tiny_cnn_ws)
    good = run.run_dir
    bad = tiny_cnn_ws.runs / "20000101-000000-bad000"
    shutil.copytree(good, bad)
    (bad / METRICS_FILE).write_text('{"kind": "run", "format_version": 4, "run_id": "x"')  # truncated
    hidden = tiny_cnn_ws.runs / ".tmp-20000101-000000-dup000"
    shutil.copytree(good, hidden)  # a temp folder holding metrics.json is not a duplicate run
    (hidden / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())}))
    take_notes()
    listed = list_runs(tiny_cnn_ws)
    assert listed["run_id"].tolist() == [run.run_id]
    assert _notes_about("20000101-000000-bad000")
    (good / "per_layer.csv").write_bytes(b"\xff\xfe\x00garbage\n\x00")
    take_notes()
    assert load_run(tiny_cnn_ws, run.run_id).run_id == run.run_id  # its table is left out, with a note
    assert _notes_about("per-layer table")
    with pytest.raises(MixprecError, match="no run"):
        load_run(tiny_cnn_ws, hidden.name)
    (good / "policy.json").write_text("[[[")
    assert last_built_policy(p) is None  # an unreadable policy is skipped, not fatal


# --- §7: write errors, temp folders, orphans ------------------------------------------------------
def test_a_failed_write_names_the_workspace_and_leaves_no_temp_file(tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws")
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(ws.root))
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(MixprecError) as e:
        atomic_write_bytes(ws.calib / "x.json", b"x" * 5000)
    msg = str(e.value)
    assert "no space left to write x.json" in msg and f"the workspace {ws.root}" in msg
    assert "about 4.9 KiB needed" in msg and "free" in msg and "Fix:" in msg
    assert list(ws.calib.iterdir()) == []  # the temp file is gone
    monkeypatch.setattr(os, "fsync", real_fsync)

    def readonly(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", readonly)
    with pytest.raises(MixprecError, match="cannot write y.json .*Permission denied"):
        atomic_write_bytes(ws.calib / "y.json", b"{}")
    assert list(ws.calib.iterdir()) == []


def test_a_build_that_runs_out_of_space_midway_says_so_and_leaves_nothing(tiny_cnn_ws, monkeypatch):
    """ONNX Runtime reports a full disk as a protobuf error: the build says it is out of space."""
    from core.backends.onnxruntime import OnnxRuntimeBackend

    def failing_build(self, model, policy, calib, out_dir, input_shapes):
        (Path(out_dir) / "compiled.onnx").write_bytes(b"half")
        raise MixprecError("ONNX Runtime cannot create a session for compiled.onnx: INVALID_PROTOBUF",
                           "set the layers named in the message to fp32")

    monkeypatch.setattr(OnnxRuntimeBackend, "build", failing_build)
    monkeypatch.setattr(runs_mod, "free_bytes", lambda path: 1000)  # nearly full after the failure
    monkeypatch.setattr(runs_mod, "check_build_space", lambda project, backend: 123456)
    with pytest.raises(MixprecError) as e:
        _build(tiny_cnn_ws)
    assert "no space left" in str(e.value) and "about 120.6 KiB needed" in str(e.value)
    assert "fp32" not in str(e.value) and isinstance(e.value.__cause__, MixprecError)
    assert list(tiny_cnn_ws.runs.iterdir()) == []


def test_a_build_checks_the_space_it_needs_before_it_starts(tiny_cnn_ws, monkeypatch):
    monkeypatch.setattr(runs_mod, "free_bytes", lambda path: 10_000)
    with pytest.raises(MixprecError) as e:
        _build(tiny_cnn_ws)
    msg = str(e.value)
    assert f"the workspace {tiny_cnn_ws.root} has 9.8 KiB free; this build needs about" in msg
    assert not (tiny_cnn_ws.root / "calib").exists() or not list(tiny_cnn_ws.calib.iterdir())  # nothing computed yet
    assert list(tiny_cnn_ws.runs.iterdir()) == []


def test_temp_run_folders_no_live_process_owns_are_removed(tiny_cnn_ws):
    folders = plant_owned_folders(tiny_cnn_ws.runs, ".tmp-", METRICS_FILE, b"{}")
    old = time.time() - 3600
    stale = tiny_cnn_ws.calib / ".x.json.abc123.tmp"
    stale.write_text("half")
    os.utime(stale, (old, old))
    fresh = tiny_cnn_ws.calib / ".y.json.def456.tmp"
    fresh.write_text("being written")
    JobManager(tiny_cnn_ws)  # start-up
    assert {n for n, d in folders.items() if d.exists()} == {"live", "new-ownerless"}
    assert not stale.exists() and fresh.exists()
    assert clean_temp_runs(tiny_cnn_ws) == [] and sweep_stale_temp(tiny_cnn_ws.root) == []


def _wait_for(cond, timeout=60.0, what=""):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _exited(pid: int) -> bool:
    """The process is gone, or a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_an_orphan_job_that_finished_records_its_real_outcome(tmp_path):
    """The server is killed while its build runs; the child finishes: the next server records done."""
    ws = Workspace(tmp_path / "ws")
    server = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from core.jobs import JobManager; from core.workspace import Workspace;"
        "m = JobManager(Workspace(Path(sys.argv[1]))); j = m.submit('sleep', {'seconds': 3, 'steps': 6}, queue='test');"
        "print(j.id, flush=True); time.sleep(120)"), str(ws.root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        job_id = server.stdout.readline().strip()
        _wait_for(lambda: (json.loads((ws.jobs / f"{job_id}.json").read_text()).get("child_pid")), what="child start")
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    _wait_for(lambda: (ws.jobs / f"{job_id}.outcome.json").exists(), what="the orphan child's outcome")
    child = json.loads((ws.jobs / f"{job_id}.json").read_text())["child_pid"]
    _wait_for(lambda: _exited(child), what="the orphan child's exit")
    job = JobManager(ws).get(job_id)
    assert job.status == "done" and Path(job.result_path).is_file(), job
    assert any("finished after its server" in n for n in job.notes) and not job.error
    assert not (ws.jobs / f"{job_id}.outcome.json").exists()


def test_an_orphan_job_that_failed_records_its_error(tmp_path):
    ws = Workspace(tmp_path / "ws")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    job = Job(id="orphan-failed", kind="build", label="x", queue="q", params={}, status="running",
              server_pid=dead.pid, child_pid=dead.pid)
    atomic_write_json(ws.jobs / f"{job.id}.json", job.__dict__)
    atomic_write_json(ws.jobs / f"{job.id}.outcome.json", {"error": "the policy does not fit. Fix: x.",
                                                           "notes": ["a note"]})
    got = JobManager(ws).get(job.id)
    assert got.status == "failed" and got.error == "the policy does not fit. Fix: x." and got.notes == ["a note"]


# --- a real full disk: a tiny tmpfs workspace (root only) ---------------------------------------------
def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``path``; the reason it cannot, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (the test runs as uid %d)" % os.geteuid()
    if not shutil.which("mount"):
        return "no mount command"
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    return None if r.returncode == 0 else f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}"


@pytest.fixture
def tiny_disk(tmp_path):
    mounts = []

    def make(size: str) -> Path:
        path = tmp_path / f"disk{len(mounts)}"
        why = _mount_tmpfs(path, size)
        if why:
            pytest.skip(why)
        mounts.append(path)
        return path

    yield make
    for m in mounts:
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


def _cli(ws_root: Path, *args):
    env = {**os.environ, "MIXPREC_WORKSPACE": str(ws_root)}
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def _leftovers(root: Path) -> list[str]:
    """Temp files, temp folders and unstamped engine files: what a write cut short leaves."""
    out = [str(p.relative_to(root)) for p in root.rglob("*") if p.name.startswith(".") and p.name != ".lock"]
    for ref in (root / "reference").glob("*/*"):
        if any(ref.glob("reference-fp32*")) and not (ref / REFERENCE_STAMPS).is_file():
            out.append(str(ref.relative_to(root)))
    return out


def _assert_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Fix:" in last, last
    for n in needles:
        assert n in last, (n, last)
    return last


def test_tiny_tmpfs_workspace_full_before_the_sample_fits(tiny_disk):
    disk = tiny_disk("300k")  # the tiny-cnn sample's data alone is about 600 KB
    p = _cli(disk, "build", "sample:tiny-cnn", "--iterations", "3")
    _assert_one_line_error(p, "no space left to write", f"the workspace {disk.resolve()}", "free")
    assert _leftovers(disk) == []
    assert not (disk / "samples" / "tiny-cnn-v1").exists()  # no half sample that a later run would trust


def test_tiny_tmpfs_workspace_full_before_the_build(tiny_disk, tiny_cnn_sample):
    disk = tiny_disk("3m")
    shutil.copytree(tiny_cnn_sample.model.parent, disk / "samples" / tiny_cnn_sample.model.parent.name)
    filler = disk / "filler.bin"
    free = shutil.disk_usage(disk).free
    filler.write_bytes(b"\0" * (free - 200_000))  # leave ~200 KB: less than a build needs
    p = _cli(disk, "build", "sample:tiny-cnn", "--iterations", "3")
    _assert_one_line_error(p, f"the workspace {disk.resolve()} has", "free; this build needs about")
    assert _leftovers(disk) == [] and not any((disk / "runs").iterdir())
    filler.unlink()  # with room again, the same build works and leaves a complete run
    p = _cli(disk, "build", "sample:tiny-cnn", "--iterations", "3", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert Path(json.loads(p.stdout)["run_dir"]).is_dir() and _leftovers(disk) == []


@pytest.mark.parametrize("step", ["calibrate_policy", "reference_engine"])
def test_tiny_tmpfs_workspace_full_in_the_middle_of_a_build(tiny_disk, tiny_cnn_sample, step):
    """The pre-flight check passes, then the disk fills (another process) while the build calibrates
    or builds the FP32 reference (its temp run folder exists): a clear error, and nothing half-written."""
    disk = tiny_disk("8m")
    shutil.copytree(tiny_cnn_sample.model.parent, disk / "samples" / tiny_cnn_sample.model.parent.name)
    code = ("import sys, shutil; from pathlib import Path; import core.measure.runs as r;"
            f"orig = r.{step}\n"
            "def fill(*a, **k):\n"
            "    d = Path(sys.argv[1]); f = shutil.disk_usage(d).free\n"
            "    (d / 'filler.bin').write_bytes(b'\\0' * (f - 4096))\n"
            "    return orig(*a, **k)\n"
            f"r.{step} = fill\n"
            "from core.cli.commands import main; sys.exit(main(['build', 'sample:tiny-cnn', '--iterations', '3']))")
    env = {**os.environ, "MIXPREC_WORKSPACE": str(disk)}
    p = subprocess.run([sys.executable, "-c", code, str(disk)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    _assert_one_line_error(p, "no space left to write", f"the workspace {disk.resolve()}")
    assert _leftovers(disk) == [] and not any((disk / "runs").iterdir())
