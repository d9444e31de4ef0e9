"""The engine-layer cost model (issue 12 §1, §2, §4; issue 19 §3): hand-checked FLOPs and bytes, the
GPU table, TensorRT 8.x report naming (8.2's Q/DQ ``Scale`` layers, depthwise kernels, tactic
names), the tile model of tensor-core convolutions, the joint fit on the nine real trtexec reports
(five A100 ResNet-18 at batch 32, four TITAN RTX MobileNetV2 at batch 1: it reproduces its own data
and meets the targets), leave-one-engine-out and leave-one-gpu-out, the cached validation rows,
estimates that move the right way when a layer's dims or precision change, and the user calibration
stored per GPU."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from core.backends.reports import load_engine_report
from core.errors import MixprecError
from core.estimate import cost, fit, gpus, layers, validation
from core.estimate.engine import EngineLayer, Tensor
from core.store.results import gpu_calibration_path, load_gpu_calibration, save_gpu_calibration
from core.workspace import Workspace

A100 = gpus.gpu("a100")
TITAN = gpus.gpu("titanrtx")


def conv(n=32, c=64, h=56, k=64, p=56, r=3, dtype="fp16", vector=8, precision="fp16", out_dtype=None,
         out_vector=None, tactic="") -> EngineLayer:
    out_dtype = out_dtype or dtype
    return EngineLayer(
        name="conv", layer_type="CaskConvolution", layer_class="conv_gemm", precision=precision,
        inputs=(Tensor("x", (n, c, h, h), dtype, vector),),
        outputs=(Tensor("y", (n, k, p, p), out_dtype, vector if out_vector is None else out_vector),),
        kernel=(r, r), out_maps=k, weights=k * c * r * r, weights_dtype=dtype if dtype != "fp32" else "fp32",
        bias=k, attrs={"tactic": tactic})


# --------------------------------------------------------------------- FLOPs and bytes, by hand

def test_conv_flops_and_bytes_by_hand():
    layer = conv()
    # 32·64·56·56 outputs × 64·3·3 multiply-adds × 2
    assert cost.flops(layer) == 2 * 32 * 64 * 56 * 56 * 64 * 9 == 7_398_752_256
    # input + output fp16 (2 B), weights 36 864 fp16, bias 64 fp32
    assert cost.bytes_moved(layer) == 12_845_056 + 12_845_056 + 73_728 + 256


def test_gemm_as_1x1_conv_flops_and_bytes_by_hand():
    fc = EngineLayer(name="fc", layer_type="CaskConvolution", layer_class="conv_gemm", precision="int8",
                     inputs=(Tensor("x", (32, 512, 1, 1), "int8", 32),),
                     outputs=(Tensor("y", (32, 1000, 1, 1), "fp32", 1),),
                     kernel=(1, 1), out_maps=1000, weights=512_000, weights_dtype="int8", bias=1000)
    assert cost.flops(fc) == 2 * 32 * 1000 * 512
    assert cost.bytes_moved(fc) == 32 * 512 + 32 * 1000 * 4 + 512_000 + 4 * 1000


def test_pooling_flops_and_bytes_by_hand():
    pool = EngineLayer(name="pool", layer_type="TiledPooling", layer_class="pooling", precision="fp32",
                       inputs=(Tensor("x", (32, 64, 112, 112), "fp32"),),
                       outputs=(Tensor("y", (32, 64, 56, 56), "fp32"),), kernel=(3, 3))
    assert cost.flops(pool) == 32 * 64 * 56 * 56 * 9
    assert cost.bytes_moved(pool) == 32 * 64 * 112 * 112 * 4 + 32 * 64 * 56 * 56 * 4


def test_reformat_bytes_by_hand_pad_channels_to_the_vector():
    # the network input quantized into a four-wide vectorized INT8 format: 3 channels stored as 4
    q = EngineLayer(name="QuantizeLinear_2", layer_type="Reformat", layer_class="reformat", precision="int8",
                    inputs=(Tensor("x", (32, 3, 224, 224), "fp32", 1),),
                    outputs=(Tensor("q", (32, 3, 224, 224), "int8", 4),), is_reformat=True)
    assert cost.flops(q) == 0
    assert cost.bytes_moved(q) == 32 * 3 * 224 * 224 * 4 + 32 * 4 * 224 * 224 * 1


def test_noop_costs_nothing():
    noop = EngineLayer(name="Reformatting CopyNode for Input Tensor 0 to x", layer_type="NoOp",
                       layer_class="other", precision="fp16",
                       inputs=(Tensor("a", (32, 64, 56, 56), "fp16", 8),),
                       outputs=(Tensor("b", (32, 64, 56, 56), "fp16", 16),))
    assert cost.flops(noop) == cost.bytes_moved(noop) == cost.layer_ms(noop, A100) == 0


# --------------------------------------------------------------------- parsing the real reports

@pytest.fixture(scope="module")
def samples(trt_reports_dir):
    more = trt_reports_dir.parent / "trt-engine-reports-more"
    if not (trt_reports_dir / "a100-resnet-fp32.graph.json").is_file() or not more.is_dir():
        pytest.skip(f"the fixture reports are not in {trt_reports_dir} and {more}")
    return fit.fixture_samples(trt_reports_dir)


def folder_of(s, trt_reports_dir):
    return trt_reports_dir if s.gpu == "a100" else trt_reports_dir.parent / "trt-engine-reports-more"


def by_name(sample, part: str) -> EngineLayer:
    return next(l for l in sample.layers if part in l.name)


def test_fixture_layers_read_precision_dims_and_conv_parameters(samples):
    s = {x.name: x for x in samples}
    fp32, fp16, residual = s["a100-resnet-fp32"], s["a100-resnet-fp16"], s["a100-resnet-qat-residual"]
    assert by_name(fp32, "Conv_3 + Relu_4").precision == "tf32"     # sm80_xmma_…_f32f32_tf32f32_f32…
    assert by_name(fp32, "Conv_0 + Relu_1").precision == "fp32"     # ampere_scudnn_… (SIMT)
    assert by_name(fp16, "Conv_3 + Relu_4").precision == "fp16"
    first = by_name(residual, "Conv_9 + MaxPool_12")                 # ConvActPool: conv fused with the max pool
    assert first.precision == "int8" and first.kernel == (7, 7) and first.attrs["conv_out"] == (112, 112)
    assert cost.flops(first) == 2 * 32 * 64 * 112 * 112 * 3 * 49
    assert first.outputs[0].dims == (32, 64, 56, 56) and first.outputs[0].vector == 32
    q = by_name(residual, "QuantizeLinear_2")
    assert q.is_reformat and q.layer_class == "reformat" and q.outputs[0].dtype == "int8"
    assert by_name(fp16, "MaxPool_2").inputs[0].vector == 8          # "Channel major FP16 … channel % 8 == 0"


def test_fixture_engines_carry_their_gpu(samples):
    assert [s.name for s in samples] == list(fit.FIXTURE_NAMES)
    assert {s.gpu for s in samples} == {"a100", "titanrtx"}
    assert all(s.gpu == ("titanrtx" if s.name.startswith("titanrtx") else "a100") for s in samples)


def test_tensorrt_82_qdq_scale_layers_read_as_reformats(samples):
    """TensorRT 8.2 ran Q/DQ as ``Scale`` layers: a quantize (float in, INT8 out) is a reformat to
    INT8, as the 8.4 engine's ``Reformat`` of the same node is, and the report parser agrees."""
    s = {x.name: x for x in samples}
    q82, q84 = by_name(s["titanrtx-mobilenetv2-qat-trt82"], "QuantizeLinear_98"), \
        by_name(s["titanrtx-mobilenetv2-qat-trt84"], "QuantizeLinear_98")
    assert q82.layer_type == "Scale" and q84.layer_type == "Reformat"
    for q in (q82, q84):
        assert q.layer_class == "reformat" and q.is_reformat and q.precision == "int8"
        assert q.outputs[0].dtype == "int8" and q.inputs[0].dims == (1, 24, 56, 56)
        assert cost.flops(q) == 0
    scales = [l for x in samples for l in x.layers if l.layer_type == "Scale"]
    assert len(scales) == 19 and all(l.layer_class == "reformat" and l.precision == "int8" for l in scales)
    # a plain Scale layer (no Q/DQ name, no INT8 side) stays elementwise
    raw = {"Name": "Mul_3", "LayerType": "Scale", "Inputs": [{"Name": "a", "Dimensions": [1, 8, 4, 4],
           "Format/Datatype": "Row major linear FP32"}], "Outputs": [{"Name": "b", "Dimensions": [1, 8, 4, 4],
           "Format/Datatype": "Row major linear FP32"}]}
    plain = layers.engine_layer(raw)
    assert plain.layer_class == "elementwise" and not plain.is_reformat and plain.precision == "fp32"


