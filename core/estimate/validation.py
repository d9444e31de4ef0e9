"""How far the TensorRT estimate is from real engines, and the uncertainty band every estimate carries.

**Validation data.** ``validation.json`` (beside this module; kind ``mixprec.estimate_validation``)
holds one row per validation case (:data:`ROW_COLUMNS`): a real engine or a published latency, the
estimate of it, and whether the fit saw it (``held_out``; ``split``: in-sample, leave-one-engine-out,
leave-one-gpu-out, held-out published). It is written by ``bench/bench_estimate_validation.py``
(which also writes docs/estimate-validation.md) from the rows of ``core.estimate.fit.validation_rows``
(CNN engine reports) and ``core.estimate.transformer.validation_rows`` (published BERT latencies);
the document names the command and date that produced it.

**The band** (:func:`band`). Every layer class belongs to a family (:func:`family_of`: ``transformer``
for the transformer and attention classes, ``cnn`` for the others). A family's spread is the
:data:`QUANTILE` quantile of ``|log(estimated / measured)|`` over the validation cases that measure
what an estimate of that family on that GPU actually is (:func:`basis_rows`), at least
:data:`MIN_SPREAD`:

* the GPUs the shipped fit saw are, per family, the GPUs of its in-sample rows (:func:`fit_gpus`; cnn:
  a100, titanrtx; transformer: a100-40gb, t4), matched by GPU key only — the ``a100`` (80 GB SXM) and
  ``a100-40gb`` rows are different GPUs here: their memory bandwidth (2,039 vs 1,555 GB/s) and clocks
  differ, the estimate uses both, and no validation case measures a fit on one priced on the other;
* an estimate on a GPU the fit saw (basis ``this-gpu``) rests on the held-out cases on that GPU that were
  still fitted with that GPU's data (leave-one-engine-out; held-out published rows on it, e.g. BERT-Large
  where BERT-base was fitted); with none, on that GPU's in-sample cases (``this-gpu-in-sample``: the
  band says so);
* an estimate on a GPU the fit did not see (``other-gpus``) rests on the cases that measure transfer to
  an unseen GPU, of the same architecture: leave-one-gpu-out rows, and held-out rows on GPUs outside the
  fit set; with none of that architecture the family is *unvalidated* there and takes the widest such
  spread of the family (:meth:`Validation.widest`).

The estimate's spread is the families' spreads weighted by each family's share of the estimated time; the
band is ``total · exp(±spread)``, its text names the basis ("0.860 ms, likely 0.785–0.942 ms (held-out
engines on this GPU)"; "… (other GPUs of this architecture, fitted without them)"; "0.860 ms,
unvalidated on Hopper GPUs: likely 0.564–1.31 ms").

**The difference band** (:attr:`Band.diff_log_spread`, what the search's ties use). The band above is the
error of one absolute estimate; the search compares two policies of the *same* model on the *same* GPU,
whose errors largely cancel. Validation cases that form a pair (:func:`pairs_of`: same family, GPU,
model, batch and sequence, the same split, two different cases — another precision or policy) give the
error of an estimated *ratio*, ``|log((est_a / est_b) / (measured_a / measured_b))|``; its
:data:`QUANTILE` quantile (at least :data:`MIN_SPREAD`) over the pairs of the same basis as above
(:func:`basis_pairs`: the pairs among the basis rows; on a GPU the fit saw without a held-out pair, its
in-sample pairs; without any, unvalidated: the family's widest difference spread on GPUs its fit did not
see), weighted by each family's share of the time, is the window inside which two candidates' estimates
are a tie."""
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

from core.errors import MixprecError
from core.estimate.cost import TRANSFORMER_CLASSES as _COST_TRANSFORMER_CLASSES
from core.estimate.gpus import GPUS

KIND = "mixprec.estimate_validation"
# 2: the difference band (diff_spreads, pairs); 3: spreads per basis (a GPU the fit saw / the GPUs of an
# architecture it did not see) and fit_gpus. The spreads are recomputed from the rows: formats 1 and 2 are read too
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
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



# ---------------------------------------------------------------------------- the basis of a spread

BASES = ("this-gpu", "this-gpu-in-sample", "other-gpus", "unvalidated")
BASIS_STATUS = {"this-gpu": "validated", "this-gpu-in-sample": "in-sample", "other-gpus": "validated",
                "unvalidated": "unvalidated"}
TRANSFER_SPLITS = ("leave-one-gpu-out",)  # fitted without any case of that GPU


