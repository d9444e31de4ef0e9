"""The estimate's validation data and uncertainty band (issue 19 §5, §6): the shipped
``core/estimate/validation.json`` parses and its rows have the schema (not that it equals a fresh
run: the fit is still changing), the schema check refuses bad rows, and the band on the basis of what
the estimate is — on a GPU the fit saw, its held-out engines still fitted with its data (its in-sample
cases when nothing was held out); on a GPU it did not see, the transfer cases (leave-one-gpu-out, held-out
GPUs outside the fit set) of its architecture; "unvalidated" without any, with the family's widest such
spread — families weighted by their share of the time; the difference band by the same rule."""
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


def _q(errs) -> float:
    """The spread of these relative errors: the QUANTILE of |log(1 + e)|, at least MIN_SPREAD."""
    return max(float(np.quantile(np.abs(np.log1p(errs)), val.QUANTILE)), val.MIN_SPREAD)


LOEO_A100 = [0.02, -0.05, 0.10, 0.12, -0.08]      # fitted with the A100's other engines: small
LOGO_A100 = [0.30, -0.29, 0.24, -0.05, 0.01]      # fitted without any A100 engine: large
LOGO_TITAN = [0.33, 0.62, 0.50, 0.67]             # the widest CNN transfer spread (Turing)


def cnn_rows(loeo=LOEO_A100, with_titan_held=True):
    """A planted CNN validation: the fit saw a100 and titanrtx (their in-sample rows), leave-one-engine-out
    on both, leave-one-gpu-out on both."""
    rows = [row(f"a{i}", estimated=1.0 + 0.001 * i, split="in-sample") for i in range(5)]
    rows += [row(f"a{i}", estimated=1.0 + e) for i, e in enumerate(loeo)]
    rows += [row(f"a{i}", estimated=1.0 + e, split="leave-one-gpu-out") for i, e in enumerate(LOGO_A100)]
    titan = dict(gpu="titanrtx", arch="turing", model="mobilenetv2", batch=1)
    rows += [row(f"t{i}", estimated=1.01, split="in-sample", **titan) for i in range(4)]
    if with_titan_held:
        rows += [row(f"t{i}", estimated=1.0 + e, **titan) for i, e in enumerate((0.1, -0.11, 0.19, -0.04))]
    rows += [row(f"t{i}", estimated=1.0 + e, split="leave-one-gpu-out", **titan) for i, e in enumerate(LOGO_TITAN)]
    return rows


def test_the_gpus_the_fit_saw_are_those_of_its_in_sample_rows():
    v = Validation(check_rows(cnn_rows() + bert_rows()))
    assert v.fit_gpus("cnn") == ("a100", "titanrtx") and v.fit_gpus("transformer") == ("a100-40gb", "t4")
    assert v.to_json()["fit_gpus"] == {"cnn": ["a100", "titanrtx"], "transformer": ["a100-40gb", "t4"]}
    assert set(v.spreads()) == {("cnn", "this-gpu", "a100"), ("cnn", "this-gpu", "titanrtx"),
                                ("cnn", "other-gpus", "ampere"), ("cnn", "other-gpus", "turing"),
                                ("transformer", "this-gpu", "a100-40gb"), ("transformer", "other-gpus", "ampere"),
                                ("transformer", "other-gpus", "turing"),
                                ("transformer", "this-gpu-in-sample", "t4")}  # nothing held out on the t4 here


