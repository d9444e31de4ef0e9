"""The parameters of each job kind: one dataclass per kind whose defaults are the only ones (the
builders write them into the job's JSON params, the runners in ``kinds`` read them back with
``from_params``). ``build_params`` & co. are the builders pages and tests call; their defaults are the
dataclasses' (a dataclass keeps a field's default as its class attribute). Every kind carries the
project it runs on as a :class:`core.project.ProjectSource` (its deployment target resolved), written
flat into the params beside the kind's own fields, as jobs always were (older job records read the same).

Where trials run (isolated / leave-one-out sensitivity, the search): ``ray`` None is the job
process's ``$MIXPREC_RAY_ADDRESS`` (``core.sensitivity.distributed.ray_address``), ``""`` the local process
pool, else a Ray address (checked by :func:`ray_param`). The rank's ``max_memory`` is
``rank --max-memory`` (``core.sensitivity.memory.parse_memory``; None: the default budget)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace

from core.errors import MixprecError
from core.estimate.gpus import FIXTURE_GPU, GPU, GPUS, custom_gpu, gpu as gpu_entry
from core.measure.evaluation import MetricSpec
from core.project import ProjectSource
from core.quant.policy import CALIB_METHODS, NETWORK_DEFAULTS
from core.search import Budget
from core.sensitivity import parse_memory
from core.sensitivity.distributed import LOCAL, OFF

RAY_FORMS = "local, auto, HOST:6379 or ray://HOST:10001"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"  # one part of a host name
_HOST = rf"(?:\[[0-9A-Fa-f:.]+\]|{_LABEL}(?:\.{_LABEL})*)"  # a host name, an IPv4 or [IPv6]
_RAY_ADDRESS = re.compile(rf"(?:ray://)?{_HOST}:(\d{{1,5}})")


@dataclass(frozen=True)
class _Params:
    source: ProjectSource  # a str is the model alone; the target None is resolved (core.project.DEFAULT_TARGET)

    def __post_init__(self):
        src = ProjectSource(self.source) if isinstance(self.source, str) else self.source
        object.__setattr__(self, "source", replace(src, target=src.deploy_target))

    def to_params(self) -> dict:
        """The job's params: JSON-serialisable, every field written out (the source's flat, first)."""
        rest = asdict(self)
        del rest["source"]
        return {**self.source.to_json(), **rest}

    @classmethod
    def from_params(cls, params: dict):
        """The parameters of a job record (fields it lacks take their defaults; unknown keys are ignored)."""
        names = {f.name for f in fields(cls)} - {"source"}
        return cls(ProjectSource.from_json(params), **{k: v for k, v in params.items() if k in names})


@dataclass(frozen=True)
class BuildParams(_Params):
    policy: str = ""  # the policy JSON
    backend: str = "auto"
    label: str = ""
    metrics: dict | None = None  # what quality is measured on: MetricSpec.to_json (None: the first float output)


@dataclass(frozen=True)
class RankParams(_Params):
    method: str = "minmax"
    max_samples: int = 16
    max_memory: str | None = None  # the comparison's budget (rank --max-memory: 2G, 512M, 40%); None: the default
    runner: str = "auto"  # where the candidate runs (rank --runner): auto, onnxruntime, tensorrt


@dataclass(frozen=True)
class IsolatedParams(_Params):
    method: str = "minmax"
    mode: str = "isolated"
    workers: int = 2
    ray: str | None = None  # where the trials run (see the module's docstring)
    metrics: dict | None = None  # MetricSpec.to_json (None: the first float output)


@dataclass(frozen=True)
class SearchParams(_Params):
    budget: str = "cosine_mean>=0.99"  # normalised, str(Budget)
    smooth: bool = False
    workers: int = 2
    gpu: str = FIXTURE_GPU  # the GPU of the estimated TensorRT time (core.estimate.gpus key)
    gpu_spec: dict | None = None  # a GPU not in the table: its figures (GPU.to_json), the job computes with them
    ray: str | None = None  # where the trials run (see the module's docstring)
    metrics: dict | None = None  # MetricSpec.to_json (None: the first float output)
    methods: list | None = None  # the calibration methods searched (None: all of core.quant.policy.CALIB_METHODS)
    refine: bool = True  # the put-back pass (False, with one method: the quick search)
    network_default: str = "fp32"  # the draft's network default: the search's base policy (fp32 / fp16)


def ray_param(text: str | None) -> str | None:
    """A Ray address as a job carries it: None stays None ($MIXPREC_RAY_ADDRESS), empty or ``off``
    is ``""`` (the local process pool), ``local``/``auto``/``[ray://]HOST:PORT`` as written; anything
    else is a MixprecError."""
    if text is None:
        return None
    value = str(text).strip()
    if value.lower() in OFF:
        return ""
    if value.lower() in (LOCAL, "auto"):
        return value.lower()
    m = _RAY_ADDRESS.fullmatch(value)
    if m is None or not 0 < int(m.group(1)) < 65536:
        raise MixprecError(f"{value[:200]!r} is not a Ray cluster address",
                           f"write {RAY_FORMS}, or leave it empty for the local process pool")
    return value


def memory_param(text: str | None) -> str | None:
    """A comparison memory budget as a job carries it (None or empty: the default budget), checked
    with ``rank --max-memory``'s parser."""
    value = "" if text is None else str(text).strip()
    if not value:
        return None
    try:
        parse_memory(value)
    except MixprecError as e:
        raise MixprecError(f"{value[:200]!r} is not a memory size", e.fix) from e
    return value


def trials_text(ray: str | None) -> str:
    """Where a job's trials run, for its label: ``""`` when nothing was chosen or the local pool."""
    if not ray:
        return ""
    return "trials on a local Ray instance" if ray == LOCAL else f"trials on Ray {ray}"


def job_label(kind: str, params: dict, label: str) -> str:
    """The label a job is recorded with: ``label`` plus where its trials run, or its comparison's
    memory budget (``rank --max-memory``), when the job says."""
    extra = [trials_text(params.get("ray"))] if kind in ("isolated", "search") else []
    if kind == "rank" and params.get("max_memory"):
        extra.append(f"comparison within {params['max_memory']}")
    extra = [e for e in extra if e and e not in label]
    return " · ".join([label or kind, *extra])


def metrics_param(metrics: MetricSpec | dict | None) -> dict | None:
    """What quality is measured on as a job carries it: None for the default (first float output), else the
    checked ``MetricSpec.to_json`` (a bad spec is a MixprecError here, before the job is queued)."""
    spec = metrics if isinstance(metrics, MetricSpec) else MetricSpec.from_json(metrics)
    return None if spec.is_default else spec.to_json()


def build_params(source: ProjectSource | str, policy_json: str, backend: str = BuildParams.backend,
                 label: str = BuildParams.label, metrics: MetricSpec | dict | None = None) -> dict:
    """The parameters of a ``build`` job (all JSON-serialisable); ``source``: the project (a str: the model alone);
    ``metrics``: what quality is measured on (:func:`metrics_param`)."""
    return BuildParams(source, policy=policy_json, backend=backend, label=label,
                       metrics=metrics_param(metrics)).to_params()


def rank_params(source: ProjectSource | str, method: str = RankParams.method,
                max_samples: int = RankParams.max_samples, max_memory: str | None = None) -> dict:
    """The parameters of a ``rank`` job; ``max_memory`` is checked (MixprecError) here."""
    return RankParams(source, method=method, max_samples=int(max_samples),
                      max_memory=memory_param(max_memory)).to_params()


def isolated_params(source: ProjectSource | str, method: str = IsolatedParams.method,
                    mode: str = IsolatedParams.mode, ray: str | None = None,
                    metrics: MetricSpec | dict | None = None) -> dict:
    """The parameters of an ``isolated`` job (either mode); the Ray address is checked (MixprecError) here."""
    return IsolatedParams(source, method=method, mode=mode, ray=ray_param(ray),
                          metrics=metrics_param(metrics)).to_params()


def search_params(source: ProjectSource | str, budget: str = SearchParams.budget, smooth: bool = SearchParams.smooth,
                  gpu: str | GPU = SearchParams.gpu, ray: str | None = None,
                  metrics: MetricSpec | dict | None = None, methods=None, refine: bool = SearchParams.refine,
                  network_default: str = SearchParams.network_default) -> dict:
    """The parameters of a ``search`` job; the budget, the GPU and the Ray address are checked
    (MixprecError) and normalised here (the GPU to its table key: ``NVIDIA A100-SXM4-80GB`` → ``a100``; a
    :class:`GPU` that is not a table row, a ``--gpu-spec`` or a GPU saved in the workspace, travels with its
    figures in ``gpu_spec``). ``methods``: the calibration methods to search (None: all), ``refine``: the put-back
    pass — one method without it is the quick search. ``network_default``: the precision of the layers the search
    does not set (the draft's, ``--network-default``; checked here)."""
    if network_default not in NETWORK_DEFAULTS:
        raise MixprecError(f"network default {str(network_default)[:40]!r} is not fp32 or fp16",
                           "pick fp32 or fp16 (--network-default)")
    if methods is not None:
        bad = [m for m in methods if m not in CALIB_METHODS]
        if bad or not methods:
            raise MixprecError(f"calibration method(s) {', '.join(map(repr, bad)) or 'none'} cannot be searched",
                               f"pick from {', '.join(CALIB_METHODS)}")
        methods = list(dict.fromkeys(methods))
    g = custom_gpu(gpu) if isinstance(gpu, GPU) else gpu_entry(gpu)
    spec = None if GPUS.get(g.key) == g else g.to_json()
    return SearchParams(source, budget=str(Budget.parse(budget)), smooth=bool(smooth), gpu=g.key, gpu_spec=spec,
                        ray=ray_param(ray), metrics=metrics_param(metrics), methods=methods,
                        refine=bool(refine), network_default=network_default).to_params()