def test_tensorrt_8x_layers_of_the_titan_engines_read_class_precision_and_shape(samples):
    titan = [s for s in samples if s.gpu == "titanrtx"]
    allowed = {"conv_gemm", "pooling", "reformat", "other"}
    for s in titan:
        for l in s.layers:
            assert l.layer_class in allowed, (s.name, l.name, l.layer_type)
            assert l.precision in ("int8", "fp16", "fp32"), (s.name, l.name)
            assert l.inputs and l.outputs and all(t.dims for t in (*l.inputs, *l.outputs)), (s.name, l.name)
            if l.layer_class == "conv_gemm":
                assert l.precision == "int8" and l.kernel in ((1, 1), (3, 3)) and l.out_maps > 0, (s.name, l.name)
            if l.layer_type == "CudaDepthwiseConvolution":
                assert l.groups == l.inputs[0].dims[1] == l.out_maps and l.kernel == (3, 3)
                assert cost.input_channels(l) == 1 and cost.is_simt(l, l.precision)
    s = {x.name: x for x in samples}
    res84 = s["titanrtx-mobilenetv2res-qat-trt84"]
    dw = by_name(res84, "features.2.conv.1.0.weight")
    assert dw.layer_type == "CudaDepthwiseConvolution" and dw.groups == 96 and dw.attrs["stride"] == (2, 2)
    assert dw.outputs[0].dims == (1, 96, 56, 56) and cost.flops(dw) == 2 * 96 * 56 * 56 * 9
    # "turing_fp16_i8816cudnn_int8…": INT8 tensor-core math writing FP16; "…_simt" / sm70 INT8: CUDA cores
    proj = by_name(s["titanrtx-mobilenetv2-qat-trt84"], "features.8.conv.2.weight")
    assert proj.precision == "int8" and proj.outputs[0].dtype == "fp16" and not cost.is_simt(proj, "int8")
    assert cost.conv_tile(proj, TITAN, "int8") == ((128, 128),)
    fc = by_name(res84, "classifier.1.weight")
    assert fc.precision == "int8" and cost.is_simt(fc, "int8") and "_simt" in fc.attrs["tactic"]
    x = by_name(res84, "features.8.conv.0.0.weight")
    assert cost.conv_tile(x, TITAN, "int8") == ((64, 32),) and cost.conv_steps(x, TITAN, "int8") == (64, 1)
    fused = by_name(res84, "features.7.conv.2.weight")
    assert fused.layer_type == "FusedConvActConvolution" and fused.precision == "int8" and not fused.attrs["tactic"]
    gap84, gap82 = (next(l for l in x.layers if l.name.startswith("GlobalAveragePool"))
                    for x in (res84, s["titanrtx-mobilenetv2-qat-trt82"]))
    assert gap84.layer_type == "TiledPooling" and gap84.layer_class == "pooling" and gap84.kernel == (7, 7)
    assert gap84.precision == "fp16"                                       # no tactic: its input's type
    assert gap82.layer_type == "CaskPooling" and gap82.precision == "fp32"  # …pooling_fw_4d_FP32FP32NCHW…