def test_on_a_gpu_the_fit_saw_the_band_rests_on_its_held_out_engines_not_on_transfer_rows():
    v = Validation(check_rows(cnn_rows()))
    b = band(2.0, {"cnn": 2.0}, "ampere", v, gpu="a100")
    assert b.status == "validated" and b.bases == (("cnn", "this-gpu"),) and b.gpu == "a100"
    assert b.log_spread == pytest.approx(_q(LOEO_A100))   # not the leave-one-gpu-out rows of the same GPU
    assert (b.low_ms, b.high_ms) == pytest.approx((2.0 * math.exp(-b.log_spread), 2.0 * math.exp(b.log_spread)))
    assert b.text(2.0) == f"2.00 ms, likely {val.sig(b.low_ms)}–{val.sig(b.high_ms)} ms (held-out engines on this GPU)"
    assert b.basis == (f"85th-percentile error on a100 (Ampere GPUs): cnn ±{b.pct:.0f} % from held-out cases on "
                       "this GPU, fitted with its other data (5 held-out cases: a100; leave-one-engine-out)")
    assert b.short() == f"likely {b.range_text()}" and b.to_json()["text"] == b.phrase()
    # a narrow set of cases gives no band below the floor
    tight = Validation(check_rows(cnn_rows(loeo=[0.001] * 5)))
    assert band(1.0, {"cnn": 1.0}, "ampere", tight, gpu="a100").log_spread == pytest.approx(val.MIN_SPREAD)


def test_on_a_gpu_the_fit_did_not_see_the_band_rests_on_transfer_rows_of_its_architecture():
    v = Validation(check_rows(cnn_rows()))
    # a30 (an Ampere the CNN fit did not see) and a GPU without a key
    for gpu in ("a30", ""):
        b = band(1.0, {"cnn": 1.0}, "ampere", v, gpu=gpu)
        assert b.status == "validated" and b.bases == (("cnn", "other-gpus"),)
        assert b.log_spread == pytest.approx(_q(LOGO_A100))
        assert b.text(1.0).endswith("(other GPUs of this architecture, fitted without them)")
        assert "5 held-out cases: a100; leave-one-gpu-out" in b.basis
    # the a100-40gb has the a100's chip (architecture, SMs, tensor peaks): it rests on the a100's held-out engines
    same = band(1.0, {"cnn": 1.0}, "ampere", v, gpu="a100-40gb")
    assert same.bases == (("cnn", "this-gpu"),) and same.text(1.0).endswith("(held-out engines on this GPU)")
    t4 = band(1.0, {"cnn": 1.0}, "turing", v, gpu="t4")
    assert t4.log_spread == pytest.approx(_q(LOGO_TITAN)) and t4.bases == (("cnn", "other-gpus"),)


def test_an_architecture_without_transfer_rows_is_unvalidated_and_takes_the_familys_widest_such_spread():
    v = Validation(check_rows(cnn_rows() + bert_rows()))
    widest_cnn = max(_q(LOGO_A100), _q(LOGO_TITAN))
    assert v.widest("cnn") == pytest.approx(widest_cnn)
    hopper = band(0.86, {"cnn": 0.86}, "hopper", v, gpu="h100")
    assert hopper.status == "unvalidated" and hopper.log_spread == pytest.approx(widest_cnn)
    assert hopper.bases == (("cnn", "unvalidated"),) and hopper.unvalidated == ("cnn",)
    assert hopper.text(0.86).startswith("0.860 ms, unvalidated on Hopper GPUs: likely ")
    assert hopper.short().startswith("unvalidated: likely")
    assert hopper.basis == ("85th-percentile error on h100 (Hopper GPUs): no validation case on Hopper GPUs for cnn "
                            "layers: the widest spread of cnn estimates on GPUs its fit did not see "
                            f"(±{100 * math.expm1(widest_cnn):.0f} %)")
    # the transformer family takes its own widest transfer spread, not the CNN's
    volta = band(1.0, {"transformer": 1.0}, "volta", v, gpu="v100")
    assert volta.status == "unvalidated" and volta.log_spread == pytest.approx(v.widest("transformer"))
    assert v.widest("transformer") == pytest.approx(max(_q(A30 + LOGO_40GB), _q(LOGO_T4))) != widest_cnn
    # no validation data at all
    nothing = band(1.0, {"cnn": 1.0}, "ampere", Validation([]), gpu="a100")
    assert nothing.status == "unvalidated" and nothing.log_spread == pytest.approx(val.NO_DATA_SPREAD)
    assert math.isclose(nothing.diff_log_spread, val.NO_DATA_SPREAD)


