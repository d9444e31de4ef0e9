"""Issue 23 §3: a calibration prices the layer classes its engine had data for, and only those; every other
layer keeps the shipped fit, and the basis line of an estimate says which classes are which. Its error is
held out (k-fold over one engine's layers, leave-one-engine-out over several), labelled so, never only
in-sample. Issue 23 §4 (core): a calibration on a report of another model, or for a GPU the report cannot
be of, is refused."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from core.errors import MixprecError
from core.estimate import cost, fit
from core.estimate.cost import FITTED
from core.estimate.engine import calibration_class
from core.estimate.gpus import gpu
from core.estimate.predict import predict
from core.project import open_project
from core.quant.policy import uniform_policy
from core.store.results import load_gpu_calibration, save_gpu_calibration
from core.workspace import Workspace
from tests.fixtures.engine_reports import fixture_resnet18, matmul_mlp


@pytest.fixture(scope="module")
def fp32_pair(trt_reports_dir):
    return trt_reports_dir / "a100-resnet-fp32.graph.json", trt_reports_dir / "a100-resnet-fp32.profile.json"


@pytest.fixture(scope="module")
def resnet_cal(fp32_pair):
    """The calibration of the A100 on the conv-only ResNet-18 fp32 fixture engine."""
    return fit.calibrate(fp32_pair, "a100")


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scope")
    ws = Workspace(folder / "ws")
    return {"mlp": open_project(str(matmul_mlp(folder / "mlp.onnx")), ws=ws),
            "resnet": open_project(str(fixture_resnet18(folder / "resnet18.onnx")), ws=ws)}


def test_a_calibration_records_the_classes_its_engine_has(resnet_cal):
    # 21 convolutions, 2 poolings, 1 reformat (too few to calibrate on: it keeps the shipped fit)
    assert resnet_cal.classes == {"conv": 21, "pooling": 2}
    label = resnet_cal.label()
    assert label.startswith("calibrated on 24 layers of a100-resnet-fp32 on the NVIDIA A100 80GB SXM: "
                            "convolution (21 layers), pooling (2); held-out median error ")
    doc = json.loads(json.dumps(resnet_cal.to_json()))
    assert cost.CostParams.from_json(doc) == resnet_cal


@pytest.mark.parametrize("precision", ["default", "fp16", "fp32"])
def test_a_conv_calibration_leaves_a_matmul_only_model_alone(resnet_cal, projects, precision):
    p = projects["mlp"]
    pol = p.default_policy() if precision == "default" else uniform_policy(p.model, p.layers, precision)
    before = predict(p.model, pol, p.input_shapes, "a100", FITTED)
    after = predict(p.model, pol, p.input_shapes, "a100", resnet_cal)
    assert {calibration_class(layer) for layer in after.engine} <= {"gemm", "reformat", "elementwise", "other"}
    assert after.total_ms == before.total_ms
    assert after.layers.est_ms.tolist() == before.layers.est_ms.tolist()
    assert after.basis == FITTED.basis
    assert after.basis_detail.startswith("the shipped fit for every layer class of this model, MatMul/GEMM (4 layers)")
    assert "your calibration covers convolution, pooling only (calibrated on 24 layers of a100-resnet-fp32" \
        in after.basis_detail
    assert f"basis: {after.basis_detail}" in after.caption()


def test_a_conv_calibration_leaves_minilm_alone(resnet_cal, minilm):
    for pol in (minilm.default_policy(), uniform_policy(minilm.model, minilm.layers, "fp16")):
        before = predict(minilm.model, pol, minilm.input_shapes, "a100", FITTED)
        after = predict(minilm.model, pol, minilm.input_shapes, "a100", resnet_cal)
        assert after.total_ms == before.total_ms
        detail = after.basis_detail
        assert detail.startswith("the shipped fit for every layer class of this model, ")
        shipped = detail.split(" (fit on the fixture engines")[0]
        assert "transformer MatMul/GEMM (24" in shipped and "attention (6)" in shipped
        assert "transformer normalization (16)" in shipped
        assert "; your calibration covers convolution, pooling only" in detail


def test_a_conv_calibration_moves_a_conv_model(resnet_cal, projects):
    p = projects["resnet"]
    pol = p.default_policy()
    before = predict(p.model, pol, p.input_shapes, "a100", FITTED)
    after = predict(p.model, pol, p.input_shapes, "a100", resnet_cal)
    assert abs(after.total_ms / before.total_ms - 1) > 0.01
    assert after.basis == cost.CALIBRATION_BASIS
    assert after.basis_detail.startswith("your calibration for convolution (")
    assert "held-out median error" in after.basis_detail
    # every layer of a calibrated class is priced by the calibration, every other one by the shipped fit
    for layer, est in zip(after.engine, after.layers.est_ms):
        want = resnet_cal if calibration_class(layer) in resnet_cal.classes else FITTED
        assert est == pytest.approx(cost.layer_ms(layer, gpu("a100"), want), rel=1e-12)
    shipped = sorted({calibration_class(layer) for layer in after.engine if layer.layer_type != "NoOp"}
                     - set(resnet_cal.classes))
    if shipped:
        assert "; the shipped fit for " in after.basis_detail


def test_the_error_is_held_out_and_labelled_so(resnet_cal, fp32_pair):
    s = fit.sample(*fp32_pair)
    assert resnet_cal.held_out == "5-fold over the engine's layers"
    assert not math.isnan(resnet_cal.held_out_err) and resnet_cal.held_out_err > resnet_cal.median_err
    assert f"held-out median error {resnet_cal.held_out_err * 100:.0f} % (5-fold over the engine's layers)" \
        in resnet_cal.label()
    assert "in-sample" not in resnet_cal.label() and f"median error {resnet_cal.median_err * 100:.0f} %" \
        not in resnet_cal.label().replace("held-out median error", "")
    # each layer's held-out error is the estimate of a fit that did not see it (fold 0 refitted here)
    rel, how = fit.held_out_errors([s], "a100")
    timed = s.timed()
    assert len(rel) == len(timed) and how == "5-fold over the engine's layers"
    fold = timed[0::5]
    alone = fit.fit([fit._without(s, set(fold))], "a100", start=FITTED, basis=cost.CALIBRATION_BASIS)
    g = gpu("a100")
    want = [cost.layer_ms(s.layers[k], g, alone) / s.times[k] - 1 for k in fold]
    assert [e for _, e in rel[:len(fold)]] == pytest.approx(want, rel=1e-9)
    kept = [abs(e) for c, e in rel if c in resnet_cal.classes]
    assert resnet_cal.held_out_err == pytest.approx(float(np.median(kept)))


def test_two_engines_are_held_out_one_at_a_time(trt_reports_dir):
    pairs = [(trt_reports_dir / f"a100-resnet-{n}.graph.json", trt_reports_dir / f"a100-resnet-{n}.profile.json")
             for n in ("fp32", "fp16")]
    cal = fit.calibrate(pairs, "a100")
    assert cal.held_out == "leave-one-engine-out over 2 engines"
    assert cal.fitted_on == ("a100-resnet-fp32", "a100-resnet-fp16")
    assert cal.classes == {"conv": 42, "pooling": 4, "reformat": 3}
    assert "held-out median error" in cal.label() and "(leave-one-engine-out over 2 engines)" in cal.label()


def test_a_calibration_stored_before_classes_is_not_applied(resnet_cal, projects, tmp_path):
    doc = resnet_cal.to_json()
    for k in ("classes", "held_out_err", "held_out", "class_err"):
        doc.pop(k)
    old = cost.CostParams.from_json(doc)
    assert old.classes == {} and "not applied" in old.label()
    ws = Workspace(tmp_path / "ws")
    save_gpu_calibration(ws, "a100", old)
    assert load_gpu_calibration(ws, "a100") == old
    p = projects["resnet"]
    pol = p.default_policy()
    assert predict(p.model, pol, p.input_shapes, "a100", old).total_ms == \
        predict(p.model, pol, p.input_shapes, "a100", FITTED).total_ms
    detail = predict(p.model, pol, p.input_shapes, "a100", old).basis_detail
    assert detail.startswith("the shipped fit for every layer class of this model") and "not applied" in detail


def test_a_calibration_of_another_model_is_refused(fp32_pair, projects, minilm):
    from core.backends.reports import node_names

    resnet = projects["resnet"]
    ok = fit.calibrate(fp32_pair, "a100", model_nodes=node_names(resnet.model.proto.graph))
    assert ok.classes == {"conv": 21, "pooling": 2}
    with pytest.raises(MixprecError, match=r"is not of this model: 0 of its 23 engine layers that name an ONNX node"):
        fit.calibrate(fp32_pair, "a100", model_nodes=node_names(minilm.model.proto.graph))


def test_a_calibration_for_a_gpu_the_report_cannot_be_of_is_refused(fp32_pair):
    from core.backends.reports import ReportDevice

    # the A100 engine runs sm80 kernels: no Turing or Volta GPU runs them
    for key in ("t4", "titanrtx", "v100"):
        with pytest.raises(MixprecError, match="kernels built for compute capability 8.0 or later"):
            fit.calibrate(fp32_pair, key)
    # a report that names its GPU (its trtexec log) calibrates that GPU only
    named = ReportDevice(name="NVIDIA A100-SXM4-40GB", source="trtexec log", capability=(8, 0))
    with pytest.raises(MixprecError, match="built on the NVIDIA A100-SXM4-40GB .trtexec log., not on the NVIDIA L4"):
        fit.calibrate(fp32_pair, "l4", device=named)
    assert fit.calibrate(fp32_pair, "a100-40gb", device=named).gpu == "a100-40gb"
