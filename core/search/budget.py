"""The quality budget of a search: ``METRIC>=VALUE`` (or ``top1_drop<=VALUE``) and the dev-half margin."""
from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import MixprecError
from core.measure.metrics import Quality

BUDGET_METRICS = {"cosine_mean": "max", "cosine_min": "max", "snr_db": "max", "knn5_overlap": "max",
                  "top1_agreement": "max", "top1_drop": "min", "kl_div": "min", "perplexity": "min"}
# kl_div: mean KL(FP32 || candidate) of softmaxed logits, nats; perplexity: with next-token labels (core.measure.metrics)


@dataclass(frozen=True)
class Budget:
    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> "Budget":
        m = re.fullmatch(r"\s*([a-z0-9_]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(%?)\s*", text or "")
        if not m or m.group(1) not in BUDGET_METRICS:
            raise MixprecError(f"cannot read the budget {text!r}",
                               "write METRIC>=VALUE or METRIC<=VALUE with METRIC one of "
                               + ", ".join(BUDGET_METRICS) + ", e.g. --budget 'cosine_mean>=0.99' or 'top1_drop<=0.5%'")
        metric, op, value = m.group(1), m.group(2), float(m.group(3)) / (100.0 if m.group(4) else 1.0)
        want = ">=" if BUDGET_METRICS[metric] == "max" else "<="
        if op != want:
            raise MixprecError(f"the budget {text!r} bounds {metric} the wrong way",
                               f"write {metric}{want}{m.group(3)}{m.group(4)}")
        return cls(metric, op, value)

    def value_of(self, q: Quality) -> float:
        if self.metric == "top1_drop":  # accuracy drop with labels, else disagreement with FP32's top-1
            if q.top1_accuracy is not None:
                return q.fp32_top1_accuracy - q.top1_accuracy
            return float("nan") if q.top1_agreement is None else 1.0 - q.top1_agreement
        v = getattr(q, self.metric)
        return float("nan") if v is None else float(v)

    def met(self, q: Quality, margin: float = 0.0) -> bool:
        v = self.value_of(q)
        return v >= self.value + margin if self.op == ">=" else v <= self.value - margin

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def default_margin(budget: Budget) -> float:
    """0.5 dB for SNR; 1 % of a perplexity bound; a tenth of the distance to perfect for the others
    (perfect is 0 for top1_drop and kl_div, 1 for the rest)."""
    if budget.metric == "snr_db":
        return 0.5
    if budget.metric == "perplexity":
        return 0.01 * budget.value
    return 0.1 * (budget.value if budget.metric in ("top1_drop", "kl_div") else 1.0 - budget.value)
