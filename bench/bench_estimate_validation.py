"""Every validation case of the TensorRT estimate, and the uncertainty band it gives (issue 19 §5, §6).

    .venv/bin/python bench/bench_estimate_validation.py [--fixtures ../shared/fixtures] [--without-transformer]

Writes ``core/estimate/validation.json`` (the data every estimate's band is computed from:
``core.estimate.validation``) and ``docs/estimate-validation.md`` (the same cases as tables, by
GPU, model, precision and batch: engine totals and per-layer medians, in-sample and held out,
with the command and date that made them, the band of each basis — a GPU the fit saw (its held-out
engines) or the GPUs of an architecture it did not see (its transfer cases) — and what it gives on
every GPU of the table, and the difference bands the search's ties use: the error of an estimated
ratio over pairs of cases of one model on one GPU, by the same rule).

The rows come from two providers:

* CNN engines: ``core.estimate.fit.validation_rows()``; where it does not exist yet, computed here
  from ``fit.evaluate`` / ``fit.leave_one_out`` on the fixture engine reports and the shipped fit
  ``core.estimate.cost.FITTED`` (an engine the fit saw is in-sample, and is scored again by
  leave-one-engine-out; an engine of a GPU the fit never saw is leave-one-gpu-out);
* transformers: ``core.estimate.transformer.validation_rows()`` (published BERT latencies); where
  it does not exist, the page says "transformer rows: not available" and every transformer estimate
  is "unvalidated"."""
from __future__ import annotations

import argparse
import importlib
import inspect
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.errors import MixprecError  # noqa: E402
from core.estimate import fit  # noqa: E402
from core.estimate.cost import FITTED  # noqa: E402
from core.estimate.gpus import GPUS, gpu as gpu_entry  # noqa: E402
from core.estimate.validation import (FAMILIES, MIN_SPREAD, PATH, QUANTILE, SPLITS, Validation, arch_name,  # noqa: E402
                                      band, basis_phrase, check_rows, sig)
from core.workspace import atomic_write_json, atomic_write_text  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures"
DOC = ROOT / "docs" / "estimate-validation.md"
# the CNN fixture engines: folder, GPU and model of each report (batch is read from the report)
ENGINE_SETS = (("trt-engine-reports", "a100", "resnet18", fit.FIXTURE_NAMES),
               ("trt-engine-reports-more", "titanrtx", "mobilenetv2",
                ("titanrtx-mobilenetv2-qat-trt82", "titanrtx-mobilenetv2-qat-trt84",
                 "titanrtx-mobilenetv2res-qat-trt82", "titanrtx-mobilenetv2res-qat-trt84")))
NOT_AVAILABLE = "transformer rows: not available"


def _precision(name: str) -> str:
    words = name.split("-")
    return "fp32" if "fp32" in words else "fp16" if "fp16" in words else "int8" if "qat" in words else "mixed"


def _row(s: fit.Sample, r: dict, gpu: str, model: str, folder: str, split: str) -> dict:
    batch = next((l.inputs[0].dims[0] for l in s.layers if l.inputs and l.inputs[0].dims), 1)
    return {"case": s.name, "source": f"shared/fixtures/{folder}/{s.name}.{{graph,profile}}.json", "gpu": gpu,
            "arch": gpu_entry(gpu).arch, "model": model, "precision": _precision(s.name), "batch": int(batch),
            "seq": None, "held_out": split != "in-sample", "split": split, "measured_ms": float(r["measured_ms"]),
            "estimated_ms": float(r["estimated_ms"]), "rel_err": float(r["estimated_ms"] / r["measured_ms"] - 1),
            "median_layer_err": None if not r["layers"] or math.isnan(r["median_abs_err"]) else float(r["median_abs_err"]),
            "family": "cnn"}


