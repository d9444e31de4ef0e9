"""Build + measure: every reported field, run storage, and the MiniLM FFN-down finding."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.backends import Latency
from core.backends.base import PER_LAYER_COLUMNS
from core.backends.reports import ReformatSummary
from core.errors import MixprecError
from core.measure.metrics import Quality
from core.measure.runs import GENERATED_NOTE, ORT_CPU_SOURCE, RUN_COLUMNS, RunResult, build_and_measure, latency_caveat, \
    latency_source, quality_warnings, speedup_text
from core.sensitivity import RANK_COLUMNS, Ranking
from core.store.runs import list_runs, load_run, load_run_per_layer
from core.workspace import Workspace, atomic_write_json, atomic_write_text

FFN_DOWN = [f"/encoder/layer.{i}/output/dense/MatMul" for i in range(6)]
FFN_UP = [f"/encoder/layer.{i}/intermediate/dense/MatMul" for i in range(6)]


def test_build_reports_every_field(tiny_transformer):
    pol = tiny_transformer.default_policy()
    r = build_and_measure(tiny_transformer, pol, backend="onnxruntime", iterations=20, profile_iterations=5)
    doc = r.to_json()
    assert doc["latency_ms"]["median"] > 0 and doc["latency_ms"]["p95"] >= doc["latency_ms"]["median"]
    assert doc["speedup"] > 0 and doc["latency_ms"]["iterations"] == 20
    assert doc["reformat"]["count"] > 0 and 0 < doc["reformat"]["pct"] < 100 and doc["reformat"]["ms"] > 0
    q = doc["quality"]
    assert 0.9 < q["cosine_mean"] <= 1.0 and q["cosine_min"] <= q["cosine_mean"] and q["snr_db"] > 10
    assert doc["precision_counts"] == pol.precision_counts() and doc["int8_mac_fraction"] == pytest.approx(1.0)
    rows = doc["per_layer"]
    assert {"name", "op_type", "precision", "ms"} <= set(rows[0])
    assert any(r_["precision"] == "int8" for r_ in rows) and any(r_["is_reformat"] for r_ in rows)
    run_dir = r.run_dir
    for f in ("policy.json", "metrics.json", "per_layer.csv", "compiled.onnx", "compiled.ort-optimized.onnx",
              "ort-profile.json"):
        assert (run_dir / f).is_file(), f
    assert json.loads((run_dir / "metrics.json").read_text())["run_id"] == r.run_id
    assert len(load_run_per_layer(run_dir)) == len(r.per_layer)
    runs = list_runs(tiny_transformer.ws, tiny_transformer.model.sha256)
    assert r.run_id in set(runs.run_id)
    assert runs.set_index("run_id").loc[r.run_id].to_dict() == {k: v for k, v in r.row().items() if k != "run_id"}
    back = load_run(tiny_transformer.ws, r.run_id)
    assert back.to_json() == json.loads(json.dumps(doc))
    assert not list(tiny_transformer.ws.runs.glob(".tmp-*"))


def test_fp32_policy_is_lossless(tiny_cnn):
    from core.quant.policy import uniform_policy

    r = build_and_measure(tiny_cnn, uniform_policy(tiny_cnn.model, tiny_cnn.layers, "fp32"), iterations=10,
                          profile_iterations=2)
    assert r.quality.cosine_min == pytest.approx(1.0, abs=1e-9) and r.quality.top1_agreement == 1.0
    assert r.reformat.count == 0 and r.int8_mac_fraction == 0.0


def test_minilm_ffn_down_projections_are_the_sensitive_six(minilm):
    """Keeping the six FFN down-projections in FP16 recovers more quality than keeping any
    other six-MatMul group (here the FFN up-projections, measured: +0.012 vs +0.005)."""
    base = minilm.default_policy()
    kw = dict(iterations=10, profile_iterations=2)
    default = build_and_measure(minilm, base, **kw).quality
    down = build_and_measure(minilm, base.with_layers({n: "fp16" for n in FFN_DOWN}), **kw).quality
    up = build_and_measure(minilm, base.with_layers({n: "fp16" for n in FFN_UP}), **kw).quality
    assert down.cosine_mean >= 0.99
    assert down.cosine_mean - default.cosine_mean >= 0.008
    assert down.cosine_mean - default.cosine_mean > 2 * (up.cosine_mean - default.cosine_mean)
    assert down.knn5_overlap > default.knn5_overlap


def test_minilm_ffn_down_with_int8_outputs_reproduces_the_seed(minilm):
    """The issue's "about 0.83 -> 0.985": with INT8 layers' *outputs* quantized too (implicit INT8,
    ``--layerOutputTypes=int8``), the default policy falls to ~0.84 and the six FFN down-projections
    in FP16 lift it by more than 0.05 — their outputs carry the residual stream's outliers.
    mixprec's placement (outputs stay float) starts at 0.981 instead."""
    from tests.fixtures.models import run_model
    from core.quant.calibration import calibrate
    from core.quant.compile import compile_policy
    from core.measure.metrics import cosine_rows

    base = minilm.default_policy()
    calib = calibrate(minilm.model, minilm.calib_data, base.calibration, minilm.ws)
    feeds = minilm.eval_data.batches(1)
    ref = run_model(minilm.model.proto, feeds)

    def cosine(policy, int8_outputs):
        out = run_model(compile_policy(minilm.model, policy, calib, int8_outputs=int8_outputs).proto, feeds)
        return float(cosine_rows(ref.astype(np.float64), out.astype(np.float64)).mean())

    default_out = cosine(base, True)
    down_out = cosine(base.with_layers({n: "fp16" for n in FFN_DOWN}), True)
    up_out = cosine(base.with_layers({n: "fp16" for n in FFN_UP}), True)
    assert default_out < 0.9  # measured 0.841
    assert down_out - default_out >= 0.05 and down_out >= 0.985  # measured 0.991
    assert up_out - default_out < 0.02  # the up-projections' outputs do not matter like that
    assert cosine(base, False) - default_out > 0.1  # mixprec's placement: 0.981


