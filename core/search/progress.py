"""How far a long job is, in trials, and how long it has left.

A job says how far it is in its stage text (the ``progress(fraction, text)`` it reports): a trial pool's
``trial 12/37`` (``core.sensitivity``), and a search, which runs several pools one after the other, its
count over all of them: ``… · 40 of about 160 trials`` (:func:`overall_text`; the total is what it expects,
updated as it learns more). :func:`trials_in` reads them back (the overall count first), and the time left
is the time per trial so far times the trials left (:func:`eta_seconds`): elapsed / done × remaining, said
only once :data:`MIN_TRIALS` trials are done (the first trial also pays for starting the workers)."""
from __future__ import annotations

import math
import re

MIN_TRIALS = 2  # trials done before an ETA is said
_OVERALL = re.compile(r"(\d+) of about (\d+) trials")
_POOL = re.compile(r"\btrial (\d+)/(\d+)")


def overall_text(done: int, total: int) -> str:
    """A search's count over all its trials: ``40 of about 160 trials``."""
    return f"{int(done)} of about {max(int(total), int(done))} trials"


def trials_in(stage: str) -> tuple[int, int] | None:
    """(done, total) of the trials a stage text names: its overall count (:func:`overall_text`) if it has
    one, else the last ``trial D/T`` of a trial pool; None when it names none."""
    if not isinstance(stage, str):
        return None
    found = _OVERALL.findall(stage) or _POOL.findall(stage)
    if not found:
        return None
    done, total = (int(x) for x in found[-1])
    return done, max(total, done)


def eta_seconds(elapsed: float, done: int, total: int, min_trials: int = MIN_TRIALS) -> float | None:
    """Seconds left: ``elapsed / done × (total − done)``; None before ``min_trials`` trials are done, or for
    counts and times that say nothing (a negative or non-finite elapsed time, no total)."""
    try:
        elapsed, done, total = float(elapsed), int(done), int(total)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(elapsed) or elapsed < 0 or done < max(1, min_trials) or total <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def minutes_text(seconds: float) -> str:
    """A duration in the words of an estimate: "less than a minute", "about 7 min", "about 2 h 10 min"."""
    minutes = round(float(seconds) / 60.0)
    if minutes < 1:
        return "less than a minute"
    if minutes < 120:
        return f"about {minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"about {hours} h" + (f" {rest} min" if rest else "")


def eta_text(seconds: float | None) -> str:
    """"about 7 min left" ("" when there is no ETA)."""
    return "" if seconds is None else f"{minutes_text(seconds)} left"
