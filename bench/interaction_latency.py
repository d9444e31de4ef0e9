"""Server time per dashboard interaction, idle and with a MiniLM build running.

    .venv/bin/python bench/interaction_latency.py [--rounds 10]

Runs the Precision page in Streamlit's AppTest (the same script run the server does per
interaction), on MiniLM, and times two interactions: filtering the precision table by op type,
and toggling one layer to FP16. Then it starts a real MiniLM build job (child process) and times
the same interactions while it runs. Prints a Markdown table for docs/benchmarks.md."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("MIXPREC_WORKSPACE", tempfile.mkdtemp(prefix="mixprec-bench-"))
    from streamlit.testing.v1 import AppTest

    from core.jobs import JobManager, build_params
    from core.project import open_project
    from core.workspace import Workspace

    ws = Workspace.default()
    project = open_project("sample:minilm", ws=ws)  # materialise once, outside the timings
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.session_state["source"] = {"model": "sample:minilm", "data": None, "eval_data": None}
    at.run()  # the frame's home page registers the pages
    at.switch_page("views/precision.py").run()
    layers = [l.name for l in project.layers if l.eligible]

    def interactions(n: int) -> dict[str, list[float]]:
        out = {"filter (op type)": [], "toggle one layer": []}
        for i in range(n):
            t0 = time.perf_counter()
            at.multiselect(key="view_ops").set_value(["MatMul"] if i % 2 == 0 else []).run()
            out["filter (op type)"].append(time.perf_counter() - t0)
            at.text_input(key="bulk_regex").input(layers[i % len(layers)] + "$")
            t0 = time.perf_counter()
            at.button(key="apply_regex").click().run()
            out["toggle one layer"].append(time.perf_counter() - t0)
            assert not at.exception, at.exception
        return out

    idle = interactions(args.rounds)
    mgr = JobManager.for_workspace(ws)
    job = mgr.submit("build", build_params("sample:minilm", project.default_policy().to_json()), label="bench")
    while mgr.get(job.id).status != "running" or mgr.get(job.id).progress < 0.05:
        time.sleep(0.2)
    busy = interactions(args.rounds)
    state = mgr.get(job.id)
    assert state.active, "the build ended before the measurement did: raise the build's length or lower --rounds"
    done = mgr.wait(job.id, 600)
    print(f"MiniLM ({len(project.layers)} layers), Precision page, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs; build '{done.status}' in {done.elapsed:.1f} s\n")
    print("| interaction | idle median (ms) | idle max (ms) | build running median (ms) | build running max (ms) |")
    print("|---|---|---|---|---|")
    for k in idle:
        print(f"| {k} | {1e3 * statistics.median(idle[k]):.0f} | {1e3 * max(idle[k]):.0f} | "
              f"{1e3 * statistics.median(busy[k]):.0f} | {1e3 * max(busy[k]):.0f} |")


if __name__ == "__main__":
    main()
