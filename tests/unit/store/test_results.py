"""core.store.results: rankings, sensitivity tables and searches are stored as typed JSON records under
keys of model, data and method; an older or damaged stored document is not used (None, so it is
computed again) and a note says why; uploads keep their file name."""
from __future__ import annotations

import pandas as pd
import pytest

from core.measure.metrics import Quality
from core.sensitivity import RANK_COLUMNS, SENSITIVITY_COLUMNS, Ranking, Sensitivity
from core.store.results import (load_ranking, load_sensitivity, project_ranking_key, ranking_path, save_ranking,
                                save_sensitivity, store_upload)
from core.workspace import Workspace, atomic_write_text, take_notes


@pytest.fixture
def store_ws(tmp_path):
    return Workspace(tmp_path)


def _ranking(method="minmax") -> Ranking:
    t = pd.DataFrame([(1, "/a/MatMul", "MatMul", "int8", True, 100, 0.9, 0.1, 0.05, 20.0, 0.3),
                      (2, "/b/Add", "Add", "fp32", False, 0, 0.99, 0.01, -0.01, float("inf"), 0.0)],
                     columns=RANK_COLUMNS)
    return Ranking(t, "cos_drop", 8, 1.5, True, method)


def test_ranking_is_stored_as_json_and_keeps_booleans(store_ws, tiny_cnn):
    assert load_ranking(store_ws, tiny_cnn) is None  # never computed
    path = save_ranking(store_ws, tiny_cnn, _ranking("entropy"))
    assert path == ranking_path(store_ws, project_ranking_key(tiny_cnn, "entropy")) and path.suffix == ".json"
    back = load_ranking(store_ws, tiny_cnn, "entropy")
    assert back.table["eligible"].dtype == bool and back.table["eligible"].tolist() == [True, False]
    assert back.table["eligible"].sum() == 1  # "False" is not a true string any more
    assert back.table["snr_db"].tolist()[1] == float("inf") and back.method == "entropy"
    assert load_ranking(store_ws, tiny_cnn, "minmax") is None


def test_a_ranking_on_the_tensorrt_engine_is_stored_beside_the_onnx_runtime_one(store_ws, tiny_cnn):
    from dataclasses import replace

    ort = save_ranking(store_ws, tiny_cnn, _ranking())
    trt = save_ranking(store_ws, tiny_cnn, replace(_ranking(), runner="tensorrt", samples=4))
    assert ort != trt and ort.is_file() and trt.is_file()  # neither replaces the other
    assert ort == ranking_path(store_ws, project_ranking_key(tiny_cnn, "minmax"))  # the key before runners existed
    assert load_ranking(store_ws, tiny_cnn, runner="tensorrt").samples == 4
    assert load_ranking(store_ws, tiny_cnn, runner="onnxruntime").samples == 8
    assert load_ranking(store_ws, tiny_cnn).runner == "onnxruntime"  # auto, where TensorRT does not run
    with pytest.raises(Exception, match="runner"):
        project_ranking_key(tiny_cnn, "minmax", runner="cuda")


def test_sensitivity_is_keyed_by_mode_and_method(store_ws, tiny_cnn):
    t = pd.DataFrame([(1, "/a/MatMul", "MatMul", 100, "leave-one-out", "minmax", 0.97, 0.02, 31.5)],
                     columns=SENSITIVITY_COLUMNS)
    q = Quality(0.99, 0.98, 40.0, 0.1, None, None, 8)
    save_sensitivity(store_ws, tiny_cnn, Sensitivity(t, "leave-one-out", "minmax", q, 2.0, False))
    back = load_sensitivity(store_ws, tiny_cnn, "minmax", "leave-one-out")
    assert back.table["rank"].tolist() == [1] and back.baseline == q
    assert load_sensitivity(store_ws, tiny_cnn, "minmax", "isolated") is None
    assert load_ranking(store_ws, tiny_cnn, "minmax") is None


def test_older_or_damaged_stored_documents_are_recomputed_with_a_note(store_ws, tiny_cnn):
    key = project_ranking_key(tiny_cnn, "minmax")
    path = ranking_path(store_ws, key)
    legacy = path.with_suffix(".csv")  # how mixprec stored rankings before the records
    atomic_write_text(legacy, _ranking().table.to_csv(index=False))
    take_notes()
    assert load_ranking(store_ws, tiny_cnn) is None
    assert any("CSV format of an older mixprec" in n and "compute it again" in n for n in take_notes())
    save_ranking(store_ws, tiny_cnn, _ranking())  # computing it again replaces the old file
    assert not legacy.exists() and load_ranking(store_ws, tiny_cnn) is not None
    # an older format is left alone (computing it again replaces it); corrupt documents are removed
    cases = [('{"kind": "ranking", "format_version": 0}', "older than this mixprec reads", True),
             ("{not json", "not valid JSON", False), ("[1, 2]", "a JSON list", False),
             ("[" * 100000 + "]" * 100000, "not valid JSON", False),
             (f'{{"kind": "ranking", "format_version": {Ranking.FORMAT_VERSION}}}', "damaged: KeyError", False)]
    for text, note, kept in cases:
        atomic_write_text(path, text)
        assert load_ranking(store_ws, tiny_cnn) is None, text[:40]
        notes = take_notes()
        assert any(note in n for n in notes), (text[:40], notes)
        assert path.exists() == kept, text[:40]
    save_ranking(store_ws, tiny_cnn, _ranking())
    assert load_ranking(store_ws, tiny_cnn) is not None and take_notes() == []