def _run(snr=float("inf"), per_layer=True, new_fields=True) -> RunResult:
    rows = [("/a/MatMul", "MatMul", "/a/MatMul", "int8", 0.5, 50.0, False), ("cast", "Cast", "", "fp16", 0.5, 50.0, True)]
    return RunResult(
        run_id="20250101-000000-abcdef", run_dir=Path("/nowhere/runs/20250101-000000-abcdef"), created=1.5e9,
        label="x", model_name="m", model_sha256="ab" * 32, backend="onnxruntime", backend_reason="why",
        policy_sha256="cd" * 32, latency=Latency(1.0, 1.2, 2.0, 2.2, 1.9, 30),
        reformat=ReformatSummary(1, 0.5, 50.0, 1.0), quality=Quality(0.99, 0.95, snr, 0.1, 0.9, None, 8),
        precision_counts={"fp32": 1, "fp16": 2, "int8": 3}, int8_mac_fraction=0.75, build_seconds=3.0,
        calibration_method="minmax", calibration_cache_hit=True,
        per_layer=pd.DataFrame(rows if per_layer else [], columns=PER_LAYER_COLUMNS),
        **(dict(warnings=["cosine_mean 0.9000 is below 0.98: …"], data_generated=True,
                input_shapes={"x": [1, 3, 320, 320]}, latency_source=ORT_CPU_SOURCE, target="onnxruntime")
           if new_fields else {}))


def _same_run(a: RunResult, b: RunResult):
    assert {k: v for k, v in vars(a).items() if k != "per_layer"} == {k: v for k, v in vars(b).items() if k != "per_layer"}
    pd.testing.assert_frame_equal(a.per_layer, b.per_layer)


def test_run_round_trips_through_its_record():
    r = _run()
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["kind"] == "run" and doc["format_version"] == RunResult.FORMAT_VERSION
    assert doc["quality"]["snr_db"] is None  # infinite SNR (lossless) is stored as null
    back = RunResult.from_json(doc)
    _same_run(back, r)
    assert back.quality.snr_db == float("inf") and back.per_layer["is_reformat"].tolist() == [False, True]
    assert list(back.row()) == RUN_COLUMNS and back.row() == r.row() and r.row()["snr_db"] is None
    no_table = RunResult.from_json({k: v for k, v in doc.items() if k != "per_layer"})  # as in metrics.json
    assert no_table.per_layer.empty and list(no_table.per_layer.columns) == PER_LAYER_COLUMNS
    _same_run(no_table, _run(per_layer=False))


