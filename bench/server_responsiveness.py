"""Server responsiveness: page interactions measured in a real browser (Playwright + Debian
chromium) while eight other browser sessions build.

    .venv/bin/python bench/server_responsiveness.py [--rounds 8] [--builders 8]

A fresh dashboard server (its own temporary workspace; the samples are materialised first, outside
the timings). Eight builder sessions open the Precision page of the tiny CNN and each clicks
Rebuild (the builds queue on the backend's queue, one child at a time; when they have all ended
the builders click again, between rounds, so builds run and end all through the measurement and
every builder page polls its job list). A ninth session, on MiniLM (172 layers), times its
interactions: "Set by name" (a form submit that changes the policy), switching to the Build and
results page and back to Precision. An interaction's time runs from the click to the server's
``script_finished`` message of that run (read off the page's websocket) plus one animation frame,
i.e. until the browser has the whole new page. Fragment runs (the job lists' polling) are told
apart by their finish status and not counted. Prints a Markdown table (median, max per
interaction and over all), the load average before and after, the build count, and each round's times."""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures import browser as T  # noqa: E402  (the e2e test's browser helpers)
from tests.fixtures.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

LAYERS = [f"/encoder/layer.{i}/output/dense/MatMul" for i in range(6)]


class RunWatch:
    """Times full script runs of one page from its websocket's ``script_finished`` messages."""

    def __init__(self, page):
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        self.page, self.done, self._fm = page, [], ForwardMsg
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _frame(self, payload) -> None:
        if isinstance(payload, str):
            return
        msg = self._fm()
        try:
            msg.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - not a ForwardMsg
            return
        if msg.WhichOneof("type") == "script_finished" and msg.script_finished == self._fm.FINISHED_SUCCESSFULLY:
            self.done.append(time.perf_counter())

    def time(self, action, timeout: float = 120.0) -> float:
        n = len(self.done)
        t0 = time.perf_counter()
        action()
        while len(self.done) == n:
            self.page.wait_for_timeout(5)  # pumps Playwright's events
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError("no script_finished")
        self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
        return time.perf_counter() - t0


def _server(ws: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(ws / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
                             "--server.address", "localhost", "--server.headless", "true"],
                            cwd=ROOT, env={**os.environ, "MIXPREC_WORKSPACE": str(ws)}, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://localhost:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
            break
        except OSError:
            time.sleep(0.3)
    return proc, log, url


def _rebuild_all(builders, mgr) -> int:
    """Each builder clicks Rebuild; returns how many builds were queued."""
    before = len(mgr.jobs(kind="build"))
    for page in builders:
        page.get_by_role("button", name="Rebuild").click(no_wait_after=True)
    deadline = time.monotonic() + 60
    while len(mgr.jobs(kind="build")) < before + len(builders) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(mgr.jobs(kind="build")) - before


def measure(b, url: str, mgr, rounds: int, n_builders: int) -> tuple[dict[str, list[float]], int, list]:
    me = T.new_page(b, url, "/Precision?model=sample:minilm")
    watch = RunWatch(me)
    me.reload()
    me.wait_for_selector("[data-testid='stApp']")
    me.get_by_role("button", name="Set by name").wait_for(timeout=300_000)
    T.idle(me)
    builders = [T.new_page(b, url, "/Precision?model=sample:tiny-cnn") for _ in range(n_builders)]
    for page in builders:
        page.get_by_role("button", name="Rebuild").wait_for(timeout=300_000)
    queued = _rebuild_all(builders, mgr)
    out: dict[str, list[float]] = {"Set by name (policy edit)": [], "to Build and results": [], "back to Precision": []}
    load = []
    for r in range(rounds):
        if not any(j.active for j in mgr.jobs(kind="build")):
            queued += _rebuild_all(builders, mgr)
        load.append(os.getloadavg()[0])
        box = me.get_by_label("Layer name (regular expression)")
        box.fill(LAYERS[r % len(LAYERS)].replace(".", r"\.") + "$")
        out["Set by name (policy edit)"].append(
            watch.time(lambda: me.get_by_role("button", name="Set by name").click(no_wait_after=True)))
        me.wait_for_timeout(300)
        nav = me.get_by_test_id("stSidebarNav")
        out["to Build and results"].append(
            watch.time(lambda: nav.get_by_role("link", name="Build and results", exact=True).click(no_wait_after=True)))
        me.wait_for_timeout(300)
        out["back to Precision"].append(
            watch.time(lambda: nav.get_by_role("link", name="Precision", exact=True).click(no_wait_after=True)))
        me.get_by_role("button", name="Set by name").wait_for()
        me.wait_for_timeout(300)
    active = sum(j.active for j in mgr.jobs(kind="build"))
    for page in builders + [me]:
        page.context.close()
    return out, queued, load + [active]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--builders", type=int, default=8)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    ws = Path(tempfile.mkdtemp(prefix="mixprec-bench-ws-"))
    os.environ["MIXPREC_WORKSPACE"] = str(ws)
    from core.jobs import JobManager
    from core.project import open_project
    from core.workspace import Workspace

    for model in ("sample:minilm", "sample:tiny-cnn"):  # materialise the samples outside the timings
        open_project(model, ws=Workspace(ws))
    mgr = JobManager(Workspace(ws))  # reads the records the server writes (never submits)
    proc, log, url = _server(ws)
    load0 = os.getloadavg()
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            out, queued, load = measure(b, url, mgr, args.rounds, args.builders)
            b.close()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    still_active = load.pop()
    allt = [t for v in out.values() for t in v]
    print(f"{args.builders} builder sessions (tiny-cnn), {queued} builds queued, {still_active} still queued/running "
          f"at the end; {args.rounds} rounds on MiniLM; {os.cpu_count()} CPUs; load average (1 min) "
          f"{load0[0]:.1f} before, {min(load):.1f}–{max(load):.1f} during, {os.getloadavg()[0]:.1f} after\n")
    print("| interaction | n | median ms | max ms |\n|---|---|---|---|")
    for k, v in {**out, "all": allt}.items():
        print(f"| {k} | {len(v)} | {1e3 * statistics.median(v):.0f} | {1e3 * max(v):.0f} |")
    print("\nEach round, in ms (load average at its start):")
    for r, la in enumerate(load):
        print(f"- round {r + 1} ({la:.1f}): " + ", ".join(f"{k.split(' (')[0]} {1e3 * v[r]:.0f}" for k, v in out.items()))


if __name__ == "__main__":
    main()
