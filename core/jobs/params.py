"""The parameters of each job kind: one dataclass per kind whose defaults are the only ones (the
builders write them into the job's JSON params, the runners in ``kinds`` read them back with
``from_params``). ``build_params`` & co. are the builders pages and tests call; their defaults are the
dataclasses' (a dataclass keeps a field's default as its class attribute)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..search import Budget


@dataclass(frozen=True)
class _Params:
    model: str
    data: str | None = None
    eval_data: str | None = None

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


def build_params(model: str, policy_json: str, data: str | None = None, eval_data: str | None = None,
                 backend: str = BuildParams.backend, label: str = BuildParams.label) -> dict:
    """The parameters of a ``build`` job (all JSON-serialisable)."""
    return BuildParams(str(model), data, eval_data, policy_json, backend, label).to_params()


def rank_params(model: str, data: str | None = None, eval_data: str | None = None,
                method: str = RankParams.method, max_samples: int = RankParams.max_samples) -> dict:
    return RankParams(str(model), data, eval_data, method, int(max_samples)).to_params()


def isolated_params(model: str, data: str | None = None, eval_data: str | None = None,
                    method: str = IsolatedParams.method, mode: str = IsolatedParams.mode) -> dict:
    return IsolatedParams(str(model), data, eval_data, method, mode).to_params()


def search_params(model: str, data: str | None = None, eval_data: str | None = None,
                  budget: str = SearchParams.budget, smooth: bool = SearchParams.smooth) -> dict:
    """The parameters of a ``search`` job; the budget is checked (MixprecError) and normalised here."""
    return SearchParams(str(model), data, eval_data, str(Budget.parse(budget)), bool(smooth)).to_params()
