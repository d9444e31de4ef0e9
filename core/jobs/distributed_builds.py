"""Engine builds of candidate policies spread over a Ray cluster's GPUs: one Ray task per policy,
each holding one GPU (``num_gpus=1``; Ray sets the task's ``CUDA_VISIBLE_DEVICES``), so a box with
N GPUs builds and times N candidates at once (``core.sensitivity.distributed.gpu_map``).

Each task reopens the project from its parameters (the same ``BuildParams`` a build job carries) and
runs the build job's code (``core.jobs.kinds.run_build``) in the workspace at ``ws.root``: every node
must see the model, the data and the workspace at the same paths (shared storage, docs/distributed.md).

The product's caller is ``python -m core build MODEL --policy A.json --policy B.json --ray ADDRESS``
(``core.cli.commands``)."""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from core.jobs.kinds import run_build
from core.jobs.params import build_params
from core.project import ProjectSource
from core.quant.policy import Policy
from core.sensitivity.distributed import gpu_map
from core.workspace import Workspace


@dataclass(frozen=True)
class GpuBuild:
    """One build of :func:`build_policies`: its run's metrics file, the GPU(s) it held, where and when."""

    metrics_path: str
    gpus: str  # the task's CUDA_VISIBLE_DEVICES
    host: str
    pid: int
    started: float
    ended: float

    @property
    def run_dir(self) -> Path:
        return Path(self.metrics_path).parent


def build_task(job: tuple[dict, str]) -> GpuBuild:
    """A Ray task: the build job ``params`` in the workspace at ``root``."""
    params, root = job
    t0 = time.time()
    metrics = run_build(params, Workspace(Path(root)), lambda fraction, text: None)
    return GpuBuild(metrics, os.environ.get("CUDA_VISIBLE_DEVICES", ""), socket.gethostname(), os.getpid(), t0,
                    time.time())


def build_policies(source: ProjectSource | str, policies: list[Policy | str], address: str, ws: Workspace, *,
                   backend: str = "tensorrt", num_gpus: float = 1, progress=None, should_stop=None) -> list[GpuBuild]:
    """Build and measure every policy (a Policy or its JSON) of the project ``source`` (a
    ProjectSource, or a model path or ``sample:NAME`` alone, that every node can open) as Ray tasks
    with ``num_gpus`` GPUs each; in the order given."""
    jobs = [(build_params(source, p if isinstance(p, str) else p.to_json(), backend=backend,
                          label=f"gpu build {i + 1}/{len(policies)}"), str(ws.root)) for i, p in enumerate(policies)]
    return gpu_map(build_task, jobs, address, num_gpus=num_gpus, progress=progress, should_stop=should_stop)