def test_layer_count_and_order_match_the_report_parser(samples, trt_reports_dir):
    for s in samples:
        d = folder_of(s, trt_reports_dir)
        report = load_engine_report(d / f"{s.name}.graph.json", d / f"{s.name}.profile.json")
        assert [l.name for l in s.layers] == list(report.layers["name"])
        assert [l.is_reformat for l in s.layers] == list(report.layers["is_reformat"])
        assert s.total_ms == pytest.approx(report.total_ms)


def test_a_tensor_core_convolution_prices_as_tiles_on_the_sms():
    """Hand-checked tile model: the 1×1 960→160 projection of MobileNetV2 at 7×7, batch 1, with the
    TITAN RTX engine's tactic (64×32 tiles, k-step 64, one stage): 1·5 tiles on 72 SMs, so the
    busiest SM computes one tile of 64·32·960 multiply-adds at a 72nd of the peak, or waits 15
    k-steps of step_us, whichever is longer."""
    p = cost.FITTED
    tactic = ("sm75_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32_nchw_vect_c_32kcrs_vect_c_32_nchw_vect_c_32_"
              "tilesize64x32x64_stage1_warpsize2x1x1_g1_tensor8x8x16_simple_t1r1s1")
    layer = conv(n=1, c=960, h=7, k=160, p=7, r=1, dtype="int8", vector=32, precision="int8", tactic=tactic)
    b = cost.layer_breakdown(layer, TITAN)
    eff = p.compute_eff["conv_gemm"] * p.math_eff["int8"] * min(1.0, 960 / p.lowc_channels)
    throughput = 2 * 64 * 32 * 960 / (261e12 * eff / 72) * 1e3
    chain = 15 * p.step_us / 1e3
    assert b["compute_ms"] == pytest.approx(max(throughput, chain))
    assert b["compute_ms"] > 10 * cost.flops(layer) / (261e12 * eff) * 1e3   # far above flops / peak at batch 1
    # twice the reduction: twice the time; 73 tiles (one more wave) twice the busiest SM's work
    deeper = conv(n=1, c=1920, h=7, k=160, p=7, r=1, dtype="int8", vector=32, precision="int8", tactic=tactic)
    assert cost.layer_breakdown(deeper, TITAN)["compute_ms"] == pytest.approx(2 * b["compute_ms"])
    one_wave = conv(n=1, c=960, h=7, k=72 * 32, p=7, r=1, dtype="int8", vector=32, precision="int8", tactic=tactic)
    two_waves = conv(n=1, c=960, h=7, k=73 * 32, p=7, r=1, dtype="int8", vector=32, precision="int8", tactic=tactic)
    assert cost.layer_breakdown(one_wave, TITAN)["compute_ms"] == pytest.approx(b["compute_ms"])
    assert cost.layer_breakdown(two_waves, TITAN)["compute_ms"] == pytest.approx(2 * b["compute_ms"])
    # the model-1 documents (stored calibrations from before) price without tiles
    old = p.with_values(model=1)
    assert cost.layer_breakdown(layer, TITAN, old)["compute_ms"] == pytest.approx(
        cost.flops(layer) / (261e12 * eff) * 1e3)


