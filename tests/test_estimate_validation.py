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
    assert doc["kind"] == "mixprec.estimate_validation" and doc["format_version"] == 1
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
