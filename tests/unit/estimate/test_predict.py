"""The policy-level predictor (issue 12 §3, §5): the engine TensorRT would build for a policy —
fusions, precisions, reformats — checked against the real A100 engines of ResNet-18 at batch 32
(``../shared/fixtures/trt-engine-reports``), the four acceptance policies' totals and order, a
boundary that adds a reformat, the labels of the estimate in the CLI JSON, and the search's
estimated-TensorRT objective where TensorRT is not available."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from core.cli.commands import main as cli_main
from core.estimate import cost
from core.estimate.fusion import fuse, static_net
from core.estimate.predict import PREDICTION_COLUMNS, Prediction, placeholder_calibration, predict
from core.quant.compile import compile_policy
from core.backends.reports import load_engine_report
from core.quant.policy import uniform_policy

SHAPES = {"input": (32, 3, 224, 224)}
# the four policies and the fixture engine each is compared with
POLICIES = {"fp32": "a100-resnet-fp32", "fp16": "a100-resnet-fp16", "int8-conv": "a100-resnet-qat",
            "int8-conv-residual": "a100-resnet-qat-residual"}
INT8_OPS = {"int8-conv": {"Conv", "Gemm"}, "int8-conv-residual": {"Conv", "Gemm", "Add"}}


@pytest.fixture(scope="module")
def resnet(resnet18_b32):
    return resnet18_b32


def resnet_policy(model, layers, name: str):
    """fp32 / fp16: every layer; int8-*: those ops INT8, everything else FP16 (the issue's wording)."""
    if name in ("fp32", "fp16"):
        return uniform_policy(model, layers, name)
    return uniform_policy(model, layers, "fp16").with_layers(
        {l.name: "int8" for l in layers if l.op_type in INT8_OPS[name]})


@pytest.fixture(scope="module")
def predictions(resnet):
    model, layers = resnet
    return {name: predict(model, resnet_policy(model, layers, name), SHAPES, "a100") for name in POLICIES}


def fixture_report(trt_reports_dir: Path, name: str):
    return load_engine_report(trt_reports_dir / f"{name}.graph.json", trt_reports_dir / f"{name}.profile.json")


def by_class(pred: Prediction, cls: str):
    return pred.layers[pred.layers.layer_class == cls]


# ------------------------------------------------------------------- structure vs the real engines

def test_fp32_fp16_and_int8_without_residual_reproduce_the_fixture_engines(predictions, trt_reports_dir):
    """Same number of convolution layers and of reformats as TensorRT built (Conv+Add+Relu fused,
    the fp32 first layer's linear output reformatted once, fp16's input/output casts, the qat
    engine's 12: input Q, MaxPool's format copy and Q, a Q after every block, GAP's copy and Q)."""
    for name in ("fp32", "fp16", "int8-conv"):
        pred, real = predictions[name], fixture_report(trt_reports_dir, POLICIES[name])
        real_convs = real.layers[real.layers.layer_type.str.contains("Convolution|ConvActPool")]
        assert len(by_class(pred, "conv_gemm")) == len(real_convs), name
        assert pred.reformat_count == real.reformat.count, name
        assert by_class(pred, "elementwise").empty, f"{name}: every residual Add fuses into a convolution"
        blocks = [nodes for nodes in pred.layers.onnx_nodes if any(n.endswith("/Add") for n in nodes)]
        assert len(blocks) == 8 and all(any(n.endswith("/Conv") for n in nodes) for nodes in blocks), name
    assert set(by_class(predictions["int8-conv"], "conv_gemm").precision) == {"int8"}
    assert set(by_class(predictions["fp16"], "conv_gemm").precision) == {"fp16"}


def test_int8_residual_fuses_into_int8_convolutions_and_drops_the_block_reformats(predictions):
    """With the residual Adds INT8 (their skip input quantized) each block writes int8 straight into
    the next: no reformat between blocks (the qat-residual engine), the first conv takes the MaxPool
    (ConvActPool); only the network's ends reformat."""
    pred, plain = predictions["int8-conv-residual"], predictions["int8-conv"]
    engine = pred.engine
    assert any(l.layer_type == "ConvActPool" for l in engine)
    blocks = [l for l in engine if any(n.endswith("/conv2/Conv") for n in l.onnx_nodes)]
    assert len(blocks) == 8 and all(l.outputs[0].dtype == "int8" for l in blocks[:-1])
    assert all(l.inputs[-1].dtype == "int8" for l in blocks[:-1]), "the quantized residual is read as int8"
    reformat_nodes = [n for nodes in pred.layers.onnx_nodes[pred.layers.is_reformat] for n in nodes]
    inner = [n for n in reformat_nodes if any(f"/layer{i}/" in n for i in (1, 2, 3))]
    assert inner == [], f"reformats between blocks: {inner}"
    assert pred.reformat_count < plain.reformat_count and pred.total_ms < plain.total_ms


def test_a_pool_after_the_int8_first_layer_runs_fp32_as_the_qat_engine_does(predictions, trt_reports_dir):
    """INT8 convolutions with everything else FP16: the 3-channel first convolution (DP4A) writes a
    linear float output, which TensorRT's INT8 kernels write in FP32 only, so the MaxPool runs FP32 and
    one reformat after it converts to FP16 for both its readers (the QuantizeLinear and the residual Add):
    the qat fixture's Conv_9, MaxPool_12 (95 µs) and its output reformat. This keeps the policy in
    TensorRT's order by more than half the measured margin over all-FP16."""
    pred, real = predictions["int8-conv"], fixture_report(trt_reports_dir, POLICIES["int8-conv"])
    engine = pred.engine
    k = next(i for i, l in enumerate(engine) if l.layer_class == "pooling")
    conv, pool, copy = engine[k - 1], engine[k], engine[k + 1]
    assert conv.precision == "int8" and conv.outputs[0].dtype == "fp32" and conv.outputs[0].vector == 1
    assert pool.precision == "fp32" and pool.inputs[0].dtype == pool.outputs[0].dtype == "fp32"
    assert copy.is_reformat and copy.name == "Reformatting CopyNode for Output Tensor 0 to /maxpool/MaxPool"
    assert (copy.inputs[0].dtype, copy.outputs[0].dtype, copy.outputs[0].vector) == ("fp32", "fp16", 32)
    readers = [l for l in engine if any(t.name == copy.outputs[0].name for t in l.inputs)]
    assert len(readers) == 2 and {l.is_reformat for l in readers} == {True, False}  # the Q, the residual Add
    measured_pool = real.layers[real.layers.name == "MaxPool_12"].time_ms.iloc[0]
    assert pool.precision == real.layers[real.layers.name == "MaxPool_12"].precision.iloc[0].lower()
    assert cost.layer_ms(pool, "a100") == pytest.approx(measured_pool, rel=0.20)
    # the FP16 policy's MaxPool reads the FP16 convolution's output: FP16, no reformat after it
    fp16 = predictions["fp16"].engine
    assert next(l for l in fp16 if l.layer_class == "pooling").precision == "fp16"
    margin = fixture_report(trt_reports_dir, "a100-resnet-qat").total_ms - \
        fixture_report(trt_reports_dir, "a100-resnet-fp16").total_ms
    assert pred.total_ms - predictions["fp16"].total_ms > 0.5 * margin


def test_int8_pooling_too_reproduces_the_qgap_engine(resnet, trt_reports_dir):
    """Pooling INT8 as well (the qat-residual-qgap placement): the GAP runs INT8 between the last
    block and the fc, leaving only the network input's quantization as a reformat."""
    model, layers = resnet
    policy = resnet_policy(model, layers, "int8-conv-residual").with_layers(
        {l.name: "int8" for l in layers if l.op_type in ("MaxPool", "GlobalAveragePool")})
    pred = predict(model, policy, SHAPES, "a100")
    real = fixture_report(trt_reports_dir, "a100-resnet-qat-residual-qgap")
    assert pred.reformat_count == real.reformat.count
    assert set(by_class(pred, "pooling").precision) == {"int8"}
    assert pred.total_ms == pytest.approx(real.total_ms, rel=0.20)


def test_four_policies_totals_within_20_percent_and_in_the_measured_order(predictions, trt_reports_dir):
    measured = {name: fixture_report(trt_reports_dir, POLICIES[name]).total_ms for name in POLICIES}
    for name, pred in predictions.items():
        assert pred.total_ms == pytest.approx(measured[name], rel=0.20), name
    order = sorted(POLICIES, key=lambda n: -measured[n])
    assert order == ["fp32", "int8-conv", "fp16", "int8-conv-residual"]
    assert sorted(POLICIES, key=lambda n: -predictions[n].total_ms) == order


def test_a_policy_change_that_adds_a_boundary_adds_a_predicted_reformat(resnet):
    """One block's first conv back to FP16 in the all-INT8 default: its input and output now cross
    INT8↔FP16, each a reformat the all-INT8 engine did not have."""
    model, layers = resnet
    base = uniform_policy(model, layers, "fp16").with_layers(
        {l.name: "int8" for l in layers if l.op_type in INT8_OPS["int8-conv-residual"]})
    layer = "/layer3/layer3.1/conv1/Conv"
    before = predict(model, base, SHAPES, "a100")
    after = predict(model, base.with_layers({layer: "fp16"}), SHAPES, "a100")
    assert after.reformat_count >= before.reformat_count + 2
    fp16 = after.layers[after.layers.onnx_nodes.apply(lambda nodes: layer in nodes)]
    assert list(fp16.precision) == ["fp16"]
    assert after.total_ms > before.total_ms


def test_the_prediction_works_from_the_compiled_trt_model(resnet):
    """Every Q/DQ/Cast of the compiled ``trt`` model is in exactly one predicted layer (fused or a
    reformat) and every convolution is in one layer: nothing is lost or counted twice."""
    model, layers = resnet
    policy = resnet_policy(model, layers, "int8-conv")
    compiled = compile_policy(model, policy, placeholder_calibration(model, policy), target="trt")
    net = static_net(compiled.proto, SHAPES)
    groups = fuse(net)
    seen = [k for g in groups for k in g.nodes]
    assert len(seen) == len(set(seen))
    live = {k for k, n in enumerate(net.nodes) if n.op_type in ("QuantizeLinear", "Cast", "Conv", "Gemm")
            and any(net.live(o) for o in n.output)}
    assert live <= set(seen)


def test_gpus_order_and_tf32(predictions, resnet):
    model, layers = resnet
    policy = resnet_policy(model, layers, "fp32")
    t4, h100 = (predict(model, policy, SHAPES, g) for g in ("t4", "h100"))
    assert t4.total_ms > predictions["fp32"].total_ms > h100.total_ms
    no_tf32 = predict(model, policy, SHAPES, "a100", tf32=False)
    assert no_tf32.total_ms > 1.5 * predictions["fp32"].total_ms  # FP32 SIMT vs TF32 tensor cores


# ------------------------------------------------------------------- the record, the CLI

def test_prediction_record_round_trips_and_is_labelled(predictions):
    pred = predictions["int8-conv"]
    doc = json.loads(json.dumps(pred.to_json()))
    assert doc["label"] == "estimate" and doc["gpu"]["key"] == "a100" and doc["basis"] == cost.FIXTURE_BASIS
    back = Prediction.from_json(doc)
    assert list(back.layers.columns) == PREDICTION_COLUMNS
    assert back.total_ms == pytest.approx(pred.total_ms) and back.reformat_count == pred.reformat_count
    assert "estimated TensorRT time on NVIDIA A100" in pred.caption()


def test_every_prediction_carries_its_band_and_older_documents_get_one(predictions, resnet):
    """The band of an A100 CNN estimate rests on the held-out A100 engines (the fit saw the A100: its
    leave-one-engine-out cases, not the leave-one-gpu-out ones); on a Hopper GPU, where no engine was
    validated, it says "unvalidated" and is the widest CNN spread on GPUs the fit did not see. A stored prediction
    of format 1 (before the band) is read, with its band computed from its layers and GPU."""
    from core.estimate import validation

    pred = predictions["int8-conv"]
    spread = validation.shipped().spreads()[("cnn", "this-gpu", "a100")]
    assert pred.band.status == "validated" and pred.band.arch == "ampere" and spread.held_out
    assert pred.band.bases == (("cnn", "this-gpu"),) and spread.splits == ("leave-one-engine-out",)
    assert pred.band.log_spread == pytest.approx(spread.log_spread)
    assert pred.low_ms < pred.total_ms < pred.high_ms
    assert pred.estimate_text() == (f"{validation.sig(pred.total_ms)} ms, likely {pred.band.range_text()} "
                                    "(held-out engines on this GPU)")
    assert pred.estimate_text() in pred.caption() and "held-out cases: a100" in pred.caption()
    doc = json.loads(json.dumps(pred.to_json()))
    assert doc["format_version"] == 2 and doc["band"]["status"] == "validated"
    assert (doc["band"]["low_ms"], doc["band"]["high_ms"]) == pytest.approx((pred.low_ms, pred.high_ms))
    assert Prediction.from_json(doc).band == pred.band
    old = {k: v for k, v in doc.items() if k not in ("band", "estimate_text")} | {"format_version": 1}
    assert Prediction.from_json(old).band == pred.band
    model, layers = resnet
    h100 = predict(model, resnet_policy(model, layers, "int8-conv"), SHAPES, "h100")
    assert h100.band_status == "unvalidated" and "unvalidated on Hopper GPUs: likely" in h100.caption()
    assert h100.band.log_spread == pytest.approx(validation.shipped().widest("cnn"))


def test_cli_estimate_json_is_labelled_with_gpu_and_basis(capsys, tmp_path, monkeypatch):
    from core.store.results import save_gpu_calibration

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "t4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["label"] == "estimate" and doc["gpu"] == {"key": "t4", "name": "NVIDIA T4"}
    assert doc["basis"] == cost.FIXTURE_BASIS and doc["layers"]["columns"] == PREDICTION_COLUMNS
    assert doc["total_ms"] == pytest.approx(sum(r[3] for r in doc["layers"]["rows"]))
    from core.workspace import Workspace

    mine = cost.FITTED.with_values(basis=cost.CALIBRATION_BASIS, gpu="t4", n_layers=21, median_err=0.07)
    save_gpu_calibration(Workspace(tmp_path / "ws"), "t4", mine)
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "t4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["basis"] == "your calibration" and "calibrated on 21 layers of your engine" in doc["basis_detail"]
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "t4"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ESTIMATE (not measured): estimated TensorRT time on NVIDIA T4")
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "no-such-gpu"]) == 2