def cnn_rows_here(fixtures: Path) -> list[dict]:
    """The CNN rows computed here (until ``fit.validation_rows`` exists): the shipped fit on every
    fixture engine, and leave-one-engine-out fits on the engines it was fitted on."""
    fitted_on = set(FITTED.fitted_on)
    rows = []
    for folder, gpu, model, names in ENGINE_SETS:
        d = fixtures / folder
        if not all((d / f"{n}.graph.json").is_file() and (d / f"{n}.profile.json").is_file() for n in names):
            print(f"  (skipped {folder}: its reports are not in {d})")
            continue
        samples = [fit.sample(d / f"{n}.graph.json", d / f"{n}.profile.json", n) for n in names]
        seen = [s for s in samples if s.name in fitted_on]
        unseen = [s for s in samples if s.name not in fitted_on]
        rows += [_row(s, r, gpu, model, folder, "in-sample") for s, r in zip(seen, fit.evaluate(FITTED, seen, gpu))]
        if len(seen) >= 2:  # fitted on the others of this GPU's engines, scored on the one left out
            t0 = time.perf_counter()
            loo = fit.leave_one_out(seen, gpu)
            print(f"  leave-one-engine-out on {len(seen)} {gpu} engines: {time.perf_counter() - t0:.0f} s")
            rows += [_row(s, r, gpu, model, folder, "leave-one-engine-out") for s, r in zip(seen, loo)]
        split = "leave-one-engine-out" if seen else "leave-one-gpu-out"
        rows += [_row(s, r, gpu, model, folder, split) for s, r in zip(unseen, fit.evaluate(FITTED, unseen, gpu))]
    return rows


def _call(provider, fixtures: Path):
    params = inspect.signature(provider).parameters
    return provider(fixtures) if params and next(iter(params.values())).default is inspect.Parameter.empty \
        else provider()


def collect(fixtures: Path, without_transformer: bool = False) -> tuple[list[dict], list[str], dict]:
    """Every validation row, the notes on what is missing, and which provider made each family's rows
    (``without_transformer``: leave the transformer rows out, e.g. while their data file is regenerated)."""
    notes, sources = [], {}
    if hasattr(fit, "validation_rows"):
        cnn = list(_call(fit.validation_rows, fixtures))
        sources["cnn"] = "core.estimate.fit.validation_rows()"
    else:
        cnn = cnn_rows_here(fixtures)
        sources["cnn"] = ("bench/bench_estimate_validation.py (fit.evaluate / fit.leave_one_out on the fixture "
                          "engines and the shipped fit; core.estimate.fit.validation_rows() does not exist yet)")
    try:
        transformer = importlib.import_module("core.estimate.transformer")
        provider = getattr(transformer, "validation_rows")
    except (ImportError, AttributeError):
        provider = None
    if without_transformer:
        tr = []
        notes.append(NOT_AVAILABLE + " (left out: --without-transformer): every transformer estimate is unvalidated")
        sources["transformer"] = "none (--without-transformer)"
    elif provider is None:
        tr = []
        notes.append(NOT_AVAILABLE + " (core.estimate.transformer.validation_rows() does not exist yet): every "
                     "transformer estimate is unvalidated")
        sources["transformer"] = "none"
    else:
        tr = list(_call(provider, fixtures))
        sources["transformer"] = "core.estimate.transformer.validation_rows()"
        if not tr:
            notes.append(NOT_AVAILABLE + " (the provider gave none): every transformer estimate is unvalidated")
    rows = check_rows([*cnn, *tr])
    return rows, notes, sources


# ---------------------------------------------------------------------------- the page

def _pct(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:+.1f} %"


def _abs_pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def _case_table(rows: list[dict]) -> list[str]:
    out = ["| case | GPU | arch | model | precision | batch | seq | split | measured ms | estimated ms | "
           "total error | per-layer median abs error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["arch"], r["gpu"], r["model"], r["precision"], r["batch"], r["seq"] or 0,  # noqa: E731
                     SPLITS.index(r["split"]), r["case"])
    for r in sorted(rows, key=key):
        out.append(f"| {r['case']} | {r['gpu']} | {r['arch']} | {r['model']} | {r['precision']} | {r['batch']} | "
                   f"{r['seq'] if r['seq'] is not None else '—'} | {r['split']} | {r['measured_ms']:.4g} | "
                   f"{r['estimated_ms']:.4g} | {_pct(r['rel_err'])} | {_abs_pct(r['median_layer_err'])} |")
    return out


