"""How far the TensorRT estimate is from real engines, and the uncertainty band every estimate carries.

**Validation data.** ``validation.json`` (beside this module; kind ``mixprec.estimate_validation``)
holds one row per validation case (:data:`ROW_COLUMNS`): a real engine or a published latency, the
estimate of it, and whether the fit saw it (``held_out``; ``split``: in-sample, leave-one-engine-out,
leave-one-gpu-out, held-out published). It is written by ``bench/bench_estimate_validation.py``
(which also writes docs/estimate-validation.md) from the rows of ``core.estimate.fit.validation_rows``
(CNN engine reports) and ``core.estimate.transformer.validation_rows`` (published BERT latencies);
the document names the command and date that produced it.

**The band** (:func:`band`). For an estimate on a GPU of architecture ``arch``: every layer class
belongs to a family (:func:`family_of`: ``transformer`` for the transformer and attention classes,
``cnn`` for the others). Each family's spread on that architecture is the :data:`QUANTILE` quantile
of ``|log(estimated / measured)|`` over its validation cases on GPUs of the same architecture —
the held-out cases where there are any, the in-sample ones only when nothing was held out (and the
band says so) — and at least :data:`MIN_SPREAD`. The estimate's spread is the families' spreads
weighted by each family's share of the estimated time; the band is ``total · exp(±spread)``
("0.860 ms, likely 0.785–0.942 ms"). A family with no validation case on that architecture is
*unvalidated*: it takes the widest spread known (any family, any architecture), and the text says
"unvalidated" ("0.860 ms, unvalidated on Hopper GPUs: likely 0.564–1.31 ms").

**The difference band** (:attr:`Band.diff_log_spread`, what the search's ties use). The band above is the
error of one absolute estimate; the search compares two policies of the *same* model on the *same* GPU,
whose errors largely cancel. Validation cases that form a pair (:func:`pairs_of`: same family, GPU,
model, batch and sequence, the same split, two different cases — another precision or policy) give the
error of an estimated *ratio*, ``|log((est_a / est_b) / (measured_a / measured_b))|``; its
:data:`QUANTILE` quantile per family and architecture (held-out pairs first, in-sample ones only when
no pair was held out, at least :data:`MIN_SPREAD`; a family or architecture without a pair takes the
widest difference spread known, or the widest absolute spread when no pair exists at all) weighted by
each family's share of the time, is the window inside which two candidates' estimates are a tie."""
from __future__ import annotations

import functools
import json
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Mapping

import numpy as np
import pandas as pd

from ..errors import MixprecError
from .cost import TRANSFORMER_CLASSES as _COST_TRANSFORMER_CLASSES

KIND = "mixprec.estimate_validation"
FORMAT_VERSION = 2  # 2: the difference band (diff_spreads, pairs); format 1 (rows only) is read too
READ_VERSIONS = (1, 2)
PATH = Path(__file__).with_name("validation.json")
ROW_COLUMNS = ["case", "source", "gpu", "arch", "model", "precision", "batch", "seq", "held_out", "split",
               "measured_ms", "estimated_ms", "rel_err", "median_layer_err", "family"]
SPLITS = ("in-sample", "leave-one-engine-out", "leave-one-gpu-out", "held-out published")
FAMILIES = ("cnn", "transformer")
# the layer classes of the transformer family: the cost model's transformer classes (transformer GEMMs,
# attention, transformer_norm), and any other class whose name says attention or transformer
TRANSFORMER_CLASSES = {"transformer", *_COST_TRANSFORMER_CLASSES}
QUANTILE = 0.85          # of |log(est / measured)| over a family's cases on one architecture
MIN_SPREAD = math.log(1.05)  # no band narrower than ±5 %: a handful of lucky cases promises no more
NO_DATA_SPREAD = math.log(2.0)  # the "widest known spread" when there is no validation data at all
ARCH_NAMES = {"pascal": "Pascal", "volta": "Volta", "turing": "Turing", "ampere": "Ampere",
              "ada": "Ada Lovelace", "hopper": "Hopper", "blackwell": "Blackwell"}
STATUSES = ("validated", "in-sample", "unvalidated")
_STRINGS = ("case", "source", "gpu", "arch", "model", "precision", "split", "family")


