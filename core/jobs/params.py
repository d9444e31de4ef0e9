"""The parameters of each job kind: one dataclass per kind whose defaults are the only ones (the
builders write them into the job's JSON params, the runners in ``kinds`` read them back with
``from_params``). ``build_params`` & co. are the builders pages and tests call; their defaults are the
dataclasses' (a dataclass keeps a field's default as its class attribute)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..estimate.gpus import FIXTURE_GPU, gpu as gpu_entry
from ..project import DEFAULT_TARGET
from ..search import Budget


@dataclass(frozen=True)
class _Params:
    model: str
    data: str | None = None
    eval_data: str | None = None
    shapes: dict | None = None  # per-input full shapes, {"images": [1, 3, 320, 320]} (core.shapes)
    dims: dict | None = None  # named dims, {"seq": 128}
    batch: int = 1
    target: str = DEFAULT_TARGET  # the project's deployment target (core.project.DEPLOY_TARGETS)

    def to_params(self) -> dict:
        """The job's params: JSON-serialisable, every field written out."""
        return asdict(self)

    @classmethod
    def from_params(cls, params: dict):
        """The parameters of a job record (fields it lacks take their defaults; unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})


@dataclass(frozen=True)
class BuildParams(_Params):
    policy: str = ""  # the policy JSON
    backend: str = "auto"
    label: str = ""


@dataclass(frozen=True)
class RankParams(_Params):
    method: str = "minmax"
    max_samples: int = 16


@dataclass(frozen=True)
class IsolatedParams(_Params):
    method: str = "minmax"
    mode: str = "isolated"
    workers: int = 2


@dataclass(frozen=True)
class SearchParams(_Params):
    budget: str = "cosine_mean>=0.99"  # normalised, str(Budget)
    smooth: bool = False
    workers: int = 2
    gpu: str = FIXTURE_GPU  # the GPU of the estimated TensorRT time (core.estimate.gpus key)


def shape_params(shapes: dict | None = None, dims: dict | None = None, batch: int = 1) -> dict:
    """The input-shape fields every job carries (JSON-serialisable: shapes as lists of ints)."""
    return {"shapes": {str(k): [int(d) for d in v] for k, v in shapes.items()} if shapes else None,
            "dims": {str(k): int(v) for k, v in dims.items()} if dims else None, "batch": int(batch)}


def build_params(model: str, policy_json: str, data: str | None = None, eval_data: str | None = None,
                 backend: str = BuildParams.backend, label: str = BuildParams.label,
                 shapes: dict | None = None, dims: dict | None = None, batch: int = 1,
                 target: str = DEFAULT_TARGET) -> dict:
    """The parameters of a ``build`` job (all JSON-serialisable)."""
    return BuildParams(str(model), data, eval_data, **shape_params(shapes, dims, batch), target=target,
                       policy=policy_json, backend=backend, label=label).to_params()


def rank_params(model: str, data: str | None = None, eval_data: str | None = None,
                method: str = RankParams.method, max_samples: int = RankParams.max_samples,
                shapes: dict | None = None, dims: dict | None = None, batch: int = 1,
                target: str = DEFAULT_TARGET) -> dict:
    return RankParams(str(model), data, eval_data, **shape_params(shapes, dims, batch), target=target, method=method,
                      max_samples=int(max_samples)).to_params()


def isolated_params(model: str, data: str | None = None, eval_data: str | None = None,
                    method: str = IsolatedParams.method, mode: str = IsolatedParams.mode,
                    shapes: dict | None = None, dims: dict | None = None, batch: int = 1,
                    target: str = DEFAULT_TARGET) -> dict:
    return IsolatedParams(str(model), data, eval_data, **shape_params(shapes, dims, batch), target=target,
                          method=method, mode=mode).to_params()


def search_params(model: str, data: str | None = None, eval_data: str | None = None,
                  budget: str = SearchParams.budget, smooth: bool = SearchParams.smooth,
                  shapes: dict | None = None, dims: dict | None = None, batch: int = 1,
                  target: str = DEFAULT_TARGET, gpu: str = SearchParams.gpu) -> dict:
    """The parameters of a ``search`` job; the budget and the GPU are checked (MixprecError) and
    normalised here (the GPU to its table key: ``NVIDIA A100-SXM4-80GB`` → ``a100``)."""
    return SearchParams(str(model), data, eval_data, **shape_params(shapes, dims, batch), target=target,
                        budget=str(Budget.parse(budget)), smooth=bool(smooth), gpu=gpu_entry(gpu).key).to_params()
