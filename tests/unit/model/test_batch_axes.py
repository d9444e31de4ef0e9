"""Issue 22 §1: batch and axes as the model has them. Each failing class is built in code (tests/fixtures/axes.py):
a batch-1-only Reshape export, a ``[frames, bins]`` input, an RNN whose width only its weights tell. Each inspects,
builds, ranks and searches, or ends in one clear error that names the input, its shape and the flag that fixes it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from core.errors import MixprecError
from core.measure.runs import build_and_measure
from core.model.load import load_model
from core.model.shapes import batch_axes, shape_choices, stacked_inputs, with_no_batch
from core.project import ProjectSource, open_project
from core.workspace import take_notes
from tests.fixtures.axes import BINS, RNN_WIDTH, SEQ, VOCAB, batch1_reshape, frames_bins, rnn_width
from tests.fixtures.cli import cli_in_process
from tests.fixtures.models import run_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("axes")
    return {"batch1": batch1_reshape(d / "tagger.onnx"), "frames": frames_bins(d / "audio.onnx"),
            "frames_unnamed": frames_bins(d / "audio_q.onnx", named=False),
            "frames_reshape": frames_bins(d / "audio_r.onnx", named=False, reshape=True),
            "rnn": rnn_width(d / "rnn.onnx")}


@pytest.fixture
def cli(ws, capfd, monkeypatch):
    def run(*args):
        return cli_in_process(capfd, monkeypatch, args, {"MIXPREC_WORKSPACE": str(ws.root)})
    return run


def _ok(p):
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    return json.loads(p.stdout)


def _one_clear_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- a dynamic batch that only runs at 1 ------------------------------------------------------------------
def test_the_fixture_declares_a_dynamic_batch_but_runs_at_one_only(models):
    ids, mask = np.zeros((1, SEQ), np.int64), np.ones((1, SEQ), bool)
    assert run_model(models["batch1"], [{"input_ids": ids, "attention_mask": mask}]).shape == (1, SEQ, 5)
    with pytest.raises(Exception, match="Reshape"):
        run_model(models["batch1"], [{"input_ids": np.zeros((4, SEQ), np.int64), "attention_mask": np.ones((4, SEQ), bool)}])


def test_a_batch_one_only_export_is_detected_evaluated_one_at_a_time_and_remembered(models, ws):
    p = open_project(str(models["batch1"]), ws=ws)
    assert batch_axes(p.model) == {"input_ids": 0, "attention_mask": 0} and p.eval_data.num_samples == 16
    take_notes()
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.samples == 16 and run.quality.cosine_mean > 0.99
    assert any("runs at batch 1 only" in n and "/Reshape" in n for n in take_notes())
    probes = list(ws.reference_dir("onnxruntime", p.model.sha256).glob("batch-probe-*.json"))
    assert len(probes) == 1 and json.loads(probes[0].read_text())["max_batch"] == 1
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.samples == 16  # the remembered probe: the same answer without trying batch 16 again


def test_a_batch_one_only_export_builds_ranks_and_searches_from_the_cli(cli, models, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", input_ids=rng.integers(0, VOCAB, (24, SEQ)), attention_mask=np.ones((24, SEQ), bool))
    m = str(models["batch1"])
    assert _ok(cli("build", m, "--data", tmp_path / "d.npz", "--iterations", "2", "--json"))["quality"]["samples"] == 6
    assert len(_ok(cli("rank", m, "--samples", "4", "--json"))["layers"]) > 0
    doc = _ok(cli("search", m, "--budget", "cosine_mean>=0.99", "--workers", "1", "--json"))
    assert doc["met_on_dev"] and doc["run"]["quality"]["samples"] == 8


def test_a_batch_above_one_on_a_batch_one_only_export_is_one_clear_error(cli, models):
    _one_clear_error(cli("build", str(models["batch1"]), "--batch", "2", "--iterations", "2"),
                     "runs at batch 1 only", "Reshape", "--batch 1")


# --- an input without a batch axis: [frames, bins] --------------------------------------------------------
def test_a_named_time_axis_is_not_a_batch_and_samples_are_stacked(models, ws):
    m = load_model(str(models["frames"]), ws)
    assert batch_axes(m) == {"input": None} and stacked_inputs(m) == {"input"}
    p = open_project(str(models["frames"]), ws=ws, shapes={"input": (200, BINS)})
    assert p.input_shapes == {"input": (200, BINS)} and p.batch == 1
    assert p.calib_data.arrays["input"].shape == (32, 200, BINS) and p.calib_data.num_samples == 32
    feeds = p.eval_data.batches(16)
    assert len(feeds) == 16 and all(f["input"].shape == (200, BINS) for f in feeds)


def test_an_unnamed_axis_the_model_unsqueezes_itself_is_not_a_batch(models, ws):
    assert batch_axes(load_model(str(models["frames_unnamed"]), ws)) == {"input": None}


def test_no_batch_marks_an_axis_mixprec_took_for_the_batch(models, ws, tmp_path):
    m = load_model(str(models["frames_reshape"]), ws)
    assert batch_axes(m) == {"input": 0}  # a Reshape hides it: only the user can say
    assert batch_axes(with_no_batch(m, ["input"])) == {"input": None}
    with pytest.raises(MixprecError, match="no input called") as e:
        with_no_batch(m, ["nope"])
    assert "input" in e.value.fix
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", input=rng.standard_normal((12, 200, BINS)).astype(np.float32))
    np.savez(tmp_path / "e.npz", input=rng.standard_normal((6, 200, BINS)).astype(np.float32))
    p = ProjectSource(str(models["frames_reshape"]), str(tmp_path / "c.npz"), str(tmp_path / "e.npz"),
                      no_batch=["input"]).open(ws)
    assert p.input_shapes == {"input": (200, BINS)} and p.eval_data.num_samples == 6
    assert [c.source for c in shape_choices(p.model, p.calib_data.arrays)] == ["data", "fixed"]
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.samples == 6
    ref = run_model(models["frames_reshape"], p.eval_data.batches(1))
    assert ref.shape == (6, 16)  # one whole [200, 105] sample per feed
    src = ProjectSource.from_json(json.loads(json.dumps(ProjectSource("m.onnx", no_batch=["b", "a"]).to_json())))
    assert src.no_batch == ("a", "b")


def test_stacked_data_of_the_wrong_rank_is_refused_with_the_layout_it_wants(models, ws, tmp_path):
    np.savez(tmp_path / "bad.npz", input=np.zeros((2, 3, 200, BINS), np.float32))
    with pytest.raises(MixprecError, match="samples along a new axis 0"):
        open_project(str(models["frames"]), data=tmp_path / "bad.npz", ws=ws)


def test_a_frames_bins_model_inspects_builds_ranks_and_searches_from_the_cli(cli, models, tmp_path):
    m = str(models["frames"])
    doc = _ok(cli("inspect", m, "--shape", "input=200x105", "--json"))["model"]
    assert doc["input_shapes"] == {"input": [200, BINS]} and doc["batch_axes"] == {"input": None}
    assert doc["no_batch"] == ["input"] and "no batch axis" in cli("inspect", m).stdout
    run = _ok(cli("build", m, "--shape", "input=200x105", "--iterations", "2", "--json"))
    assert run["quality"]["samples"] == 16
    assert len(_ok(cli("rank", m, "--shape", "input=200x105", "--samples", "4", "--json"))["layers"]) > 0
    doc = _ok(cli("search", m, "--shape", "input=200x105", "--budget", "cosine_mean>=0.99", "--workers", "1", "--json"))
    assert doc["met_on_dev"] and doc["run"]["quality"]["samples"] == 8
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", input=rng.standard_normal((16, 150, BINS)).astype(np.float32))
    run = _ok(cli("build", str(models["frames_reshape"]), "--no-batch", "input", "--data", tmp_path / "d.npz",
                  "--iterations", "2", "--json"))
    assert run["quality"]["samples"] == 4


# --- a width only the weights tell --------------------------------------------------------------------------
def test_an_unknown_width_is_read_from_the_rnn_weights(models, ws):
    p = open_project(str(models["rnn"]), ws=ws)
    width = next(c for c in p.shape_choices if c.axis == 2)
    assert width.value == RNN_WIDTH and width.source == "default" and "LSTM" in width.note and "[1, 96, 40]" in width.note
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, warmup=1, profile_iterations=1)
    assert run.quality.cosine_mean > 0.99


def test_the_rnn_inspects_builds_ranks_and_searches_from_the_cli(cli, models):
    m = str(models["rnn"])
    text = cli("inspect", m).stdout
    assert "LSTM" in text and f"x=64x1x{RNN_WIDTH}" in text
    _ok(cli("build", m, "--iterations", "2", "--json"))
    _ok(cli("rank", m, "--samples", "4", "--json"))
    assert _ok(cli("search", m, "--budget", "cosine_mean>=0.99", "--workers", "1", "--json"))["met_on_dev"]


def test_a_width_the_weights_contradict_is_one_clear_error_naming_the_input_and_the_fix(cli, models):
    _one_clear_error(cli("build", str(models["rnn"]), "--shape", "x=7x1x64", "--iterations", "2"),
                     "LSTM", "x 7x1x64", "--shape", "--no-batch")


def test_the_feed_error_names_every_flag_that_fixes_it():
    from core.model.data_errors import feed_error

    class Fake(Exception):
        __module__ = "onnxruntime.capi"

    e = feed_error(Fake("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running "
                        "Conv node. Name:'/c1/Conv' Status Message: Invalid input shape: {1,105}"),
                   {"input": np.zeros((1, BINS), np.float32)}, "calibrating")
    assert "Conv node /c1/Conv" in e.what and "input 1x105" in e.what and "Invalid input shape: {1,105}" in e.what
    assert all(flag in e.fix for flag in ("--dim", "--shape", "--no-batch"))


def test_a_tensorrt_profile_of_a_batch_one_only_export_stays_at_batch_one(models, ws):
    from dataclasses import replace

    from core.backends.tensorrt.profiles import dynamic_batch_axes, profile_shapes

    m = load_model(str(models["batch1"]), ws)
    assert dynamic_batch_axes(m) == {"input_ids": 0, "attention_mask": 0}
    one = replace(m, max_batch=1)
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    assert profile_shapes(shapes, None, dynamic_batch_axes(one))["input_ids"] == ((1, SEQ),) * 3
    assert profile_shapes(shapes, None, dynamic_batch_axes(m))["input_ids"][2] == (16, SEQ)
