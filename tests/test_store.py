"""core.store: rankings, sensitivity tables and searches are stored as typed JSON records under
keys of model, data and method; an older or damaged stored document is not used (None, so it is
computed again) and a note says why; uploads keep their file name."""
from __future__ import annotations

import pandas as pd
import pytest

from core.metrics import Quality
from core.sensitivity import RANK_COLUMNS, SENSITIVITY_COLUMNS, Ranking, Sensitivity
from core.store import (load_ranking, load_sensitivity, project_ranking_key, ranking_path, save_ranking,
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
    from core.model import load_model

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
