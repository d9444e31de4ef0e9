"""core/store/drafts.py: the saved project and the draft policy with undo/redo, in the workspace."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from core.errors import MixprecError
from core.project import ProjectSource
from core.quant.policy import policy_from_dict
from core.store.drafts import (MAX_UNDO, Draft, SavedProject, check_project_id, draft_key, draft_path, file_stamp,
                               load_draft, load_project, new_project_id, project_path, save_draft, save_project)
from core.workspace import Workspace


@pytest.fixture
def tmp_ws(tmp_path):
    return Workspace(tmp_path)


def test_project_ids_are_checked_before_they_become_paths(tmp_ws):
    pid = new_project_id()
    assert check_project_id(pid) == pid and pid != new_project_id()
    for bad in ("../../etc", "ABCDEFGH", "short", "a" * 33, "abc/defgh", None, 12345678, "abcdefgh\n"):
        assert check_project_id(bad) is None
        with pytest.raises(MixprecError, match="not a project id"):
            project_path(tmp_ws, bad)
    with pytest.raises(MixprecError, match="not a draft key"):
        draft_path(tmp_ws, pid, "../x")


def test_project_round_trip_and_missing(tmp_ws):
    pid = new_project_id()
    assert load_project(tmp_ws, pid) is None
    p = replace(SavedProject(pid, ProjectSource("sample:tiny-cnn")), source=ProjectSource(
        "/srv/m.onnx", "/d/c.npz", None, shapes={"images": (1, 3, 320, 320)}, target="onnxruntime"))
    p = SavedProject(**{**p.__dict__, "model_name": "m.onnx", "settings": {"run_label": "a*b", "smooth": True}})
    save_project(tmp_ws, p)
    back = load_project(tmp_ws, pid)
    assert back.source == ProjectSource("/srv/m.onnx", "/d/c.npz", None, shapes={"images": [1, 3, 320, 320]},
                                        target="onnxruntime")
    assert back.model_name == "m.onnx" and back.settings == {"run_label": "a*b", "smooth": True}
    assert back.created > 0 and back.updated >= back.created
    assert not list(project_path(tmp_ws, pid).parent.glob(".*.tmp"))  # atomic: no temp file left


@pytest.mark.parametrize("text", ["{not json", json.dumps({"kind": "project", "format_version": 1}),
                                  json.dumps({"kind": "run", "format_version": 1}),
                                  json.dumps({"kind": "project", "format_version": 1, "id": "../x", "model": "m"}),
                                  "\udcff"])
def test_a_damaged_project_is_a_clear_error(tmp_ws, text):
    pid = new_project_id()
    path = project_path(tmp_ws, pid)
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(MixprecError, match="saved project|stored project") as e:
        load_project(tmp_ws, pid)
    assert "Fix:" in str(e.value)


def _doc(**layers):
    return {"format": "mixprec.policy", "version": 1, "model": {"name": "m", "sha256": "s"},
            "network_default": "fp32", "layers": layers, "calibration": {"method": "minmax"}}


def test_undo_redo_walks_the_history_both_ways():
    d0 = Draft(_doc(a="int8", b="int8", c="fp16"))
    d1 = d0.edited(_doc(a="fp16", b="int8", c="fp16"), "a → FP16")
    d2 = d1.edited({**_doc(a="fp16", b="fp32", c="fp16"), "network_default": "fp16"}, "b → FP32")
    assert d2.undo_what == "b → FP32" and d2.redo_what is None and len(d2.undo) == 2
    assert d2.undo[-1].layers == {"b": "int8"}  # a step stores what changed, not the whole policy
    u1 = d2.undone()
    assert u1.policy == d1.policy and u1.redo_what == "b → FP32" and u1.undo_what == "a → FP16"
    u2 = u1.undone()
    assert u2.policy == d0.policy and u2.undone() == u2 and not u2.undo
    r1 = u2.redone()
    assert r1.policy == d1.policy
    r2 = r1.redone()
    assert r2.policy == d2.policy and r2.policy["network_default"] == "fp16" and r2.redone() == r2
    branch = r1.edited(_doc(a="fp16", b="int8", c="fp32"), "c → FP32")  # a new edit drops the redo stack
    assert not branch.redo and branch.undo_what == "c → FP32"
    assert branch.edited(dict(branch.policy), "no-op") is branch  # an edit that changes nothing is not recorded


def test_undo_restores_added_and_removed_layers():
    d = Draft(_doc(a="int8")).edited(_doc(a="int8", b="fp16"), "add b")
    assert d.undone().policy["layers"] == {"a": "int8"}
    assert d.undone().redone().policy["layers"] == {"a": "int8", "b": "fp16"}


def test_history_is_capped():
    d = Draft(_doc(a="fp32"))
    for i in range(MAX_UNDO + 5):
        d = d.edited(_doc(a=("fp16", "int8")[i % 2]), f"edit {i}")
    assert len(d.undo) == MAX_UNDO and d.undo[0].what == "edit 5"


def test_draft_saved_and_loaded_with_its_history(tmp_ws, tiny_cnn):
    pid, key = new_project_id(), draft_key(tiny_cnn.model.sha256, tiny_cnn.calib_data.sha256)
    assert load_draft(tmp_ws, pid, key) is None and file_stamp(draft_path(tmp_ws, pid, key)) is None
    base = tiny_cnn.default_policy()
    new = base.with_layers({"/conv2/Conv": "fp16"})
    d = Draft(base.to_dict()).edited(new.to_dict(), "conv2 → FP16")
    save_draft(tmp_ws, pid, key, d)
    stamp = file_stamp(draft_path(tmp_ws, pid, key))
    back = load_draft(tmp_ws, pid, key)
    assert back == d and policy_from_dict(back.policy, tiny_cnn.model, tiny_cnn.layers).sha256 == new.sha256
    assert policy_from_dict(back.undone().policy, tiny_cnn.model, tiny_cnn.layers).sha256 == base.sha256
    save_draft(tmp_ws, pid, key, back.undone())
    assert file_stamp(draft_path(tmp_ws, pid, key)) != stamp  # another session sees the change
    draft_path(tmp_ws, pid, key).write_text('{"kind": "draft", "format_version": 1, "policy": [], "undo": []}')
    with pytest.raises(MixprecError, match="damaged"):
        load_draft(tmp_ws, pid, key)