def fit_gpus(rows: Iterable[dict], family: str) -> tuple[str, ...]:
    """The GPUs the shipped fit of ``family`` saw: the GPUs of its in-sample rows."""
    return tuple(sorted({r["gpu"] for r in rows if r["family"] == family and r["split"] == "in-sample"}))


def _transfer(r: dict, fit: set | frozenset) -> bool:
    """A held-out row that measures transfer to an unseen GPU: fitted without that GPU's data."""
    return r["held_out"] and (r["split"] in TRANSFER_SPLITS or r["gpu"] not in fit)


def same_chip(gpu: str, fit: set[str] | Iterable[str]) -> str:
    """The GPU of ``fit`` with the same chip as the table row ``gpu`` (architecture, SM count and dense
    tensor-core peaks: the A100 80GB SXM and the A100 40GB), else ``gpu``: an estimate on it rests on that
    GPU's cases (memory bandwidth and clocks differ, and the estimate prices those explicitly)."""
    fit = set(fit)
    if not gpu or gpu in fit or gpu not in GPUS:
        return gpu
    g = GPUS[gpu]
    chip = (g.arch, g.sm_count, g.fp16_tflops, g.int8_tops)
    return next((k for k in sorted(fit) if k in GPUS and (GPUS[k].arch, GPUS[k].sm_count, GPUS[k].fp16_tflops,
                                                          GPUS[k].int8_tops) == chip), gpu)


def basis_rows(rows: Iterable[dict], family: str, gpu: str, arch: str) -> tuple[str, list[dict]]:
    """(basis, the rows a ``family`` estimate on ``gpu`` (a GPU key; "" for a GPU without one) of
    architecture ``arch`` rests on): ``this-gpu`` (the held-out rows on that GPU still fitted with its
    data), ``this-gpu-in-sample`` (nothing of the kind: its in-sample rows), ``other-gpus`` (a GPU the fit
    did not see: the transfer rows of its architecture) or ``unvalidated`` (none: [])."""
    mine = [r for r in rows if r["family"] == family]
    fit = set(fit_gpus(mine, family))
    arch = str(arch).lower()
    gpu = same_chip(gpu, fit)
    if gpu and gpu in fit:
        here = [r for r in mine if r["gpu"] == gpu and r["arch"] == arch]
        if here:
            held = [r for r in here if r["held_out"] and not _transfer(r, fit)]
            return ("this-gpu", held) if held else ("this-gpu-in-sample", [r for r in here if not r["held_out"]])
    far = [r for r in mine if r["arch"] == arch and _transfer(r, fit)]
    return ("other-gpus", far) if far else ("unvalidated", [])


@dataclass(frozen=True)
class Spread:
    """The spread of one family's estimates on one basis: one GPU the fit saw (``basis`` this-gpu /
    this-gpu-in-sample, ``gpu``), or the GPUs of one architecture it did not see (other-gpus)."""

    family: str
    arch: str
    log_spread: float           # the QUANTILE of |log(est / measured)|, at least MIN_SPREAD
    cases: int
    held_out: bool              # from held-out cases (False: in-sample ones only, nothing was held out)
    gpus: tuple[str, ...] = ()  # the GPUs of those cases
    basis: str = "other-gpus"   # this-gpu / this-gpu-in-sample / other-gpus
    gpu: str = ""               # the GPU of a this-gpu* spread
    splits: tuple[str, ...] = ()  # the splits of those cases

    @property
    def pct(self) -> float:
        return 100.0 * math.expm1(self.log_spread)

    @property
    def where(self) -> str:
        """The GPU (a this-gpu* spread) or the architecture (other-gpus) it is of."""
        return self.gpu if self.basis != "other-gpus" else self.arch

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.family, self.basis, self.where)


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


def basis_pairs(rows: Iterable[dict], family: str, gpu: str, arch: str) -> tuple[str, list[Pair]]:
    """(basis, pairs) of the difference band: the pairs among :func:`basis_rows`; on a GPU the fit saw
    without a held-out pair, its in-sample pairs (``this-gpu-in-sample``); without any, ``unvalidated``."""
    rows = list(rows)
    kind, use = basis_rows(rows, family, gpu, arch)
    pairs = pairs_of(use)
    if pairs:
        return kind, pairs
    if kind == "this-gpu":
        gpu = same_chip(gpu, fit_gpus([r for r in rows if r["family"] == family], family))
        ins = pairs_of(r for r in rows if r["family"] == family and r["gpu"] == gpu and not r["held_out"]
                       and r["arch"] == str(arch).lower())
        if ins:
            return "this-gpu-in-sample", ins
    return "unvalidated", []


