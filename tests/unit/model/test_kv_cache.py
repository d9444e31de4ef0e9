"""Issue 21 §1: a decoder exported with its KV cache (the "with past" export, built in code: 2-layer Qwen2)
is recognised; its dims keep attention_mask = past + seq; generated data fills the cache from a prompt run
with positions past … past + seq − 1; inspect, build, rank and search run on it, with generated data and an
.npz; sizes ONNX Runtime refuses end in one clear error (for every model, not only decoders)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.data import generate_dataset
from core.model.kv_cache import KV_PAST, KV_SEQ, kv_cache
from core.model.load import load_model
from core.model.shapes import resolve_input_shapes, shape_choices
from tests.fixtures.cli import cli_in_process
from tests.fixtures.decoders import CACHE_INPUTS, HEAD_DIM, KV_HEADS, PRESENT, VOCAB, kv_decoder, kv_feeds
from tests.fixtures.models import run_model


@pytest.fixture(scope="module")
def kv_path(tmp_path_factory):
    return kv_decoder(tmp_path_factory.mktemp("kv") / "decoder_with_past.onnx")


@pytest.fixture(scope="module")
def kv_model(kv_path):
    return load_model(kv_path)


@pytest.fixture
def cli(ws, capfd, monkeypatch):
    def run(*args):
        return cli_in_process(capfd, monkeypatch, args, {"MIXPREC_WORKSPACE": str(ws.root)})
    return run


def test_the_export_runs_in_onnx_runtime_as_exported(kv_path):
    out = run_model(str(kv_path), [kv_feeds(2, 8, 4)])  # the fixture is what transformers users export
    assert out.shape == (2, 4, VOCAB)


def test_the_cache_mask_and_positions_are_recognised(kv_model):
    kv = kv_cache(kv_model)
    assert kv is not None and list(kv.cache_inputs) == CACHE_INPUTS
    assert kv.present == dict(zip(CACHE_INPUTS, PRESENT))
    assert (kv.past, kv.seq, kv.total, kv.past_axis) == ("past", "seq", "total", 2)
    assert (kv.ids, kv.mask, kv.positions) == ("input_ids", "attention_mask", "position_ids")
    assert kv.relation() == "attention_mask axis 1 = past + seq"


def test_a_decoder_without_a_cache_is_not_one(tiny_decoder_sample_model):
    assert kv_cache(tiny_decoder_sample_model) is None


@pytest.fixture(scope="module")
def tiny_decoder_sample_model(tmp_path_factory):
    from core.model.samples import materialize_sample
    from core.workspace import Workspace

    paths = materialize_sample("tiny-decoder", Workspace(tmp_path_factory.mktemp("dec-ws")))
    return load_model(paths.model)


def test_dims_keep_the_mask_at_past_plus_seq(kv_model):
    by = {(c.input, c.axis): c for c in shape_choices(kv_model)}
    assert by[("input_ids", 1)].value == KV_SEQ and by[(CACHE_INPUTS[0], 2)].value == KV_PAST
    mask = by[("attention_mask", 1)]
    assert mask.value == KV_PAST + KV_SEQ and "attention_mask axis 1 = past + seq" in mask.note
    assert "--dim past=N" in by[(CACHE_INPUTS[0], 2)].note and "--dim seq=N" in by[("input_ids", 1)].note
    s = resolve_input_shapes(kv_model, overrides={"past": 8, "seq": 4})
    assert s["attention_mask"] == (1, 12) and s["position_ids"] == (1, 4) and s[CACHE_INPUTS[3]] == (1, KV_HEADS, 8, HEAD_DIM)
    assert resolve_input_shapes(kv_model, overrides={"total": 12, "seq": 4})[CACHE_INPUTS[0]][2] == 8  # past = total − seq
    with pytest.raises(MixprecError, match=r"attention_mask has 20 positions .* = 12") as e:
        resolve_input_shapes(kv_model, overrides={"past": 8, "seq": 4, "total": 20})
    assert "--dim total=12" in e.value.fix


def test_generated_data_follows_a_prompt_whose_cache_it_holds(kv_model, monkeypatch):
    import onnxruntime as ort

    prompts = []

    class Recording(ort.InferenceSession):  # the prompt runs fill_cache makes, recorded to be checked below
        def run(self, names, feeds, *args):
            prompts.append({k: v.copy() for k, v in feeds.items()})
            return super().run(names, feeds, *args)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    ds = generate_dataset(kv_model, 10, shapes=resolve_input_shapes(kv_model, overrides={"past": 8, "seq": 4}))
    monkeypatch.undo()
    a = ds.arrays
    assert "holds the model's own keys and values of a prompt of 8 tokens" in ds.source
    assert a["attention_mask"].shape == (10, 12) and (a["attention_mask"] == 1).all()
    assert (a["position_ids"] == np.arange(8, 12)).all() and a["input_ids"].max() < VOCAB
    # each prompt: 8 tokens within the vocabulary at positions 0..7, its mask, an empty cache
    assert sum(f["input_ids"].shape[0] for f in prompts) == 10
    for f in prompts:
        assert f["input_ids"].shape[1] == 8 and f["input_ids"].max() < VOCAB and (f["attention_mask"] == 1).all()
        assert (f["position_ids"] == np.arange(8)).all() and all(f[c].shape[2] == 0 for c in CACHE_INPUTS)
    # the cache is the model's own present outputs for those prompts (a fresh session, run again here)
    sess = ort.InferenceSession(str(kv_model.path), providers=["CPUExecutionProvider"])
    again = {c: np.concatenate([sess.run([p], f)[0] for f in prompts]) for c, p in zip(CACHE_INPUTS, PRESENT)}
    for c in CACHE_INPUTS:
        assert a[c].shape == (10, KV_HEADS, 8, HEAD_DIM)
        np.testing.assert_allclose(a[c], again[c], rtol=1e-5, atol=1e-5)
    # and the model accepts the sample: its present outputs start with that cache
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(a))))
    assert all(np.array_equal(got[p][:, :, :8], a[c]) for c, p in zip(CACHE_INPUTS, PRESENT))


def test_inspect_shows_the_relation_and_build_rank_run_on_generated_data(cli, kv_path):
    p = cli("inspect", str(kv_path), "--dim", "past=8", "--dim", "seq=4")
    assert p.returncode == 0, p.stderr
    assert "attention_mask axis 1 = past + seq = 8 + 4 = 12" in p.stdout and "--dim past=N --dim seq=N" in p.stdout
    doc = json.loads(cli("inspect", str(kv_path), "--json").stdout)
    assert doc["model"]["kv_cache"]["relation"] == "attention_mask axis 1 = past + seq"
    assert doc["model"]["input_shapes"]["attention_mask"] == [1, KV_PAST + KV_SEQ]
    b = cli("build", str(kv_path), "--iterations", "3", "--json")  # the defaults: no --dim needed any more
    assert b.returncode == 0 and "Traceback" not in b.stderr, b.stderr[-2000:]
    q = json.loads(b.stdout)["quality"]
    assert q["cosine_mean"] > 0.99 and q["top1_agreement"] is not None
    r = cli("rank", str(kv_path), "--dim", "past=8", "--dim", "seq=4", "--samples", "4", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)["layers"]) > 0


def test_build_rank_and_search_with_an_npz_score_the_new_tokens(kv_path, kv_model, tmp_path, ws):
    from core.measure.runs import build_and_measure
    from core.project import open_project
    from core.search import SearchConfig, search
    from core.sensitivity import rank_layers

    calib, ev = (kv_feeds(n, 8, 4, seed) for n, seed in ((8, 1), (8, 2)))
    np.savez(tmp_path / "calib.npz", **calib)
    labels = np.random.default_rng(3).integers(0, VOCAB, (8, 4))  # the next token after each of the 4 new ones
    np.savez(tmp_path / "eval.npz", **ev, labels=labels)
    p = open_project(str(kv_path), data=tmp_path / "calib.npz", eval_data=tmp_path / "eval.npz", ws=ws)
    assert p.input_shapes["attention_mask"] == (1, 12) and not p.data_generated
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    q = run.quality
    # the metrics are on the logits of the 4 new tokens, with the 8 cached ones in place: 8 samples × 4 positions
    assert q.top1_agreement is not None and q.kl_div is not None and q.perplexity is not None
    assert q.fp32_perplexity is not None and q.samples == 8
    assert len(rank_layers(p, max_samples=4).table) > 0
    r = search(p, SearchConfig("kl_div<=0.01", methods=("minmax",), workers=1))
    assert r.met_on_dev and r.holdout is not None and r.holdout.kl_div is not None


def test_search_on_generated_data(kv_path, ws):
    from core.project import open_project
    from core.search import SearchConfig, search

    p = open_project(str(kv_path), ws=ws, shape_overrides={"past": 8, "seq": 4})
    assert p.data_generated and p.input_shapes["attention_mask"] == (1, 12)
    r = search(p, SearchConfig("kl_div<=0.01", methods=("minmax",), workers=1))
    assert r.met_on_dev and r.holdout is not None and r.holdout.kl_div is not None


def test_a_mask_shorter_than_past_plus_seq_is_one_clear_error(cli, kv_path, tmp_path):
    feeds = kv_feeds(4, 8, 4)
    feeds["attention_mask"] = feeds["attention_mask"][:, :10]
    np.savez(tmp_path / "short.npz", **feeds)
    p = cli("build", str(kv_path), "--data", str(tmp_path / "short.npz"), "--eval", str(tmp_path / "short.npz"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "attention_mask has 10 positions" in last and "= 12" in last and "Fix:" in last
    p = cli("build", str(kv_path), "--dim", "past=8", "--dim", "seq=4", "--dim", "total=20")
    assert p.returncode == 2 and "--dim total=12" in p.stderr.strip().splitlines()[-1]


def _gather_model(path):
    table = numpy_helper.from_array(np.random.default_rng(0).random((16, 8), np.float32), "table")
    w = numpy_helper.from_array(np.random.default_rng(1).random((8, 8), np.float32), "w")
    g = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], ["e"], name="emb"),
                           helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])], [table, w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_inputs_onnx_runtime_refuses_are_one_clear_error_for_any_model(cli, tmp_path):
    model = _gather_model(tmp_path / "gather.onnx")
    np.savez(tmp_path / "bad.npz", input_ids=np.full((4, 5), 20, np.int64))  # beyond the 16-row table
    p = cli("build", str(model), "--data", str(tmp_path / "bad.npz"), "--eval", str(tmp_path / "bad.npz"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    # the first run on the data (the batch probe of core.measure.reference.settle_eval_batch) names it
    assert last.startswith("error: ONNX Runtime refused the inputs while running the model")
    assert "Gather node emb" in last and "input_ids 1x5" in last and "--dim" in last and "--shape" in last