def test_a_predicted_depthwise_convolution_runs_on_cuda_cores_and_costs_its_memory():
    """A depthwise convolution (one channel per group) fills 1/64 of each tensor-core tile: priced
    both ways (no tactic), the CUDA-core kernel wins, and the layer is near its memory time plus
    the launch; a dense 1×1 convolution of the same tensors stays on tensor cores."""
    dw = EngineLayer(name="dw", layer_type="CaskConvolution", layer_class="conv_gemm", precision="int8",
                     inputs=(Tensor("x", (1, 144, 56, 56), "int8", 32),),
                     outputs=(Tensor("y", (1, 144, 56, 56), "int8", 32),), kernel=(3, 3), groups=144,
                     out_maps=144, weights=144 * 9, weights_dtype="int8", bias=144)
    b = cost.layer_breakdown(dw, TITAN)
    assert b["simt"] and b["bound"] == "memory"
    tc = cost._compute_ms(dw, TITAN, cost.FITTED, "int8", simt=False)
    assert tc > 3 * b["compute_ms"]
    overhead = cost.FITTED.overhead_us["conv_gemm"] / 1e3
    assert b["ms"] < overhead + 3 * b["memory_ms"]
    dense = dataclasses.replace(dw, kernel=(1, 1), groups=1, weights=144 * 144)
    assert not cost.layer_breakdown(dense, TITAN)["simt"]
    # a layer read from an engine keeps its kernel: CudaDepthwiseConvolution is CUDA cores
    read = dataclasses.replace(dw, layer_type="CudaDepthwiseConvolution")
    assert cost.math_options(read, TITAN, cost.FITTED) == (("int8", True),)


def test_an_engine_report_alone_is_not_enough(samples, trt_reports_dir):
    report = load_engine_report(trt_reports_dir / "a100-resnet-fp16.graph.json")
    with pytest.raises(MixprecError, match="layer-info JSON"):
        layers.from_layer_info(report)


# --------------------------------------------------------------------- the fit

def test_the_shipped_fit_meets_the_targets_on_each_fixture(samples):
    rows = fit.evaluate(cost.FITTED, samples)
    assert [r["gpu"] for r in rows] == [s.gpu for s in samples]
    for row in rows:
        assert abs(row["total_err"]) <= 0.15, row
        assert row["median_abs_err"] <= 0.30, row


def test_refitting_the_fixtures_gives_the_shipped_parameters(samples):
    refit = fit.fit(samples)
    for mine, shipped in zip(fit.evaluate(refit, samples), fit.evaluate(cost.FITTED, samples)):
        assert mine["estimated_ms"] == pytest.approx(shipped["estimated_ms"], rel=0.01)
    assert refit.n_layers == sum(len(s.timed()) for s in samples)
    assert set(refit.fitted_on) == set(fit.FIXTURE_NAMES) and refit.gpu == "a100+titanrtx"
    assert refit.basis == cost.FIXTURE_BASIS == cost.FITTED.basis and refit.model == cost.CURRENT_MODEL
    assert "step_us" in refit.fitted and refit.step_us > 0
    # one parameter set: nothing per engine, per model or per GPU
    assert not [k for k in refit.fitted if any(n in k for n in ("a100", "titan", "resnet", "mobilenet"))]