def test_store_upload_keeps_content_by_hash_and_the_file_name(store_ws, tiny_cnn):
    from core.model.load import load_model

    data = tiny_cnn.model.path.read_bytes()
    path = store_upload(store_ws, data, "tiny.onnx", "model")
    assert path.parent == store_ws.models / tiny_cnn.model.sha256 and path.name == "tiny.onnx"
    assert path.read_bytes() == data and store_upload(store_ws, data, "tiny.onnx", "model") == path
    again = store_upload(store_ws, data, "C:\\Users\\me\\my <i>net*.onnx", "model")  # another name, same content
    assert again.parent == path.parent and again.name == "my _i_net_.onnx" and again.read_bytes() == data
    loaded = load_model(path, store_ws)
    assert loaded.name == "tiny" and loaded.sha256 == tiny_cnn.model.sha256  # the file's name, not the sha256
    assert load_model(again, store_ws).name == "my _i_net_"
    assert store_upload(store_ws, data, "../../etc/passwd", "model").parent == path.parent


def _search(gpu_name: str, message: str, target_objective: str = "trt_estimate", budget: str = "cosine_mean>=0.99"):
    from core.search import SearchResult
    from core.search.budget import Budget
    from core.search.result import CANDIDATE_COLUMNS

    t = pd.DataFrame([(1, "/a/MatMul", "MatMul", 100, "isolated", "minmax", 0.97, 0.02, 31.5)],
                     columns=SENSITIVITY_COLUMNS)
    sens = Sensitivity(t, "isolated", "minmax", Quality(0.99, 0.98, 40.0, 0.1, None, None, 8), 2.0, False)
    cands = pd.DataFrame([(0, "minmax", 0, 1, 1.0, 2.0, 0.0, 0.0, 0, True, True, "", "", 1.8, 2.2)],
                         columns=CANDIDATE_COLUMNS)
    return lambda p: SearchResult(Budget.parse(budget), p.default_policy(), True, None, None, message,
                                  cands, sens, variants={"minmax": p.default_policy()}, objective=target_objective,
                                  latency_label=f"estimated TensorRT ms on the {gpu_name} (an estimate; basis: x)")


def test_searches_are_kept_per_gpu_and_an_old_key_is_read_for_its_own_gpu(store_ws, tiny_cnn):
    """Issue 19 §4: a TensorRT-estimate search is stored per GPU (a T4 one does not replace the A100 one
    of the same budget); a user's GPU is keyed by its figures too; a search stored under the key of
    before (no GPU) is still found for the GPU it estimated on, and only for it."""
    from core.estimate.gpus import GPU, GPUS
    from core.project import open_project
    from core.store.results import load_search, save_search, search_path, stored_search_path

    b = "cosine_mean>=0.99"
    t4, a100 = GPUS["t4"], GPUS["a100"]
    assert tiny_cnn.target == "tensorrt"
    p_t4 = save_search(store_ws, tiny_cnn, _search(t4.name, "on the T4")(tiny_cnn), False, t4)
    p_a100 = save_search(store_ws, tiny_cnn, _search(a100.name, "on the A100")(tiny_cnn), False, a100)
    assert p_t4 != p_a100 and p_t4.is_file() and p_a100.is_file()
    assert load_search(store_ws, tiny_cnn, b, False, t4).message == "on the T4"
    assert load_search(store_ws, tiny_cnn, b, False, a100).message == "on the A100"
    assert load_search(store_ws, tiny_cnn, b, False, "t4").message == "on the T4"  # a key resolves too
    assert load_search(store_ws, tiny_cnn, b, False, GPUS["l4"]) is None  # never run on the L4
    # without a GPU given, save_search keys by the GPU its label names
    assert save_search(store_ws, tiny_cnn, _search(t4.name, "again")(tiny_cnn), False) == p_t4
    # two user GPUs sharing a key but not their figures are two searches
    mine = GPU("my-gpu", "My GPU", "ampere", 80, 30.0, 60.0, 120.0, 120.0, 240.0, 700.0, 24)
    faster = GPU("my-gpu", "My GPU", "ampere", 80, 30.0, 60.0, 120.0, 120.0, 240.0, 900.0, 24)
    assert search_path(store_ws, tiny_cnn, b, False, mine) != search_path(store_ws, tiny_cnn, b, False, faster)
    save_search(store_ws, tiny_cnn, _search(mine.name, "mine")(tiny_cnn), False, mine)
    assert load_search(store_ws, tiny_cnn, b, False, mine).message == "mine"
    assert load_search(store_ws, tiny_cnn, b, False, faster) is None

    # a search stored before the GPU was in the key (the old path): found for its GPU, not for another
    from core.workspace import atomic_write_json
    ob = "cosine_min>=0.9"
    old = search_path(store_ws, tiny_cnn, ob, True)
    atomic_write_json(old, _search(GPUS["a10"].name, "old A10", budget=ob)(tiny_cnn).to_json())
    assert stored_search_path(store_ws, tiny_cnn, ob, True, GPUS["a10"]) == old
    assert load_search(store_ws, tiny_cnn, ob, True, GPUS["a10"]).message == "old A10"
    assert load_search(store_ws, tiny_cnn, ob, True, t4) is None  # the T4's: computed again
    save_search(store_ws, tiny_cnn, _search(t4.name, "new T4", budget=ob)(tiny_cnn), True, t4)
    assert load_search(store_ws, tiny_cnn, ob, True, t4).message == "new T4"
    assert load_search(store_ws, tiny_cnn, ob, True, GPUS["a10"]).message == "old A10"  # both kept
    # an old search that estimated on no GPU (not the TensorRT-estimate objective) serves any GPU
    atomic_write_json(old, _search("", "measured", "latency", budget=ob)(tiny_cnn).to_json())
    assert load_search(store_ws, tiny_cnn, ob, True, GPUS["l4"]).message == "measured"
    # an ONNX Runtime target keeps its key: the GPU is no part of it
    ort = open_project("sample:tiny-cnn", ws=tiny_cnn.ws, target="onnxruntime")
    assert search_path(store_ws, ort, b, False, t4) == search_path(store_ws, ort, b, False)
    save_search(store_ws, ort, _search("", "cpu", "latency")(ort), False, t4)
    assert load_search(store_ws, ort, b, False, a100).message == "cpu"
    # no GPU given: a search job's default GPU (the A100), as a job without one searches on
    assert load_search(store_ws, tiny_cnn, b, False).message == "on the A100"


