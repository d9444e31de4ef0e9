"""Issue 21 §2: the CLI process's memory when isolated sensitivity's trials start, before and after handing the
freed heap back (``core.sensitivity.memory.release_memory``, which ``TrialPool.evaluate`` now calls first).

    .venv/bin/python bench/bench_trial_start_memory.py /tmp/q05/model.onnx /tmp/q05/ws-probe   # a cold workspace

Runs ``sensitivity(mode="isolated")`` (calibration, the FP32 reference, compiling the switchable model) with the
pool's ``evaluate`` replaced by a probe that reads /proc/self/status, calls ``release_memory()``, reads it again,
and stops before any trial.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def status() -> dict:
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "RssAnon", "VmHWM")):
            k, v = line.split(":")
            out[k] = round(int(v.split()[0]) / 1048576, 2)  # GiB
    return out


class _Stop(Exception):
    pass


def main():
    import core.sensitivity.isolated as iso
    from core.project import open_project
    from core.sensitivity.memory import release_memory
    from core.workspace import Workspace

    seen = {}

    def probe(self, sets, progress=None, should_stop=None):
        seen["before"] = status()
        release_memory()
        seen["after release_memory()"] = status()
        raise _Stop()

    iso.TrialPool.evaluate = probe
    p = open_project(sys.argv[1], ws=Workspace(Path(sys.argv[2])))
    try:
        iso.sensitivity(p, mode="isolated", workers=2)
    except _Stop:
        pass
    for k, v in seen.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
