"""Streamlit AppTest of the Export page (views/export.py): downloads, compile, policy import, the estimate in
the bundle."""
from __future__ import annotations

import json

from core.estimate.predict import predict
from core.export import BUNDLE_SCRIPTS, BUNDLE_STEM, ESTIMATE_NAME, README_NAME, export_bundle
from core.project import open_project
from tests.fixtures.apptest import LAYER, MODEL, ok, page


def test_export_and_import(ws):
    at = ok(page("export"))
    assert [b.proto.label for b in at.get("download_button")][0] == "Policy JSON"
    assert len(at.get("download_button")) == 3 and len(at.code) == 6  # 3 commands folded, each whole in an expander
    at.button(key="compile").click().run()
    ok(at)
    assert len(at.get("download_button")) > 3 and not [b for b in at.button if b.key == "compile"]
    from core.project import open_project

    other = open_project("sample:tiny-transformer", ws=ws).default_policy().to_json()
    at.text_area(key="policy_text").input(other)
    at.button(key="import").click().run()
    assert at.error and "does not fit the model" in at.error[0].value and "unknown layer" in at.error[0].value
    mine = json.loads(open_project("sample:tiny-cnn", ws=ws).default_policy().to_json())
    mine["layers"][LAYER] = "fp32"
    at.text_area(key="policy_text").input(json.dumps(mine))
    at.button(key="import").click().run()
    ok(at)
    fp32 = list(mine["layers"].values()).count("fp32")  # the imported policy is the one shown (and exported)
    assert at.success and f"fp32 {fp32} · " in at.caption[1].value and at.selectbox(key="export_run").value == "session"


def test_export_bundle_labels_the_estimate(ws):
    p = open_project(MODEL, ws=ws)
    pol = p.default_policy()
    r = predict(p.model, pol, p.input_shapes, "h100")
    b = export_bundle(p, pol, estimate=r)
    doc = json.loads(b.files[ESTIMATE_NAME])
    assert doc["label"] == "estimate" and doc["gpu"]["key"] == "h100" and doc["basis"] == "fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)"
    assert abs(doc["total_ms"] - r.total_ms) < 1e-12
    readme = b.files[README_NAME].decode()
    assert "an estimate, not measured" in readme and "NVIDIA H100" in readme and "basis" in readme
    assert ESTIMATE_NAME not in export_bundle(p, pol).files


def _plant(run, **changes) -> None:
    doc = json.loads((run.run_dir / "metrics.json").read_text())
    (run.run_dir / "metrics.json").write_text(json.dumps(doc | changes))


def _estimate_metric(at):
    return next(m for m in at.metric if m.label.startswith("Estimated TensorRT time on"))


def test_the_estimate_of_a_run_chosen_for_export_is_for_its_shapes_and_gpu(ws):
    """Issue 23 §1: a run built at 4×3×32×32, picked on the Export page, shows the estimate at 4×3×32×32 (not today's
    1×3×32×32) on the session's GPU and says so, as beside the run on Build and results; the bundle's README and
    estimate.json state the same estimate, and that its files are for today's shapes."""
    from core.display.tables import ms_text
    from core.measure.runs import build_and_measure
    from tests.fixtures.apptest import captions_text

    p = open_project(MODEL, ws=ws)
    run = build_and_measure(p, p.default_policy(), label="at batch 4", iterations=3, profile_iterations=1)
    _plant(run, input_shapes={"image": [4, 3, 32, 32]})
    want = predict(p.model, p.default_policy(), {"image": (4, 3, 32, 32)}, "a100")
    today = predict(p.model, p.default_policy(), p.input_shapes, "a100")
    assert ms_text(want.total_ms) != ms_text(today.total_ms)
    at = ok(page("export"))
    at.selectbox(key="export_run").select(run.run_id).run()
    ok(at)
    est = _estimate_metric(at)
    assert est.label == f"Estimated TensorRT time on {want.gpu_name}" and est.value == ms_text(want.total_ms)
    said = (f"Estimated for 4×3×32×32, policy at batch 4 ({run.policy_sha256[:8]}), {want.gpu_name} (the GPU picked "
            "on the Precision page).")
    assert said in captions_text(at)
    assert any("was built at 4×3×32×32: the files below are for those shapes" in i.value
               and "today's shapes, 1×3×32×32, stay on the Model page" in i.value for i in at.info)
    at.button(key="compile").click().run()
    ok(at)
    files = at.session_state["export_bundle"][1].files
    doc = json.loads(files[ESTIMATE_NAME])
    assert doc["input_shapes"] == {"image": [4, 3, 32, 32]} and abs(doc["total_ms"] - want.total_ms) < 1e-9
    assert doc["estimated_for"] == said
    readme = files[README_NAME].decode()
    assert "Estimated for 4×3×32×32, policy at batch 4" in readme and want.estimate_text() in readme
    assert "the project's (`1×3×32×32`)" not in readme  # the files are for the run's shapes: no mismatch to say
    # the files themselves are for the run's shapes: the build scripts' shapes and the compiled ONNX's input
    assert "image:4x3x32x32" in files[BUNDLE_SCRIPTS["typed"]].decode()
    assert "image:1x3x32x32" not in files[BUNDLE_SCRIPTS["typed"]].decode()
    at.selectbox(key="export_run").select("session").run()  # today's shapes are not changed by the export
    assert "Estimated for 1×3×32×32 (today's shapes, set on the Model page)" in captions_text(ok(at))


def test_the_estimate_of_a_tensorrt_run_chosen_for_export_is_for_the_gpu_it_was_measured_on(ws):
    from core.display.tables import ms_text
    from core.measure.runs import build_and_measure
    from tests.fixtures.apptest import captions_text

    p = open_project(MODEL, ws=ws)
    run = build_and_measure(p, p.default_policy(), label="on a T4", iterations=3, profile_iterations=1)
    _plant(run, latency_source="TensorRT 10.13 on Tesla T4, measured")
    at = ok(page("export"))  # the session's GPU is the A100
    at.selectbox(key="export_run").select(run.run_id).run()
    est = _estimate_metric(ok(at))
    assert est.label == "Estimated TensorRT time on NVIDIA T4"
    assert est.value == ms_text(predict(p.model, p.default_policy(), p.input_shapes, "t4").total_ms)
    assert "NVIDIA T4 (the GPU the run was measured on)." in captions_text(at)
    assert not [i for i in at.info if "was built at" in i.value]  # built at today's shapes


def test_the_estimate_of_the_sessions_policy_says_todays_shapes(ws):
    from core.display.tables import ms_text
    from tests.fixtures.apptest import captions_text

    at = ok(page("export", state={"source": {"model": MODEL, "data": None, "eval_data": None,
                                             "shapes": {"image": [2, 3, 32, 32]}}}))
    p = open_project(MODEL, ws=ws, shapes={"image": (2, 3, 32, 32)})
    pol = p.default_policy()
    want = predict(p.model, pol, {"image": (2, 3, 32, 32)}, "a100")
    assert want.total_ms != predict(p.model, pol, {"image": (1, 3, 32, 32)}, "a100").total_ms
    assert _estimate_metric(at).value == ms_text(want.total_ms)
    assert (f"Estimated for 2×3×32×32 (today's shapes, set on the Model page), this session's policy "
            f"({pol.sha256[:8]}), {want.gpu_name} (the GPU picked on the Precision page).") in captions_text(at)
