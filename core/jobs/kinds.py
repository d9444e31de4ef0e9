"""What each job kind runs in the child process: ``KINDS[kind](params, ws, progress)`` returns
the path of its result, saved through ``core.store.results`` (a build by ``core.measure.runs``, an isolated
or leave-one-out table by ``core.sensitivity``, where the store reads it). The isolated
and search jobs run their trials where their ``ray`` param says (``core.jobs.params``); the rank
compares within its ``max_memory``."""
from __future__ import annotations

import os
import signal
import time
import uuid

from core.errors import MixprecError
from core.estimate.gpus import GPUS, custom_gpu
from core.jobs.params import BuildParams, IsolatedParams, RankParams, SearchParams
from core.measure.evaluation import MetricSpec
from core.measure.runs import build_and_measure
from core.quant.policy import CALIB_METHODS, policy_from_text
from core.search import SearchConfig, search
from core.sensitivity import rank_layers, sensitivity, sensitivity_file
from core.store.results import cached_ranking, load_gpu_calibration, resolve_gpu, save_ranking, save_search
from core.workspace import METRICS_FILE, Workspace, atomic_write_json

ANALYSIS_KINDS = ("rank", "isolated", "search")  # one at a time, in the "rank" queue, beside the builds


def _open(p, ws: Workspace, progress):
    progress(0.01, "opening the model")
    return p.source.open(ws)


def run_build(params: dict, ws: Workspace, progress) -> str:
    p = BuildParams.from_params(params)
    project = _open(p, ws, progress)
    policy = policy_from_text(p.policy, project.model, project.layers)
    result = build_and_measure(project, policy, backend=p.backend, label=p.label, progress=progress,
                               ranking=cached_ranking(project, policy.calibration.method),
                               metrics=MetricSpec.from_json(p.metrics))
    return str(result.run_dir / METRICS_FILE)


def run_rank(params: dict, ws: Workspace, progress) -> str:
    p = RankParams.from_params(params)
    project = _open(p, ws, progress)
    ranking = rank_layers(project, method=p.method, max_samples=int(p.max_samples), progress=progress,
                          max_memory=p.max_memory, runner=p.runner)
    return str(save_ranking(ws, project, ranking))


def run_isolated(params: dict, ws: Workspace, progress) -> str:
    p = IsolatedParams.from_params(params)
    project = _open(p, ws, progress)
    # stored by sensitivity() itself, once, where the store and the search read it
    metrics = MetricSpec.from_json(p.metrics)
    sensitivity(project, p.mode, p.method, workers=int(p.workers), progress=progress, ray=p.ray, metrics=metrics)
    return str(sensitivity_file(project, p.mode, p.method, metrics=metrics))


def run_search(params: dict, ws: Workspace, progress) -> str:
    p = SearchParams.from_params(params)
    project = _open(p, ws, progress)
    # a GPU not in the table comes with its figures (what was submitted, not what the workspace holds now)
    g = custom_gpu(p.gpu_spec, "the job's GPU") if p.gpu_spec else resolve_gpu(ws, p.gpu)
    config = SearchConfig(budget=p.budget, smooth=bool(p.smooth), workers=int(p.workers),
                          gpu=g.key if GPUS.get(g.key) == g else g, cost_params=load_gpu_calibration(ws, g),
                          ray=p.ray, metrics=MetricSpec.from_json(p.metrics),
                          methods=tuple(p.methods) if p.methods else CALIB_METHODS, refine=bool(p.refine),
                          network_default=p.network_default)
    result = search(project, config, progress=progress)
    # kept per GPU, metric spec and network default (its policy's: the search's)
    return str(save_search(ws, project, result, bool(p.smooth), g, p.metrics))


def run_sleep(params: dict, ws: Workspace, progress) -> str:
    """Diagnostic kind (tests): sleep in steps, reporting progress; writes a small result file."""
    steps = int(params.get("steps", 10))
    for i in range(steps):
        progress(i / steps, f"step {i + 1}/{steps}")
        time.sleep(float(params.get("seconds", 1.0)) / steps)
    path = ws.scratch / f"sleep-{uuid.uuid4().hex[:8]}.json"
    atomic_write_json(path, {"started_at": params.get("tag", ""), "ended": time.time()})
    return str(path)


def run_crash(params: dict, ws: Workspace, progress) -> str:
    """Diagnostic kind (tests): die like native code does — abort, hard exit or raise."""
    progress(0.5, "about to crash")
    how = params.get("how", "abort")
    if how == "abort":
        os.abort()
    if how == "exit":
        os._exit(int(params.get("code", 7)))
    if how == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    raise MixprecError("the diagnostic job failed on purpose", "nothing to fix")


KINDS = {"build": run_build, "rank": run_rank, "isolated": run_isolated, "search": run_search,
         "sleep": run_sleep, "crash": run_crash}
