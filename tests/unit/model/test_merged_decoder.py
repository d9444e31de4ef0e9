"""Issue 21 §1: a merged decoder (optimum's ``decoder_model_merged.onnx``: the with-past and the no-past
export of a 2-layer Qwen2 in one graph, ``If(use_cache_branch)`` between them, built in code) is folded on
load to the branch the user picks (default: with the cache), says so, keeps the two branches apart, and
inspects, builds, ranks and searches with generated data and with an .npz."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.kv_cache import kv_cache
from core.model.load import load_model
from core.project import ProjectSource, open_project
from tests.fixtures.cli import cli_in_process
from tests.fixtures.decoders import CACHE_INPUTS, VOCAB, merged_decoder, merged_feeds
from tests.fixtures.models import run_model


@pytest.fixture(scope="module")
def merged_path(tmp_path_factory):
    return merged_decoder(tmp_path_factory.mktemp("merged") / "decoder_model_merged.onnx")


@pytest.fixture
def cli(ws, capfd, monkeypatch):
    def run(*args):
        return cli_in_process(capfd, monkeypatch, args, {"MIXPREC_WORKSPACE": str(ws.root)})
    return run


def _ifs(proto):
    return [n for n in proto.graph.node if n.op_type == "If"]


def test_the_fixture_is_a_merged_decoder_both_branches_run(merged_path):
    proto = onnx.load(str(merged_path))
    assert [n.name for n in _ifs(proto)] == ["optimum::if"] and len(proto.graph.node) == 1
    for use_cache in (True, False):
        out = run_model(str(merged_path), [merged_feeds(2, 8, 4, use_cache)])
        assert out.shape == (2, 4, VOCAB)


def test_the_cache_branch_is_folded_by_default_and_said(ws, merged_path):
    m = load_model(merged_path, ws)
    assert m.branch_inputs == ["use_cache_branch"] and m.branches == {"use_cache_branch": True}
    assert not _ifs(m.proto) and "use_cache_branch" not in [i.name for i in m.inputs]
    step = next(s for s in m.normalization if s.step == "fold_branch")
    assert "use_cache_branch = true" in step.detail and "then branch" in step.detail and "--branch" in step.detail
    kv = kv_cache(m)
    assert kv is not None and list(kv.cache_inputs) == CACHE_INPUTS
    assert kv.relation() == "attention_mask axis 1 = past + seq"
    assert sum(n.op_type == "MatMul" for n in m.proto.graph.node) >= 15  # the MatMuls are layers of the graph now


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_folded_branch_computes_what_the_merged_graph_does(ws, merged_path, tmp_path, use_cache):
    import onnxruntime as ort

    m = load_model(merged_path, ws, branches={"use_cache_branch": use_cache})
    folded = m.save(tmp_path / "folded.onnx")
    feeds = merged_feeds(2, 8, 4, use_cache)
    want = ort.InferenceSession(str(merged_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = ort.InferenceSession(str(folded), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_branch_without_the_cache_drops_the_past_inputs_and_is_another_model(ws, merged_path):
    with_cache = load_model(merged_path, ws)
    first = load_model(merged_path, ws, branches={"use_cache_branch": False})
    assert first.sha256 != with_cache.sha256  # runs, caches and rankings of the two never mix
    assert [i.name for i in first.inputs] == ["input_ids", "attention_mask", "position_ids"]
    assert kv_cache(first) is None
    ids, mask = (next(i for i in first.inputs if i.name == n) for n in ("input_ids", "attention_mask"))
    assert mask.shape[1] == ids.shape[1]  # no past: the mask covers the new tokens
    detail = next(s for s in first.normalization if s.step == "fold_branch").detail
    assert "else branch" in detail and "past_key_values.0.key" in detail


def test_a_branch_input_the_model_lacks_is_refused_with_the_ones_it_has(ws, merged_path):
    with pytest.raises(MixprecError, match="not a branch input") as e:
        load_model(merged_path, ws, branches={"use_cache": True})
    assert "use_cache_branch" in e.value.fix


def test_the_branch_is_part_of_the_project_source(merged_path, ws):
    src = ProjectSource(str(merged_path), branches={"use_cache_branch": False})
    again = ProjectSource.from_json(json.loads(json.dumps(src.to_json())))
    assert again == src and hash(again) == hash(src) and again.branches == {"use_cache_branch": False}
    assert ProjectSource.from_json({"model": "m.onnx"}).branches is None  # older records
    p = src.open(ws)
    assert p.model.branches == {"use_cache_branch": False} and "past_key_values.0.key" not in p.input_shapes


def _switch_model(path):
    """A graph whose If picks by a boolean input that is no cache branch (a training flag)."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((4, 4), np.float32), "w")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm_then")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"], name="relu_else")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph([helper.make_node("If", ["flag"], ["y"], name="pick", then_branch=then, else_branch=other)],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_another_branch_input_stays_unless_given(cli, ws, tmp_path):
    path = _switch_model(tmp_path / "switch.onnx")
    m = load_model(path, ws)
    assert m.branch_inputs == ["flag"] and m.branches == {} and len(_ifs(m.proto)) == 1
    p = cli("inspect", str(path))
    assert p.returncode == 0 and "flag pick(s) an If branch at run time" in p.stdout and "--branch" in p.stdout
    fixed = load_model(path, ws, branches={"flag": True})
    assert not _ifs(fixed.proto) and [n.op_type for n in fixed.proto.graph.node] == ["MatMul"]
    p = cli("inspect", str(path), "--branch", "flag=maybe")
    assert p.returncode == 2 and "--branch INPUT=true|false" in p.stderr