def _summary(rows: list[dict]) -> list[str]:
    """Per family, GPU and split: cases, median and worst |total error|, median per-layer error."""
    out = ["| family | GPU | split | cases | median abs total error | worst total error | "
           "median per-layer median error |", "|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["family"], r["gpu"], r["split"]), []).append(r)
    for (fam, gpu, split), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], SPLITS.index(kv[0][2]))):
        errs = [r["rel_err"] for r in rs]
        worst = max(errs, key=abs)
        layer = [r["median_layer_err"] for r in rs if r["median_layer_err"] is not None]
        out.append(f"| {fam} | {gpu} | {split} | {len(rs)} | {100 * float(np.median(np.abs(errs))):.1f} % | "
                   f"{_pct(worst)} | {_abs_pct(float(np.median(layer))) if layer else '—'} |")
    return out


BASIS_NAMES = {"this-gpu": "a GPU the fit saw: its held-out engines", "this-gpu-in-sample":
               "a GPU the fit saw: its in-sample cases (nothing held out)",
               "other-gpus": "GPUs of this architecture the fit did not see"}


def _spread_cell(s) -> str:
    return f"±{s.pct:.1f} %" if s is not None else "—"


def _basis_table(v: Validation) -> list[str]:
    """One row per basis: a GPU the fit saw, or the GPUs of an architecture it did not see."""
    spreads, diffs = v.spreads(), v.diff_spreads()
    out = ["| family | basis | GPU / architecture | band | cases | difference band | pairs | cases from |",
           "|---|---|---|---|---|---|---|---|"]
    order = {"this-gpu": 0, "this-gpu-in-sample": 0, "other-gpus": 1}
    for k in sorted(set(spreads) | set(diffs), key=lambda k: (FAMILIES.index(k[0]), order[k[1]], k[2])):
        s, d = spreads.get(k), diffs.get(k)
        any_s = s or d
        where = f"`{any_s.gpu}` ({arch_name(any_s.arch)})" if k[1] != "other-gpus" else arch_name(any_s.arch)
        src = f"{', '.join(any_s.gpus)}: {', '.join(any_s.splits)}"
        out.append(f"| {k[0]} | {BASIS_NAMES[k[1]]} | {where} | {_spread_cell(s)} | {s.cases if s else 0} | "
                   f"{_spread_cell(d)} | {d.cases if d else 0} | {src} |")
    if not spreads:
        out.append("| — | — | — | — | 0 | — | 0 | no validation case |")
    return out


def _gpu_cell(v: Validation, fam: str, key: str, arch: str, diff: bool = False) -> str:
    """A family's band (or difference band) on one GPU and the basis it rests on."""
    b = band(1.0, {fam: 1.0}, arch, v, gpu=key)
    kind, s = v.spread_for(fam, key, arch, diff)
    pct = b.diff_pct if diff else b.pct
    if s is None:
        return f"±{pct:.0f} % (unvalidated on {arch_name(arch)} GPUs)"
    return f"±{pct:.0f} % ({basis_phrase(kind, 'pair' if diff else 'case', key in s.gpus)})"


def _gpu_table(v: Validation) -> list[str]:
    out = ["| GPU | architecture | fit saw it (cnn / transformer) | CNN band | CNN difference band | "
           "transformer band | transformer difference band |", "|---|---|---|---|---|---|---|"]
    for key, g in GPUS.items():
        cells = [_gpu_cell(v, fam, key, g.arch, diff) for fam in FAMILIES for diff in (False, True)]
        seen = " / ".join("yes" if key in v.fit_gpus(f) else "no" for f in FAMILIES)
        out.append(f"| `{key}` ({g.name}) | {arch_name(g.arch)} | {seen} | {' | '.join(cells)} |")
    return out