def test_the_fit_reproduces_its_own_data(samples):
    """Times made by known parameters are fitted back: every layer's estimate matches them."""
    truth = dataclasses.replace(cost.FITTED, simt_eff=0.5, knee=2.0, int8_linear_out=0.5,
                                compute_eff={**cost.FITTED.compute_eff, "conv_gemm": 0.5},
                                memory_eff={**cost.FITTED.memory_eff, "pooling": 0.9, "reformat": 0.3},
                                overhead_us={**cost.FITTED.overhead_us, "conv_gemm": 5.0},
                                math_eff={**cost.FITTED.math_eff, "fp16": 1.4})
    made = [fit.Sample(s.name, s.layers, tuple(cost.layer_ms(l, A100, truth) for l in s.layers))
            for s in samples if s.gpu == "a100"]
    params = fit.fit(made)
    rel = [e for s in made for e in fit.errors(params, s, A100)[2]]
    assert np.median(np.abs(rel)) < 0.02 and np.max(np.abs(rel)) < 0.15
    assert params.math_eff["fp16"] == pytest.approx(1.4, rel=0.1)


def test_fp16_tensor_core_efficiency_is_fitted_apart_from_int8_and_tf32(samples):
    """The FP16 factor scales the FP16 tensor-core convolutions only; the shipped fit determined it
    from the data (the FP16 engine's convolutions run nearer their peak than one shared efficiency
    says) and it puts that engine within 5 %."""
    assert "math_eff[fp16]" in cost.FITTED.fitted and cost.FITTED.math_eff["int8"] == 1.0
    s = {x.name: x for x in samples}
    fp16_conv = by_name(s["a100-resnet-fp16"], "Conv_15")
    tf32_conv = by_name(s["a100-resnet-fp32"], "Conv_15")
    int8_conv = by_name(s["a100-resnet-qat-residual"], "layer3.0.conv2.weight")
    pool = by_name(s["a100-resnet-fp16"], "MaxPool_2")
    faster = cost.FITTED.with_values(math_eff={**cost.FITTED.math_eff, "fp16": 2 * cost.FITTED.math_eff["fp16"]})
    assert cost.layer_ms(fp16_conv, A100, faster) < cost.layer_ms(fp16_conv, A100)
    for layer in (tf32_conv, int8_conv, pool):
        assert cost.layer_ms(layer, A100, faster) == cost.layer_ms(layer, A100), layer.name
    fp16_row = next(r for r in fit.evaluate(cost.FITTED, samples) if r["engine"] == "a100-resnet-fp16")
    assert abs(fp16_row["total_err"]) <= 0.05, fp16_row
    # without the data to fit it (no FP16 convolution), the factor stays where it started
    int8_only = fit.fit([s["a100-resnet-qat-residual"]])
    assert "math_eff[fp16]" not in int8_only.fitted and int8_only.math_eff["fp16"] == cost.PRIOR.math_eff["fp16"]


def test_leave_one_out_and_leave_one_gpu_out_hold_back_what_they_score(samples, monkeypatch):
    """A small set (fast): one A100 engine and two TITAN RTX engines. Leave-one-out scores each
    engine with a fit on the two others; leave-one-gpu-out scores each GPU's engines with a fit on
    the other GPU's only, so the A100 fit prices the batch-1 engines through the GPU table."""
    # the fit is deterministic: a fit on the same engines (the two TITAN RTX ones: leave-one-out's first fold
    # and leave-one-gpu-out's A100 score; the A100 one alone: twice below) is made once
    fits, real_fit = {}, fit.fit

    def fit_once(train, gpu=None, start=None, **kw):
        key = (tuple(map(id, train)), id(gpu), id(start), tuple(sorted(kw.items())))
        if key not in fits:
            fits[key] = real_fit(train, gpu, start, **kw)
        return fits[key]

    monkeypatch.setattr(fit, "fit", fit_once)
    s = {x.name: x for x in samples}
    few = [s["a100-resnet-qat-residual"], s["titanrtx-mobilenetv2res-qat-trt84"], s["titanrtx-mobilenetv2-qat-trt84"]]
    loo = fit.leave_one_out(few)
    assert [r["engine"] for r in loo] == [x.name for x in few] and all(r["held_out"] for r in loo)
    assert [r["gpu"] for r in loo] == ["a100", "titanrtx", "titanrtx"]
    # the two TITAN RTX engines are alike: each predicts the other within 15 %
    assert all(abs(r["total_err"]) <= 0.15 for r in loo[1:]), loo
    logo = fit.leave_one_gpu_out(few)
    assert [r["engine"] for r in logo] == [x.name for x in few] and all(r["held_out"] for r in logo)
    only_a100 = fit.fit(few[:1])
    assert only_a100.gpu == "a100" and only_a100.fitted_on == ("a100-resnet-qat-residual",)
    assert logo[1]["estimated_ms"] == pytest.approx(fit.evaluate(only_a100, [few[1]])[0]["estimated_ms"])


