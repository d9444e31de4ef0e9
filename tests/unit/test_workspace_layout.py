"""The workspace layout (issue 20 §3): one module, core/workspace.py, names every folder of the workspace;
no other file in core/, ui/ or views/ spells one. The paths are those of earlier versions (an existing
workspace keeps working). Every stored result is written once: the isolated sensitivity is stored in
rankings/ by the code that computes it, and the store, the job and the search read that one file; a
table an older version kept in the search's folder is still read."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest

import core.store.results as results
import core.workspace as layout
from core.project import open_project
from core.search import SearchConfig, search
from core.sensitivity import sensitivity, sensitivity_file
from core.store.results import load_sensitivity, project_ranking_key, ranking_path, save_sensitivity
from core.workspace import FOLDERS, Workspace, take_notes
from tests.fixtures import ROOT

CHECKED = [p for d in ("core", "ui", "views") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]
LAYOUT_MODULE = ROOT / "core" / "workspace.py"


def _leftmost(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        node = node.left
    return node


def _is_workspace_root(node: ast.AST) -> bool:
    """``….root``, ``default_root()``, ``root`` / ``ws_root``: the start of a path in the workspace."""
    node = _leftmost(node)
    if isinstance(node, ast.Attribute):
        return node.attr == "root"
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "default_root") or (
            isinstance(f, ast.Attribute) and f.attr == "default_root")
    return isinstance(node, ast.Name) and node.id in ("root", "ws_root")


def _is_workspace(node: ast.AST) -> bool:
    """``ws``, ``self.ws``, ``project.ws``…: an expression naming a Workspace."""
    return (isinstance(node, ast.Name) and node.id.endswith("ws")) or (
        isinstance(node, ast.Attribute) and node.attr.endswith("ws"))


def folder_spellings(source: str, filename: str = "<planted>") -> list[str]:
    """Where ``source`` chooses a workspace folder itself: ``ws.sub(...)`` (the layout's own helper), a
    folder name of the layout joined to the workspace root (``ws.root / "runs"``), or passed to
    ``joinpath`` / ``Workspace.folder``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if f.attr == "sub" and _is_workspace(f.value):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
            elif f.attr in ("joinpath", "folder") and set(literal) & set(FOLDERS):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value in FOLDERS and _is_workspace_root(node.left):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_the_layout_names_a_workspace_folder():
    found = [hit for p in CHECKED if p != LAYOUT_MODULE
             for hit in folder_spellings(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "folder names chosen outside core/workspace.py:\n" + "\n".join(found)


@pytest.mark.parametrize("planted", [
    'ws.sub("search", sha[:16])', 'project.ws.sub("reference", name)', 'self.ws.sub("engines", "tensorrt")',
    'ws.root / "gpus"', 'project.ws.root / "reference" / backend', 'default_root() / "runs"',
    'ws_root / "jobs"', 'ws.root.joinpath("rankings", key)',
    'ws.root / "projects" / project_id / "drafts"'])
def test_the_check_catches_a_planted_folder_name(planted):
    assert folder_spellings(planted)


def test_the_check_leaves_other_paths_alone():
    for fine in ('ROOT / "bench" / "data"', 're.sub(r"x", "", text)', '_MARKDOWN.sub(r"\\\\1", text)',
                 'ws.runs / run_id', 'model.weights.folder / "tmp"', 'ws.rankings / f"{key}.json"'):
        assert folder_spellings(fine) == [], fine


def test_every_folder_is_in_the_documented_layout():
    doc = layout.__doc__
    assert all(f"    {name}/" in doc for name in FOLDERS), [n for n in FOLDERS if f"    {name}/" not in doc]


def test_the_paths_are_those_of_earlier_versions(tmp_path):
    """An existing workspace keeps working: every path the layout names is where it was."""
    ws, sha = Workspace(tmp_path), "ab" * 32
    expected = {
        ws.models: "models", ws.upload_dir("model", sha): f"models/{sha}", ws.upload_dir("data", sha): f"data/{sha}",
        ws.samples: "samples", ws.external_dir(sha): f"external/{sha[:32]}", ws.file_hashes: "external/hashes",
        ws.calib: "calib", ws.reference_dir("onnxruntime", sha): f"reference/onnxruntime/{sha[:16]}",
        ws.engine_cache("tensorrt"): "engines/tensorrt", ws.runs: "runs", ws.run_dir("r1"): "runs/r1",
        ws.temp_run_dir("r1"): "runs/.tmp-r1", ws.ranking_file("k"): "rankings/k.json",
        ws.search_file("k"): "searches/k.json", ws.search_dir(sha): f"search/{sha[:16]}",
        ws.latency_dir(sha, "onnxruntime", "int8"): f"search/{sha[:16]}/latency/onnxruntime/int8",
        ws.legacy_sensitivity_file(sha, "isolated", "k"): f"search/{sha[:16]}/sensitivity-isolated-k.json",
        ws.jobs: "jobs", ws.gpu_specs(): "gpus", ws.gpu_calibration_file("t4", 3): "gpu_calibrations/t4.v3.json",
        ws.project_dir("p1"): "projects/p1", ws.drafts_dir("p1"): "projects/p1/drafts", ws.policies: "policies",
        ws.scratch: "scratch", ws.tmp: "tmp"}
    assert {str(p.relative_to(ws.root)): v for p, v in expected.items()} == {v: v for v in expected.values()}
    assert {Path(v).parts[0] for v in expected.values()} == set(FOLDERS)  # every folder, and only those
    fresh = Workspace(tmp_path / "fresh")  # a reader's path creates nothing
    fresh.project_dir("p2"), fresh.drafts_dir("p2"), fresh.gpu_specs(create=False)
    fresh.reference_dir("onnxruntime", sha, create=False), fresh.search_dir(sha, create=False)
    assert not fresh.root.exists()
    with pytest.raises(ValueError):
        ws.folder("elsewhere")


def test_the_results_store_no_longer_carries_the_runs():
    import core.store.runs as runs

    for name in ("run_dir", "list_runs", "load_run", "load_run_per_layer", "run_policy", "last_built_policy",
                 "RunResult"):
        assert not hasattr(results, name), name
        assert name == "RunResult" or hasattr(runs, name), name


# --- the isolated sensitivity: written once, read by the store, the job and the search ---------------
def _sensitivity_documents(ws: Workspace) -> list[Path]:
    out = []
    for p in ws.root.rglob("*.json"):
        try:
            if json.loads(p.read_text()).get("kind") == "sensitivity":
                out.append(p.relative_to(ws.root))
        except (ValueError, AttributeError):
            continue
    return out


def test_the_isolated_sensitivity_is_written_once_and_read_by_the_store_and_the_search(tiny_cnn_ws):
    from core.jobs import isolated_params
    from core.jobs.kinds import run_isolated

    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    first = sensitivity(p, "isolated", workers=1)
    path = sensitivity_file(p, "isolated")
    assert path == ranking_path(tiny_cnn_ws, project_ranking_key(p, "minmax", "isolated"))  # where the page looks
    assert _sensitivity_documents(tiny_cnn_ws) == [path.relative_to(tiny_cnn_ws.root)]
    listed = load_sensitivity(tiny_cnn_ws, p, "minmax", "isolated")
    assert listed.table["name"].tolist() == first.table["name"].tolist()
    stamp = path.stat().st_mtime_ns
    # the job measures nothing again and stores nothing again: it names the one file
    assert run_isolated(isolated_params("sample:tiny-cnn"), tiny_cnn_ws, lambda f, t: None) == str(path)
    assert path.stat().st_mtime_ns == stamp and _sensitivity_documents(tiny_cnn_ws) == [path.relative_to(tiny_cnn_ws.root)]
    result = search(p, SearchConfig(budget="cosine_mean>=0.99", methods=("minmax",), verify=False,
                                    objective="mac_share", workers=1))
    assert result.sensitivity.cache_hit and result.sensitivity.table["name"].tolist() == first.table["name"].tolist()
    assert path.stat().st_mtime_ns == stamp and _sensitivity_documents(tiny_cnn_ws) == [path.relative_to(tiny_cnn_ws.root)]
    # the stored search names that file (its rankings/ key) and holds no copy of the table
    stored = results.save_search(tiny_cnn_ws, p, result, False)
    doc = json.loads(stored.read_text())
    assert stored.parent.name == "searches" and doc["sensitivity_ref"] == path.stem
    assert "sensitivity" not in doc and "rows" not in json.dumps({k: v for k, v in doc.items() if k != "candidates"})
    assert _sensitivity_documents(tiny_cnn_ws) == [path.relative_to(tiny_cnn_ws.root)]
    take_notes()
    loaded = results.load_search(tiny_cnn_ws, p, str(result.budget), False)
    pd.testing.assert_frame_equal(loaded.sensitivity.table, listed.table)  # read from rankings/
    assert loaded.sensitivity.baseline == first.baseline and loaded.sensitivity_ref == path.stem
    assert take_notes() == []
    # the rankings/ document gone, then damaged: the search still loads, without its table, with a note
    for damage in (path.unlink, lambda: path.write_text("{not json")):
        damage()
        gone = results.load_search(tiny_cnn_ws, p, str(result.budget), False)
        assert gone is not None and gone.sensitivity is None and gone.message == result.message
        assert any("isolated sensitivity the stored search" in n and path.name in n for n in take_notes())
        assert stored.is_file()  # the search is kept


def test_an_older_workspace_copy_is_read_and_other_inputs_are_measured_again(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    first = sensitivity(p, "isolated", workers=1)
    path = sensitivity_file(p, "isolated")
    key = json.loads(path.read_text())["inputs"]
    legacy = tiny_cnn_ws.legacy_sensitivity_file(p.model.sha256, "isolated", key)  # where an older version kept it
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_text(json.dumps(first.to_json()))
    path.unlink()
    again = sensitivity(p, "isolated", workers=1)
    assert again.cache_hit and again.table["name"].tolist() == first.table["name"].tolist()
    assert path.is_file() and not legacy.exists()  # moved: one copy
    assert json.loads(path.read_text())["inputs"] == key
    # a table stored without its inputs (by hand, or by an older version's job) is shown, but measured again
    save_sensitivity(tiny_cnn_ws, p, first)
    assert "inputs" not in json.loads(path.read_text()) and load_sensitivity(tiny_cnn_ws, p) is not None
    measured = sensitivity(p, "isolated", workers=1)
    assert not measured.cache_hit and json.loads(path.read_text())["inputs"] == key
    # another dev set has a file of its own: the project's table is left as it is
    dev = p.eval_data.slice(0, 4)
    other = sensitivity(p, "isolated", data=dev, workers=1)
    assert not other.cache_hit and sensitivity_file(p, "isolated", data=dev) != path
    assert json.loads(path.read_text())["inputs"] == key and len(_sensitivity_documents(tiny_cnn_ws)) == 2


def test_a_corrupt_older_copy_is_measured_again_with_a_note(tiny_cnn_ws):
    p = open_project("sample:tiny-cnn", ws=tiny_cnn_ws)
    first = sensitivity(p, "isolated", workers=1)
    path = sensitivity_file(p, "isolated")
    key = json.loads(path.read_text())["inputs"]
    legacy = tiny_cnn_ws.legacy_sensitivity_file(p.model.sha256, "isolated", key)
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_text("{not json")
    path.unlink()
    take_notes()
    again = sensitivity(p, "isolated", workers=1)
    assert not again.cache_hit and again.table["name"].tolist() == first.table["name"].tolist()
    assert any("isolated sensitivity" in n for n in take_notes()) and not legacy.exists() and path.is_file()


def test_default_root_follows_the_setting_and_the_working_folder(tmp_path, monkeypatch):
    """The resolved root is remembered (issue 23 fault 10: every page run asks), keyed by the setting and, for a
    relative one, the working folder: changing either gives the new folder, created by Workspace.default."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "one")
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "link" / "ws"))
    assert layout.default_root() == (tmp_path / "one" / "ws").resolve()
    assert Workspace.default().root == (tmp_path / "one" / "ws").resolve() and (tmp_path / "one" / "ws").is_dir()
    monkeypatch.setenv("MIXPREC_WORKSPACE", "rel-ws")
    monkeypatch.chdir(tmp_path / "one")
    assert Workspace.default().root == (tmp_path / "one" / "rel-ws").resolve()
    monkeypatch.chdir(tmp_path / "two")
    assert Workspace.default().root == (tmp_path / "two" / "rel-ws").resolve() and (tmp_path / "two" / "rel-ws").is_dir()
    monkeypatch.delenv("MIXPREC_WORKSPACE")
    assert layout.default_root() == (ROOT / "workspace").resolve()
