"""core.project.ProjectSource: the one record of where a project comes from (model, data, evaluation
data, shapes, dims, batch, target), round-tripped through job params, saved projects and the CLI."""
from __future__ import annotations

import dataclasses
import json

import pytest

from core.cli.commands import build_parser
from core.cli.source import source_from_args
from core.errors import MixprecError
from core.jobs.params import (BuildParams, IsolatedParams, RankParams, SearchParams, build_params, isolated_params,
                              rank_params, search_params)
from core.project import DEFAULT_TARGET, ProjectSource, open_project
from core.store.drafts import SavedProject, load_project, new_project_id, project_path, save_project
from core.workspace import Workspace

FULL = ProjectSource("/srv/m.onnx", "/d/calib.npz", "/d/eval.npz", shapes={"images": [1, 3, 320, 320]},
                     dims={"seq": 128}, batch=2, target="onnxruntime", branches={"use_cache_branch": False})


def _through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_a_source_is_frozen_normalised_and_hashable():
    assert FULL.shapes == {"images": (1, 3, 320, 320)} and FULL.dims == {"seq": 128}
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL.model = "other.onnx"
    same = ProjectSource("/srv/m.onnx", "/d/calib.npz", "/d/eval.npz", shapes={"images": (1, 3, 320, 320)},
                         dims={"seq": "128"}, batch="2", target="onnxruntime", branches={"use_cache_branch": 0})
    assert same == FULL and hash(same) == hash(FULL) and len({same, FULL}) == 1
    assert ProjectSource("m", shapes={}, dims={}) == ProjectSource("m")  # empty shapes/dims: none given
    assert ProjectSource("m").deploy_target == DEFAULT_TARGET and FULL.deploy_target == "onnxruntime"
    assert ProjectSource.from_json(_through_json(FULL.to_json())) == FULL
    for bad in ({"model": 3}, {"data": "x"}, {"model": "m", "shapes": [1, 2]}, {"model": "m", "data": 1}):
        with pytest.raises(TypeError):
            ProjectSource.from_json(bad)


@pytest.mark.parametrize("params, cls", [
    (lambda s: build_params(s, "{}", backend="onnxruntime", label="x"), BuildParams),
    (lambda s: rank_params(s, "entropy", max_samples=8, max_memory="2G"), RankParams),
    (lambda s: isolated_params(s, mode="leave-one-out", ray="h:6379"), IsolatedParams),
    (lambda s: search_params(s, "snr_db>=30", smooth=True, gpu="t4"), SearchParams),
])
def test_the_source_round_trips_through_every_job_kind(params, cls):
    doc = _through_json(params(FULL))
    assert cls.from_params(doc).source == FULL
    # flat, as jobs always carried it: a job record written before ProjectSource reads the same
    assert {k: doc[k] for k in FULL.to_json()} == FULL.to_json() | {"shapes": {"images": [1, 3, 320, 320]}}
    # a str is the model alone; a source without a target runs on the default one (the job names it)
    assert cls.from_params(params("m.onnx")).source == ProjectSource("m.onnx", target=DEFAULT_TARGET)
    assert params(ProjectSource("m.onnx"))["target"] == DEFAULT_TARGET


def test_a_job_record_of_the_old_flat_form_reads():
    old = {"model": "sample:tiny-cnn", "data": None, "eval_data": None, "shapes": {"image": [4, 3, 32, 32]},
           "dims": None, "batch": 1, "target": "onnxruntime", "policy": "{}", "backend": "auto", "label": ""}
    p = BuildParams.from_params(old)
    assert p.source == ProjectSource("sample:tiny-cnn", shapes={"image": (4, 3, 32, 32)}, target="onnxruntime")
    assert p.to_params() == old | {"branches": None, "no_batch": None, "profiles": None, "metrics": None}  # added since: null
    assert RankParams.from_params({"model": "m"}).source == ProjectSource("m", target=DEFAULT_TARGET)