def test_run_records_of_an_older_or_foreign_format(tmp_path):
    doc = {k: v for k, v in _run().to_json().items() if k != "per_layer"}  # as in metrics.json
    v3 = {k: v for k, v in doc.items() if k not in ("latency_source", "target")} | {"format_version": 3}
    v2 = {k: v for k, v in v3.items() if k not in ("warnings", "data_generated", "input_shapes")} \
        | {"format_version": 2}  # before quality warnings
    v1 = {k: v for k, v in v2.items() if k != "kind"} | {"format_version": 1}  # mixprec before run records
    old = _run(per_layer=False, new_fields=False)
    assert old.warnings == [] and old.data_generated is False and old.input_shapes == {}
    assert old.latency_source == ORT_CPU_SOURCE and old.target == "tensorrt"
    _same_run(RunResult.from_json(v2), old)
    _same_run(RunResult.from_json(v1), old)
    assert RunResult.from_json(v2).to_json()["format_version"] == RunResult.FORMAT_VERSION == 4
    # 3 -> 4: the latency source is read from the backend and its reason; the target was TensorRT
    migrated = RunResult.from_json(v3)
    assert migrated.latency_source == ORT_CPU_SOURCE and migrated.target == "tensorrt"
    assert migrated.warnings == doc["warnings"] and migrated.input_shapes == {"x": [1, 3, 320, 320]}
    gpu = RunResult.from_json(v3 | {"backend": "tensorrt", "backend_reason": "tensorrt: TensorRT 10.13.0.35 on "
                                    "NVIDIA A100-SXM4-40GB (compute capability 8.0)"})
    assert gpu.latency_source == "TensorRT 10.13.0.35 on NVIDIA A100-SXM4-40GB, measured"
    assert gpu.to_json()["latency_source"] == gpu.latency_source and gpu.latency_note == ""
    with pytest.raises(MixprecError, match="newer than this mixprec reads"):
        RunResult.from_json(doc | {"format_version": 99})
    with pytest.raises(MixprecError, match="not a mixprec run document"):
        RunResult.from_json(doc | {"kind": "search"})
    with pytest.raises(MixprecError, match="lacks the field 'latency_ms'"):
        RunResult.from_json({k: v for k, v in doc.items() if k != "latency_ms"})
    # list_runs reads the current and the migrated format, and skips damaged or foreign runs
    ws = Workspace(tmp_path)
    for run_id, d in (("new", doc | {"run_id": "new"}), ("old", v1 | {"run_id": "old", "created": 2e9}),
                      ("foreign", doc | {"run_id": "foreign", "kind": "ranking"})):
        atomic_write_json(ws.runs / run_id / "metrics.json", d)
    atomic_write_text(ws.runs / "damaged" / "metrics.json", "{")
    runs = list_runs(ws)
    assert runs["run_id"].tolist() == ["old", "new"] and list(runs.columns) == RUN_COLUMNS
    assert load_run(ws, "new").run_dir == ws.runs / "new" and load_run(ws, "new").per_layer.empty
    with pytest.raises(MixprecError, match="there is no run 'gone'"):
        load_run(ws, "gone")


def test_latency_source_and_what_it_predicts():
    assert latency_source("onnxruntime", "onnxruntime: ONNX Runtime 1.22.0 on the CPU") == "ONNX Runtime CPU, measured"
    assert latency_source("tensorrt", "tensorrt: TensorRT 10.8.0 on NVIDIA L4 (compute capability 8.9)") == \
        "TensorRT 10.8.0 on NVIDIA L4, measured"
    assert latency_source("tensorrt", "something else") == "TensorRT (GPU), measured"
    assert "does not predict TensorRT latency" in latency_caveat("tensorrt", "onnxruntime")
    assert latency_caveat("onnxruntime", "onnxruntime") == "" and latency_caveat("tensorrt", "tensorrt") == ""
    r = _run()  # target onnxruntime, measured there: nothing to say
    assert r.latency_note == "" and r.latency_label == "ONNX Runtime CPU, measured · target ONNX Runtime (CPU)"
    assert r.row()["latency_source"] == ORT_CPU_SOURCE and r.row()["target"] == "onnxruntime"
    from dataclasses import replace

    assert "does not predict TensorRT latency" in replace(r, target="tensorrt").latency_note


