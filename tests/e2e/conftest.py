"""Fixtures of the browser tests: the dashboard server they talk to and the Chromium they drive."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.fixtures import ROOT
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test (each test opens its own contexts: own cookies, own sessions)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class _Dashboard:
    """``streamlit run app.py`` on a free localhost port over its own workspace, its log in ``streamlit.log``
    there. Started in its own process group, so stopping it also stops its estimate and job children."""

    def __init__(self, root: Path, estimate_wait: str = "0.25"):
        self.root = root
        self.proc = None
        self.url = ""
        self.estimate_wait = estimate_wait  # MIXPREC_ESTIMATE_WAIT: how long a page run waits for a new estimate

    def start(self) -> None:
        import os
        import socket
        import subprocess
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "MIXPREC_WORKSPACE": str(self.root), "MIXPREC_ESTIMATE_WAIT": self.estimate_wait}
        repo = ROOT
        with open(self.root / "streamlit.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", str(repo / "app.py"), "--server.port", str(port),
                 "--server.address", "localhost", "--server.headless", "true"],
                cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://localhost:{port}"
        deadline = time.monotonic() + 120
        while not self.healthy():
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.root / "streamlit.log").read_text()
            time.sleep(0.3)  # polling the health endpoint until the server answers

    def healthy(self) -> bool:
        import urllib.request

        try:
            urllib.request.urlopen(self.url + "/_stcore/health", timeout=5)
            return True
        except OSError:
            return False

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)


@pytest.fixture(scope="session")
def dashboard(tmp_path_factory, minilm_sample, tiny_cnn_sample, tiny_transformer_sample):
    """One dashboard for every browser test, over a workspace of its own (not the samples workspace, where the
    unit tests store rankings). The session's built samples are linked in, so the server never exports MiniLM
    again (the home page's default model)."""
    from core.workspace import Workspace

    root = tmp_path_factory.mktemp("e2e-ws")
    link_samples(Workspace(root), minilm_sample, tiny_cnn_sample, tiny_transformer_sample)
    d = _Dashboard(root)
    d.start()
    yield d
    d.stop()


def link_samples(ws, *samples) -> None:
    """The session's built samples linked into the workspace ``ws`` (the server never builds them again)."""
    import shutil

    for paths in samples:
        folder = Path(paths.model).parent
        shutil.copytree(folder, ws.samples / folder.name, copy_function=_link_or_copy)


def _link_or_copy(src, dst):
    import os
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class Server(NamedTuple):
    """What a browser test gets: the dashboard's ``url``, its workspace ``ws`` and ``since``, the time the test
    started (``time.time()``): the jobs it started are those created since."""
    url: str
    ws: object
    since: float


@pytest.fixture
def server(dashboard):
    """The session's dashboard for one browser test (a server that died is started again)."""
    import time

    from core.workspace import Workspace

    if dashboard.proc.poll() is not None or not dashboard.healthy():
        dashboard.stop()
        dashboard.start()
    return Server(dashboard.url, Workspace(dashboard.root), time.time())