def test_the_cached_validation_rows_are_current_and_meet_the_targets(samples):
    """``cnn_validation.json`` (bench/bench_trt_estimate.py --write-validation) was computed with the
    shipped parameters and the cost model as it is: its in-sample rows are what the shipped fit gives
    now. Every engine has its three rows; in-sample within 15 %, leave-one-engine-out within 25 %,
    per-layer medians of the batch-1 MobileNetV2 engines ≤ 30 %."""
    doc = fit.cached_validation()
    assert doc is not None, "regenerate it: .venv/bin/python bench/bench_trt_estimate.py --write-validation"
    assert doc["params"] == fit.cnn_signature(cost.FITTED), "stale: rerun bench/bench_trt_estimate.py --write-validation"
    rows = validation.check_rows(fit.validation_rows())
    assert rows == validation.check_rows(doc["rows"])
    now = {r["engine"]: r for r in fit.evaluate(cost.FITTED, samples)}
    for r in rows:
        assert r["source"] == "trtexec fixture" and r["family"] == "cnn" and r["seq"] is None
        assert r["gpu"] == next(s.gpu for s in samples if s.name == r["case"])
        assert r["arch"] == gpus.gpu(r["gpu"]).arch and r["batch"] == (32 if r["gpu"] == "a100" else 1)
        if r["split"] == "in-sample":
            assert r["estimated_ms"] == pytest.approx(now[r["case"]]["estimated_ms"], rel=1e-6), r["case"]
            assert abs(r["rel_err"]) <= 0.15 and not r["held_out"]
        if r["split"] == "leave-one-engine-out":
            assert abs(r["rel_err"]) <= 0.25 and r["held_out"]
        if r["model"] == "mobilenetv2" and r["split"] != "leave-one-gpu-out":
            assert r["median_layer_err"] <= 0.30
    for name in fit.FIXTURE_NAMES:
        assert sorted(r["split"] for r in rows if r["case"] == name) == sorted(fit.SPLITS)


# --------------------------------------------------------------------- the estimate moves the right way

def test_bigger_dims_cost_more(samples):
    fp16 = next(s for s in samples if s.name == "a100-resnet-fp16")
    for part in ("Conv_15", "MaxPool_2", "Reformatting CopyNode for Input Tensor 0 to Conv_0", "Gemm_48"):
        layer = by_name(fp16, part)
        base = cost.layer_ms(layer, A100)
        doubled = dataclasses.replace(
            layer, inputs=tuple(dataclasses.replace(t, dims=(2 * t.dims[0], *t.dims[1:])) for t in layer.inputs),
            outputs=tuple(dataclasses.replace(t, dims=(2 * t.dims[0], *t.dims[1:])) for t in layer.outputs))
        assert cost.layer_ms(doubled, A100) > base, part
    conv15 = by_name(fp16, "Conv_15")
    wider = dataclasses.replace(conv15, out_maps=2 * conv15.out_maps, weights=2 * conv15.weights, outputs=tuple(
        dataclasses.replace(t, dims=(t.dims[0], 2 * t.dims[1], *t.dims[2:])) for t in conv15.outputs))
    assert cost.layer_ms(wider, A100) > cost.layer_ms(conv15, A100)


def _with_precision(layer: EngineLayer, precision: str, dtype: str) -> EngineLayer:
    return dataclasses.replace(
        layer, precision=precision, weights_dtype=dtype, attrs={**layer.attrs, "tactic": ""},
        inputs=tuple(dataclasses.replace(t, dtype=dtype) for t in layer.inputs),
        outputs=tuple(dataclasses.replace(t, dtype=dtype) for t in layer.outputs))