def test_inspect_build_and_rank_on_generated_data(cli, merged_path):
    p = cli("inspect", str(merged_path), "--json")
    doc = json.loads(p.stdout)
    assert doc["model"]["branches"] == {"use_cache_branch": True} and doc["model"]["branch_inputs"] == ["use_cache_branch"]
    assert doc["model"]["kv_cache"]["relation"] == "attention_mask axis 1 = past + seq"
    assert any(s["step"] == "fold_branch" for s in doc["normalization"])
    text = cli("inspect", str(merged_path), "--dim", "past=8", "--dim", "seq=4").stdout
    assert "attention_mask axis 1 = past + seq = 8 + 4 = 12" in text
    b = cli("build", str(merged_path), "--iterations", "3", "--json")
    assert b.returncode == 0 and "Traceback" not in b.stderr, b.stderr[-2000:]
    run = json.loads(b.stdout)
    assert run["quality"]["cosine_mean"] > 0.99 and run["precision_counts"]["int8"] >= 15
    r = cli("rank", str(merged_path), "--branch", "use_cache_branch=false", "--samples", "4", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sum(row["eligible"] for row in json.loads(r.stdout)["layers"]) >= 15


def test_build_and_search_with_an_npz_on_either_branch(merged_path, tmp_path, ws):
    from core.measure.runs import build_and_measure
    from core.search import SearchConfig, search
    from core.sensitivity import rank_layers

    calib, ev = (merged_feeds(8, 8, 4, True, seed) for seed in (1, 2))
    np.savez(tmp_path / "calib.npz", **{k: v for k, v in calib.items() if k != "use_cache_branch"})
    np.savez(tmp_path / "eval.npz", **{k: v for k, v in ev.items() if k != "use_cache_branch"})
    p = open_project(str(merged_path), data=tmp_path / "calib.npz", eval_data=tmp_path / "eval.npz", ws=ws)
    assert p.input_shapes["attention_mask"] == (1, 12) and not p.data_generated
    r = search(p, SearchConfig("kl_div<=0.01", methods=("minmax",), workers=1))
    assert r.met_on_dev and r.holdout is not None and r.holdout.kl_div is not None
    assert len(rank_layers(p, max_samples=4).table) > 0
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.kl_div is not None and run.quality.samples == 8
    first = {k: v for k, v in merged_feeds(8, 0, 6, False, 3).items() if k in ("input_ids", "attention_mask", "position_ids")}
    np.savez(tmp_path / "first.npz", **first)
    q = open_project(str(merged_path), data=tmp_path / "first.npz", ws=ws, branches={"use_cache_branch": False})
    assert q.input_shapes["attention_mask"] == (1, 6)
    run = build_and_measure(q, q.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.cosine_mean > 0.99 and run.model_sha256 == q.model.sha256 != p.model.sha256


def test_search_on_generated_data_on_either_branch(merged_path, ws):
    from core.search import SearchConfig, search

    for branches, dims in ((None, {"past": 8, "seq": 4}), ({"use_cache_branch": False}, {"seq": 6})):
        p = open_project(str(merged_path), ws=ws, shape_overrides=dims, branches=branches)
        assert p.data_generated
        r = search(p, SearchConfig("kl_div<=0.01", methods=("minmax",), workers=1))
        assert r.met_on_dev and r.holdout is not None and r.holdout.kl_div is not None


def test_a_mask_shorter_than_past_plus_seq_is_one_clear_error(cli, merged_path, tmp_path):
    feeds = {k: v for k, v in merged_feeds(4, 8, 4, True).items() if k != "use_cache_branch"}
    feeds["attention_mask"] = feeds["attention_mask"][:, :10]
    np.savez(tmp_path / "short.npz", **feeds)
    p = cli("build", str(merged_path), "--data", str(tmp_path / "short.npz"), "--eval", str(tmp_path / "short.npz"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "attention_mask has 10 positions" in last and "Fix:" in last


def test_a_merged_decoder_whose_weights_stay_external_folds_and_builds(merged_path, tmp_path, ws, monkeypatch):
    """Merged decoders of real LLMs are over 2 GB: their weights stay in the data file (core.model.external)."""
    from core.measure.runs import build_and_measure

    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = tmp_path / "ext" / "decoder_model_merged.onnx"
    path.parent.mkdir()
    onnx.save_model(onnx.load(str(merged_path)), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="decoder_model_merged.onnx.data", size_threshold=1024)
    for branches, dims in ((None, {"past": 8, "seq": 4}), ({"use_cache_branch": False}, {"seq": 4})):
        p = open_project(str(path), ws=ws, branches=branches, shape_overrides=dims)
        assert p.model.external and not _ifs(p.model.proto)
        assert any(s.step == "fold_branch" for s in p.model.normalization)
        run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
        assert run.quality.cosine_mean > 0.99
