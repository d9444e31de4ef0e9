"""Quality per output, per slice, per task, and by a user metric (issue 22 §3)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from core.errors import MixprecError
from core.measure.evaluation import (MetricOutput, MetricSpec, box_iou_matrix, dense_metrics, detect_task, evaluate,
                                     headline_text, matched_iou)
from core.measure.metrics import Quality
from core.measure.runs import RunResult, build_and_measure
from core.project import open_project
from core.search import Budget
from core.workspace import Workspace
from tests.fixtures.cli import cli_in_process
from tests.fixtures.detector import write_detector

SCORES = "scores=output[...,4:]"


@pytest.fixture(scope="module")
def det_files(tmp_path_factory):
    return write_detector(tmp_path_factory.mktemp("detector"))


@pytest.fixture(scope="module")
def det_ws(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("det-ws"))


@pytest.fixture(scope="module")
def detector(det_files, det_ws):
    m, c, e = det_files
    return open_project(str(m), str(c), str(e), ws=det_ws)


# --- parsing --------------------------------------------------------------------------------------
def test_metric_output_and_budget_syntax():
    assert MetricOutput.parse(SCORES) == MetricOutput("scores", "output", 4, None)
    assert MetricOutput.parse("logits") == MetricOutput("logits", "logits", None, None)
    assert MetricOutput.parse("boxes=output[..., :4]") == MetricOutput("boxes", "output", None, 4)
    assert MetricOutput.parse("output[...,4:10]").name == "output[...,4:10]"
    with pytest.raises(MixprecError, match="metric output"):
        MetricOutput.parse("=x")
    b = Budget.parse("scores:cosine_mean>=0.99")
    assert (b.output, b.metric, b.op, b.value) == ("scores", "cosine_mean", ">=", 0.99)
    assert str(b) == "scores:cosine_mean>=0.99" and Budget.parse(str(b)) == b
    assert Budget.parse("user>=0.98") == Budget("user", ">=", 0.98)
    for bad in ("scores:cosine>=0.9", "scores:kl_div>=1", "x:user>=0.9"):
        with pytest.raises(MixprecError, match="budget"):
            Budget.parse(bad)
    spec = MetricSpec((SCORES, "output"), "detection", 0.3, "xyxy", 5)
    assert MetricSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert MetricSpec().is_default and MetricSpec().key == "" and spec.key
    with pytest.raises(MixprecError, match="given twice"):
        MetricSpec(("a=output[...,4:]", "a=output[...,:4]"))


# --- task metrics by hand -------------------------------------------------------------------------
def test_dense_iou_by_hand_and_near_empty_maps_are_not_scored_by_cosine():
    ref = np.zeros((3, 1, 8, 8), np.float32)
    ref[0, 0, :4, :4] = 0.9            # 16 pixels on
    ref[1, 0, 0, 0] = 0.01             # near-empty: nothing above the threshold
    ref[2, 0, :, :2] = 0.8             # 16 pixels on
    cand = ref.copy()
    cand[0, 0, :4, 4:6] = 0.9          # 8 more on: IoU 16/24
    cand[1, 0, 0, 0] = 0.0             # cosine 0 with the near-empty FP32 map, both masks empty: IoU 1
    cand[2, 0, :, 1] = 0.2             # 8 of 16 off: IoU 8/16
    d = dense_metrics([ref], [cand], 0.5)
    assert d["mask_iou"] == pytest.approx((16 / 24 + 1 + 0.5) / 3) and d["mask_iou_min"] == pytest.approx(0.5)
    assert d["empty_maps"] == 1
    # cosine over the two maps that are not near-empty only (the empty one would read 0)
    cos0 = 16 * 0.81 / (np.sqrt(16 * 0.81) * np.sqrt(24 * 0.81))
    cos2 = (8 * 0.64 + 8 * 0.16) / (np.sqrt(16 * 0.64) * np.sqrt(8 * 0.64 + 8 * 0.04))
    assert d["map_cosine_mean"] == pytest.approx((cos0 + cos2) / 2)
    assert dense_metrics([ref], [cand], 0.1)["mask_iou"] != d["mask_iou"]  # the threshold is used
    assert detect_task(ref, "maps") == "dense"
    q = evaluate(None, {"maps": [ref]}, {"maps": [cand]})
    assert q.task == "dense" and q.mask_iou == pytest.approx(d["mask_iou"]) and q.top1_agreement is None
    assert q.cosine_mean == pytest.approx((cos0 + 0.0 + cos2) / 3)  # the plain cosine still counts every sample
    assert headline_text(q).startswith(f"mask IoU {d['mask_iou']:.4f}")


def test_box_iou_and_matching_by_hand():
    a = np.array([[0, 0, 10, 10]], float)
    assert box_iou_matrix(a, np.array([[5, 0, 15, 10]], float))[0, 0] == pytest.approx(50 / 150)
    # matched one to one: both reference boxes cannot take the same candidate box
    ref = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
    assert matched_iou(ref, np.array([[0, 0, 10, 10], [100, 100, 110, 110]], float)) == pytest.approx(0.5)


def test_detection_metrics_and_no_top1_for_a_detection_head():
    rng = np.random.default_rng(0)
    n, boxes = 4, 64
    grid = np.stack([np.arange(boxes) % 8 * 100 + 50, np.arange(boxes) // 8 * 100 + 50], -1)  # 100 px apart
    ref = np.concatenate([np.broadcast_to(grid, (n, boxes, 2)), np.full((n, boxes, 2), 40.0),
                          rng.uniform(0, 1, (n, boxes, 3))], -1).astype(np.float32)
    assert detect_task(ref, "output") == "detection"
    same = evaluate(MetricSpec(task="detection", top_k=5), {"output": [ref]}, {"output": [ref.copy()]})
    assert (same.score_topk, same.box_iou, same.score_cosine) == (1.0, 1.0, pytest.approx(1.0))
    shifted = ref.copy()
    shifted[..., 0] += 20.0  # every box moves half its width: IoU 20*40 / (60*40) = 1/3
    q = evaluate(MetricSpec(task="detection", top_k=5), {"output": [ref]}, {"output": [shifted]})
    assert q.score_topk == 1.0 and q.box_iou == pytest.approx(1 / 3) and q.top1_agreement is None
    assert q.kl_div is None and q.task == "detection"
    xyxy = evaluate(MetricSpec(task="detection", top_k=5, box_format="xyxy"), {"output": [ref]}, {"output": [shifted]})
    assert xyxy.box_iou != pytest.approx(1 / 3)  # the box format is read


# --- the detector: the slice shows what the whole output hides -------------------------------------
def test_per_slice_metric_shows_the_score_loss_the_whole_output_cosine_hides(detector):
    spec = MetricSpec((SCORES, "output"))
    r = build_and_measure(detector, detector.default_policy(), iterations=3, profile_iterations=1, metrics=spec,
                          warn_below=0.99)
    whole, scores = r.quality.outputs["output"], r.quality.outputs["scores"]
    assert whole.cosine_mean > 0.9999  # the box channels (up to 331 px) dominate the whole output
    assert scores.cosine_mean < 0.98 and r.quality.cosine_mean == scores.cosine_mean  # the first is the headline
    assert r.quality.output == "scores" and scores.task == whole.task == "detection"
    assert scores.score_topk < 0.3 and scores.top1_agreement is None and whole.top1_agreement is None
    assert Budget.parse("scores:cosine_mean>=0.99").value_of(r.quality) == scores.cosine_mean
    assert not Budget.parse("scores:cosine_mean>=0.99").met(r.quality)
    assert Budget.parse("output:cosine_mean>=0.99").met(r.quality)
    assert r.warnings and r.warnings[0].startswith("cosine_mean of scores (the --warn-below metric)")
    back = RunResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back.quality == r.quality and back.quality.outputs["scores"].score_topk == scores.score_topk
    # the score conv in FP16: the scores agree again (the metrics can pass)
    cls = {n: "fp16" for n in detector.default_policy().layers if n == "/cls/Conv"}
    ok = build_and_measure(detector, detector.default_policy().with_layers(cls), iterations=3, profile_iterations=1,
                           metrics=spec)
    assert ok.quality.outputs["scores"].cosine_mean > 0.999 and ok.quality.outputs["scores"].score_topk >= 0.9
    assert ok.quality.outputs["scores"].box_iou > 0.9


def test_classification_top1_is_in_the_headline(tiny_cnn, ws, capfd, monkeypatch):
    p = cli_in_process(capfd, monkeypatch, ["build", "sample:tiny-cnn", "--iterations", "3"],
                       {"MIXPREC_WORKSPACE": str(ws.root)})
    assert p.returncode == 0, p.stderr
    line = next(l for l in p.stdout.splitlines() if l.startswith("quality headline:"))
    assert line.startswith("quality headline: top-1 agreement ")
    top1 = float(line.split("top-1 agreement ")[1].split()[0])
    assert 0.5 <= top1 <= 1.0


def test_old_result_json_still_loads():
    old = {"cosine_mean": 0.99, "cosine_min": 0.9, "snr_db": "inf", "max_abs": 0.1, "top1_agreement": 0.95,
           "knn5_overlap": None, "samples": 8}  # a Quality document of before issue 22 §3
    q = Quality.from_dict(old)
    assert q.snr_db == float("inf") and q.outputs is None and q.task is None and q.user is None
    assert Quality.from_dict(q.to_dict()) == q
    nested = replace(q, output="scores", outputs={"scores": replace(q, task="detection", score_topk=0.5)})
    assert Quality.from_dict(json.loads(json.dumps(nested.to_dict()))) == nested


# --- the user's metric ----------------------------------------------------------------------------
USER_METRIC = '''import numpy as np


def score(reference, candidate, inputs):
    assert inputs["images"].shape[1:] == (3, 16, 16)  # every input, the whole set
    assert reference["output"].shape == candidate["output"].shape == (len(inputs["images"]), 256, 10)
    # the share of boxes whose best class is FP32's
    return float(np.mean(reference["output"][..., 4:].argmax(-1) == candidate["output"][..., 4:].argmax(-1)))
'''


def _cli(capfd, monkeypatch, ws, *args):
    return cli_in_process(capfd, monkeypatch, list(map(str, args)), {"MIXPREC_WORKSPACE": str(ws.root)})


def test_a_user_metric_drives_a_search_to_its_budget(det_files, det_ws, tmp_path, capfd, monkeypatch):
    m, c, e = det_files
    f = tmp_path / "metric.py"
    f.write_text(USER_METRIC)
    p = _cli(capfd, monkeypatch, det_ws, "search", m, "--data", c, "--eval", e, "--metric-file", f,
             "--budget", "user>=0.95", "--workers", "1", "--backend", "onnxruntime", "--target", "onnxruntime",
             "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["met_on_dev"] and doc["met_on_holdout"], doc["message"]
    assert doc["holdout"]["user"] >= 0.95
    policy = json.loads(open(doc["policy_path"]).read())
    assert policy["layers"]["/cls/Conv"] != "int8"  # the layer that loses the classes is kept out of INT8
    # the same budget on the default policy (everything INT8) fails: the search had to work for it
    b = _cli(capfd, monkeypatch, det_ws, "build", m, "--data", c, "--eval", e, "--metric-file", f,
             "--iterations", "3", "--json")
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["quality"]["user"] < 0.95


@pytest.mark.parametrize("body, what", [
    ("def score(reference, candidate, inputs):\n    return 1 +\n", "SyntaxError"),
    ("def helper(x):\n    return x[0] / 0\n\n\ndef score(reference, candidate, inputs):\n    return helper([1])\n",
     "ZeroDivisionError"),
    ("def score(reference, candidate, inputs):\n    return 'good'\n", "not a number"),
    ("def score(reference, candidate, inputs):\n    return float('nan')\n", "returned nan"),
])
def test_user_metric_errors_show_the_users_traceback(det_files, det_ws, tmp_path, capfd, monkeypatch, body, what):
    m, c, e = det_files
    f = tmp_path / "bad_metric.py"
    f.write_text(body)
    p = _cli(capfd, monkeypatch, det_ws, "build", m, "--data", c, "--eval", e, "--metric-file", f, "--iterations", "3")
    assert p.returncode == 2
    (err,) = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
    assert what in err and str(f) in err and "Traceback (most recent call last)" not in p.stderr.split("error: ")[0]
    if what in ("SyntaxError", "ZeroDivisionError"):
        assert f"user code {f}: Traceback" in err and "line 2" in err
        assert "core/" not in err.replace(str(f), "")  # none of mixprec's frames
    if what == "ZeroDivisionError":
        assert "in helper" in err and "return x[0] / 0" in err and "in score" in err


def test_a_user_metric_error_in_a_trial_worker_shows_the_users_traceback(det_files, det_ws, tmp_path, capfd,
                                                                         monkeypatch):
    m, c, e = det_files
    f = tmp_path / "trial_metric.py"
    f.write_text("import numpy as np\n\n\ndef score(reference, candidate, inputs):\n"
                 "    if not np.array_equal(reference['output'], candidate['output']):\n"
                 "        raise ValueError('candidates differ')\n    return 1.0\n")
    p = _cli(capfd, monkeypatch, det_ws, "sensitivity", m, "--data", c, "--eval", e, "--metric-file", f,
             "--workers", "1")
    assert p.returncode == 2
    (err,) = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
    assert "ValueError: candidates differ" in err and f"user code {f}: Traceback" in err and "line 6, in score" in err