def family_of(layer_class: str) -> str:
    """``transformer`` for the transformer layer classes (:data:`TRANSFORMER_CLASSES`, any attention
    or transformer class), else ``cnn``."""
    c = str(layer_class).lower()
    return "transformer" if c in TRANSFORMER_CLASSES or "attention" in c or "transformer" in c else "cnn"


def arch_name(arch: str) -> str:
    return ARCH_NAMES.get(str(arch).lower(), str(arch).capitalize() or "unknown")


def sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits in fixed notation (0.86 → 0.860, 35.52 → 35.5)."""
    v = float(value)
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    return f"{v:.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"


# ---------------------------------------------------------------------------- validation rows

def _bad(i: int, row, what: str) -> MixprecError:
    case = row.get("case", "?") if isinstance(row, dict) else "?"
    return MixprecError(f"validation row {i} ({case}): {what}",
                        "regenerate it: .venv/bin/python bench/bench_estimate_validation.py")


def check_rows(rows: Iterable[dict]) -> list[dict]:
    """``rows`` as validation rows (:data:`ROW_COLUMNS`, each typed and consistent); a MixprecError
    naming the first bad row otherwise. Numbers become floats/ints, ``held_out`` a bool."""
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _bad(i, row, "not an object")
        if set(row) != set(ROW_COLUMNS):
            missing, extra = sorted(set(ROW_COLUMNS) - set(row)), sorted(set(row) - set(ROW_COLUMNS))
            raise _bad(i, row, f"keys differ from the schema (missing {missing}, extra {extra})")
        r = dict(row)
        for k in _STRINGS:
            if not isinstance(r[k], str) or not r[k]:
                raise _bad(i, row, f"{k} must be a non-empty string, not {r[k]!r}")
        if r["split"] not in SPLITS:
            raise _bad(i, row, f"split {r['split']!r} is not one of {', '.join(SPLITS)}")
        if r["family"] not in FAMILIES:
            raise _bad(i, row, f"family {r['family']!r} is not one of {', '.join(FAMILIES)}")
        if not isinstance(r["held_out"], (bool, np.bool_)) or bool(r["held_out"]) != (r["split"] != "in-sample"):
            raise _bad(i, row, f"held_out {r['held_out']!r} does not match split {r['split']!r}")
        r["held_out"] = bool(r["held_out"])
        for k in ("batch", "seq"):
            v = r[k]
            if v is None and k == "seq":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or v != int(v) or int(v) < 1:
                raise _bad(i, row, f"{k} must be a positive integer{' or null' if k == 'seq' else ''}, not {v!r}")
            r[k] = int(v)
        for k in ("measured_ms", "estimated_ms"):
            v = r[k]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not (math.isfinite(v) and v > 0):
                raise _bad(i, row, f"{k} must be a positive number, not {v!r}")
            r[k] = float(v)
        if isinstance(r["rel_err"], bool) or not isinstance(r["rel_err"], (int, float, np.floating)):
            raise _bad(i, row, f"rel_err must be a number, not {r['rel_err']!r}")
        r["rel_err"] = float(r["rel_err"])
        if abs(r["rel_err"] - (r["estimated_ms"] / r["measured_ms"] - 1)) > 1e-6 * max(1.0, abs(r["rel_err"])):
            raise _bad(i, row, "rel_err is not estimated_ms / measured_ms - 1")
        m = r["median_layer_err"]
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float, np.floating)) or not (math.isfinite(m) and m >= 0):
                raise _bad(i, row, f"median_layer_err must be a number >= 0 or null, not {m!r}")
            r["median_layer_err"] = float(m)
        out.append(r)
    return out


@dataclass(frozen=True)
class Spread:
    """The spread of one family's estimates on one GPU architecture."""

    family: str
    arch: str
    log_spread: float           # the QUANTILE of |log(est / measured)|, at least MIN_SPREAD
    cases: int
    held_out: bool              # from held-out cases (False: in-sample ones only, nothing was held out)
    gpus: tuple[str, ...] = ()  # the GPUs of those cases

    @property
    def pct(self) -> float:
        return 100.0 * math.expm1(self.log_spread)


