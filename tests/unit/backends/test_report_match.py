"""Issue 23 §4 (core): an engine report matched to the project's model by ONNX node names ("N of M engine
layers are layers of this model"), and what a report says of the GPU it was built on: the name and compute
capability of trtexec's log or of TREx's device JSON (the layer info and the profile never say it: the
fixtures do not), and the least compute capability its kernels need (sm80_… in the A100 fixtures)."""
from __future__ import annotations

import json

import pytest
from onnx import TensorProto, helper

from core.backends.reports import (MIN_MATCH_SHARE, ReportDevice, engine_device, load_engine_report, match_model,
                                   match_nodes, node_names)
from core.errors import MixprecError
from core.estimate.fit import device_problem, gpus_for
from core.estimate.gpus import GPUS, gpu

FIXTURE_NAMES = [f"{op}_{i}" for i, op in enumerate(
    ["Conv", "Relu", "MaxPool"] + ["Conv", "Relu", "Conv", "Add", "Relu"] * 2
    + (["Conv", "Relu", "Conv", "Conv", "Add", "Relu", "Conv", "Relu", "Conv", "Add", "Relu"]) * 3
    + ["GlobalAveragePool", "Flatten", "Gemm"])]
LOG = """&&&& RUNNING TensorRT.trtexec [TensorRT v100800] # trtexec --onnx=model.onnx
[12/01/2026-10:00:00] [I] === Device Information ===
[12/01/2026-10:00:00] [I] Available Devices:
[12/01/2026-10:00:00] [I]   Device 0: "NVIDIA A100-SXM4-40GB" UUID: GPU-0b1d2c3e-0000-0000-0000-000000000000
[12/01/2026-10:00:00] [I] Selected Device: NVIDIA A100-SXM4-40GB
[12/01/2026-10:00:00] [I] Selected Device ID: 0
[12/01/2026-10:00:00] [I] Compute Capability: 8.0
[12/01/2026-10:00:00] [I] SMs: 108
"""


def report(trt_reports_dir, name: str):
    return load_engine_report(trt_reports_dir / f"{name}.graph.json", trt_reports_dir / f"{name}.profile.json")


def test_the_fixture_names_are_those_of_the_fp32_engine(trt_reports_dir):
    assert FIXTURE_NAMES[:3] == ["Conv_0", "Relu_1", "MaxPool_2"] and FIXTURE_NAMES[-1] == "Gemm_48"
    m = match_model(report(trt_reports_dir, "a100-resnet-fp32").layers, FIXTURE_NAMES)
    assert (m.layers, m.named, m.matched) == (32, 23, 23) and m.share == 1.0 and m.enough
    assert m.text() == ("23 of 23 engine layers are layers of this model (matched by ONNX node name; 9 more engine "
                        "layers — reformat copies, Q/DQ, TensorRT's own — name no node)")
    assert m.to_json()["enough"] is True


def test_a_report_of_another_model_matches_nothing(trt_reports_dir):
    minilm_like = ["/embeddings/word_embeddings/Gather", "/encoder/layer.0/attention/self/query/MatMul"]
    m = match_model(report(trt_reports_dir, "a100-resnet-qat").layers, minilm_like, "this model (sample:minilm)")
    assert (m.matched, m.named) == (0, 23) and not m.enough
    assert m.text().startswith("0 of 23 engine layers are layers of this model (sample:minilm)")
    assert m.unmatched[0] == "conv1.weight + QuantizeLinear_7 + Conv_9" and len(m.unmatched) == 5
    e = m.refusal("engine report a100-resnet-qat")
    assert isinstance(e, MixprecError)
    assert e.what.startswith("The engine report a100-resnet-qat is not of this model (sample:minilm): 0 of its 23")
    assert "built from this model's ONNX" in e.fix and e.details[0].startswith("not in the model: conv1.weight")
    # a report with a few of the model's layers is still another model's
    few = match_model(report(trt_reports_dir, "a100-resnet-fp32").layers, FIXTURE_NAMES[:6])
    assert 0 < few.matched and few.share < MIN_MATCH_SHARE and not few.enough