def test_a_slowdown_reads_as_one():
    assert speedup_text(1.5) == ("1.50× faster than FP32", "up")
    assert speedup_text(0.78) == ("1.28× slower than FP32", "down")  # said once (issue 23)
    assert speedup_text(1.001) == ("1.00× · same as FP32", "off")
    assert speedup_text(float("nan"))[1] == "off" and speedup_text(None)[1] == "off"


def test_build_records_the_target_and_latency_source(ws, tiny_cnn):
    from dataclasses import replace

    r = build_and_measure(replace(tiny_cnn, ws=ws, target="tensorrt"), tiny_cnn.default_policy(), iterations=3,
                          profile_iterations=1)
    assert r.backend == "onnxruntime" and r.latency_source == ORT_CPU_SOURCE and r.target == "tensorrt"
    assert "does not predict TensorRT latency" in r.latency_note
    stored = load_run(ws, r.run_id)
    assert stored.latency_source == ORT_CPU_SOURCE and stored.target == "tensorrt"


def _ranking(names: list[str]) -> Ranking:
    rows = [(i + 1, n, "Conv", "int8", True, 1, 0.9, 0.1, 0.1, 20.0, 0.1) for i, n in enumerate(names)]
    return Ranking(pd.DataFrame(rows, columns=RANK_COLUMNS), "cos_drop", 4, 1.0, None)


def test_quality_warning_below_the_threshold(tiny_cnn):
    """No silent quality loss: below ``warn_below`` the run warns, naming the worst INT8 layers of
    the ranking it is given (most sensitive first, only those the policy puts in INT8), or offering
    to compute one; at or above it there is no warning."""
    pol = tiny_cnn.default_policy()
    int8 = [n for n, p in pol.layers.items() if p == "int8"]
    pol = pol.with_layers({int8[0]: "fp16"})  # not INT8 in this policy: never named
    q = Quality(0.41, 0.2, 3.0, 1.0, 0.5, None, 8)
    ranked = _ranking([int8[0], int8[2], "/no/such/layer", int8[1]])
    (w,) = quality_warnings(tiny_cnn, pol, q, 0.98, ranked)
    # it names the metric it used: cosine_mean of the model's first float output (no --metric-output)
    assert w.startswith("cosine_mean of logits (the --warn-below metric) 0.4100 is below 0.98: the worst INT8 layers "
                        "in the cached cumulative ranking")
    assert f"are {int8[2]}, {int8[1]}." in w and int8[0] not in w
    (offer,) = quality_warnings(tiny_cnn, pol, q, 0.98, None, generated=True)
    # on generated data it says first that the number may only reflect the generated inputs
    assert offer.startswith("On generated data, this number may only reflect the generated inputs: cosine_mean of "
                            "logits (the --warn-below metric) 0.4100")
    assert "python -m core rank sample:tiny-cnn" in offer
    assert "Sensitivity page" in offer
    assert quality_warnings(tiny_cnn, pol, q, 0.41, ranked) == []  # at the threshold: no warning
    (nan,) = quality_warnings(tiny_cnn, pol, Quality(float("nan"), 0, 0, 0, None, None, 8), 0.98)
    assert "not finite" in nan and "could not be measured" in nan  # NaN quality is never silent

    r = build_and_measure(tiny_cnn, pol, iterations=3, profile_iterations=1, warn_below=1.01, ranking=ranked)
    assert len(r.warnings) == 1 and f"are {int8[2]}, {int8[1]}." in r.warnings[0]
    assert r.data_generated is False and r.input_shapes == {k: list(v) for k, v in tiny_cnn.input_shapes.items()}
    doc = json.loads((r.run_dir / "metrics.json").read_text())
    assert doc["warnings"] == r.warnings and doc["data_generated"] is False
    assert load_run(tiny_cnn.ws, r.run_id).warnings == r.warnings
    fine = build_and_measure(tiny_cnn, pol, iterations=3, profile_iterations=1)  # tiny-cnn's default: cosine > 0.98
    assert fine.quality.cosine_mean >= 0.98 and fine.warnings == []