def _spread_of(fam: str, arch: str, errs: list[float], kind: str, gpu: str, gpus: Iterable[str],
               splits: Iterable[str]) -> Spread:
    spread = max(float(np.quantile(np.abs(errs), QUANTILE)), MIN_SPREAD)
    used = set(splits)
    return Spread(fam, arch, spread, len(errs), kind != "this-gpu-in-sample", tuple(sorted(set(gpus))), kind,
                  gpu if kind != "other-gpus" else "", tuple(s for s in SPLITS if s in used))


def _spread_json(s: Spread) -> dict:
    return {"family": s.family, "basis": s.basis, "gpu": s.gpu, "arch": s.arch, "log_spread": s.log_spread,
            "pct": s.pct, "cases": s.cases, "held_out": s.held_out, "gpus": list(s.gpus), "splits": list(s.splits)}


def _widest(spreads: Iterable[Spread], family: str | None, default: float) -> float:
    s = list(spreads)
    for pick in ([x for x in s if x.family == family and x.basis == "other-gpus"],
                 [x for x in s if x.basis == "other-gpus"], s):
        if pick:
            return max(x.log_spread for x in pick)
    return default


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
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def frame(self) -> pd.DataFrame:
        """The rows as a table with :data:`ROW_COLUMNS`."""
        return pd.DataFrame(self.rows, columns=ROW_COLUMNS)

    def to_json(self) -> dict:
        return {"kind": KIND, "format_version": FORMAT_VERSION, "command": self.command, "date": self.date,
                "quantile": QUANTILE, "min_spread": MIN_SPREAD, "notes": list(self.notes),
                "sources": dict(self.sources), "columns": ROW_COLUMNS,
                "fit_gpus": {f: list(self.fit_gpus(f)) for f in FAMILIES},
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

    def fit_gpus(self, family: str) -> tuple[str, ...]:
        """The GPUs the shipped fit of ``family`` saw (:func:`fit_gpus`)."""
        return fit_gpus(self.rows, family)

    def _targets(self) -> list[tuple[str, str, str]]:
        """(family, gpu, arch) of every basis the rows give: each GPU the fit saw, each architecture of
        the transfer rows (gpu "")."""
        out = []
        for fam in FAMILIES:
            mine = [r for r in self.rows if r["family"] == fam]
            fit = set(fit_gpus(mine, fam))
            for g in sorted(fit):
                out += [(fam, g, a) for a in sorted({r["arch"] for r in mine if r["gpu"] == g and not r["held_out"]})]
            out += [(fam, "", a) for a in sorted({r["arch"] for r in mine if _transfer(r, fit)})]
        return out

    def spread_for(self, family: str, gpu: str, arch: str, diff: bool = False) -> tuple[str, Spread | None]:
        """(basis, its :class:`Spread`, None when unvalidated) of a ``family`` estimate on ``gpu`` of
        architecture ``arch``; ``diff``: of its estimated ratios (the difference band; ``cases``: pairs)."""
        key = (family, gpu or "", str(arch).lower(), diff)
        if key not in self._memo:
            if diff:
                kind, pairs = basis_pairs(self.rows, family, gpu, arch)
                s = _spread_of(family, key[2], [p.log_err for p in pairs], kind, gpu, (p.gpu for p in pairs),
                               (p.split for p in pairs)) if pairs else None
            else:
                kind, rows = basis_rows(self.rows, family, gpu, arch)
                s = _spread_of(family, key[2], [math.log(r["estimated_ms"] / r["measured_ms"]) for r in rows],
                               kind, gpu, (r["gpu"] for r in rows), (r["split"] for r in rows)) if rows else None
            self._memo[key] = (kind if s is not None else "unvalidated", s)
        return self._memo[key]

    def _all(self, diff: bool) -> dict[tuple[str, str, str], Spread]:
        out = {}
        for fam, gpu, arch in self._targets():
            _, s = self.spread_for(fam, gpu, arch, diff)
            if s is not None:
                out[s.key] = s
        return out

    def spreads(self) -> dict[tuple[str, str, str], Spread]:
        """(family, basis, GPU or architecture) -> its :class:`Spread`: per family, one for each GPU the
        fit saw (this-gpu / this-gpu-in-sample, keyed by the GPU), one for each architecture with cases of
        GPUs it did not see (other-gpus, keyed by the architecture)."""
        return self._all(False)

    def diff_spreads(self) -> dict[tuple[str, str, str], Spread]:
        """The same for the estimated ratios (``cases``: pairs)."""
        return self._all(True)

    def widest(self, family: str | None = None) -> float:
        """What an unvalidated ``family`` estimate takes: the widest spread of its estimates on GPUs its fit
        did not see; without one, the widest such spread of any family, then the widest spread known;
        :data:`NO_DATA_SPREAD` without data."""
        return _widest(self.spreads().values(), family, NO_DATA_SPREAD)

    def pairs(self) -> list[Pair]:
        """The rows' pairs (:func:`pairs_of`)."""
        return pairs_of(self.rows)

    def widest_diff(self, family: str | None = None) -> float:
        """:meth:`widest` of the difference spreads; without any pair, the widest absolute spread."""
        return _widest(self.diff_spreads().values(), family, self.widest(family))


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

def basis_phrase(basis: str, unit: str = "case", this_gpu_among: bool = False) -> str:
    """What a band of ``basis`` rests on, for its text: "held-out engines on this GPU", "other GPUs of this
    architecture, fitted without them" (``this_gpu_among``: the GPU's own held-out cases among them)…"""
    if basis == "this-gpu":
        return "held-out engines on this GPU"
    if basis == "this-gpu-in-sample":
        return f"in-sample {'errors' if unit == 'case' else 'pairs'} on this GPU only: nothing held out"
    if basis == "other-gpus":
        return ("this and other GPUs of this architecture, fitted without them" if this_gpu_among
                else "other GPUs of this architecture, fitted without them")
    return "unvalidated"


@dataclass(frozen=True)
class Band:
    """The likely range of an estimate (``low_ms``–``high_ms``) and what it rests on."""

    low_ms: float
    high_ms: float
    status: str                 # validated / in-sample / unvalidated
    arch: str                   # the GPU architecture whose validation cases it uses
    log_spread: float           # half-width in log space: total · exp(±log_spread)
    basis: str                  # a sentence: which cases, which GPUs
    unvalidated: tuple[str, ...] = ()  # families without a case of their basis
    shares: tuple[tuple[str, float], ...] = ()  # (family, share of the estimated time)
    arch_validated: bool = False  # the architecture has validation cases (of some family)
    # the difference band: the error of the ratio of two estimates of one model on this GPU (the search's
    # tie window; from pairs of validation cases); NaN / "" on a band made before it existed
    diff_log_spread: float = math.nan
    diff_status: str = ""       # validated / in-sample / unvalidated
    diff_basis: str = ""
    diff_unvalidated: tuple[str, ...] = ()  # families without a pair of their basis
    # which basis each family used (this-gpu / this-gpu-in-sample / other-gpus / unvalidated) and what the
    # text says of the validated ones ("held-out engines on this GPU"); () / "" on a band made before them
    gpu: str = ""
    bases: tuple[tuple[str, str], ...] = ()
    note: str = ""
    diff_bases: tuple[tuple[str, str], ...] = ()
    diff_note: str = ""

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

    def _share_of(self, families: Iterable[str]) -> float:
        fams = set(families)
        return sum(s for f, s in self.shares if f in fams)

    def diff_qualifier(self) -> str:
        """What the difference band rests on: "held-out engines on this GPU" / "unvalidated on Hopper GPUs" /
        "unvalidated for transformer layers on Ampere GPUs, 40 % of the time; cnn: held-out engines on this
        GPU" (a band made before the bases: "" / "from in-sample pairs only" / "unvalidated …")."""
        where = f"on {arch_name(self.arch)} GPUs"
        if self.diff_status == "unvalidated":
            share = self._share_of(self.diff_unvalidated)
            head = (f"unvalidated {where}" if not self.shares or share >= 0.995 else
                    f"unvalidated for {' and '.join(self.diff_unvalidated)} layers {where}, "
                    f"{100 * share:.0f} % of the time")
            return head + (f"; {self.diff_note}" if self.diff_note else "")
        if self.diff_bases:
            return self.diff_note
        return "from in-sample pairs only" if self.diff_status == "in-sample" else ""

    def diff_window(self) -> str:
        """"the estimate's ±14 % difference band (held-out engines on this GPU)"."""
        q = self.diff_qualifier()
        return f"the estimate's ±{self.diff_pct:.0f} % difference band" + (f" ({q})" if q else "")

    def range_text(self) -> str:
        return f"{sig(self.low_ms)}–{sig(self.high_ms)} ms"

    def qualifier(self) -> str:
        """The unvalidated part of the band's text: "unvalidated on Hopper GPUs" / "transformer layers (40 %
        of the time) unvalidated on Ampere GPUs"; a band made before the bases: also "from in-sample errors
        only"; "" otherwise."""
        where = f"on {arch_name(self.arch)} GPUs"
        if self.status == "unvalidated":
            share = self._share_of(self.unvalidated)
            if (not self.bases and not self.arch_validated) or (self.bases and share >= 0.995) or not self.shares:
                return f"unvalidated {where}"
            names = " and ".join(self.unvalidated)
            return (f"{names} layers{'' if share >= 0.995 else f' ({100 * share:.0f} % of the time)'} "
                    f"unvalidated {where}")
        if self.status == "in-sample" and not self.bases:
            return "from in-sample errors only"
        return ""

    def phrase(self) -> str:
        """The band without the total: "likely 0.785–0.942 ms (held-out engines on this GPU)" /
        "unvalidated on Hopper GPUs: likely 0.564–1.31 ms"."""
        q, note = self.qualifier(), self.note
        if self.status == "unvalidated":
            return f"{q}: likely {self.range_text()}" + (f" ({note})" if note else "")
        paren = note or q
        return f"likely {self.range_text()}" + (f" ({paren})" if paren else "")

    def text(self, total_ms: float) -> str:
        """"0.860 ms, likely 0.785–0.942 ms (held-out engines on this GPU)" / "0.860 ms, unvalidated on
        Hopper GPUs: likely 0.564–1.31 ms"."""
        return f"{sig(total_ms)} ms, {self.phrase()}"

    def short(self) -> str:
        """For a metric's delta or a table cell: "likely 0.785–0.942 ms" / "unvalidated: likely …"."""
        return ("unvalidated: " if self.status == "unvalidated" else "") + f"likely {self.range_text()}"

    def to_json(self) -> dict:
        return {"low_ms": self.low_ms, "high_ms": self.high_ms, "status": self.status, "arch": self.arch,
                "gpu": self.gpu, "log_spread": self.log_spread, "pct": self.pct, "basis": self.basis,
                "unvalidated": list(self.unvalidated), "shares": {f: s for f, s in self.shares},
                "arch_validated": self.arch_validated, "text": self.phrase(),
                "bases": {f: b for f, b in self.bases}, "note": self.note,
                "diff_log_spread": self.diff_log_spread if self.has_diff else None,
                "diff_pct": self.diff_pct if self.has_diff else None, "diff_status": self.diff_status,
                "diff_basis": self.diff_basis, "diff_unvalidated": list(self.diff_unvalidated),
                "diff_bases": {f: b for f, b in self.diff_bases}, "diff_note": self.diff_note}

    @classmethod
    def from_json(cls, doc: dict) -> "Band":
        try:
            status = str(doc["status"])
            if status not in STATUSES:
                raise ValueError(status)
            d_status = str(doc.get("diff_status") or "")  # absent: a band stored before the difference band
            if d_status and d_status not in STATUSES:
                raise ValueError(d_status)
            bases = tuple((str(f), str(b)) for f, b in dict(doc.get("bases") or {}).items())
            d_bases = tuple((str(f), str(b)) for f, b in dict(doc.get("diff_bases") or {}).items())
            if any(b not in BASES for _, b in (*bases, *d_bases)):
                raise ValueError(f"basis not one of {', '.join(BASES)}")
            d_spread = doc.get("diff_log_spread")
            return cls(float(doc["low_ms"]), float(doc["high_ms"]), status, str(doc["arch"]),
                       float(doc["log_spread"]), str(doc["basis"]), tuple(str(f) for f in doc.get("unvalidated", ())),
                       tuple((str(f), float(s)) for f, s in dict(doc.get("shares") or {}).items()),
                       bool(doc.get("arch_validated", False)),
                       float(d_spread) if d_spread is not None and d_status else math.nan, d_status,
                       str(doc.get("diff_basis") or ""), tuple(str(f) for f in doc.get("diff_unvalidated") or ()),
                       str(doc.get("gpu") or ""), bases, str(doc.get("note") or ""), d_bases,
                       str(doc.get("diff_note") or ""))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
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
    splits = f"; {', '.join(s.splits)}" if s.splits else ""
    return f"{s.cases} {kind} {unit}{'s' if s.cases != 1 else ''}{gpus}{splits}"


_BASIS_HEAD = {"this-gpu": "held-out cases on this GPU, fitted with its other data",
               "this-gpu-in-sample": "this GPU's in-sample cases (nothing held out on it)",
               "other-gpus": "GPUs of this architecture the fit did not see, fitted without them"}


def _weigh(shares: Mapping[str, float], v: Validation, gpu: str, arch: str, diff: bool):
    """(spread, status, basis sentence, unvalidated families, bases, note) of an estimate whose families take
    ``shares`` of the time on ``gpu`` of architecture ``arch`` (``diff``: of its estimated ratios)."""
    unit, what = ("pair", "error of an estimated ratio") if diff else ("case", "error")
    where = f"{arch_name(arch)} GPUs"
    spread, unvalidated, kinds, parts, bases = 0.0, [], set(), [], []
    order = sorted(shares, key=lambda f: -shares[f])
    phrases = {}
    for fam in order:
        kind, s = v.spread_for(fam, gpu, arch, diff)
        bases.append((fam, kind))
        if s is None:
            w = v.widest_diff(fam) if diff else v.widest(fam)
            unvalidated.append(fam)
            spread += shares[fam] * w
            parts.append(f"no validation {unit} on {where} for {fam} layers: the widest "
                         f"{'difference ' if diff else ''}spread of {fam} estimates on GPUs its fit did not see "
                         f"(±{100 * math.expm1(w):.0f} %)")
            continue
        spread += shares[fam] * s.log_spread
        kinds.add(BASIS_STATUS[kind])
        parts.append(f"{fam} ±{s.pct:.0f} % from {_BASIS_HEAD[kind]} ({_cases_text(s, unit)})")
        phrases[fam] = basis_phrase(kind, unit, bool(gpu) and gpu in s.gpus)
    if unvalidated:
        status = "unvalidated"
    else:
        status = "in-sample" if "in-sample" in kinds else "validated"
    basis = (f"{int(round(100 * QUANTILE))}th-percentile {what}" + (f" on {gpu}" if gpu else "") +
             f" ({where}): " + "; ".join(parts))
    if len(shares) > 1:
        basis += " — weighted by each family's share of the time (" + ", ".join(
            f"{f} {100 * shares[f]:.0f} %" for f in order) + ")"
    if len(set(phrases.values())) == 1 and not unvalidated:
        note = next(iter(phrases.values()))
    elif unvalidated and len(phrases) == 1:
        note = f"{next(iter(phrases))}: {next(iter(phrases.values()))}"
    else:
        note = "; ".join(f"{f} {100 * shares[f]:.0f} %: {p}" for f, p in phrases.items())
    return spread, status, basis, tuple(unvalidated), tuple(bases), note


def band(total_ms: float, family_ms: Mapping[str, float], arch: str,
         validation: Validation | None = None, gpu: str = "") -> Band:
    """The band of an estimate of ``total_ms`` whose layers take ``family_ms`` (family -> estimated ms,
    :func:`family_times`) on the GPU ``gpu`` (its key; "" for one the validation cannot know) of
    architecture ``arch`` (turing / ampere / ada / hopper …), each family on its basis (:func:`basis_rows`)
    in ``validation`` (default the shipped data), with its difference band (the error of a ratio of two such
    estimates: :func:`basis_pairs`)."""
    v = validation if validation is not None else shipped()
    arch = str(arch or "unknown").lower()
    gpu = str(gpu or "")
    total_f = sum(ms for ms in family_ms.values() if ms > 0)
    shares = {f: ms / total_f for f, ms in family_ms.items() if ms > 0} if total_f > 0 else {"cnn": 1.0}
    spread, status, basis, unvalidated, bases, note = _weigh(shares, v, gpu, arch, False)
    d_spread, d_status, d_basis, d_unvalidated, d_bases, d_note = _weigh(shares, v, gpu, arch, True)
    return Band(total_ms * math.exp(-spread), total_ms * math.exp(spread), status, arch, spread, basis,
                unvalidated, tuple(sorted(shares.items(), key=lambda kv: -kv[1])),
                any(s.arch == arch for s in v.spreads().values()), d_spread, d_status, d_basis, d_unvalidated,
                gpu, bases, note, d_bases, d_note)


def band_of(layers: pd.DataFrame, total_ms: float, arch: str, validation: Validation | None = None,
            gpu: str = "") -> Band:
    """:func:`band` of a prediction's layer table (``layer_class``, ``est_ms``) on ``gpu`` (its key)."""
    return band(total_ms, family_times(layers["layer_class"], layers["est_ms"]), arch, validation, gpu)