def _difference_section(v: Validation) -> list[str]:
    """How the difference bands (the search's tie window) are made, and the pairs they come from."""
    pairs = v.pairs()
    out = ["## The difference band the search's ties use", "",
           "The band above is the error of one absolute estimate. The search compares two policies of the same "
           "model on the same GPU, whose errors largely cancel: two of its candidates are a tie when their "
           "estimates differ by less than the **difference band** — the "
           f"{int(round(100 * QUANTILE))}th percentile of |log((est_a / est_b) / (measured_a / measured_b))| over "
           "the pairs of validation cases of one model on one GPU (same batch, sequence and split, another "
           "precision or policy) among the cases of the estimate's basis (the table above: a GPU the fit saw, its "
           "held-out pairs, its in-sample pairs only when none was held out; a GPU it did not see, the transfer "
           f"pairs of its architecture), at least ±{100 * math.expm1(MIN_SPREAD):.0f} %, weighted by each family's "
           "share of the estimated time. Without a pair of its basis a family is **unvalidated** and takes the "
           "widest difference band of that family on GPUs its fit did not see (cnn "
           f"±{100 * math.expm1(v.widest_diff('cnn')):.0f} %, transformer "
           f"±{100 * math.expm1(v.widest_diff('transformer')):.0f} %). The displayed ranges (\"likely …–… ms\") "
           "keep the absolute band."]
    if not pairs:
        return out + ["", "No pair of validation cases."]
    out += ["", "By GPU and split:", "",
            f"| family | GPU | split | pairs | {int(round(100 * QUANTILE))}th-percentile ratio error | "
            "median ratio error | worst |", "|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for p in pairs:
        groups.setdefault((p.family, p.gpu, p.split), []).append(p.log_err)
    for (fam, gpu, split), errs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                          SPLITS.index(kv[0][2]))):
        a = np.abs(errs)
        q, med = 100 * math.expm1(np.quantile(a, QUANTILE)), 100 * math.expm1(np.median(a))
        out.append(f"| {fam} | {gpu} | {split} | {len(errs)} | ±{q:.1f} % | ±{med:.1f} % | "
                   f"{_pct(math.expm1(max(errs, key=abs)))} |")
    out += ["", f"### The pairs ({len(pairs)}; a: the faster measured case)", "",
            "| family | GPU | model | batch | seq | split | case a | case b | measured a/b | estimated a/b | "
            "ratio error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(pairs, key=lambda p: (p.family, p.arch, p.gpu, p.model, p.batch, p.seq or 0,
                                          SPLITS.index(p.split), p.case_a, p.case_b)):
        out.append(f"| {p.family} | {p.gpu} | {p.model} | {p.batch} | {p.seq if p.seq is not None else '—'} | "
                   f"{p.split} | {p.case_a} | {p.case_b} | {p.measured_ratio:.3f} | {p.estimated_ratio:.3f} | "
                   f"{_pct(math.expm1(p.log_err))} |")
    return out