def test_cli_estimate_prints_the_band_in_its_text_and_json(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "a100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    band = doc["band"]
    assert band["status"] == "validated" and band["arch"] == "ampere"
    assert band["low_ms"] < doc["total_ms"] < band["high_ms"] and band["pct"] > 0
    assert doc["estimate_text"].endswith(f"likely {band['text'].removeprefix('likely ')}")
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "h100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["band"]["status"] == "unvalidated" and "unvalidated on Hopper GPUs: likely" in doc["estimate_text"]
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "h100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "unvalidated on Hopper GPUs: likely" in first and "no validation case on Hopper GPUs" in first


# ------------------------------------------------------------------- the search

def test_search_for_tensorrt_without_tensorrt_ranks_by_the_estimate(tiny_cnn):
    """Target TensorRT, TensorRT absent: every candidate's est_ms is the predicted engine time of its
    policy on the configured GPU, and the verdict says so (not CPU ms, not the MAC share)."""
    from core.search import SearchConfig, search
    from core.search.result import candidate_policy
    from core.search.searcher import MAC_SHARE_NOTE, search_objective

    assert search_objective("auto", "tensorrt", "onnxruntime") == "trt_estimate"
    assert search_objective("auto", "tensorrt", "tensorrt") == "latency"
    p = replace(tiny_cnn, target="tensorrt")
    r = search(p, SearchConfig("cosine_mean>=0.9", methods=("minmax",), workers=1, verify=False, gpu="t4"))
    assert r.objective == "trt_estimate" and "estimated TensorRT ms on the NVIDIA T4" in r.message
    assert MAC_SHARE_NOTE not in r.message and "NVIDIA T4" in r.latency_label
    for _, row in r.candidates.iterrows():
        pol = candidate_policy(r.variants, row)
        assert row.est_ms == pytest.approx(predict(p.model, pol, p.input_shapes, "t4").total_ms)


def test_search_falls_back_to_the_mac_share_when_the_estimate_fails(tiny_cnn, monkeypatch):
    import core.search.searcher as searcher
    from core.errors import MixprecError
    from core.search import SearchConfig, search

    def fail(*a, **k):
        raise MixprecError("shape inference failed on the compiled model", "give every dim a value")

    monkeypatch.setattr(searcher, "estimated_latency", fail)
    r = search(replace(tiny_cnn, target="tensorrt"),
               SearchConfig("cosine_mean>=0.9", methods=("minmax",), workers=1, verify=False))
    assert r.objective == "mac_share" and searcher.MAC_SHARE_NOTE in r.message
    assert "the TensorRT estimate could not be made (shape inference failed" in r.message


# ------------------------------------------------------------------- the search's GPU (CLI and job)

@pytest.fixture(scope="module")
def search_ws(tmp_path_factory) -> Path:
    """The workspace of the CLI searches below: the second finds the first's calibrations, isolated rankings and
    switchable models of tiny-cnn in its caches (a stored T4 calibration does not touch its A100 search)."""
    return tmp_path_factory.mktemp("search-ws") / "ws"


def _t4_calibration():
    return cost.FITTED.with_values(basis=cost.CALIBRATION_BASIS, gpu="t4", n_layers=21, median_err=0.07)


def test_cli_search_estimates_on_the_chosen_gpu_with_its_stored_calibration(capsys, search_ws, monkeypatch):
    import core.cli.commands as cli
    from core.store.results import save_gpu_calibration
    from core.workspace import Workspace

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(search_ws))
    save_gpu_calibration(Workspace(search_ws), "t4", _t4_calibration())
    seen = []
    real_search = cli.search

    def spy(project, config, **kw):
        seen.append(config)
        return real_search(project, config, **kw)

    monkeypatch.setattr(cli, "search", spy)
    argv = ["search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.9", "--workers", "1", "--gpu", "t4", "--json"]
    assert cli_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert seen[0].gpu == "t4" and seen[0].cost_params == _t4_calibration()
    assert doc["objective"] == "trt_estimate" and doc["gpu"] == "t4"
    assert "NVIDIA T4" in doc["latency_label"] and "calibrated on 21 layers of your engine" in doc["latency_label"]
    cols = doc["candidates"]["columns"]  # every candidate's band (Turing: the TITAN RTX engines' spread)
    low, high, est = (cols.index(c) for c in ("est_low_ms", "est_high_ms", "est_ms"))
    assert all(r[low] < r[est] < r[high] for r in doc["candidates"]["rows"])
    assert "estimated TensorRT time" in doc["message"] and ", likely " in doc["message"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv[:-3] + ["--gpu", "no-such-gpu"])


