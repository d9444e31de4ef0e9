"""The estimate's validation data and uncertainty band (issue 19 §5, §6): the shipped
``core/estimate/validation.json`` parses and its rows have the schema (not that it equals a fresh
run: the fit is still changing), the schema check refuses bad rows, and the band — held-out errors
first, in-sample only when nothing was held out, "unvalidated" on an architecture or family without
a case, families weighted by their share of the time."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from core.errors import MixprecError
from core.estimate import validation as val
from core.estimate.validation import ROW_COLUMNS, SPLITS, Band, Validation, band, check_rows, family_of


def row(case="e1", gpu="a100", arch="ampere", measured=1.0, estimated=1.1, split="leave-one-engine-out",
        family="cnn", **kw):
    r = {"case": case, "source": "test", "gpu": gpu, "arch": arch, "model": "resnet18", "precision": "int8",
         "batch": 32, "seq": None, "held_out": split != "in-sample", "split": split, "measured_ms": measured,
         "estimated_ms": estimated, "rel_err": estimated / measured - 1, "median_layer_err": 0.05, "family": family}
    return r | kw


def test_the_shipped_validation_data_parses_and_its_rows_have_the_schema():
    doc = json.loads(val.PATH.read_text())
    assert doc["kind"] == "mixprec.estimate_validation" and doc["format_version"] in val.READ_VERSIONS
    assert doc["command"].startswith(".venv/bin/python bench/bench_estimate_validation.py") and doc["date"]
    v = Validation.from_json(doc)
    assert v.rows and all(list(r) == ROW_COLUMNS or set(r) == set(ROW_COLUMNS) for r in doc["rows"])
    for r in v.rows:
        assert r["split"] in SPLITS and r["family"] in ("cnn", "transformer")
        assert r["held_out"] == (r["split"] != "in-sample")
        assert r["measured_ms"] > 0 and r["estimated_ms"] > 0 and isinstance(r["batch"], int)
        assert r["rel_err"] == pytest.approx(r["estimated_ms"] / r["measured_ms"] - 1)
        assert r["median_layer_err"] is None or r["median_layer_err"] >= 0
        assert r["seq"] is None or (r["family"] == "transformer" and r["seq"] > 0)
    assert any(r["held_out"] for r in v.rows)  # held-out cases exist: the bands rest on them
    assert list(v.frame().columns) == ROW_COLUMNS
    assert val.shipped().rows == v.rows


@pytest.mark.parametrize("change, message", [
    ({"held_out": False}, "does not match split"),
    ({"split": "cross-validated"}, "split 'cross-validated' is not one of"),
    ({"family": "rnn"}, "family 'rnn'"),
    ({"rel_err": 0.5}, "rel_err is not estimated_ms / measured_ms - 1"),
    ({"measured_ms": 0.0}, "measured_ms must be a positive number"),
    ({"batch": 0}, "batch must be a positive integer"),
    ({"seq": "128"}, "seq must be a positive integer or null"),
    ({"median_layer_err": -0.1}, "median_layer_err must be a number >= 0 or null"),
    ({"gpu": ""}, "gpu must be a non-empty string"),
    ({"extra": 1}, "extra ['extra']"),
])
def test_the_schema_check_refuses_a_bad_row(change, message):
    good = row()
    assert check_rows([good])[0] == good
    with pytest.raises(MixprecError, match="validation row 1 \\(e1\\)") as e:
        check_rows([row(case="ok"), good | change])
    assert message in str(e.value)
    missing = {k: v for k, v in good.items() if k != "family"}
    with pytest.raises(MixprecError, match=r"missing \['family'\]"):
        check_rows([missing])


def test_layer_families():
    assert family_of("transformer") == "transformer" and family_of("fused_attention") == "transformer"
    assert family_of("Attention") == "transformer" and family_of("transformer_norm") == "transformer"
    from core.estimate.engine import LAYER_CLASSES

    assert {c for c in LAYER_CLASSES if family_of(c) == "transformer"} == {"transformer", "attention",
                                                                          "transformer_norm"}
    assert {family_of(c) for c in ("conv_gemm", "pooling", "elementwise", "reformat", "softmax_norm", "other")} \
        == {"cnn"}


def test_the_band_uses_the_held_out_errors_of_the_same_architecture():
    errs = [0.02, -0.05, 0.10, 0.30, -0.15]
    rows = [row(f"h{i}", measured=1.0, estimated=1.0 + e) for i, e in enumerate(errs)]
    rows += [row(f"s{i}", measured=1.0, estimated=1.001, split="in-sample") for i in range(5)]  # ignored
    rows += [row("t1", gpu="titanrtx", arch="turing", measured=1.0, estimated=2.0, split="leave-one-gpu-out")]
    v = Validation(check_rows(rows))
    want = float(np.quantile(np.abs(np.log1p(errs)), val.QUANTILE))
    b = band(2.0, {"cnn": 2.0}, "ampere", v)
    assert b.status == "validated" and b.log_spread == pytest.approx(want)
    assert (b.low_ms, b.high_ms) == pytest.approx((2.0 * math.exp(-want), 2.0 * math.exp(want)))
    assert b.text(2.0) == f"2.00 ms, likely {val.sig(b.low_ms)}–{val.sig(b.high_ms)} ms"
    assert b.basis == f"85th-percentile error on Ampere GPUs: cnn ±{b.pct:.0f} % (5 held-out cases: a100)"
    turing = band(2.0, {"cnn": 2.0}, "turing", v)
    assert turing.log_spread == pytest.approx(math.log(2.0)) and "Turing GPUs" in turing.basis
    # a narrow set of cases gives no band below the floor
    tight = Validation(check_rows([row("x", measured=1.0, estimated=1.001)]))
    assert band(1.0, {"cnn": 1.0}, "ampere", tight).log_spread == pytest.approx(val.MIN_SPREAD)


def test_in_sample_errors_only_when_nothing_was_held_out_and_the_band_says_so():
    v = Validation(check_rows([row(f"s{i}", measured=1.0, estimated=1.0 + 0.2 * (-1) ** i, split="in-sample")
                               for i in range(4)]))
    b = band(1.0, {"cnn": 1.0}, "ampere", v)
    assert b.status == "in-sample" and b.log_spread > val.MIN_SPREAD
    assert b.text(1.0).endswith("(from in-sample errors only)") and "in-sample" in b.basis


def test_unvalidated_architectures_and_families_take_the_widest_spread():
    v = Validation(check_rows([row("a", measured=1.0, estimated=1.1),
                               row("t", gpu="titanrtx", arch="turing", measured=1.0, estimated=1.6,
                                   split="leave-one-gpu-out")]))
    widest = math.log(1.6)
    hopper = band(0.86, {"cnn": 0.86}, "hopper", v)
    assert hopper.status == "unvalidated" and hopper.log_spread == pytest.approx(widest)
    assert hopper.text(0.86).startswith("0.860 ms, unvalidated on Hopper GPUs: likely ")
    assert hopper.short().startswith("unvalidated: likely")
    # 40 % of the time in transformer layers, which have no case on the Ampere
    mixed = band(1.0, {"cnn": 0.6, "transformer": 0.4}, "ampere", v)
    assert mixed.status == "unvalidated" and mixed.unvalidated == ("transformer",)
    assert mixed.log_spread == pytest.approx(0.6 * max(math.log(1.1), val.MIN_SPREAD)
                                             + 0.4 * widest)
    assert "transformer layers (40 % of the time) unvalidated on Ampere GPUs: likely" in mixed.text(1.0)
    assert "cnn 60 %, transformer 40 %" in mixed.basis
    nothing = band(1.0, {"cnn": 1.0}, "ampere", Validation([]))
    assert nothing.status == "unvalidated" and nothing.log_spread == pytest.approx(val.NO_DATA_SPREAD)


def test_the_band_round_trips():
    b = band(0.86, {"cnn": 0.5, "transformer": 0.36}, "ampere")
    back = Band.from_json(json.loads(json.dumps(b.to_json())))
    assert back == b
    with pytest.raises(MixprecError, match="band is damaged"):
        Band.from_json({"low_ms": 1.0})


# --- the difference band: the error of an estimated ratio, from pairs of cases ------------------
def _ratio_err(est_a, meas_a, est_b, meas_b):
    return abs(math.log((est_a / est_b) / (meas_a / meas_b)))


def test_pairs_are_cases_of_one_model_on_one_gpu_at_one_batch_and_split():
    rows = [row("fp16", measured=1.0, estimated=1.10), row("int8", measured=0.5, estimated=0.60),
            row("qat", measured=0.6, estimated=0.58),
            row("int8", measured=0.5, estimated=0.50, split="in-sample"),       # another split: its own pairs
            row("fp16", measured=1.0, estimated=1.00, split="in-sample"),
            row("b1", measured=0.1, estimated=0.2, batch=1),                    # alone at batch 1: no pair
            row("other", measured=0.3, estimated=0.3, model="resnet50"),        # another model: no pair
            row("t8", gpu="titanrtx", arch="turing", measured=0.2, estimated=0.3, split="leave-one-gpu-out"),
            row("t16", gpu="titanrtx", arch="turing", measured=0.4, estimated=0.45, split="leave-one-gpu-out")]
    pairs = val.pairs_of(check_rows(rows))
    got = {(p.arch, p.split, p.case_a, p.case_b) for p in pairs}
    assert got == {("ampere", "leave-one-engine-out", "int8", "fp16"), ("ampere", "leave-one-engine-out", "int8", "qat"),
                   ("ampere", "leave-one-engine-out", "qat", "fp16"), ("ampere", "in-sample", "int8", "fp16"),
                   ("turing", "leave-one-gpu-out", "t8", "t16")}
    p = next(p for p in pairs if (p.split, p.case_a, p.case_b) == ("leave-one-engine-out", "int8", "fp16"))
    assert (p.measured_ratio, p.estimated_ratio) == pytest.approx((0.5, 0.6 / 1.1)) and p.held_out
    assert abs(p.log_err) == pytest.approx(_ratio_err(0.6, 0.5, 1.1, 1.0))
    assert p.to_json()["ratio_err"] == pytest.approx((0.6 / 1.1) / 0.5 - 1)
    # a case listed twice in one split counts once
    assert len(val.pairs_of(check_rows([row("a"), row("a"), row("b", measured=2.0)]))) == 1


def test_the_difference_band_is_the_quantile_of_the_held_out_ratio_errors():
    # every estimate 30 % high (absolute band ±30 %), their ratios exact but one: the difference band is narrow
    rows = [row(f"p{i}", measured=m, estimated=1.3 * m) for i, m in enumerate((1.0, 0.8, 0.6, 0.5))]
    rows += [row("p4", measured=0.4, estimated=1.3 * 0.4 * 1.15)]
    rows += [row(f"s{i}", measured=1.0 + i, estimated=(1.0 + i) * (1.5 if i else 1.0), split="in-sample")
             for i in range(2)]  # in-sample pairs: ignored where held-out pairs exist
    v = Validation(check_rows(rows))
    held = [p for p in v.pairs() if p.held_out]
    assert len(held) == 10 and len(v.pairs()) == 11
    want = max(float(np.quantile([abs(p.log_err) for p in held], val.QUANTILE)), val.MIN_SPREAD)
    d = v.diff_spreads()[("cnn", "ampere")]
    assert d.log_spread == pytest.approx(want) and d.cases == 10 and d.held_out and d.gpus == ("a100",)
    b = band(1.0, {"cnn": 1.0}, "ampere", v)
    assert b.pct > 25 and b.diff_log_spread == pytest.approx(want) and b.diff_pct < b.pct
    assert b.diff_status == "validated" and b.diff_window() == f"the estimate's ±{b.diff_pct:.0f} % difference band"
    assert b.diff_basis == (f"85th-percentile error of an estimated ratio on Ampere GPUs: cnn ±{b.diff_pct:.0f} % "
                            f"(10 held-out pairs: a100)")
    # in-sample pairs only when no pair was held out, and the band says so
    ins = Validation(check_rows([r for r in rows if r["split"] == "in-sample"]))
    bi = band(1.0, {"cnn": 1.0}, "ampere", ins)
    assert bi.diff_status == "in-sample" and bi.diff_log_spread == pytest.approx(math.log(1.5))
    assert bi.diff_window().endswith("difference band (from in-sample pairs only)")
    # exact ratios promise no more than the floor
    exact = Validation(check_rows(rows[:4]))
    assert band(1.0, {"cnn": 1.0}, "ampere", exact).diff_log_spread == pytest.approx(val.MIN_SPREAD)


def test_without_a_pair_the_difference_band_takes_the_widest_one_known():
    ampere = [row("a", measured=1.0, estimated=1.0), row("b", measured=0.5, estimated=0.6)]  # ratio +20 %
    turing = [row("t", gpu="titanrtx", arch="turing", measured=1.0, estimated=1.6, split="leave-one-gpu-out")]
    v = Validation(check_rows(ampere + turing))
    assert set(v.diff_spreads()) == {("cnn", "ampere")} and v.widest_diff() == pytest.approx(math.log(1.2))
    t = band(1.0, {"cnn": 1.0}, "turing", v)  # a case on the Turing, but no pair
    assert t.status == "validated" and t.diff_status == "unvalidated"
    assert t.diff_log_spread == pytest.approx(math.log(1.2))
    assert t.diff_window() == "the estimate's ±20 % difference band (unvalidated on Turing GPUs)"
    assert t.diff_basis == "no validation pair on Turing GPUs: the widest difference spread known (±20 %)"
    # transformer rows may be missing (validation_rows() == []): its layers are unvalidated, weighted by share
    m = band(1.0, {"cnn": 0.6, "transformer": 0.4}, "ampere", v)
    assert m.diff_unvalidated == ("transformer",)
    assert m.diff_log_spread == pytest.approx(0.6 * math.log(1.2) + 0.4 * math.log(1.2))
    assert m.diff_qualifier() == "unvalidated for transformer layers on Ampere GPUs, 40 % of the time"
    # no pair at all: the widest absolute spread; no data at all: NO_DATA_SPREAD
    lone = Validation(check_rows(turing))
    assert band(1.0, {"cnn": 1.0}, "turing", lone).diff_log_spread == pytest.approx(math.log(1.6))
    assert band(1.0, {"cnn": 1.0}, "ampere", Validation([])).diff_log_spread == pytest.approx(val.NO_DATA_SPREAD)


def test_transformer_pairs_are_int8_vs_fp16_at_each_gpu_model_seq_and_batch():
    def tr(prec, batch, measured, estimated, split="in-sample"):
        return row(f"bert {prec} b{batch}", model="bert-base", precision=prec, batch=batch, seq=128,
                   measured=measured, estimated=estimated, split=split, family="transformer")
    rows = [tr("fp16", 32, 3.85, 3.9), tr("int8", 32, 2.23, 2.5), tr("fp16", 1, 0.62, 0.6), tr("int8", 1, 0.54, 0.5),
            tr("fp16", 32, 3.85, 4.4, "leave-one-gpu-out"), tr("int8", 32, 2.23, 2.0, "leave-one-gpu-out")]
    v = Validation(check_rows(rows))
    pairs = v.pairs()
    assert len(pairs) == 3 and {(p.batch, p.split) for p in pairs} == {(32, "in-sample"), (1, "in-sample"),
                                                                        (32, "leave-one-gpu-out")}
    d = v.diff_spreads()[("transformer", "ampere")]
    assert d.held_out and d.cases == 1 and d.log_spread == pytest.approx(_ratio_err(2.0, 2.23, 4.4, 3.85))


def test_the_validation_document_carries_the_difference_bands_and_reads_format_1():
    v = Validation(check_rows([row("a", measured=1.0, estimated=1.0), row("b", measured=0.5, estimated=0.6)]),
                   "cmd", "today")
    doc = json.loads(json.dumps(v.to_json()))
    assert doc["format_version"] == 2 and len(doc["pairs"]) == 1
    assert doc["diff_spreads"] == [{"family": "cnn", "arch": "ampere", "log_spread": pytest.approx(math.log(1.2)),
                                    "pct": pytest.approx(20.0), "cases": 1, "held_out": True, "gpus": ["a100"]}]
    old = {k: v for k, v in doc.items() if k not in ("diff_spreads", "pairs")} | {"format_version": 1}
    for d in (doc, old):
        back = Validation.from_json(d)
        assert back.rows == v.rows and back.diff_spreads() == v.diff_spreads()
    with pytest.raises(MixprecError, match="format 3, not one of 1, 2"):
        Validation.from_json(doc | {"format_version": 3})


def test_the_shipped_difference_bands_are_the_rows_pairs():
    doc = json.loads(val.PATH.read_text())
    v = Validation.from_json(doc)
    assert doc["format_version"] == 2
    assert {(s["family"], s["arch"]): s["log_spread"] for s in doc["diff_spreads"]} == pytest.approx(
        {k: s.log_spread for k, s in v.diff_spreads().items()})
    assert len(doc["pairs"]) == len(v.pairs()) and v.pairs()
    for p in v.pairs():  # a pair is one model on one GPU at one batch, two cases
        assert p.case_a != p.case_b and p.measured_ratio <= 1.0


def test_a_band_stored_before_the_difference_band_reads_without_one():
    b = band(0.86, {"cnn": 1.0}, "ampere")
    doc = {k: v for k, v in b.to_json().items() if not k.startswith("diff_")}
    old = Band.from_json(doc)
    assert not old.has_diff and math.isnan(old.diff_log_spread) and old.low_ms == b.low_ms
    assert b.has_diff and Band.from_json(json.loads(json.dumps(b.to_json()))).diff_log_spread == b.diff_log_spread
