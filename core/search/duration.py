"""How long a search takes, in trials: the count it expects before it starts (:func:`expected_trials`),
its count while it runs over every trial pool it opens (:class:`TrialCount`, :class:`CountedPool`, said in
its stage as ``core.search.progress.overall_text``, where the job list reads its time left), and the time a search
is expected to take from a measured time per trial (:func:`per_trial_seconds`, :func:`expected_text`).

A search (``core.search.searcher``) measures, per calibration method, the isolated ranking (one trial per
eligible layer and the baseline: ``n + 1``; none when that ranking is stored already), then per variant (each
method, the per-tensor mix when there are several methods, the smoothed variant) a binary search over the
fallback count (about ``2 + log2(n + 1)`` trials) and, unless it is a quick search, the put-back pass
(one trial per layer that fell back: about a quarter of them, :data:`PUT_BACK_SHARE`)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from core.search.progress import minutes_text, overall_text

PUT_BACK_SHARE = 0.25  # the share of eligible layers the put-back pass tries, expected (it is counted as it runs)


def isolated_trials(n_eligible: int) -> int:
    """The trials of one isolated ranking: the baseline and one per eligible layer."""
    return int(n_eligible) + 1


def variant_trials(n_eligible: int, refine: bool = True) -> int:
    """The trials expected of one variant's search: the binary search over the fallback count and (``refine``)
    the put-back pass."""
    n = max(int(n_eligible), 0)
    return 2 + math.ceil(math.log2(n + 1)) + (math.ceil(PUT_BACK_SHARE * n) if refine else 0)


def expected_trials(n_eligible: int, methods: int, smooth: bool = False, refine: bool = True,
                    ranked: int = 0) -> int:
    """The trials a search of ``methods`` calibration methods is expected to run on ``n_eligible`` layers;
    ``ranked``: how many of the methods' isolated rankings are stored already (not measured again)."""
    rankings = max(int(methods) - int(ranked), 0) + (1 if smooth else 0)
    variants = int(methods) + (1 if methods > 1 else 0) + (1 if smooth else 0)
    return rankings * isolated_trials(n_eligible) + variants * variant_trials(n_eligible, refine)


@dataclass
class TrialCount:
    """The trials a running search has done and how many it expects in all (corrected as it learns more:
    a stored ranking, a variant that is not made, a variant's search done in fewer or more trials)."""

    done: int = 0
    total: int = 0

    def add(self, n: int = 1) -> None:
        self.done += n
        self.total = max(self.total, self.done)

    def expect(self, delta: int) -> None:
        """``delta`` more (or, negative, fewer) trials than expected so far."""
        self.total = max(self.done, self.total + int(delta))

    def text(self) -> str:
        return overall_text(self.done, self.total) if self.total else ""


class CountedPool:
    """A trial pool (``core.sensitivity.open_trial_pool``'s) whose every finished trial calls ``on_trial()``
    before the caller's own progress (if any) hears of it; anything else is the pool's."""

    def __init__(self, pool, on_trial):
        self.pool, self.on_trial = pool, on_trial

    def evaluate(self, int8_sets, progress=None, should_stop=None):
        def each(fraction, text):
            self.on_trial()
            if progress is not None:
                progress(fraction, text)
        return self.pool.evaluate(int8_sets, each, should_stop)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def per_trial_seconds(samples) -> float | None:
    """The time per trial measured before: the median of ``seconds / trials`` over ``samples`` ((seconds,
    trials) pairs, e.g. a stored isolated ranking's time and its layers + 1); None when none says anything."""
    rates = []
    for seconds, trials in samples:
        try:
            s, k = float(seconds), int(trials)
        except (TypeError, ValueError, OverflowError):
            continue
        if k > 0 and math.isfinite(s) and s > 0:
            rates.append(s / k)
    return statistics.median(rates) if rates else None


def expected_seconds(trials: int, per_trial: float | None) -> float | None:
    return None if per_trial is None else float(trials) * float(per_trial)


def expected_text(trials: int, per_trial: float | None) -> str:
    """"about 12 min (about 180 trials × 4.0 s, the time per trial measured on this model)", or that the time is
    unknown when no trial of this model was timed yet."""
    if per_trial is None:
        return (f"expected time unknown: about {trials} trials, and no trial of this model has been timed yet "
                "(an isolated ranking on the Sensitivity page times them)")
    each = f"{per_trial:.1f}" if per_trial >= 1 else f"{per_trial:.2g}"
    return (f"{minutes_text(expected_seconds(trials, per_trial))} (about {trials} trials × {each} s, the "
            "time per trial measured on this model; calibrating and the verifying build come on top)")