def page(v: Validation) -> str:
    rows = v.rows
    fit = "; ".join(f"{fam}: {', '.join(f'`{g}`' for g in v.fit_gpus(fam)) or 'none'}" for fam in FAMILIES)
    lines = ["# Validation of the TensorRT estimate", "",
             f"Written by `{v.command}` on {v.date} (do not edit by hand: run it again). The same cases are "
             "shipped as `core/estimate/validation.json`, the data of every estimate's uncertainty band "
             "(`core.estimate.validation`).", "",
             "Every case is an engine TensorRT built (its per-layer sum, as `trtexec --exportProfile` measures "
             "it) or a published TensorRT latency, next to the estimate of it. **in-sample**: the fit saw it; "
             "**leave-one-engine-out**: fitted without this engine (with the other engines of its GPU); "
             "**leave-one-gpu-out**: fitted without any case of this GPU; **held-out published**: a published "
             "latency never fitted on (on a GPU the fit saw, e.g. BERT-Large where BERT-base was fitted, or on "
             "another GPU).", "",
             "Rows: " + "; ".join(f"{fam}: {src}" for fam, src in v.sources.items()) + ".", ""]
    lines += [f"- {n}" for n in v.notes] + ([""] if v.notes else [])
    lines += ["## The band each estimate carries", "",
              "Per family (cnn / transformer: layer classes `transformer`, `transformer_norm` and any attention "
              f"class), the GPUs the shipped fit saw are those of its in-sample cases ({fit}); a GPU with the same "
              "chip as one of them (architecture, SM count and tensor-core peaks: `a100`, the A100 80GB SXM, and "
              "`a100-40gb`) counts as that GPU — their memory bandwidth and clocks differ, and the estimate prices "
              "those explicitly. A family's band on a GPU is the "
              f"{int(round(100 * QUANTILE))}th percentile of |log(estimated / measured)| over the cases of what "
              f"that estimate is, at least ±{100 * math.expm1(MIN_SPREAD):.0f} %:", "",
              "- on a **GPU the fit saw**: the held-out cases on that GPU that were still fitted with its data "
              "(leave-one-engine-out; held-out published rows on it) — the band says \"held-out engines on this "
              "GPU\"; with none, its in-sample cases (\"in-sample errors on this GPU only: nothing held out\");",
              "- on a **GPU it did not see**: the cases that measure transfer to an unseen GPU, of the same "
              "architecture (leave-one-gpu-out rows; held-out rows on GPUs outside the fit set) — \"other GPUs of "
              "this architecture, fitted without them\";",
              "- with none of its architecture: **unvalidated on <Arch> GPUs**, with the widest transfer spread "
              f"of the family (cnn ±{100 * math.expm1(v.widest('cnn')):.0f} %, transformer "
              f"±{100 * math.expm1(v.widest('transformer')):.0f} %).", "",
              "An estimate's band is total · exp(±spread), the spread weighted by each family's share of the "
              "estimated time (each family on its own basis). The difference band (next section) follows the "
              "same rule over pairs of cases.", "",
              *_basis_table(v), "",
              "What that gives on each GPU of the table (an all-CNN and an all-transformer estimate: its band and "
              "the difference band the search's ties use, and the basis each rests on):", "",
              *_gpu_table(v)]
    lines += ["", *_difference_section(v)]
    lines += ["", "## Summary by GPU and split", "", *_summary(rows), ""]
    for fam in FAMILIES:
        fam_rows = [r for r in rows if r["family"] == fam]
        lines += [f"## {fam.upper() if fam == 'cnn' else 'Transformer'} cases ({len(fam_rows)})", ""]
        if not fam_rows:
            lines += [f"{NOT_AVAILABLE}: every {fam} estimate is unvalidated.", ""]
            continue
        held = [r for r in fam_rows if r["held_out"]]
        ins = [r for r in fam_rows if not r["held_out"]]
        lines += [f"### Held out ({len(held)})", "", *(_case_table(held) if held else ["none"]), "",
                  f"### In-sample ({len(ins)})", "", *(_case_table(ins) if ins else ["none"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, default=FIXTURES, help="folder holding trt-engine-reports etc.")
    ap.add_argument("--json", type=Path, default=PATH, help="where to write the validation data")
    ap.add_argument("--doc", type=Path, default=DOC, help="where to write the page")
    ap.add_argument("--without-transformer", action="store_true",
                    help="leave the transformer rows out (while core.estimate.transformer's data is regenerated)")
    args = ap.parse_args(argv)
    command = ".venv/bin/python bench/bench_estimate_validation.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    t0 = time.perf_counter()
    try:
        rows, notes, sources = collect(args.fixtures, args.without_transformer)
    except MixprecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    v = Validation(rows, command, date, notes, sources)
    atomic_write_json(args.json, v.to_json())
    atomic_write_text(args.doc, page(v) + "\n")
    diffs = v.diff_spreads()
    for key, s in sorted(v.spreads().items()):
        d = diffs.get(key)
        print(f"{key[0]:12} {key[1]:19} {key[2]:10} ±{s.pct:5.1f} % ({s.cases:3} cases)  difference "
              f"{'±%5.1f %%' % d.pct if d else '   —   '} ({d.cases if d else 0:3} pairs)  {', '.join(s.splits)}")
    for n in notes:
        print(n)
    print(f"{len(rows)} cases -> {args.json}, {args.doc} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
