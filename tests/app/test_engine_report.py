"""AppTest of the engine-report import on the Build and results page (issue 23 §4): how much of the report is
the project's model ("N of M engine layers are layers of this model"), a report of another model calibrates
nothing, the GPU a calibration is for is read from the report's trtexec log or chosen by the user (never the
estimate panel's GPU by default, never one the report's kernels cannot run on), and of an upload and a typed
path the one given last is used, as the page says. Issue 23 §3: the basis line of the Precision page's
estimate names the classes the calibration prices."""
from __future__ import annotations

import pytest

from core.store.results import load_gpu_calibration
from tests.fixtures.apptest import captions_text, ok, page, shown
from tests.fixtures.engine_reports import fixture_resnet18

LOG = ("[12/01/2026-10:00:00] [I] === Device Information ===\n"
       "[12/01/2026-10:00:00] [I] Selected Device: NVIDIA A100-SXM4-40GB\n"
       "[12/01/2026-10:00:00] [I] Compute Capability: 8.0\n")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """ResNet-18 at batch 32 with the node names of the A100 fp32 / fp16 fixture engines."""
    return str(fixture_resnet18(tmp_path_factory.mktemp("resnet") / "resnet18.onnx"))


def load(at, trt_reports_dir, name: str, log=None):
    at.text_input(key="trt_graph_path").input(str(trt_reports_dir / f"{name}.graph.json"))
    at.text_input(key="trt_profile_path").input(str(trt_reports_dir / f"{name}.profile.json"))
    if log is not None:
        at.text_input(key="trt_log_path").input(str(log))
    return at.run()


def warnings(at) -> str:
    return " ".join(shown(w) for w in at.warning)


def test_a_report_of_another_model_says_so_and_calibrates_nothing(ws, trt_reports_dir):
    at = ok(load(page("build_and_results"), trt_reports_dir, "a100-resnet-fp32"))
    text = warnings(at)
    assert "0 of 23 engine layers are layers of this model (sample:tiny-cnn)" in text
    assert "this report is of another model" in text
    assert "Calibration refused: The engine report a100-resnet-fp32 is not of this model (sample:tiny-cnn)" in text
    assert len(at.get("plotly_chart")) == 4  # its charts are still drawn
    assert not [b for b in at.button if b.key == "calibrate_gpu"]
    assert load_gpu_calibration(ws, "a100") is None


def test_the_gpu_is_chosen_by_the_user_among_those_the_kernels_run_on(ws, trt_reports_dir, resnet):
    at = ok(load(page("build_and_results", model=resnet, state={"estimate_gpu:value": "t4"}), trt_reports_dir,
                 "a100-resnet-fp32"))
    text = captions_text(at)
    assert "23 of 23 engine layers are layers of this model" in text
    assert "the report does not name its GPU; its kernels (sm80_xmma_fprop" in text
    box = at.selectbox(key="calib_gpu")
    assert box.value is None  # no default: not the estimate panel's T4
    assert "NVIDIA A100 80GB SXM" in box.options and "NVIDIA A100 40GB SXM" in box.options  # (shown by name)
    assert not {"NVIDIA T4", "NVIDIA TITAN RTX", "NVIDIA Tesla V100 SXM2"} & set(box.options)  # no sm80 kernels
    assert "GPUs its kernels cannot run on are left out" in text
    assert at.button(key="calibrate_gpu").disabled
    box.select("a100").run()
    at.button(key="calibrate_gpu").click().run()
    ok(at)
    (msg,) = [shown(s) for s in at.success]
    assert "Estimates on the NVIDIA A100 80GB SXM now use your calibration for convolution, pooling; every other " \
           "layer class keeps the shipped fit" in msg
    assert "held-out median error" in msg and "(5-fold over the engine's layers)" in msg
    params = load_gpu_calibration(ws, "a100")
    assert params is not None and params.classes == {"conv": 21, "pooling": 2}
    assert load_gpu_calibration(ws, "t4") is None
    pre = ok(page("precision", model=resnet, state={"estimate_gpu:value": "a100"}))
    text = captions_text(pre)
    assert "on NVIDIA A100 80GB SXM" in text and "basis: your calibration for convolution (" in text
    assert "calibrated on 24 layers of a100-resnet-fp32 on the NVIDIA A100 80GB SXM" in text


def test_a_trtexec_log_names_the_gpu(ws, trt_reports_dir, resnet, tmp_path):
    log = tmp_path / "trtexec.log"
    log.write_text(LOG)
    at = ok(load(page("build_and_results", model=resnet, state={"estimate_gpu:value": "t4"}), trt_reports_dir,
                 "a100-resnet-fp32", log))
    assert not [s for s in at.selectbox if s.key == "calib_gpu"]
    text = " ".join(shown(m) for m in at.markdown)
    assert "GPU the engine was built on: **NVIDIA A100 40GB SXM**, read from the report (trtexec log, " \
           "\"Selected Device\": NVIDIA A100-SXM4-40GB)" in text
    assert "the report names its GPU: NVIDIA A100-SXM4-40GB" in captions_text(at)
    at.button(key="calibrate_gpu").click().run()
    ok(at)
    assert load_gpu_calibration(ws, "a100-40gb") is not None and load_gpu_calibration(ws, "a100") is None


def test_of_an_upload_and_a_typed_path_the_one_given_last_is_used(ws, trt_reports_dir):
    def shown_report(at) -> str:
        return next(shown(m) for m in at.markdown if shown(m).startswith("**a100"))

    fp16 = trt_reports_dir / "a100-resnet-fp16.graph.json"
    at = page("build_and_results")
    at.file_uploader(key="trt_graph_upload").set_value((fp16.name, fp16.read_bytes(), "application/json")).run()
    ok(at)
    assert shown_report(at).startswith("**a100-resnet-fp16")
    uploaded = captions_text(at)
    qat = trt_reports_dir / "a100-resnet-qat.graph.json"
    at.text_input(key="trt_graph_path").input(str(qat)).run()
    ok(at)
    assert shown_report(at).startswith("**a100-resnet-qat**")  # the path typed last wins
    assert "Layer info: the uploaded file `a100-resnet-fp16.graph.json`." in uploaded
    assert (f"Layer info: the path `{qat}` (typed after the upload `a100-resnet-fp16.graph.json`, which is not used)"
            in captions_text(at))
    fp32 = trt_reports_dir / "a100-resnet-fp32.graph.json"
    at.file_uploader(key="trt_graph_upload").set_value((fp32.name, fp32.read_bytes(), "application/json")).run()
    ok(at)
    assert shown_report(at).startswith("**a100-resnet-fp32**")  # then the new upload wins
    assert f"Layer info: the uploaded file `a100-resnet-fp32.graph.json` (given after the path `{qat}`, which is " \
           "not used)" in captions_text(at)
    at.file_uploader(key="trt_graph_upload").set_value(None).run()  # the upload removed: the path again
    assert shown_report(ok(at)).startswith("**a100-resnet-qat**")