def test_cli_build_json_carries_the_warning(ws, tiny_cnn, monkeypatch, capsys):
    from core.cli.commands import main

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(ws.root))
    assert main(["build", "sample:tiny-cnn", "--json", "--iterations", "3", "--warn-below", "1.01"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["data_generated"] is False and len(doc["warnings"]) == 1
    assert doc["target"] == "tensorrt" and doc["latency_source"] == ORT_CPU_SOURCE  # the default target
    assert doc["warnings"][0].startswith("cosine_mean ") and "below 1.01" in doc["warnings"][0]
    assert main(["build", "sample:tiny-cnn", "--iterations", "3", "--warn-below", "1.01"]) == 0
    assert "\nwarning: cosine_mean" in capsys.readouterr().out
    assert "does not predict TensorRT latency" in doc["latency_note"] and "FP32" in doc["speedup_text"]


def test_cli_target_in_the_json_and_the_text(ws, monkeypatch, capsys):
    from core.cli.commands import main

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(ws.root))
    assert main(["build", "sample:tiny-cnn", "--json", "--iterations", "3", "--target", "onnxruntime"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "onnxruntime" and doc["latency_note"] == ""
    assert main(["build", "sample:tiny-cnn", "--iterations", "3"]) == 0
    text = capsys.readouterr().out
    assert "[ONNX Runtime CPU, measured · target TensorRT (GPU)]" in text and "does not predict TensorRT" in text
    assert main(["inspect", "sample:tiny-cnn", "--json", "--target", "onnxruntime"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "onnxruntime"


def test_search_verdict_carries_the_warning_and_says_generated(tiny_cnn, tmp_path):
    """The search's verdict includes the verifying build's quality warning (naming the worst INT8
    layers of its isolated ranking); on generated evaluation data it says so."""
    from dataclasses import replace

    from core.search import SearchConfig, search

    r = search(tiny_cnn, SearchConfig("cosine_mean>=0.5", methods=("minmax",), workers=1, warn_below=1.01))
    assert r.run is not None and r.run.warnings and f"Warning: {r.run.warnings[0]}" in r.message
    if r.policy.precision_counts()["int8"]:
        assert "the worst INT8 layers in the isolated ranking (minmax)" in r.message
    assert GENERATED_NOTE not in r.message  # the sample's own evaluation data
    generated = replace(tiny_cnn, eval_data=replace(tiny_cnn.eval_data, generated=True))
    g = search(generated, SearchConfig("cosine_mean>=0.5", methods=("minmax",), workers=1))
    assert g.run.data_generated and f"(quality {GENERATED_NOTE}" in g.message and not g.run.warnings


def test_list_runs_reads_each_metrics_file_once_and_sees_every_change(tmp_path, monkeypatch):
    """Issue 23 fault 10: a listing reads a run's row (its speedup interval a bootstrap) once per file version,
    not at every page run; a run written again, removed or added is seen at the next listing."""
    import core.store.runs as store_runs

    doc = {k: v for k, v in _run().to_json().items() if k != "per_layer"}
    ws = Workspace(tmp_path)
    for run_id in ("a", "b"):
        atomic_write_json(ws.runs / run_id / "metrics.json", doc | {"run_id": run_id})
    parsed = []
    real = RunResult.from_json
    monkeypatch.setattr(store_runs.RunResult, "from_json", staticmethod(lambda d: parsed.append(d["run_id"]) or real(d)))
    first = list_runs(ws)
    assert sorted(parsed) == ["a", "b"]
    parsed.clear()
    again = list_runs(ws)
    assert parsed == [] and again.equals(first)  # nothing read again
    atomic_write_json(ws.runs / "a" / "metrics.json", doc | {"run_id": "a", "label": "rewritten"})
    atomic_write_json(ws.runs / "c" / "metrics.json", doc | {"run_id": "c"})
    (ws.runs / "b" / "metrics.json").unlink()
    now = list_runs(ws)
    assert sorted(parsed) == ["a", "c"]
    assert sorted(now["run_id"]) == ["a", "c"] and now.set_index("run_id").loc["a", "label"] == "rewritten"
    assert not any(k.endswith("/b/metrics.json") for k in store_runs._ROWS)  # a removed run's row is dropped
