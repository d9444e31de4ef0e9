"""Server responsiveness: how long the dashboard server takes to answer HTTP requests (health
and a page) in each state of a real session — fresh, MiniLM loaded, a MiniLM build running with
its page polling, a second session opening — in a real browser (Playwright + Debian chromium).

    .venv/bin/python bench/server_responsiveness.py

Prints max and median per state (20-30 probes of both paths, 0.25 s apart). The workspace is a
fresh temporary folder, so the first MiniLM load includes the sample's export."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import test_e2e_browser as T  # noqa: E402  (the e2e test's browser helpers)


def main():
    from playwright.sync_api import sync_playwright

    ws = Path(tempfile.mkdtemp(prefix="mixprec-bench-ws-"))
    port = T._free_port()
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

    def probe(state: str, n: int = 20):
        times = []
        for _ in range(n):
            for path in ("/_stcore/health", "/Precision"):
                t0 = time.perf_counter()
                urllib.request.urlopen(url + path, timeout=30).read()
                times.append(time.perf_counter() - t0)
            time.sleep(0.25)
        print(f"| {state} | {len(times)} | {1e3 * sorted(times)[len(times) // 2]:.0f} | {1e3 * max(times):.0f} |",
              flush=True)

    print("| state | requests | median ms | max ms |\n|---|---|---|---|")
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=T.CHROMIUM, headless=True, args=T.ARGS)
            probe("fresh server")
            page = T._new_page(b, url)
            T._idle(page)
            T._goto(page, "Model")
            page.get_by_text("Layer inventory").wait_for(timeout=300_000)
            T._idle(page)
            probe("MiniLM loaded (Model page open)")
            T._goto(page, "Precision")
            probe("MiniLM Precision page open")
            page.get_by_role("button", name="Rebuild").click()
            time.sleep(1)
            probe("MiniLM build running, its page polling", 30)
            page2 = T._new_page(b, url, "/Precision?model=sample:tiny-cnn")
            T._idle(page2)
            probe("a second session (tiny-cnn) opened during it", 10)
            page2.context.close()
            page.context.close()
            time.sleep(2)
            probe("sessions closed")
            b.close()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


if __name__ == "__main__":
    main()