def test_lower_precision_costs_less(samples):
    qat = next(s for s in samples if s.name == "a100-resnet-qat-residual")
    for part in ("layer1.1.conv1.weight", "layer3.0.conv2.weight", "layer4.1.conv1.weight"):
        int8 = by_name(qat, part)
        fp16 = _with_precision(int8, "fp16", "fp16")
        fp32 = _with_precision(int8, "fp32", "fp32")
        t8, t16, t32 = (cost.layer_ms(l, A100) for l in (int8, fp16, fp32))
        assert t8 < t16 < t32, part
        # --noTF32: an FP32 convolution loses the TF32 tensor cores
        assert cost.layer_ms(fp32, A100, tf32=False) > t32
        # on a GPU without TF32 (T4), tf32 makes no difference
        assert cost.layer_ms(fp32, "t4", tf32=False) == cost.layer_ms(fp32, "t4")


def test_tf32_reported_layer_follows_no_tf32(samples):
    fp32 = next(s for s in samples if s.name == "a100-resnet-fp32")
    layer = by_name(fp32, "Conv_26")
    assert layer.precision == "tf32"
    assert cost.layer_breakdown(layer, A100)["math"] == "tf32"
    assert cost.layer_breakdown(layer, A100, tf32=False)["math"] == "fp32"
    assert cost.layer_ms(layer, A100, tf32=False) > 2 * cost.layer_ms(layer, A100)


def test_a_faster_gpu_is_faster_and_fp16_accumulation_matters_on_geforce():
    layer = conv()
    assert cost.layer_ms(layer, "h100") < cost.layer_ms(layer, "a100") < cost.layer_ms(layer, "t4")
    acc32 = dataclasses.replace(layer, attrs={"tactic": "sm86_xmma_fprop_implicit_gemm_f16f16_f16f32_f32"})
    assert cost.layer_ms(acc32, "rtx4090") > cost.layer_ms(layer, "rtx4090")
    assert cost.layer_ms(acc32, "a100") == cost.layer_ms(layer, "a100")


# --------------------------------------------------------------------- GPU table

def test_gpu_table_holds_the_nine_gpus_with_dense_figures():
    keys = {"t4", "a10", "a100", "l4", "l40s", "h100", "rtx3090", "rtx4090", "orin"}
    assert keys <= set(gpus.GPUS)
    for g in gpus.GPUS.values():
        # Volta has no INT8 tensor cores: its INT8 is DP4A on the CUDA cores, below its FP16 tensor rate
        assert g.int8_tops >= g.fp16_acc16_tflops or g.arch == "volta"
        assert g.fp16_acc16_tflops >= g.fp16_tflops > 0 and g.bandwidth_gbs > 0 and g.sm_count > 0
        assert g.tf32_tflops is None or g.fp16_tflops >= g.tf32_tflops
        assert gpus.GPU.from_json(json.loads(json.dumps(g.to_json()))) == g
    assert gpus.gpu("t4").tf32_tflops is None and gpus.gpu("a100").tf32_tflops == 156.0
    assert gpus.gpu("h100").fp16_tflops == 989.5 and "fp16_tflops" in gpus.gpu("h100").halved
    assert gpus.gpu("NVIDIA A100-SXM4-80GB").key == "a100" and gpus.gpu("Tesla T4").key == "t4"
    assert gpus.gpu("NVIDIA GeForce RTX 4090").key == "rtx4090"
    with pytest.raises(MixprecError, match="No GPU named"):
        gpus.gpu("NVIDIA A10G")


# --------------------------------------------------------------------- calibration (§4) and its store

def test_calibrate_on_a_user_engine_and_store_it_per_gpu(samples, trt_reports_dir, tmp_path):
    pair = (trt_reports_dir / "a100-resnet-qat.graph.json", trt_reports_dir / "a100-resnet-qat.profile.json")
    params = fit.calibrate(pair, "NVIDIA A100-SXM4-80GB")
    assert params.basis == cost.CALIBRATION_BASIS and params.gpu == "a100"
    assert params.n_layers == len(next(s for s in samples if s.name == "a100-resnet-qat").timed())
    assert params.median_err <= 0.30 and params.held_out_err <= 0.30
    # labelled with its engine, GPU, classes and its held-out error (issue 23 §3), not the in-sample one
    assert params.label() == (f"calibrated on {params.n_layers} layers of a100-resnet-qat on the NVIDIA A100 80GB SXM: "
                              "convolution (21 layers), pooling (2), reformat (12); held-out median error "
                              f"{params.held_out_err * 100:.0f} % (5-fold over the engine's layers)")
    ws = Workspace(tmp_path)
    assert load_gpu_calibration(ws, "a100") is None
    save_gpu_calibration(ws, "a100", params)
    assert load_gpu_calibration(ws, "NVIDIA A100-SXM4-80GB") == params
    assert load_gpu_calibration(ws, "t4") is None
    gpu_calibration_path(ws, "a100").write_text("{not json")
    assert load_gpu_calibration(ws, "a100") is None
    gpu_calibration_path(ws, "a100").write_text(json.dumps({"kind": "something else"}))
    assert load_gpu_calibration(ws, "a100") is None


