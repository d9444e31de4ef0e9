"""Issue 23 §7: the network default of a policy, set as the CLI's --network-default sets it, and what an edit
changed in words (core.quant.policy.with_network_default, change_summary)."""
from __future__ import annotations

import pytest

from core.errors import MixprecError
from core.quant.policy import change_summary, default_policy, with_network_default


def test_the_default_policy_becomes_the_clis_fp16_default_and_back(tiny_transformer):
    p = tiny_transformer
    fp32 = p.default_policy()
    fp16 = with_network_default(fp32, p.model, p.layers, "fp16")
    assert fp16.layers == p.default_policy("fp16").layers == default_policy(p.model, p.layers, "fp16").layers
    assert fp16.network_default == "fp16" and fp16.calibration == fp32.calibration
    assert fp16.precision_counts()["fp32"] < fp32.precision_counts()["fp32"]
    assert with_network_default(fp16, p.model, p.layers, "fp32") == fp32  # and back, exactly


def test_layers_set_otherwise_keep_their_precision(tiny_transformer):
    p = tiny_transformer
    at_default = [l.name for l in p.layers if l.default_precision == "default"]
    eligible = next(l.name for l in p.layers if l.eligible)
    edited = p.default_policy().with_layers({at_default[0]: "fp16", eligible: "fp16"})
    moved = with_network_default(edited, p.model, p.layers, "fp16")
    assert moved.layers[eligible] == "fp16" and moved.layers[at_default[0]] == "fp16"
    assert all(moved.layers[n] == "fp16" for n in at_default)
    back = with_network_default(moved, p.model, p.layers, "fp32")
    assert back.layers[eligible] == "fp16"  # set by hand: not a network-default layer
    assert all(back.layers[n] == "fp32" for n in at_default)  # at the network default: they follow it
    with pytest.raises(MixprecError, match="not fp32 or fp16"):
        with_network_default(edited, p.model, p.layers, "int8")


def test_change_summary_names_each_move_largest_first(tiny_transformer):
    p = tiny_transformer
    before = p.default_policy()
    names = [l.name for l in p.layers]
    fp32 = [n for n in names if before.layers[n] == "fp32"]
    int8 = [n for n in names if before.layers[n] == "int8"]
    after = before.with_layers({**{n: "fp16" for n in fp32[:3]}, int8[0]: "fp16"})
    assert change_summary(before, after) == "3 layers FP32 → FP16, 1 INT8 → FP16"
    assert change_summary(before, before.with_layers({fp32[0]: "fp16"})) == "1 layer FP32 → FP16"
    assert change_summary(before, before) == "no layer changed"
    nd = with_network_default(before, p.model, p.layers, "fp16")
    k = sum(before.layers[n] != nd.layers[n] for n in names)
    assert change_summary(before, nd) == f"network default FP32 → FP16; {k} layer{'s' * (k != 1)} FP32 → FP16"