def test_the_source_round_trips_through_a_saved_project(tmp_path):
    ws, pid = Workspace(tmp_path), new_project_id()
    save_project(ws, SavedProject(pid, FULL, "m.onnx", {"run_label": "a"}))
    back = load_project(ws, pid)
    assert back.source == FULL and back.model_name == "m.onnx" and back.settings == {"run_label": "a"}
    doc = json.loads(project_path(ws, pid).read_text())  # the source's fields flat, as in a job's params
    assert doc["format_version"] == 2 and {k: doc[k] for k in FULL.to_json()} == _through_json(FULL.to_json())


def test_a_saved_project_of_format_1_still_opens(tmp_path):
    """Format 1 had no dims or batch (empty or non-text paths read as none, as they always did)."""
    ws, pid = Workspace(tmp_path), new_project_id()
    path = project_path(ws, pid)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind": "project", "format_version": 1, "id": pid, "model": "/srv/m.onnx",
                                "data": "/d/calib.npz", "eval_data": "", "shapes": {"images": [1, 3, 320, 320]},
                                "target": "onnxruntime", "model_name": "m", "settings": {"search_smooth": True},
                                "created": 1.0, "updated": 2.0}))
    back = load_project(ws, pid)
    assert back.source == ProjectSource("/srv/m.onnx", "/d/calib.npz", None, shapes={"images": (1, 3, 320, 320)},
                                        target="onnxruntime")
    assert (back.model_name, back.settings, back.created, back.updated) == ("m", {"search_smooth": True}, 1.0, 2.0)
    save_project(ws, back)  # written again in the current format, same source
    assert json.loads(path.read_text())["format_version"] == 2 and load_project(ws, pid).source == back.source
    path.write_text(json.dumps({"kind": "project", "format_version": 1, "id": pid, "model": 3}))
    with pytest.raises(MixprecError, match="saved project .* is damaged"):
        load_project(ws, pid)


def test_the_cli_builds_the_source_from_its_args(tmp_path):
    args = build_parser().parse_args(["rank", "/srv/m.onnx", "--data", "/d/calib.npz", "--eval", "/d/eval.npz",
                                      "--shape", "images=1x3x320x320", "--dim", "seq=128", "--batch", "2",
                                      "--target", "onnxruntime", "--branch", "use_cache_branch=false"])
    src = source_from_args(args)
    assert src == FULL
    assert RankParams.from_params(_through_json(rank_params(src))).source == src  # CLI -> job -> back
    ws, pid = Workspace(tmp_path), new_project_id()
    save_project(ws, SavedProject(pid, src))
    assert load_project(ws, pid).source == src  # CLI -> saved project -> back
    plain = source_from_args(build_parser().parse_args(["export", "sample:tiny-cnn", "--format", "json", "--out", "x"]))
    assert plain == ProjectSource("sample:tiny-cnn", target=DEFAULT_TARGET)  # export has no --target (deploy)
    with pytest.raises(MixprecError, match="bad --branch"):
        source_from_args(build_parser().parse_args(["inspect", "m.onnx", "--branch", "use_cache_branch"]))
    with pytest.raises(MixprecError, match="bad --dim"):
        source_from_args(build_parser().parse_args(["inspect", "m.onnx", "--dim", "seq"]))


def test_open_is_open_project(ws, tiny_cnn_sample):
    src = ProjectSource("sample:tiny-cnn", shapes={"image": (4, 3, 32, 32)}, target="onnxruntime")
    p = src.open(ws)
    q = open_project("sample:tiny-cnn", ws=ws, shapes={"image": (4, 3, 32, 32)}, target="onnxruntime")
    assert p.input_shapes == q.input_shapes == {"image": (4, 3, 32, 32)} and p.target == q.target == "onnxruntime"
    assert (p.model.sha256, p.calib_data.sha256, p.eval_data.sha256) == \
        (q.model.sha256, q.calib_data.sha256, q.eval_data.sha256)
    assert ProjectSource("sample:tiny-cnn").open(ws).target == DEFAULT_TARGET