def test_calibration_needs_enough_timed_layers(samples):
    tiny = fit.Sample("tiny", samples[0].layers[:3], samples[0].times[:3])
    with pytest.raises(MixprecError, match="too few to calibrate"):
        fit.calibrate([tiny], "a100")


def test_the_launch_cost_runs_in_gpu_cycles_and_a_stored_calibration_keeps_its_pricing(samples, tmp_path):
    """Every class's fixed cost is given at REFERENCE_BOOST_MHZ and scales with 1 / boost clock (the
    TITAN RTX's 1770 MHz pays 1500/1770 of it, the A100's 1410 MHz 1500/1410); a GPU without clocks pays
    it as given. A calibration stored before (``model`` 2) still loads and prices the CNN classes'
    fixed cost unscaled, as it was fitted; its transformer classes scale as they always did."""
    p = cost.FITTED
    assert cost.REFERENCE_BOOST_MHZ == 1500.0
    for g in (TITAN, A100):
        for cls in ("conv_gemm", "pooling", "reformat", "transformer"):
            assert cost.overhead_scale(g, cls) == pytest.approx(1500.0 / g.boost_clock_mhz)
    noclock = dataclasses.replace(TITAN, base_clock_mhz=0.0, boost_clock_mhz=0.0)
    assert cost.overhead_scale(noclock, "conv_gemm") == 1.0
    dw = next(l for l in next(s for s in samples if s.name == "titanrtx-mobilenetv2-qat-trt84").layers
              if l.layer_type == "CudaDepthwiseConvolution")
    b = cost.layer_breakdown(dw, TITAN)
    assert b["overhead_ms"] == pytest.approx(p.overhead_us["conv_gemm"] / 1e3 * 1500.0 / 1770.0)
    assert cost.layer_breakdown(dw, noclock)["overhead_ms"] == pytest.approx(p.overhead_us["conv_gemm"] / 1e3)
    # a stored calibration of the model before (2): loads, prices the CNN fixed cost as fitted
    ws = Workspace(tmp_path / "ws")
    mine = p.with_values(basis=cost.CALIBRATION_BASIS, gpu="titanrtx", model=2, n_layers=57)
    save_gpu_calibration(ws, "titanrtx", mine)
    loaded = load_gpu_calibration(ws, "titanrtx")
    assert loaded == mine and loaded.model == 2 and loaded.label().startswith("calibrated on 57 layers")
    old = cost.layer_breakdown(dw, TITAN, loaded)
    assert old["overhead_ms"] == pytest.approx(p.overhead_us["conv_gemm"] / 1e3)
    assert old["ms"] - old["overhead_ms"] == pytest.approx(b["ms"] - b["overhead_ms"])
    assert cost.overhead_scale(TITAN, "transformer", 2) == pytest.approx(1500.0 / 1770.0)
    assert cost.overhead_scale(TITAN, "conv_gemm", 2) == 1.0


def test_cost_params_round_trip():
    doc = json.loads(json.dumps(cost.FITTED.to_json()))
    assert cost.CostParams.from_json(doc) == cost.FITTED
    # a stored document from before the per-math factor: one efficiency for every math, as fitted then
    old = {k: v for k, v in doc.items() if k != "math_eff"}
    assert cost.CostParams.from_json(old).math_eff == {"tf32": 1.0, "fp16": 1.0, "int8": 1.0}
    # and from before the tile model: priced as it was fitted (model 1, no k-step latency)
    older = {k: v for k, v in doc.items() if k not in ("model", "step_us")}
    assert cost.CostParams.from_json(older).model == 1 and cost.CostParams.from_json(older).step_us == 0.0
    assert cost.FITTED.model == cost.CURRENT_MODEL == 3
    with pytest.raises(MixprecError):
        cost.CostParams.from_json({**doc, "format_version": 99})
    assert cost.FITTED.label().startswith("fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)")
