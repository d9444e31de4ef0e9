"""AppTest of "Add a GPU" on the Precision page (issue 19 §4): the form validates with the same code
as --gpu-spec (errors shown, the page stays usable), saves the GPU in the workspace, and the GPU
picker then offers and selects it; a corrupt saved file is skipped with a note."""
from __future__ import annotations

import json

from core.display.tables import ms_text
from core.estimate.gpus import GPU
from core.estimate.predict import predict
from core.project import open_project
from test_app import ok, page, ws  # noqa: F401 (fixture)

A6000 = {"key": "rtx-a6000", "name": "NVIDIA RTX A6000", "arch": "ampere", "sm_count": 84, "fp32_tflops": 38.7,
         "tf32_tflops": 77.4, "fp16_tflops": 154.8, "fp16_acc16_tflops": 154.8, "int8_tops": 309.7,
         "bandwidth_gbs": 768.0, "memory_gb": 48.0}


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label))


def _fill(at, doc: dict):
    at.text_input(key="gpu_form_key").input(doc["key"])
    at.text_input(key="gpu_form_name").input(doc["name"])
    at.selectbox(key="gpu_form_arch").select(doc["arch"])
    for f in ("sm_count", "fp32_tflops", "tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops",
              "bandwidth_gbs", "memory_gb"):
        if doc.get(f) is not None:
            at.number_input(key=f"gpu_form_{f}").set_value(doc[f])
    return at.button(key="gpu_form_save").click().run()


def test_add_a_gpu_then_estimate_on_it(ws):
    at = ok(page("precision"))
    assert "NVIDIA RTX A6000 (added)" not in at.selectbox(key="estimate_gpu").options
    # a figure that is not positive: the same check as --gpu-spec, shown; nothing saved, the page still works
    at = _fill(at, {**A6000, "bandwidth_gbs": -768.0})
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert "bandwidth_gbs is -768, not positive" in err.replace("\\", "")
    assert not (ws.root / "gpus" / "rtx-a6000.json").exists()
    assert _metric(at, "Estimated TensorRT time")  # the panel is still there
    # the right figures: saved, offered in the picker and selected, the estimate on it
    at.number_input(key="gpu_form_bandwidth_gbs").set_value(768.0)
    at = ok(at.button(key="gpu_form_save").click().run())
    saved = json.loads((ws.root / "gpus" / "rtx-a6000.json").read_text())
    assert GPU.from_json(saved) == GPU.from_json(A6000)
    picker = at.selectbox(key="estimate_gpu")
    assert "NVIDIA RTX A6000 (added)" in picker.options  # beside the table's rows
    assert "NVIDIA T4" in picker.options
    assert picker.value == "rtx-a6000"
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA RTX A6000") for s in at.subheader)
    p = open_project("sample:tiny-cnn", ws=ws)
    want = predict(p.model, p.default_policy(), p.input_shapes, GPU.from_json(A6000))
    assert _metric(at, "Estimated TensorRT time") == ms_text(want.total_ms)
    assert any("Saved NVIDIA RTX A6000" in s.value.replace("\\", "") for s in at.success)
    # kept with the project: a new session of the same project starts on it
    again = ok(page("precision", state={"estimate_gpu:value": "rtx-a6000"}))
    assert again.selectbox(key="estimate_gpu").value == "rtx-a6000"


def test_a_corrupt_saved_gpu_is_skipped_with_a_note(ws):
    (ws.root / "gpus").mkdir(parents=True, exist_ok=True)
    (ws.root / "gpus" / "broken.json").write_text("{not json")
    (ws.root / "gpus" / "rtx-a6000.json").write_text(json.dumps(A6000))
    at = page("precision")
    assert not at.exception and not at.error
    assert any("broken.json" in w.value for w in at.warning)
    assert "NVIDIA RTX A6000 (added)" in at.selectbox(key="estimate_gpu").options
    at.selectbox(key="estimate_gpu").select("rtx-a6000").run()
    ok(at)
    assert any(s.value.startswith("Estimated TensorRT latency on NVIDIA RTX A6000") for s in at.subheader)