def test_myelin_regions_and_unnamed_nodes_match():
    m = match_nodes([("{ForeignNode[/embeddings/Add.../encoder/layer.0/output/LayerNorm/Add_1]}",
                      ["{ForeignNode[/embeddings/Add.../encoder/layer.0/output/LayerNorm/Add_1]}"]),
                     ("Reformatting CopyNode for Input Tensor 0 to x", []),
                     ("node_of_y", ["node_of_y"])],
                    ["/embeddings/Add", "node_of_y"])
    assert (m.layers, m.named, m.matched) == (3, 2, 2)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"], name="neg")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    assert node_names(helper.make_model(graph).graph) == ["node_of_y", "neg"]


def test_the_fixtures_do_not_name_their_gpu_but_their_kernels_bound_it(trt_reports_dir):
    a100 = engine_device(trt_reports_dir / "a100-resnet-fp16.graph.json", trt_reports_dir / "a100-resnet-fp16.profile.json")
    assert not a100.named and a100.capability is None and a100.min_capability == (8, 0)
    assert a100.kernel.startswith("sm80_xmma_fprop")
    assert a100.text().startswith("the report does not name its GPU; its kernels (sm80_xmma_fprop")
    assert a100.text().endswith("need compute capability 8.0 or later")
    more = trt_reports_dir.parent / "trt-engine-reports-more"
    titan = engine_device(more / "titanrtx-mobilenetv2-qat-trt84.graph.json")
    assert not titan.named and titan.min_capability == (7, 5)
    # GPUs the A100 engine can be of: none older than Ampere
    fits = gpus_for(a100, GPUS)
    assert "a100" in fits and "l4" in fits and "h100" in fits
    assert not {"t4", "titanrtx", "v100", "rtx2080ti"} & set(fits)
    assert device_problem(a100, gpu("t4")).startswith("the engine runs kernels built for compute capability 8.0 or later")
    assert set(gpus_for(titan, GPUS)) >= {"t4", "titanrtx", "a100"} and "v100" not in gpus_for(titan, GPUS)


def test_a_trtexec_log_names_the_gpu(trt_reports_dir, tmp_path):
    graph = trt_reports_dir / "a100-resnet-qat.graph.json"
    log = tmp_path / "trtexec.log"
    log.write_text(LOG)
    for source in (log, LOG.encode(), LOG):
        d = engine_device(graph, None, source)
        assert d.name == "NVIDIA A100-SXM4-40GB" and d.capability == (8, 0) and d.min_capability == (8, 0)
        assert d.source == 'trtexec log, "Selected Device"'
    assert d.text() == ('the report names its GPU: NVIDIA A100-SXM4-40GB (trtexec log, "Selected Device", '
                        "compute capability 8.0)")
    assert gpu(d.name).key == "a100-40gb" and gpus_for(d, GPUS) == ["a100-40gb"]
    assert device_problem(d, gpu("a100")) == ('the engine was built on the NVIDIA A100-SXM4-40GB (trtexec log, '
                                              '"Selected Device"), not on the NVIDIA A100 80GB SXM')
    assert device_problem(d, gpu("a100-40gb")) is None
    # a name not in the table still bounds the GPU by its stated compute capability
    other = ReportDevice(name="NVIDIA RTX 6000 Ada Generation", source="trtexec log", capability=(8, 9))
    assert device_problem(other, gpu("a100")).startswith("the engine's GPU has compute capability 8.9")
    assert device_problem(other, gpu("l40s")) is None
    with pytest.raises(MixprecError, match="Cannot read the log"):
        engine_device(graph, None, tmp_path / "missing.log")


def test_trex_device_json_names_the_gpu(trt_reports_dir, tmp_path):
    graph = trt_reports_dir / "a100-resnet-fp16.graph.json"
    meta = {"model_options": {}, "build_options": {},
            "device_information": {"Selected Device": "NVIDIA T4", "Compute Capability": 7.5, "SMs": 40.0}}
    d = engine_device(graph, None, json.dumps(meta).encode())
    assert (d.name, d.capability, d.source) == ("NVIDIA T4", (7, 5), "device information JSON")
    # trex's device_info.py: a list of devices
    d = engine_device(graph, None, json.dumps([{"Name": "NVIDIA L4", "ComputeCapability": [8, 9]}]).encode())
    assert (d.name, d.capability) == ("NVIDIA L4", (8, 9)) and gpus_for(d, GPUS) == ["l4"]
    # a layer-info JSON carrying device information (not trtexec's own) is read too
    doc = json.loads(graph.read_text())
    doc["device_information"] = {"Selected Device": "NVIDIA A10"}
    assert engine_device(doc).name == "NVIDIA A10"
