"""Issue 23 fault 2: two sessions (browser tabs, processes) writing one project's draft lose nothing — a write is a
compare-and-swap on the draft's version under its lock; a session's change made on an older version is applied to
the newer draft where it touches other layers or fields, and said (never dropped) where both changed the same one."""
from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from core.project import ProjectSource
from core.store.drafts import (Draft, SavedProject, commit_draft, draft_path, load_draft, load_project,
                               merge_save_project, new_project_id, save_draft, save_project, update_draft)
from core.workspace import Workspace

KEY = "0" * 32


def _doc(**layers):
    return {"format": "mixprec.policy", "version": 1, "model": {"name": "m", "sha256": "s"},
            "network_default": "fp32", "layers": layers, "calibration": {"method": "minmax"}}


def _set(d: Draft, name: str, prec: str) -> Draft:
    return d.edited({**d.policy, "layers": {**d.policy["layers"], name: prec}}, f"{name} → {prec}")


def _session(root: str, pid: str, names: list[str], barrier) -> None:
    """One session: an edit of each of ``names`` in turn, each made on the draft this session last read or wrote
    (as a tab does: it never reads the file between its own clicks unless its stamp changed)."""
    ws = Workspace(Path(root))
    barrier.wait()
    seen = load_draft(ws, pid, KEY)
    for name in names:
        w = commit_draft(ws, pid, KEY, seen, _set(seen, name, "fp16"), f"{name} → fp16")
        assert not w.conflicts, w.conflicts
        seen = w.draft


def test_two_processes_editing_one_draft_at_once_keep_every_edit(tmp_path):
    """Two processes each set their own 40 layers to FP16 on one draft at the same time: all 80 are in it, each one
    undoable step, and the version counts every write."""
    ws, pid = Workspace(tmp_path), new_project_id()
    names = [f"layer{i}" for i in range(80)]
    save_draft(ws, pid, KEY, Draft(_doc(**{n: "int8" for n in names})))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_session, args=(str(tmp_path), pid, names[i::2], barrier)) for i in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    d = load_draft(ws, pid, KEY)
    assert [n for n in names if d.policy["layers"][n] != "fp16"] == []
    assert len(d.undo) == 80 and d.version == 81
    assert not list(draft_path(ws, pid, KEY).parent.glob(".*.tmp"))


def test_an_edit_on_an_older_version_is_merged_and_undone_alone(tmp_path):
    ws, pid = Workspace(tmp_path), new_project_id()
    base = save_draft(ws, pid, KEY, Draft(_doc(a="int8", b="int8", c="int8")))
    other = commit_draft(ws, pid, KEY, base, _set(base, "a", "fp16"), "a → fp16").draft  # another tab
    other = commit_draft(ws, pid, KEY, other, other.edited({**other.policy, "network_default": "fp16"}, "fp16 default"),
                         "fp16 default").draft
    w = commit_draft(ws, pid, KEY, base, _set(base, "b", "fp32"), "b → fp32")  # this tab, on the version it saw
    assert w.merged == ("a", "the policy's network_default") and not w.conflicts
    stored = load_draft(ws, pid, KEY)
    assert stored == w.draft and stored.version == other.version + 1
    assert stored.policy["layers"] == {"a": "fp16", "b": "fp32", "c": "int8"} and stored.policy["network_default"] == "fp16"
    assert stored.undo_what == "b → fp32" and stored.undone().policy == other.policy  # its undo undoes it alone


def test_both_changing_one_layer_keep_the_stored_value_and_say_so(tmp_path):
    ws, pid = Workspace(tmp_path), new_project_id()
    base = save_draft(ws, pid, KEY, Draft(_doc(a="int8", b="int8")))
    commit_draft(ws, pid, KEY, base, _set(base, "a", "fp16"), "a → fp16")
    mine = _set(_set(base, "a", "fp32"), "b", "fp16")
    w = commit_draft(ws, pid, KEY, base, mine, "a → fp32, b → fp16")
    assert w.conflicts == ("a",) and w.merged == ()
    assert load_draft(ws, pid, KEY).policy["layers"] == {"a": "fp16", "b": "fp16"}  # b applied, a: the other's
    again = commit_draft(ws, pid, KEY, w.draft, _set(w.draft, "a", "fp32"), "a → fp32")  # made again: overwrites
    assert not again.conflicts and load_draft(ws, pid, KEY).policy["layers"]["a"] == "fp32"
    same = commit_draft(ws, pid, KEY, base, _set(base, "b", "fp16"), "b → fp16")  # the same value: no conflict
    assert not same.conflicts and same.draft == again.draft  # and nothing new to write