@dataclass(frozen=True)
class Pair:
    """Two validation cases of one model on one GPU (same batch, sequence and split, another precision
    or policy): how far the estimated ratio ``est_a / est_b`` is from the measured one. ``a`` is the
    faster measured case."""

    family: str
    arch: str
    gpu: str
    model: str
    batch: int
    seq: int | None
    split: str
    case_a: str
    case_b: str
    measured_ratio: float       # measured_a / measured_b (<= 1)
    estimated_ratio: float      # estimated_a / estimated_b

    @property
    def held_out(self) -> bool:
        return self.split != "in-sample"

    @property
    def log_err(self) -> float:
        """log(estimated ratio / measured ratio)."""
        return math.log(self.estimated_ratio / self.measured_ratio)

    def to_json(self) -> dict:
        return {"family": self.family, "arch": self.arch, "gpu": self.gpu, "model": self.model, "batch": self.batch,
                "seq": self.seq, "split": self.split, "held_out": self.held_out, "case_a": self.case_a,
                "case_b": self.case_b, "measured_ratio": self.measured_ratio,
                "estimated_ratio": self.estimated_ratio, "ratio_err": math.expm1(self.log_err)}


def pairs_of(rows: Iterable[dict]) -> list[Pair]:
    """Every pair of validation rows (:func:`check_rows`) of the same family, architecture, GPU, model,
    batch, sequence and split, with different cases (a case listed twice in one split counts once)."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = (r["family"], r["arch"], r["gpu"], r["model"], r["batch"], r["seq"], r["split"])
        groups.setdefault(key, {}).setdefault(r["case"], r)
    out = []
    for (fam, arch, gpu, model, batch, seq, split), cases in sorted(
            groups.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0])):
        for x, y in itertools.combinations(sorted(cases.values(), key=lambda r: r["case"]), 2):
            a, b = (x, y) if x["measured_ms"] <= y["measured_ms"] else (y, x)
            out.append(Pair(fam, arch, gpu, model, batch, seq, split, a["case"], b["case"],
                            a["measured_ms"] / b["measured_ms"], a["estimated_ms"] / b["estimated_ms"]))
    return out


def _spread_of(fam: str, arch: str, errs: list[float], held: bool, gpus: Iterable[str]) -> Spread:
    spread = max(float(np.quantile(np.abs(errs), QUANTILE)), MIN_SPREAD)
    return Spread(fam, arch, spread, len(errs), held, tuple(sorted(set(gpus))))


def _spread_json(s: Spread) -> dict:
    return {"family": s.family, "arch": s.arch, "log_spread": s.log_spread, "pct": s.pct, "cases": s.cases,
            "held_out": s.held_out, "gpus": list(s.gpus)}


@dataclass
class Validation:
    """The validation cases of the estimate (``validation.json``: :meth:`to_json` / :meth:`from_json`)."""

    KIND: ClassVar[str] = KIND
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION

    rows: list[dict]
    command: str = ""
    date: str = ""
    notes: list = field(default_factory=list)   # what is missing ("transformer rows: not available")
    sources: dict = field(default_factory=dict)  # family -> what produced its rows

    def frame(self) -> pd.DataFrame:
        """The rows as a table with :data:`ROW_COLUMNS`."""
        return pd.DataFrame(self.rows, columns=ROW_COLUMNS)

    def to_json(self) -> dict:
        return {"kind": KIND, "format_version": FORMAT_VERSION, "command": self.command, "date": self.date,
                "quantile": QUANTILE, "min_spread": MIN_SPREAD, "notes": list(self.notes),
                "sources": dict(self.sources), "columns": ROW_COLUMNS,
                "spreads": [_spread_json(s) for s in self.spreads().values()],
                # the search's tie window: the error of an estimated ratio (``cases``: pairs)
                "diff_spreads": [_spread_json(s) for s in self.diff_spreads().values()],
                "pairs": [p.to_json() for p in self.pairs()],
                "rows": [dict(r) for r in self.rows]}

    @classmethod
    def from_json(cls, doc: dict) -> "Validation":
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise MixprecError("the estimate's validation data is not a mixprec.estimate_validation document",
                               "regenerate it: .venv/bin/python bench/bench_estimate_validation.py")
        if doc.get("format_version") not in READ_VERSIONS:  # the spreads are recomputed from the rows
            raise MixprecError(f"the estimate's validation data has format {doc.get('format_version')!r}, "
                               f"not one of {', '.join(map(str, READ_VERSIONS))}",
                               "regenerate it: .venv/bin/python bench/bench_estimate_validation.py")
        if not isinstance(doc.get("rows"), list):
            raise MixprecError("the estimate's validation data has no rows list",
                               "regenerate it: .venv/bin/python bench/bench_estimate_validation.py")
        return cls(check_rows(doc["rows"]), str(doc.get("command", "")), str(doc.get("date", "")),
                   [str(n) for n in doc.get("notes", [])], {str(k): str(v) for k, v in dict(doc.get("sources") or {}).items()})

    def spreads(self) -> dict[tuple[str, str], Spread]:
        """(family, arch) -> its :class:`Spread`: held-out cases where there are any, else in-sample ones."""
        out = {}
        keys = sorted({(r["family"], r["arch"]) for r in self.rows})
        for fam, arch in keys:
            rows = [r for r in self.rows if r["family"] == fam and r["arch"] == arch]
            held = [r for r in rows if r["held_out"]]
            use = held or rows
            errs = [math.log(r["estimated_ms"] / r["measured_ms"]) for r in use]
            out[(fam, arch)] = _spread_of(fam, arch, errs, bool(held), (r["gpu"] for r in use))
        return out

    def widest(self) -> float:
        """The widest spread known (any family, any architecture); :data:`NO_DATA_SPREAD` without data."""
        s = self.spreads()
        return max((v.log_spread for v in s.values()), default=NO_DATA_SPREAD)

    def pairs(self) -> list[Pair]:
        """The rows' pairs (:func:`pairs_of`)."""
        return pairs_of(self.rows)

    def diff_spreads(self) -> dict[tuple[str, str], Spread]:
        """(family, arch) -> the :class:`Spread` of its estimated ratios (``cases``: pairs): held-out pairs
        where there are any, else in-sample ones."""
        pairs = self.pairs()
        out = {}
        for fam, arch in sorted({(p.family, p.arch) for p in pairs}):
            mine = [p for p in pairs if p.family == fam and p.arch == arch]
            held = [p for p in mine if p.held_out]
            use = held or mine
            out[(fam, arch)] = _spread_of(fam, arch, [p.log_err for p in use], bool(held), (p.gpu for p in use))
        return out

    def widest_diff(self) -> float:
        """The widest difference spread known; without any pair, the widest absolute spread (:meth:`widest`)."""
        return max((v.log_spread for v in self.diff_spreads().values()), default=self.widest())