def test_cli_search_json_reports_the_mac_share_fallback_as_its_objective(capsys, search_ws, monkeypatch):
    """The estimate fails → the search ranks by the MAC share; the CLI's JSON must say so (it used to
    relabel every TensorRT-target search without TensorRT as ``trt_estimate``)."""
    import core.search.searcher as searcher
    from core.errors import MixprecError

    def fail(*a, **k):
        raise MixprecError("shape inference failed on the compiled model", "give every dim a value")

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(search_ws))
    monkeypatch.setattr(searcher, "estimated_latency", fail)
    assert cli_main(["search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.9", "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["objective"] == "mac_share" and searcher.MAC_SHARE_NOTE in doc["message"]


def test_search_job_carries_the_gpu_and_its_stored_calibration(tmp_path, monkeypatch, tiny_cnn_sample):
    import core.jobs.kinds as kinds
    from core.errors import MixprecError
    from core.jobs import search_params
    from core.store.results import save_gpu_calibration
    from core.workspace import Workspace

    params = search_params("sample:tiny-cnn", budget="cosine_mean>=0.9", gpu="Tesla T4")
    assert params["gpu"] == "t4" and search_params("sample:tiny-cnn")["gpu"] == "a100"
    with pytest.raises(MixprecError, match="No GPU named"):
        search_params("sample:tiny-cnn", gpu="no-such-gpu")
    ws = Workspace(tmp_path / "ws")
    seen = []
    monkeypatch.setattr(kinds, "search", lambda project, config, **kw: seen.append(config) or "result")
    monkeypatch.setattr(kinds, "save_search", lambda ws, project, result, smooth, gpu=None, metrics=None: tmp_path / "search.json")
    kinds.run_search(params, ws, lambda f, t="": None)
    assert seen[-1].gpu == "t4" and seen[-1].cost_params is None  # nothing stored: the fixture fit
    save_gpu_calibration(ws, "t4", _t4_calibration())
    kinds.run_search(params, ws, lambda f, t="": None)
    assert seen[-1].cost_params == _t4_calibration()
    old = {k: v for k, v in params.items() if k != "gpu"}  # a job submitted before the field existed
    kinds.run_search(old, ws, lambda f, t="": None)
    assert seen[-1].gpu == "a100"