def test_undo_and_redo_step_the_stored_history_under_the_lock(tmp_path):
    ws, pid = Workspace(tmp_path), new_project_id()
    base = save_draft(ws, pid, KEY, Draft(_doc(a="int8")))
    first = commit_draft(ws, pid, KEY, base, _set(base, "a", "fp16"), "a → fp16").draft
    before, after, stamp = update_draft(ws, pid, KEY, lambda d: d.undone())
    assert before == first and after.policy == base.policy and after.version == first.version + 1 and stamp
    assert update_draft(ws, pid, KEY, lambda d: d.redone())[1].policy == first.policy
    nothing = Draft(_doc(a="int8"))  # none stored, nothing to undo: None, nothing is written
    before, after, _ = update_draft(ws, pid, "1" * 32, lambda d: None if (d or nothing).undone() is (d or nothing)
                                    else (d or nothing).undone())
    assert before is None and after is None and not draft_path(ws, pid, "1" * 32).exists()


def test_a_draft_of_an_older_format_has_version_0_and_a_damaged_one_is_replaced(tmp_path):
    ws, pid = Workspace(tmp_path), new_project_id()
    path = draft_path(ws, pid, KEY)
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "draft", "format_version": 1, "policy": {"layers": {"a": "int8"}}}')
    old = load_draft(ws, pid, KEY)
    assert old.version == 0
    w = commit_draft(ws, pid, KEY, old, _set(old, "a", "fp16"), "a")
    assert w.draft.version == 1 and load_draft(ws, pid, KEY).policy["layers"]["a"] == "fp16"
    path.write_text("{ damaged")
    fresh = Draft(_doc(a="int8"))
    assert commit_draft(ws, pid, KEY, fresh, _set(fresh, "a", "fp32"), "a").draft.version == 1


@pytest.mark.parametrize("bad", ['"1"', "-1", "true", "1.5"])
def test_a_draft_version_that_is_not_a_count_is_a_damaged_file(tmp_path, bad):
    from core.errors import MixprecError

    ws, pid = Workspace(tmp_path), new_project_id()
    path = draft_path(ws, pid, KEY)
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "draft", "format_version": 1, "version": %s, "policy": {}}' % bad)
    with pytest.raises(MixprecError, match="damaged"):
        load_draft(ws, pid, KEY)


def test_two_sessions_saving_one_project_keep_each_others_changes(tmp_path):
    """The project file is merged too: a tab that changed only a setting leaves the other tab's model (with its
    data and shapes), its settings and its per-model sources as that tab saved them."""
    ws, pid = Workspace(tmp_path), new_project_id()
    start = SavedProject(pid, ProjectSource("sample:tiny-cnn"), "tiny", {"run_label": "x"})
    save_project(ws, start)
    start = load_project(ws, pid)
    a = SavedProject(pid, ProjectSource("/m/b.onnx", "/d/c.npz", shapes={"x": [1, 4]}), "", {"run_label": "x"},
                     models={"sample:tiny-cnn": ProjectSource("sample:tiny-cnn").to_json()})
    merge_save_project(ws, start, a)  # tab A switched models
    b = SavedProject(pid, start.source, "tiny", {"run_label": "x", "search_budget": "cosine_mean>=0.9"})
    out = merge_save_project(ws, start, b)  # tab B, which saw the start, set a budget
    stored = load_project(ws, pid)
    assert stored == out and stored.source == a.source and stored.model_name == ""
    assert stored.settings == {"run_label": "x", "search_budget": "cosine_mean>=0.9"}
    assert set(stored.models) == {"sample:tiny-cnn"} and stored.created == start.created