def read(path: str | Path = PATH) -> Validation:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise MixprecError(f"cannot read the estimate's validation data {path} ({e})",
                           "regenerate it: .venv/bin/python bench/bench_estimate_validation.py") from e
    return Validation.from_json(doc)


@functools.lru_cache(maxsize=1)
def shipped() -> Validation:
    """The shipped validation data; without it (missing or damaged), no case: every band is "unvalidated"."""
    try:
        return read(PATH)
    except MixprecError as e:
        return Validation([], notes=[f"no validation data: {e.what}"])


# ---------------------------------------------------------------------------- the band

@dataclass(frozen=True)
class Band:
    """The likely range of an estimate (``low_ms``–``high_ms``) and what it rests on."""

    low_ms: float
    high_ms: float
    status: str                 # validated / in-sample / unvalidated
    arch: str                   # the GPU architecture whose validation cases it uses
    log_spread: float           # half-width in log space: total · exp(±log_spread)
    basis: str                  # a sentence: which cases, which architecture
    unvalidated: tuple[str, ...] = ()  # families without a case on the architecture
    shares: tuple[tuple[str, float], ...] = ()  # (family, share of the estimated time)
    arch_validated: bool = False  # the architecture has validation cases (of some family)
    # the difference band: the error of the ratio of two estimates of one model on this GPU (the search's
    # tie window; from pairs of validation cases); NaN / "" on a band made before it existed
    diff_log_spread: float = math.nan
    diff_status: str = ""       # validated / in-sample / unvalidated
    diff_basis: str = ""
    diff_unvalidated: tuple[str, ...] = ()  # families without a pair on the architecture

    @property
    def pct(self) -> float:
        """The band's half-width as a percentage (exp(spread) − 1)."""
        return 100.0 * math.expm1(self.log_spread)

    @property
    def has_diff(self) -> bool:
        return math.isfinite(self.diff_log_spread) and self.diff_status in STATUSES

    @property
    def diff_pct(self) -> float:
        """The difference band's half-width as a percentage (NaN without one)."""
        return 100.0 * math.expm1(self.diff_log_spread)

    def diff_qualifier(self) -> str:
        """"" / "from in-sample pairs only" / "unvalidated on Hopper GPUs" / "unvalidated for transformer layers
        on Ampere GPUs, 40 % of the time"."""
        where = f"on {arch_name(self.arch)} GPUs"
        if self.diff_status == "unvalidated":
            share = sum(s for f, s in self.shares if f in self.diff_unvalidated)
            if not self.shares or share >= 0.995:
                return f"unvalidated {where}"
            return (f"unvalidated for {' and '.join(self.diff_unvalidated)} layers {where}, "
                    f"{100 * share:.0f} % of the time")
        return "from in-sample pairs only" if self.diff_status == "in-sample" else ""

    def diff_window(self) -> str:
        """"the estimate's ±14 % difference band" (with its qualifier: "… (unvalidated on Hopper GPUs)")."""
        q = self.diff_qualifier()
        return f"the estimate's ±{self.diff_pct:.0f} % difference band" + (f" ({q})" if q else "")

    def range_text(self) -> str:
        return f"{sig(self.low_ms)}–{sig(self.high_ms)} ms"

    def qualifier(self) -> str:
        """"" / "in-sample errors only" / "unvalidated on Hopper GPUs" / "transformer layers unvalidated on …"."""
        where = f"on {arch_name(self.arch)} GPUs"
        if self.status == "unvalidated":
            if not self.arch_validated:
                return f"unvalidated {where}"
            share = sum(s for f, s in self.shares if f in self.unvalidated)
            names = " and ".join(self.unvalidated)
            return (f"{names} layers{'' if share >= 0.995 else f' ({100 * share:.0f} % of the time)'} "
                    f"unvalidated {where}")
        if self.status == "in-sample":
            return "from in-sample errors only"
        return ""

    def text(self, total_ms: float) -> str:
        """"0.860 ms, likely 0.785–0.942 ms" / "0.860 ms, unvalidated on Hopper GPUs: likely 0.564–1.31 ms"."""
        q = self.qualifier()
        if self.status == "unvalidated":
            return f"{sig(total_ms)} ms, {q}: likely {self.range_text()}"
        return f"{sig(total_ms)} ms, likely {self.range_text()}" + (f" ({q})" if q else "")

    def short(self) -> str:
        """For a metric's delta or a table cell: "likely 0.785–0.942 ms" / "unvalidated: likely …"."""
        return ("unvalidated: " if self.status == "unvalidated" else "") + f"likely {self.range_text()}"

    def to_json(self) -> dict:
        return {"low_ms": self.low_ms, "high_ms": self.high_ms, "status": self.status, "arch": self.arch,
                "log_spread": self.log_spread, "pct": self.pct, "basis": self.basis,
                "unvalidated": list(self.unvalidated), "shares": {f: s for f, s in self.shares},
                "arch_validated": self.arch_validated, "text": self.short(),
                "diff_log_spread": self.diff_log_spread if self.has_diff else None,
                "diff_pct": self.diff_pct if self.has_diff else None, "diff_status": self.diff_status,
                "diff_basis": self.diff_basis, "diff_unvalidated": list(self.diff_unvalidated)}

    @classmethod
    def from_json(cls, doc: dict) -> "Band":
        try:
            status = str(doc["status"])
            if status not in STATUSES:
                raise ValueError(status)
            d_status = str(doc.get("diff_status") or "")  # absent: a band stored before the difference band
            if d_status and d_status not in STATUSES:
                raise ValueError(d_status)
            d_spread = doc.get("diff_log_spread")
            return cls(float(doc["low_ms"]), float(doc["high_ms"]), status, str(doc["arch"]),
                       float(doc["log_spread"]), str(doc["basis"]), tuple(str(f) for f in doc.get("unvalidated", ())),
                       tuple((str(f), float(s)) for f, s in dict(doc.get("shares") or {}).items()),
                       bool(doc.get("arch_validated", False)),
                       float(d_spread) if d_spread is not None and d_status else math.nan, d_status,
                       str(doc.get("diff_basis") or ""), tuple(str(f) for f in doc.get("diff_unvalidated") or ()))
        except (KeyError, TypeError, ValueError) as e:
            raise MixprecError(f"the stored estimate's band is damaged ({e})", "estimate the policy again") from e


