"""The quality budget of a search: ``METRIC>=VALUE`` (or ``top1_drop<=VALUE``), or ``NAME:METRIC>=VALUE`` on the
metric output ``NAME`` (``--metric-output``, ``core.measure.evaluation``), and the dev-half margin."""
from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import MixprecError
from core.measure.metrics import Quality

BUDGET_METRICS = {"cosine_mean": "max", "cosine_min": "max", "snr_db": "max", "knn5_overlap": "max",
                  "top1_agreement": "max", "top1_drop": "min", "kl_div": "min", "perplexity": "min",
                  "top1_accuracy": "max", "mask_iou": "max", "map_cosine_mean": "max", "score_cosine": "max",
                  "score_topk": "max", "box_iou": "max", "user": "max"}
# kl_div: mean KL(FP32 || candidate) of softmaxed logits, nats; perplexity: with next-token labels (core.measure.metrics)
# mask_iou & co.: the task metrics, user: the user metric (--metric-file) (core.measure.evaluation)
BUDGET_FORM = ("METRIC>=VALUE or METRIC<=VALUE, or NAME:METRIC>=VALUE for the metric output NAME "
               "(--metric-output NAME=OUTPUT[...,A:B])")


@dataclass(frozen=True)
class Budget:
    metric: str
    op: str
    value: float
    output: str | None = None  # a metric output's name (NAME:METRIC); None: the headline output

    @classmethod
    def parse(cls, text: str) -> "Budget":
        m = re.fullmatch(r"\s*(?:(.+?)\s*:\s*)?([a-z0-9_]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(%?)\s*", text or "")
        if not m or m.group(2) not in BUDGET_METRICS:
            raise MixprecError(f"cannot read the budget {text!r}",
                               f"write {BUDGET_FORM}, with METRIC one of " + ", ".join(BUDGET_METRICS)
                               + ", e.g. --budget 'cosine_mean>=0.99', 'top1_drop<=0.5%', 'scores:cosine_mean>=0.99' "
                               "or 'user>=0.98'")
        output, metric, op = m.group(1), m.group(2), m.group(3)
        value = float(m.group(4)) / (100.0 if m.group(5) else 1.0)
        want = ">=" if BUDGET_METRICS[metric] == "max" else "<="
        if op != want:
            raise MixprecError(f"the budget {text!r} bounds {metric} the wrong way",
                               f"write {(output + ':') if output else ''}{metric}{want}{m.group(4)}{m.group(5)}")
        if metric == "user" and output:
            raise MixprecError(f"the budget {text!r} names an output, but the user metric is one number for the model",
                               "write user>=VALUE")
        return cls(metric, op, value, output)

    def value_of(self, q: Quality) -> float:
        if self.output is not None:
            q = (q.outputs or {}).get(self.output)
            if q is None:
                return float("nan")
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
        return f"{self.output + ':' if self.output else ''}{self.metric}{self.op}{self.value:g}"


def default_margin(budget: Budget) -> float:
    """0.5 dB for SNR; 1 % of a perplexity bound; none for the user metric (its scale is the user's); a tenth of the distance to perfect for the others
    (perfect is 0 for top1_drop and kl_div, 1 for the rest)."""
    if budget.metric == "snr_db":
        return 0.5
    if budget.metric == "perplexity":
        return 0.01 * budget.value
    if budget.metric == "user":  # a scale mixprec does not know: no headroom
        return 0.0
    return 0.1 * (budget.value if budget.metric in ("top1_drop", "kl_div") else 1.0 - budget.value)
