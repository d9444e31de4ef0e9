"""The layer-wise ranking through Polygraphy (issue 20 §6): ModifyOutputs marks each chunk's tensors,
OnnxrtRunner (or, where TensorRT runs, TrtRunner) runs FP32 and the candidate, Comparator.run streams
the samples. Its table equals the one the ranking gave before (ONNX Runtime sessions built by hand with
the outputs appended to the serialized model: kept here verbatim as ``_reference_compare``, from
commit 46f9421) within 1e-6, on MiniLM and the tiny samples, in one chunk and in many."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.comparator import Comparator

import core.sensitivity.cumulative as cumulative
import core.sensitivity.runners as runners
from core.backends import tensorrt_available
from core.errors import MixprecError
from core.measure.metrics import StreamingError
from core.project import open_project
from core.sensitivity import RANK_COLUMNS, Ranking, rank_layers
from core.sensitivity.memory import bound_heap, release_memory
from tests.fixtures import ROOT
from tests.fixtures.ranking import ComparatorSpy

NUMERIC = ["macs", "cosine", "cos_drop", "added_cos_drop", "snr_db", "max_abs"]
EXACT = ["rank", "name", "op_type", "precision", "eligible"]


# --- the ranking's comparison before Polygraphy (commit 46f9421, core/sensitivity/cumulative.py), verbatim

def _session(proto: onnx.ModelProto, outputs: list[str], model=None) -> ort.InferenceSession:
    extra = onnx.ModelProto()
    have = {o.name for o in proto.graph.output}
    for t in outputs:
        if t not in have:
            extra.graph.output.add().name = t
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = False
    so.log_severity_level = 3
    if model is not None and model.weights is not None:  # the graph only: a copy costs nothing
        marked = onnx.ModelProto()
        marked.CopyFrom(proto)
        marked.MergeFrom(extra)
        (model.weights.folder / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="rank-", dir=model.weights.folder / "tmp") as tmp:
            return ort.InferenceSession(str(model.save(Path(tmp) / "marked.onnx", marked)), so,
                                        providers=["CPUExecutionProvider"])  # ORT keeps its maps of the files
    return ort.InferenceSession(proto.SerializeToString() + extra.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _reference_compare(project, compiled_proto, plan, feeds, step, on_chunk, compiled_model=None, runner=None):
    acc: dict[str, StreamingError] = {}
    n = len(plan.chunks) * len(feeds)
    if len(plan.chunks) > 1:
        bound_heap()
    for c, chunk in enumerate(plan.chunks):
        ref_sess = _session(project.model.proto, chunk, project.model)
        cand_sess = _session(compiled_proto, chunk, compiled_model)
        part = {t: StreamingError() for t in chunk}
        for i, feed in enumerate(feeds):
            step(0.3 + 0.65 * (c * len(feeds) + i) / n, f"comparing chunk {c + 1}/{len(plan.chunks)}, "
                                                        f"sample {i + 1}/{len(feeds)}")
            ref = ref_sess.run(chunk, feed)
            cand = cand_sess.run(chunk, feed)
            for t, r, k in zip(chunk, ref, cand):
                part[t].add(np.asarray(r), np.asarray(k))
            del ref, cand
        del ref_sess, cand_sess
        release_memory()
        acc.update(part)
        on_chunk(acc)
    return acc


# ---

@pytest.fixture(scope="module")
def tiny_decoder(ws):
    return open_project("sample:tiny-decoder", ws=ws)


def _equal_tables(new: Ranking, old: Ranking) -> float:
    """Assert the two tables are the same rows in the same order, numbers within 1e-6; the max abs difference."""
    a, b = new.table, old.table
    assert list(a.columns) == RANK_COLUMNS == list(b.columns) and len(a) == len(b) > 0
    for col in EXACT:
        assert a[col].tolist() == b[col].tolist(), col
    worst = 0.0
    for col in NUMERIC:
        x, y = a[col].to_numpy(float), b[col].to_numpy(float)
        finite = np.isfinite(x)
        assert np.array_equal(finite, np.isfinite(y)), col
        assert np.array_equal(x[~finite], y[~finite], equal_nan=True), col  # inf/nan SNRs alike
        d = float(np.max(np.abs(x[finite] - y[finite]), initial=0.0))
        assert d <= 1e-6, f"{col}: {d:.3g}"
        worst = max(worst, d)
    return worst


@pytest.mark.parametrize("sample,samples,max_memory", [
    ("minilm", 4, None), ("tiny_cnn", 16, None), ("tiny_transformer", 16, None), ("tiny_decoder", 8, None),
    ("tiny_transformer", 4, "420K"), ("tiny_cnn", 4, "400K")])
def test_table_equals_the_ranking_before_polygraphy(request, monkeypatch, sample, samples, max_memory):
    project = request.getfixturevalue(sample)
    spy = ComparatorSpy()
    monkeypatch.setattr(Comparator, "run", spy)
    rows = []
    new = rank_layers(project, max_samples=samples, max_memory=max_memory, runner="onnxruntime",
                      on_rows=lambda df: rows.append(len(df)))
    assert new.runner == "onnxruntime" and spy.calls == new.chunks and spy.runner_types == {runners.NumpyOnnxrtRunner}
    assert issubclass(runners.NumpyOnnxrtRunner, OnnxrtRunner)
    assert len(rows) == new.chunks and rows[-1] == len(new.table)  # rows streamed after each chunk
    assert (new.chunks > 1) == (max_memory is not None)
    monkeypatch.setattr(cumulative, "_compare", _reference_compare)
    old = rank_layers(project, max_samples=samples, max_memory=max_memory, runner="onnxruntime")
    assert old.chunks == new.chunks and spy.calls == new.chunks  # the reference did not go through Polygraphy
    print(f"{sample} x{samples} {max_memory or 'one chunk'}: {new.chunks} chunk(s), max abs difference "
          f"{_equal_tables(new, old):.3g}")
    off = old.table.copy()
    off.loc[len(off) // 2, "cosine"] += 2e-6  # the check is not vacuous
    with pytest.raises(AssertionError, match="cosine"):
        _equal_tables(new, Ranking(off, old.metric, old.samples, old.seconds, None))


def test_the_ranking_code_imports_polygraphys_comparator():
    import polygraphy.backend.onnx as pg_onnx
    import polygraphy.backend.onnxrt as pg_onnxrt
    import polygraphy.comparator as pg_comparator

    assert runners.Comparator is pg_comparator.Comparator
    assert runners.ModifyOutputs is pg_onnx.ModifyOutputs and runners.BytesFromOnnx is pg_onnx.BytesFromOnnx
    assert issubclass(runners.SessionWithoutArena, pg_onnxrt.SessionFromOnnx)
    assert cumulative.compare_chunk is runners.compare_chunk and cumulative.chunk_runners is runners.chunk_runners


def _odd_model() -> onnx.ModelProto:
    """y = relu(x * w) + 1 with tensor names ModifyOutputs would read as wildcards."""
    w = numpy_helper.from_array(np.array([2.0, -1.0, 0.5], np.float32), "w")
    one = numpy_helper.from_array(np.ones(3, np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "w"], ["mul[0]"], name="mul"),
             helper.make_node("Relu", ["mul[0]"], ["relu*"], name="relu"),
             helper.make_node("Add", ["relu*", "one"], ["y"], name="add")]
    g = helper.make_graph(nodes, "odd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w, one])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_marked_model_marks_exact_names_and_puts_the_models_outputs_back():
    proto = _odd_model()
    before = proto.SerializeToString()
    marked = onnx.load_from_string(runners.MarkedModel(proto, ["relu*", "mul[0]"]).to_bytes())
    assert [o.name for o in marked.graph.output] == ["y", "relu*", "mul[0]"]  # its own output first, as before
    assert proto.SerializeToString() == before  # ModifyOutputs worked on the proto itself: restored
    feeds = [{"x": np.array([[1.0, 2.0, -3.0]], np.float32)}]
    with runners.polygraphy_quiet("onnxruntime"):
        pair = runners.chunk_runners("onnxruntime", (proto, None), (proto, None), ["mul[0]", "relu*"], feeds)
        part = runners.compare_chunk(pair, feeds, ["mul[0]", "relu*"])
    assert {t: (e.n, e.max_abs, e.cosine) for t, e in part.items()} == {"mul[0]": (1, 0.0, pytest.approx(1.0)),
                                                                         "relu*": (1, 0.0, pytest.approx(1.0))}


def test_a_tensor_polygraphy_cannot_mark_is_a_mixprec_error():
    proto = _odd_model()
    feeds = [{"x": np.ones((1, 3), np.float32)}]
    with pytest.raises(MixprecError, match="the layer-wise comparison failed on ONNX Runtime"):
        with runners.polygraphy_quiet("onnxruntime"):
            pair = runners.chunk_runners("onnxruntime", (proto, None), (proto, None), ["no_such_tensor"], feeds)
            runners.compare_chunk(pair, feeds, ["no_such_tensor"])
    assert [o.name for o in proto.graph.output] == ["y"]


def test_the_ranking_imports_no_torch_and_leaves_polygraphys_config(ws, tiny_cnn_sample):
    """Polygraphy's OnnxrtRunner.infer and IterationResult ask whether outputs are torch tensors, which
    imports torch (~200 MiB resident); the ranking avoids both (its own process: the suite has torch)."""
    code = ("import sys\nfrom polygraphy import config\nfrom core.project import open_project\n"
            "from core.sensitivity import rank_layers\n"
            "r = rank_layers(open_project('sample:tiny-cnn'), max_samples=2, max_memory='400K')\n"
            "print(r.chunks, 'torch' in sys.modules, config.ARRAY_SWAP_THRESHOLD_MB)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MIXPREC_WORKSPACE": str(ws.root)})
    assert p.returncode == 0, p.stderr
    chunks, torch, swap = p.stdout.split()
    assert int(chunks) > 1 and torch == "False" and swap == "-1"


def test_runner_choice_and_the_stored_record(tiny_cnn):
    with pytest.raises(MixprecError, match="unknown ranking runner 'gpu'"):
        rank_layers(tiny_cnn, runner="gpu")
    usable, why = tensorrt_available()
    if not usable:
        assert runners.resolve_runner("auto") == "onnxruntime"
        with pytest.raises(MixprecError, match="cannot run on TensorRT here"):
            rank_layers(tiny_cnn, runner="tensorrt")
    r = rank_layers(tiny_cnn, max_samples=2, runner="onnxruntime")
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["runner"] == "onnxruntime" and Ranking.from_json(doc).runner == "onnxruntime"
    old = {k: v for k, v in doc.items() if k != "runner"}
    assert Ranking.from_json(old).runner == "onnxruntime"  # stored before the field: it ran on ONNX Runtime


def test_the_page_says_what_marking_outputs_does_on_tensorrt_and_where_it_ran(tmp_path, monkeypatch):
    from core.jobs import JobManager
    from core.workspace import Workspace
    from tests.fixtures.apptest import ok, page, wait_all

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path))
    at = ok(page("sensitivity"))
    captions = [c.value for c in at.caption]
    assert runners.RANKING_NOTE in captions and "marking outputs changes what TensorRT fuses" in runners.RANKING_NOTE
    at.button(key="run_rank").click().run()
    wait_all(Workspace(tmp_path))
    at.run()
    ok(at)
    where = runners.RUNNER_LABELS[runners.resolve_runner("auto")]
    assert any(c.value.startswith("Stored ranking of 8 layers, compared on " + where) for c in at.caption)
    assert len(JobManager.for_workspace(Workspace(tmp_path)).jobs()) == 1
