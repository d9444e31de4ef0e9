"""Trial workers start where the system temp folder is deep: multiprocessing's forkserver makes its AF_UNIX socket
there (``$TMPDIR/pymp-*/listener-*``, at most 107 bytes), so a deep ``TMPDIR`` made every search fail with "AF_UNIX
path too long"; workers are then spawned instead."""
from __future__ import annotations

import subprocess
import sys

from core.sensitivity.isolated import AF_UNIX_PATH_MAX, FORKSERVER_SOCKET, worker_context
from tests.fixtures import ROOT


def test_a_deep_temp_folder_spawns_the_workers(tmp_path, monkeypatch):
    import tempfile

    deep = tmp_path / ("d" * (AF_UNIX_PATH_MAX - len(FORKSERVER_SOCKET) - len(str(tmp_path))))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert worker_context().get_start_method() == "spawn"
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert worker_context().get_start_method() == "forkserver"


def test_isolated_sensitivity_runs_under_a_deep_tmpdir(tmp_path):
    """The real start, in a process whose TMPDIR is 150 bytes deep: its trial workers run and the ranking ends."""
    deep = tmp_path / ("t" * 150)
    deep.mkdir()
    code = ("from core.project import open_project\n"
            "from core.sensitivity import sensitivity\n"
            "from core.workspace import Workspace\n"
            "from pathlib import Path\n"
            f"p = open_project('sample:tiny-cnn', ws=Workspace(Path({str(tmp_path / 'ws')!r})))\n"
            "s = sensitivity(p, 'isolated', workers=2)\n"
            "print('layers', len(s.table))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(deep)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split("layers")[-1]) > 0
