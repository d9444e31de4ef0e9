"""What a search produces: its candidates, their Pareto front, and the ``SearchResult`` record
(the one place a stored search document is assembled and read)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd

from core.errors import MixprecError
from core.measure.metrics import Quality
from core.measure.runs import RunResult
from core.model.inventory import Layer
from core.model.load import LoadedModel
from core.quant.policy import Policy, policy_from_dict
from core.records import check_format, frame_from_json, frame_to_json
from core.search.budget import Budget
from core.sensitivity import Sensitivity

CANDIDATE_COLUMNS = ["candidate", "method", "n_int8", "n_fallback", "quality", "est_ms", "int8_mac_share",
                     "est_reformat_pct", "boundaries", "meets_budget", "pareto", "fallback", "int8_layers",
                     "est_low_ms", "est_high_ms"]
# est_low_ms / est_high_ms: the band of est_ms (core.estimate.validation) when it is a TensorRT estimate, else NaN
BAND_COLUMNS = ["est_low_ms", "est_high_ms"]
_V1_CANDIDATE_COLUMNS = [c for c in CANDIDATE_COLUMNS if c not in BAND_COLUMNS]
FRONT_COLUMNS = ["candidate", "method", "n_int8", "quality", "est_ms", "est_low_ms", "est_high_ms", "int8_mac_share",
                 "est_reformat_pct", "boundaries", "meets_budget"]


@dataclass
class Candidate:
    method: str  # the calibration variant
    int8: frozenset
    quality: Quality
    est_ms: float
    int8_mac_share: float
    est_reformat_pct: float
    meets_budget: bool
    boundaries: int = 0  # edges between an INT8 layer and an FP16 one (core.search.latency)
    est_low_ms: float = math.nan   # the band of est_ms (a TensorRT estimate), else NaN
    est_high_ms: float = math.nan


def pareto_flags(quality_vals: np.ndarray, latency_vals: np.ndarray) -> np.ndarray:
    """Non-dominated points for (quality ↑, latency ↓)."""
    n = len(quality_vals)
    flags = np.ones(n, dtype=bool)
    for i in range(n):
        better_eq = (quality_vals >= quality_vals[i]) & (latency_vals <= latency_vals[i])
        strictly = (quality_vals > quality_vals[i]) | (latency_vals < latency_vals[i])
        flags[i] = not np.any(better_eq & strictly)
    return flags


def candidate_table(cands: list[Candidate], budget: Budget, eligible: list[str]) -> pd.DataFrame:
    """CANDIDATE_COLUMNS, one row per distinct (quality, estimated time), with the Pareto flag."""
    rows = [(i, c.method, len(c.int8), 0, budget.value_of(c.quality), c.est_ms, c.int8_mac_share, c.est_reformat_pct,
             c.boundaries, c.meets_budget, False, "", ",".join(sorted(c.int8)), c.est_low_ms, c.est_high_ms)
            for i, c in enumerate(cands)]
    df = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS).drop_duplicates(["quality", "est_ms"], ignore_index=True)
    cands = [cands[i] for i in df.candidate]
    q = df.quality.to_numpy() if budget.op == ">=" else -df.quality.to_numpy()
    df["pareto"] = pareto_flags(q, df.est_ms.to_numpy())
    df["n_fallback"] = [len(eligible) - len(c.int8) for c in cands]
    df["fallback"] = [",".join(sorted(set(eligible) - set(c.int8))) for c in cands]
    return df


def candidate_policy(variants: dict[str, Policy], row) -> Policy:
    """Policy of a candidate row (``method``, ``int8_layers``) on top of its variant's base policy:
    its INT8 layers INT8, the other eligible layers FP16."""
    base = variants[row["method"]]
    int8 = set(filter(None, str(row["int8_layers"]).split(",")))
    eligible_now = {n for n, p in base.layers.items() if p == "int8"}
    return base.with_layers({n: ("int8" if n in int8 else "fp16") for n in eligible_now | int8})


def candidate_number(candidates: pd.DataFrame, cand: Candidate) -> int | None:
    """The number of ``cand`` in the candidate table (its method and INT8 set; else the row of its
    quality and time, which the table keeps one of), or None."""
    key = ",".join(sorted(cand.int8))
    rows = candidates[(candidates["method"] == cand.method) & (candidates["int8_layers"] == key)]
    if rows.empty:
        rows = candidates[candidates["est_ms"] == cand.est_ms]
    return int(rows["candidate"].iloc[0]) if not rows.empty else None


def chosen_candidate(candidates: pd.DataFrame, variants: dict[str, Policy], policy: Policy) -> int | None:
    """The number of the candidate whose policy is ``policy``, or None."""
    return next((int(row["candidate"]) for _, row in candidates.iterrows()
                 if candidate_policy(variants, row).sha256 == policy.sha256), None)


@dataclass
class SearchResult:
    """A finished search, stored as a ``"search"`` document (:meth:`to_json` / :meth:`from_json`).
    Its isolated sensitivity is stored once, in ``rankings/<sensitivity_ref>.json`` where
    ``core.sensitivity.sensitivity`` computes it: the document holds that key, not a copy of the table
    (``core.store.results.load_search`` reads the table back)."""

    # 2: the estimate's band per candidate (est_low_ms, est_high_ms), tie_note;
    # 3: "sensitivity_ref" (the rankings/ key of the isolated table) instead of the table itself
    FORMAT_VERSION: ClassVar[int] = 3
    KIND: ClassVar[str] = "search"

    budget: Budget
    policy: Policy
    met_on_dev: bool
    met_on_holdout: bool | None
    holdout: Quality | None
    message: str
    candidates: pd.DataFrame  # CANDIDATE_COLUMNS, with the Pareto flag
    sensitivity: Sensitivity | None  # None: a stored search whose rankings/ document is gone or damaged
    run: RunResult | None = None  # the verifying build (without its per-layer table once stored)
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)  # calibration variant -> its base Policy
    chosen: int | None = None  # the candidate whose policy is ``policy``
    objective: str = "latency"  # what ranked the candidates: latency / trt_estimate / mac_share
    latency_label: str = ""     # what est_ms is when it is not the backend's profile fit (trt_estimate)
    tie_note: str = ""          # trt_estimate: candidates within the estimate's band of the fastest, and the pick
    sensitivity_ref: str = ""   # the key of ``sensitivity`` in rankings/ (``core.sensitivity.sensitivity_file``)

    @property
    def front(self) -> pd.DataFrame:
        """The Pareto front (FRONT_COLUMNS), fastest first."""
        c = self.candidates
        return c[c["pareto"]].sort_values("est_ms", kind="stable", ignore_index=True)[FRONT_COLUMNS]

    def policy_for(self, candidate: int) -> Policy:
        """The policy of any evaluated candidate (e.g. a point of the front the user picks)."""
        return candidate_policy(self.variants, self.candidates.set_index("candidate").loc[candidate])

    def front_policy(self, candidate: int) -> Policy:
        """The policy of one point of the Pareto front; a MixprecError naming the front's points otherwise."""
        on_front = sorted(int(c) for c in self.front["candidate"])
        if int(candidate) not in on_front:
            raise MixprecError(f"candidate {candidate} is not on the stored Pareto front",
                               "pick one of the front's points: " + ", ".join(map(str, on_front)))
        return self.policy_for(int(candidate))

    def to_json(self) -> dict:
        run = {k: v for k, v in self.run.to_json().items() if k != "per_layer"} if self.run else None
        return {
            "kind": self.KIND, "format_version": self.FORMAT_VERSION,
            "budget": str(self.budget), "met_on_dev": self.met_on_dev, "met_on_holdout": self.met_on_holdout,
            "message": self.message, "seconds": self.seconds, "timings": self.timings,
            "policy": self.policy.to_dict(), "precision_counts": self.policy.precision_counts(),
            "holdout": self.holdout.to_dict() if self.holdout else None, "run": run,
            "candidates": frame_to_json(self.candidates), "chosen": self.chosen,
            "objective": self.objective, "latency_label": self.latency_label, "tie_note": self.tie_note,
            **self._sensitivity_json(),
            "variants": {k: v.to_dict() for k, v in self.variants.items()},
        }

    def _sensitivity_json(self) -> dict:
        """The reference to the stored table; the table itself only when it is stored nowhere else (no
        reference: a result not made by ``core.search.search``) or there is none (``null``)."""
        if self.sensitivity_ref:
            return {"sensitivity_ref": self.sensitivity_ref}
        return {"sensitivity": self.sensitivity.to_json() if self.sensitivity is not None else None}

    @classmethod
    def from_json(cls, doc: dict, model: LoadedModel, layers: list[Layer]) -> "SearchResult":
        """The search of a stored document; its policies are validated against ``model``. A document
        of format 1 (before the band) reads with NaN bands; formats 1 and 2 hold the sensitivity table,
        format 3 its ``sensitivity_ref`` (the result's ``sensitivity`` is None until the store reads it)."""
        got = doc.get("format_version") if isinstance(doc, dict) else None
        old = got == 1
        doc = check_format(doc, cls.KIND, got if got in (1, 2) else cls.FORMAT_VERSION, "search")
        ref = doc.get("sensitivity_ref", "") if got == cls.FORMAT_VERSION else ""
        if not isinstance(ref, str):
            raise TypeError(f"sensitivity_ref is a {type(ref).__name__}, not a key")
        sens = None if ref else doc["sensitivity"]  # the table (formats 1, 2; format 3 without a reference)
        sens = Sensitivity.from_json(sens) if sens is not None else None
        if old:
            candidates = frame_from_json(doc["candidates"], _V1_CANDIDATE_COLUMNS, "search candidates")
            candidates = candidates.assign(**{c: math.nan for c in BAND_COLUMNS})[CANDIDATE_COLUMNS]
        else:
            candidates = frame_from_json(doc["candidates"], CANDIDATE_COLUMNS, "search candidates")
        return cls(
            Budget.parse(doc["budget"]), policy_from_dict(doc["policy"], model, layers), bool(doc["met_on_dev"]),
            doc["met_on_holdout"], Quality.from_dict(doc["holdout"]) if doc["holdout"] else None, doc["message"],
            candidates,
            sens, RunResult.from_json(doc["run"]) if doc["run"] else None,
            float(doc["seconds"]), dict(doc["timings"]),
            {k: policy_from_dict(v, model, layers) for k, v in doc["variants"].items()}, doc["chosen"],
            str(doc.get("objective", "latency")), str(doc.get("latency_label", "")), str(doc.get("tie_note", "")), ref)