def family_times(layer_classes: Iterable[str], est_ms: Iterable[float]) -> dict[str, float]:
    """Estimated ms per family (:func:`family_of`) of a prediction's layers."""
    out: dict[str, float] = {}
    for c, ms in zip(layer_classes, est_ms):
        if ms and ms > 0:
            out[family_of(c)] = out.get(family_of(c), 0.0) + float(ms)
    return out


def _cases_text(s: Spread, unit: str = "case") -> str:
    kind = "held-out" if s.held_out else "in-sample"
    gpus = f": {', '.join(s.gpus)}" if s.gpus else ""
    return f"{s.family} ±{s.pct:.0f} % ({s.cases} {kind} {unit}{'s' if s.cases != 1 else ''}{gpus})"


def _weigh(shares: Mapping[str, float], spreads: Mapping[tuple[str, str], Spread], widest: float, arch: str,
           what: str, unit: str) -> tuple[float, str, str, tuple[str, ...]]:
    """The spread of an estimate whose families take ``shares`` of the time, its status, its basis
    sentence and its unvalidated families (``what``: "error" / "ratio error"; ``unit``: "case" / "pair")."""
    spread, unvalidated, in_sample, parts = 0.0, [], [], []
    for fam in sorted(shares, key=lambda f: -shares[f]):
        s = spreads.get((fam, arch))
        if s is None:
            unvalidated.append(fam)
            spread += shares[fam] * widest
            continue
        spread += shares[fam] * s.log_spread
        parts.append(_cases_text(s, unit))
        if not s.held_out:
            in_sample.append(fam)
    where = f"{arch_name(arch)} GPUs"
    if unvalidated:
        status = "unvalidated"
        head = (f"no validation {unit} on {where}" if not any(a == arch for _, a in spreads)
                else f"no validation {unit} of {' or '.join(unvalidated)} layers on {where}")
        basis = head + f": the widest {'' if unit == 'case' else 'difference '}spread known " \
                       f"(±{100 * math.expm1(widest):.0f} %)"
        if parts:
            basis += "; " + "; ".join(parts)
    else:
        status = "in-sample" if in_sample else "validated"
        basis = (f"{int(round(100 * QUANTILE))}th-percentile {what} on {where}: " + "; ".join(parts) +
                 ("" if not in_sample else f" (nothing held out for {' or '.join(in_sample)}: in-sample {unit}s)"))
    if len(shares) > 1:
        basis += " — weighted by each family's share of the time (" + ", ".join(
            f"{f} {100 * s:.0f} %" for f, s in sorted(shares.items(), key=lambda kv: -kv[1])) + ")"
    return spread, status, basis, tuple(unvalidated)