def test_a_seen_gpu_without_held_out_cases_uses_its_in_sample_ones_and_says_so():
    rows = [r for r in cnn_rows(with_titan_held=False)]
    v = Validation(check_rows(rows))
    b = band(1.0, {"cnn": 1.0}, "turing", v, gpu="titanrtx")
    assert b.status == "in-sample" and b.bases == (("cnn", "this-gpu-in-sample"),)
    assert b.log_spread == pytest.approx(_q([0.01] * 4))
    assert b.text(1.0).endswith("(in-sample errors on this GPU only: nothing held out)")
    assert "this GPU's in-sample cases (nothing held out on it) (4 in-sample cases: titanrtx; in-sample)" in b.basis


# --- transformers: BERT-base fitted on a100-40gb and t4; BERT-Large and other GPUs held out --------------
BERT_LARGE_40GB = [0.05, -0.03, 0.08, 0.02]        # held out, on a GPU the fit saw
LOGO_40GB = [0.51, 0.40, 0.30, 0.10]              # BERT-base on the a100-40gb, fitted on the t4 only
A30 = [-0.16, -0.29, -0.41, -0.55]                # held-out published, a GPU outside the fit
LOGO_T4 = [-0.31, -0.27, -0.25, -0.36]


def bert_rows():
    def tr(case, gpu, arch, err, split, model="bert-base", prec="fp16", batch=1):
        return row(f"{model} {prec} b{batch} {case} on {gpu}", gpu=gpu, arch=arch, model=model, precision=prec,
                   batch=batch, seq=128, estimated=1.0 + err, split=split, family="transformer")
    out = []
    for gpu, arch, logo in (("a100-40gb", "ampere", LOGO_40GB), ("t4", "turing", LOGO_T4)):
        for i, e in enumerate(logo):
            prec, batch = ("fp16", "int8")[i % 2], 1 + i // 2
            out += [tr("", gpu, arch, 0.01 * i, "in-sample", prec=prec, batch=batch),
                    tr("", gpu, arch, e, "leave-one-gpu-out", prec=prec, batch=batch)]
    for i, e in enumerate(BERT_LARGE_40GB):
        out.append(tr("", "a100-40gb", "ampere", e, "held-out published", "bert-large", ("fp16", "int8")[i % 2],
                      1 + i // 2))
    for i, e in enumerate(A30):
        out.append(tr("", "a30", "ampere", e, "held-out published", prec=("fp16", "int8")[i % 2], batch=1 + i // 2))
    return out


def test_transformer_bands_follow_the_same_rule():
    v = Validation(check_rows(bert_rows()))
    seen = band(1.0, {"transformer": 1.0}, "ampere", v, gpu="a100-40gb")
    assert seen.bases == (("transformer", "this-gpu"),) and seen.log_spread == pytest.approx(_q(BERT_LARGE_40GB))
    assert seen.text(1.0).endswith("(held-out engines on this GPU)") and "held-out published" in seen.basis
    # the a100 (80 GB) has the a100-40gb's chip (architecture, SMs, tensor peaks): the same basis
    same = band(1.0, {"transformer": 1.0}, "ampere", v, gpu="a100")
    assert same.bases == (("transformer", "this-gpu"),) and same.log_spread == pytest.approx(seen.log_spread)
    # the a10 is an Ampere the transformer fit did not see: transfer rows of the Ampere
    a10 = band(1.0, {"transformer": 1.0}, "ampere", v, gpu="a10")
    assert a10.bases == (("transformer", "other-gpus"),) and a10.log_spread == pytest.approx(_q(A30 + LOGO_40GB))
    assert "8 held-out cases: a100-40gb, a30; leave-one-gpu-out, held-out published" in a10.basis
    assert a10.text(1.0).endswith("(other GPUs of this architecture, fitted without them)")
    # on the a30 itself: its own held-out rows are among them
    a30 = band(1.0, {"transformer": 1.0}, "ampere", v, gpu="a30")
    assert a30.log_spread == pytest.approx(a10.log_spread)
    assert a30.text(1.0).endswith("(this and other GPUs of this architecture, fitted without them)")


def test_an_estimate_of_two_families_weighs_each_on_its_own_basis():
    v = Validation(check_rows(cnn_rows()))  # no transformer row at all
    mixed = band(1.0, {"cnn": 0.6, "transformer": 0.4}, "ampere", v, gpu="a100")
    assert mixed.status == "unvalidated" and mixed.unvalidated == ("transformer",)
    assert mixed.bases == (("cnn", "this-gpu"), ("transformer", "unvalidated"))
    assert mixed.log_spread == pytest.approx(0.6 * _q(LOEO_A100) + 0.4 * v.widest("transformer"))
    assert v.widest("transformer") == pytest.approx(v.widest("cnn"))  # no transformer transfer spread: any family's
    assert mixed.text(1.0) == (f"1.00 ms, transformer layers (40 % of the time) unvalidated on Ampere GPUs: likely "
                               f"{mixed.range_text()} (cnn: held-out engines on this GPU)")
    assert "cnn 60 %, transformer 40 %" in mixed.basis
    both = Validation(check_rows(cnn_rows() + bert_rows()))
    m2 = band(1.0, {"transformer": 0.9, "cnn": 0.1}, "ampere", both, gpu="a30")
    assert m2.status == "validated" and m2.bases == (("transformer", "other-gpus"), ("cnn", "other-gpus"))
    assert m2.log_spread == pytest.approx(0.9 * _q(A30 + LOGO_40GB) + 0.1 * _q(LOGO_A100))
    # a GPU the fit saw for one family (the a100-40gb: transformer) and by its chip for the other (cnn: the a100)
    m3 = band(1.0, {"transformer": 0.9, "cnn": 0.1}, "ampere", both, gpu="a100-40gb")
    assert m3.bases == (("transformer", "this-gpu"), ("cnn", "this-gpu"))
    assert m3.log_spread == pytest.approx(0.9 * _q(BERT_LARGE_40GB) + 0.1 * _q(LOEO_A100))


def test_the_band_round_trips():
    v = Validation(check_rows(cnn_rows() + bert_rows()))
    for gpu, arch in (("a100", "ampere"), ("h100", "hopper"), ("a30", "ampere")):
        b = band(0.86, {"cnn": 0.5, "transformer": 0.36}, arch, v, gpu=gpu)
        back = Band.from_json(json.loads(json.dumps(b.to_json())))
        assert back == b and back.text(0.86) == b.text(0.86)
    assert band(0.86, {"cnn": 1.0}, "ampere", gpu="a100") == Band.from_json(
        band(0.86, {"cnn": 1.0}, "ampere", gpu="a100").to_json())
    with pytest.raises(MixprecError, match="band is damaged"):
        Band.from_json({"low_ms": 1.0})
    with pytest.raises(MixprecError, match="band is damaged"):
        Band.from_json(b.to_json() | {"bases": {"cnn": "somewhere"}})


def test_a_band_stored_before_the_bases_reads_with_its_old_text():
    b = band(0.86, {"cnn": 1.0}, "ampere", Validation(check_rows(cnn_rows())), gpu="a100")
    old_keys = ("gpu", "bases", "note", "diff_bases", "diff_note")
    old = Band.from_json({k: v for k, v in b.to_json().items() if k not in old_keys})
    assert old.bases == () and old.low_ms == b.low_ms and old.text(0.86) == f"0.860 ms, likely {b.range_text()}"
    ins = Band.from_json({k: v for k, v in b.to_json().items() if k not in old_keys} | {"status": "in-sample"})
    assert ins.text(0.86).endswith("(from in-sample errors only)")


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


def _pair_errs(errs):
    """The |ratio errors| of every pair of cases whose relative errors are ``errs`` (measured 1 ms each)."""
    return [abs(math.log((1 + a) / (1 + b))) for i, a in enumerate(errs) for b in errs[i + 1:]]


def _qp(errs) -> float:
    return max(float(np.quantile(_pair_errs(errs), val.QUANTILE)), val.MIN_SPREAD)


def test_the_difference_band_follows_the_same_rule_as_the_band():
    v = Validation(check_rows(cnn_rows()))
    # the planted rows are all of one model/batch per GPU and split: every two cases are a pair
    seen = band(1.0, {"cnn": 1.0}, "ampere", v, gpu="a100")
    assert seen.diff_bases == (("cnn", "this-gpu"),) and seen.diff_status == "validated"
    assert seen.diff_log_spread == pytest.approx(_qp(LOEO_A100))
    assert seen.diff_window() == f"the estimate's ±{seen.diff_pct:.0f} % difference band (held-out engines on this GPU)"
    assert "(10 held-out pairs: a100; leave-one-engine-out)" in seen.diff_basis
    unseen = band(1.0, {"cnn": 1.0}, "ampere", v, gpu="a30")
    assert unseen.diff_bases == (("cnn", "other-gpus"),) and unseen.diff_log_spread == pytest.approx(_qp(LOGO_A100))
    assert unseen.diff_window().endswith("difference band (other GPUs of this architecture, fitted without them)")
    hopper = band(1.0, {"cnn": 1.0}, "hopper", v, gpu="h100")
    assert hopper.diff_status == "unvalidated" and hopper.diff_bases == (("cnn", "unvalidated"),)
    assert hopper.diff_log_spread == pytest.approx(max(_qp(LOGO_A100), _qp(LOGO_TITAN))) == v.widest_diff("cnn")
    assert hopper.diff_window() == f"the estimate's ±{hopper.diff_pct:.0f} % difference band (unvalidated on Hopper GPUs)"
    assert hopper.diff_basis.startswith("85th-percentile error of an estimated ratio on h100 (Hopper GPUs): no "
                                        "validation pair on Hopper GPUs for cnn layers")


def test_the_difference_band_falls_back_to_in_sample_pairs_then_unvalidated():
    # a seen GPU whose held-out cases form no pair (one per batch): its in-sample pairs, and it says so
    rows = [row("s1", estimated=1.0, split="in-sample"), row("s2", estimated=1.5, split="in-sample"),
            row("s1", estimated=1.1, batch=1), row("s2", estimated=1.2, batch=2)]
    v = Validation(check_rows(rows))
    b = band(1.0, {"cnn": 1.0}, "ampere", v, gpu="a100")
    assert b.status == "validated" and b.bases == (("cnn", "this-gpu"),)
    assert b.diff_status == "in-sample" and b.diff_bases == (("cnn", "this-gpu-in-sample"),)
    assert b.diff_log_spread == pytest.approx(math.log(1.5))
    assert b.diff_window().endswith("difference band (in-sample pairs on this GPU only: nothing held out)")
    # transfer rows without a pair: the absolute band is validated, the difference band is not
    lone = Validation(check_rows(rows + [row("x", gpu="a30", estimated=1.3, split="leave-one-gpu-out")]))
    t = band(1.0, {"cnn": 1.0}, "ampere", lone, gpu="a10")
    assert t.status == "validated" and t.log_spread == pytest.approx(math.log(1.3))
    assert t.diff_status == "unvalidated" and t.diff_window().endswith("(unvalidated on Ampere GPUs)")
    # no transfer pair anywhere: the widest difference spread known (here the in-sample one)
    assert t.diff_log_spread == pytest.approx(math.log(1.5)) == lone.widest_diff("cnn")
    # no pair at all: the widest absolute spread
    nopair = Validation(check_rows([row("x", gpu="a30", estimated=1.3, split="leave-one-gpu-out")]))
    assert band(1.0, {"cnn": 1.0}, "hopper", nopair).diff_log_spread == pytest.approx(math.log(1.3))


def test_transformer_pairs_are_int8_vs_fp16_at_each_gpu_model_seq_and_batch():
    v = Validation(check_rows(bert_rows()))
    pairs = v.pairs()
    assert {(p.model, p.gpu, p.split) for p in pairs} == {
        ("bert-base", "a100-40gb", "in-sample"), ("bert-base", "a100-40gb", "leave-one-gpu-out"),
        ("bert-base", "t4", "in-sample"), ("bert-base", "t4", "leave-one-gpu-out"),
        ("bert-large", "a100-40gb", "held-out published"), ("bert-base", "a30", "held-out published")}
    assert all(p.batch in (1, 2) and p.seq == 128 for p in pairs) and len(pairs) == 12
    d = v.diff_spreads()[("transformer", "this-gpu", "a100-40gb")]
    want = [_ratio_err(1 + BERT_LARGE_40GB[i + 1], 1, 1 + BERT_LARGE_40GB[i], 1) for i in (0, 2)]
    assert d.cases == 2 and d.log_spread == pytest.approx(max(float(np.quantile(want, val.QUANTILE)), val.MIN_SPREAD))
    ampere = v.diff_spreads()[("transformer", "other-gpus", "ampere")]
    assert ampere.cases == 4 and ampere.gpus == ("a100-40gb", "a30")


def test_the_validation_document_carries_the_bands_and_reads_formats_1_and_2():
    v = Validation(check_rows(cnn_rows()), "cmd", "today")
    doc = json.loads(json.dumps(v.to_json()))
    assert doc["format_version"] == 3 and len(doc["pairs"]) == len(v.pairs())
    d = next(s for s in doc["diff_spreads"] if s["basis"] == "this-gpu" and s["gpu"] == "a100")
    assert d == {"family": "cnn", "basis": "this-gpu", "gpu": "a100", "arch": "ampere",
                 "log_spread": pytest.approx(_qp(LOEO_A100)), "pct": pytest.approx(100 * math.expm1(_qp(LOEO_A100))),
                 "cases": 10, "held_out": True, "gpus": ["a100"], "splits": ["leave-one-engine-out"]}
    assert {(s["family"], s["basis"], s["gpu"] or s["arch"]) for s in doc["spreads"]} == set(v.spreads())
    for version in (1, 2):
        old = {k: x for k, x in doc.items() if k not in ("diff_spreads", "pairs", "fit_gpus")} | \
            {"format_version": version}
        back = Validation.from_json(old)
        assert back.rows == v.rows and back.diff_spreads() == v.diff_spreads() and back.spreads() == v.spreads()
    with pytest.raises(MixprecError, match="format 4, not one of 1, 2, 3"):
        Validation.from_json(doc | {"format_version": 4})


def test_the_shipped_bands_are_the_rows_bases():
    doc = json.loads(val.PATH.read_text())
    v = Validation.from_json(doc)
    assert doc["format_version"] == 3
    key = lambda s: (s["family"], s["basis"], s["gpu"] or s["arch"])  # noqa: E731
    assert {key(s): s["log_spread"] for s in doc["spreads"]} == pytest.approx(
        {k: s.log_spread for k, s in v.spreads().items()})
    assert {key(s): s["log_spread"] for s in doc["diff_spreads"]} == pytest.approx(
        {k: s.log_spread for k, s in v.diff_spreads().items()})
    assert len(doc["pairs"]) == len(v.pairs()) and v.pairs()
    for p in v.pairs():  # a pair is one model on one GPU at one batch, two cases
        assert p.case_a != p.case_b and p.measured_ratio <= 1.0
    # the CNN fit saw the A100 and the TITAN RTX: an A100 CNN estimate rests on its held-out engines
    assert set(v.fit_gpus("cnn")) >= {"a100", "titanrtx"}
    a100 = band(1.0, {"cnn": 1.0}, "ampere", v, gpu="a100")
    assert a100.bases == (("cnn", "this-gpu"),) and a100.text(1.0).endswith("(held-out engines on this GPU)")
    assert "leave-one-gpu-out" not in a100.basis


def test_a_band_stored_before_the_difference_band_reads_without_one():
    b = band(0.86, {"cnn": 1.0}, "ampere", gpu="a100")
    doc = {k: v for k, v in b.to_json().items() if not k.startswith("diff_")}
    old = Band.from_json(doc)
    assert not old.has_diff and math.isnan(old.diff_log_spread) and old.low_ms == b.low_ms
    assert b.has_diff and Band.from_json(json.loads(json.dumps(b.to_json()))).diff_log_spread == b.diff_log_spread