def test_a_search_from_the_fp16_network_default_is_stored_apart_from_the_fp32_one(store_ws, tiny_cnn):
    """Issue 23 §7: the search's network default is part of its key: a stored FP32-default search is not the one
    of an FP16-default draft (and the reverse); the FP32 key is the one of searches stored before."""
    from core.estimate.gpus import GPUS
    from core.store.results import load_search, save_search, search_path

    b, a100 = "cosine_mean>=0.99", GPUS["a100"]
    fp32 = save_search(store_ws, tiny_cnn, _search(a100.name, "from fp32")(tiny_cnn), False, a100)
    assert fp32 == search_path(store_ws, tiny_cnn, b, False, a100)  # the key of before
    assert load_search(store_ws, tiny_cnn, b, False, a100, network_default="fp16") is None
    assert load_search(store_ws, tiny_cnn, b, False, a100, network_default="fp32").message == "from fp32"
    fp16_search = _search(a100.name, "from fp16")(tiny_cnn)
    fp16_search.policy = tiny_cnn.default_policy("fp16")
    fp16 = save_search(store_ws, tiny_cnn, fp16_search, False, a100)  # keyed by its policy's network default
    assert fp16 != fp32 and fp16 == search_path(store_ws, tiny_cnn, b, False, a100, network_default="fp16")
    assert load_search(store_ws, tiny_cnn, b, False, a100, network_default="fp16").message == "from fp16"
    assert load_search(store_ws, tiny_cnn, b, False, a100).message == "from fp32"


def test_a_search_on_other_metric_outputs_is_stored_apart_from_the_default_one(ws):
    """Issue 22 §3: what quality is measured on is part of a stored search's key (a search measured on a slice is
    another search than one on the whole first output); the default spec keeps the key searches always had."""
    from core.measure.evaluation import MetricOutput, MetricSpec
    from core.project import open_project
    from core.store.results import search_path, stored_search_path

    p = open_project("sample:tiny-cnn", ws=ws)
    plain = search_path(ws, p, "cosine_mean>=0.99", False, "a100")
    assert search_path(ws, p, "cosine_mean>=0.99", False, "a100", MetricSpec()) == plain
    assert search_path(ws, p, "cosine_mean>=0.99", False, "a100", MetricSpec().to_json()) == plain
    spec = MetricSpec((MetricOutput.parse("head=logits[...,0:5]"),))
    sliced = search_path(ws, p, "cosine_mean>=0.99", False, "a100", spec.to_json())
    assert sliced != plain and sliced == search_path(ws, p, "cosine_mean>=0.99", False, "a100", spec)
    assert search_path(ws, p, "cosine_mean>=0.99", False, "a100", MetricSpec(task="dense").to_json()) not in (plain, sliced)
    old = search_path(ws, p, "cosine_mean>=0.99", False)  # a search stored before the GPU was in the key
    old.write_text("{}")
    assert stored_search_path(ws, p, "cosine_mean>=0.99", False, "a100") == old  # the default falls back to it
    assert stored_search_path(ws, p, "cosine_mean>=0.99", False, "a100", spec.to_json()) == sliced  # never for a spec