def band(total_ms: float, family_ms: Mapping[str, float], arch: str,
         validation: Validation | None = None) -> Band:
    """The band of an estimate of ``total_ms`` whose layers take ``family_ms`` (family -> estimated ms,
    :func:`family_times`) on a GPU of architecture ``arch`` (turing / ampere / ada / hopper …), from the
    validation cases of the same architecture (``validation``: default the shipped data), with its
    difference band (the error of a ratio of two such estimates, from the pairs of those cases)."""
    v = validation if validation is not None else shipped()
    spreads = v.spreads()
    arch = str(arch or "unknown").lower()
    total_f = sum(ms for ms in family_ms.values() if ms > 0)
    shares = {f: ms / total_f for f, ms in family_ms.items() if ms > 0} if total_f > 0 else {"cnn": 1.0}
    spread, status, basis, unvalidated = _weigh(shares, spreads, v.widest(), arch, "error", "case")
    d_spread, d_status, d_basis, d_unvalidated = _weigh(shares, v.diff_spreads(), v.widest_diff(), arch,
                                                        "error of an estimated ratio", "pair")
    return Band(total_ms * math.exp(-spread), total_ms * math.exp(spread), status, arch, spread, basis,
                unvalidated, tuple(sorted(shares.items(), key=lambda kv: -kv[1])),
                any(a == arch for _, a in spreads), d_spread, d_status, d_basis, d_unvalidated)


def band_of(layers: pd.DataFrame, total_ms: float, arch: str, validation: Validation | None = None) -> Band:
    """:func:`band` of a prediction's layer table (``layer_class``, ``est_ms``)."""
    return band(total_ms, family_times(layers["layer_class"], layers["est_ms"]), arch, validation)
