"""core.backends.reports and its charts in core.display.charts, on the real A100 trtexec reports in shared/fixtures.

Uploads (file contents as bytes) are read with ``load_engine_report``: ``EngineReport.from_bytes``, which only
these tests used, was removed as dead code (issue 9); the tests of it now call ``load_engine_report`` on the
same bytes."""
from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import pytest

from core.backends.reports import (
                                   LAYER_COLUMNS, NEIGHBOUR_COLUMNS, PRECISION_COLUMNS, REFORMAT_COLUMNS, TYPE_COLUMNS,
                                   EngineReport, datatype, load_engine_report, onnx_names, reformat_table,
                                   )
from core.display.charts import (
                                 plot_latency_by_type, plot_layer_latency, plot_precision_distribution, plot_reformat_overhead,
                                 )
from core.errors import MixprecError

RUNS = ["fp32", "fp16", "qat", "qat-residual", "qat-residual-qgap"]
# run: (layers, reformat layers, reformat ms, per-layer sum ms, NoOp CopyNodes, layers by precision)
EXPECTED = {
    "fp32": (32, 1, 0.045056, 2.123776, 7, {"FP32": 32}),
    "fp16": (36, 2, 0.088064, 1.016832, 10, {"FP16": 35, "FP32": 1}),
    "qat": (37, 12, 0.278528, 1.09568, 1, {"INT8": 32, "FP16": 3, "FP32": 2}),
    "qat-residual": (26, 3, 0.115712, 0.731136, 0, {"INT8": 23, "FP32": 3}),
    "qat-residual-qgap": (24, 1, 0.095232, 0.672768, 0, {"INT8": 23, "FP32": 1}),
}


def paths(d, run):
    return d / f"a100-resnet-{run}.graph.json", d / f"a100-resnet-{run}.profile.json"


def raw(d, run):
    graph, profile = paths(d, run)
    return json.loads(graph.read_text()), json.loads(profile.read_text())


@pytest.fixture(scope="module")
def reports(trt_reports_dir) -> dict[str, EngineReport]:
    return {run: load_engine_report(*paths(trt_reports_dir, run)) for run in RUNS}


# ---------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("run", RUNS)
def test_layers_match_the_files(run, reports, trt_reports_dir):
    graph, profile = raw(trt_reports_dir, run)
    records = profile[1:]
    layers = reports[run].layers
    assert list(layers.columns) == LAYER_COLUMNS
    assert reports[run].name == f"a100-resnet-{run}"
    assert reports[run].profiled_runs == profile[0]["count"] == 1
    assert layers["name"].tolist() == [layer["Name"] for layer in graph["Layers"]]
    assert layers["layer_type"].tolist() == [layer["LayerType"] for layer in graph["Layers"]]
    assert layers["time_ms"].tolist() == [r["averageMs"] for r in records]
    assert layers["median_ms"].tolist() == [r["medianMs"] for r in records]
    # pct is the share of the per-layer sum: trtexec's own "percentage" agrees to its 6 digits.
    assert layers["pct"].sum() == pytest.approx(100)
    assert (layers["pct"] - [r["percentage"] for r in records]).abs().max() < 1e-4
    assert layers["in_formats"].tolist() == [
        [t["Format/Datatype"] for t in layer["Inputs"]] for layer in graph["Layers"]]


@pytest.mark.parametrize("run", RUNS)
def test_reformat_and_precision_numbers(run, reports):
    n_layers, count, ms, total, elided, by_precision = EXPECTED[run]
    report = reports[run]
    assert len(report.layers) == n_layers
    summary = report.reformat
    assert (summary.count, summary.elided) == (count, elided)
    assert summary.ms == pytest.approx(ms, abs=1e-9)
    assert summary.total_ms == pytest.approx(total, abs=1e-9) == report.total_ms
    assert summary.pct == pytest.approx(ms / total * 100)
    table = report.precision_distribution()
    assert list(table.columns) == PRECISION_COLUMNS
    assert dict(zip(table["precision"], table["layers"])) == by_precision
    assert table["time_ms"].sum() == pytest.approx(total)
    types = report.latency_by_type()
    assert list(types.columns) == TYPE_COLUMNS
    assert types.loc[types["layer_type"] == "Reformat", "time_ms"].sum() == pytest.approx(ms)


def test_acceptance_numbers(reports):
    qat = reports["qat"].reformat
    assert (len(reports["qat"].layers), qat.count) == (37, 12)
    assert (round(qat.ms, 4), round(qat.total_ms, 4), round(qat.pct, 1)) == (0.2785, 1.0957, 25.4)
    fp16 = reports["fp16"].reformat
    assert (fp16.count, round(fp16.pct, 1)) == (2, 8.7)


def test_noop_copy_nodes_are_not_reformats(reports):
    layers = reports["fp32"].layers
    copies = layers[layers["name"].str.startswith("Reformatting CopyNode")]
    assert len(copies) == 8
    assert copies["is_reformat"].sum() == 1
    assert copies.loc[~copies["is_reformat"], "layer_type"].eq("NoOp").all()
    assert copies.loc[~copies["is_reformat"], "time_ms"].eq(0).all()


def _expected_precision(layer: dict) -> str:
    tensors = layer["Outputs"] if layer["LayerType"] == "Reformat" else layer["Inputs"]
    fmt = tensors[0]["Format/Datatype"]
    return next(p for key, p in (("Int8", "INT8"), ("FP16", "FP16"), ("FP32", "FP32")) if key in fmt)


@pytest.mark.parametrize("run", RUNS)
def test_precision_follows_format_datatype(run, reports, trt_reports_dir):
    graph, _ = raw(trt_reports_dir, run)
    assert reports[run].layers["precision"].tolist() == [_expected_precision(x) for x in graph["Layers"]]


def test_precision_spot_checks(reports):
    def precision(run, name):
        layers = reports[run].layers
        return layers.loc[layers["name"] == name, "precision"].item()

    assert precision("qat", "QuantizeLinear_2") == "INT8"  # FP32 -> Int8: labelled by its output
    assert precision("qat", "conv1.weight + QuantizeLinear_7 + Conv_9") == "INT8"  # Int8 in, FP32 out
    assert precision("qat", "MaxPool_12") == "FP32"
    assert precision("qat-residual", "DequantizeLinear_291") == "FP32"  # Int8 -> FP32
    assert precision("fp16", "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1") == "FP16"
    assert precision("fp16", "Reformatting CopyNode for Output Tensor 0 to reshape_after_Gemm_48") == "FP32"


@pytest.mark.parametrize("fmt, expected", [
    ("Row major linear FP32", "FP32"),
    ("Thirty-two wide channel vectorized row major Int8 format", "INT8"),
    ("Channel major FP16 format where channel % 16 == 0", "FP16"),
    ("Channel major INT8 format where channel % 16 == 0", "INT8"),
    ("Row major linear BFloat16 format", "BF16"),
    ("Half", "FP16"),
    ("Float", "FP32"),
    ("Unknown format", "UNKNOWN"),
])
def test_datatype(fmt, expected):
    assert datatype(fmt) == expected


def test_bytes_and_parsed_objects_equal_paths(reports, trt_reports_dir):
    graph, profile = paths(trt_reports_dir, "qat")
    uploaded = load_engine_report(graph.read_bytes(), profile.read_bytes(), name="upload")
    assert uploaded.name == "upload"
    pd.testing.assert_frame_equal(uploaded.layers, reports["qat"].layers)
    parsed = load_engine_report(*raw(trt_reports_dir, "qat"))
    assert parsed.name == "engine"
    pd.testing.assert_frame_equal(parsed.layers, reports["qat"].layers)


def test_layer_info_without_profile(trt_reports_dir):
    report = load_engine_report(paths(trt_reports_dir, "qat")[0])
    assert not report.has_profile and report.profiled_runs is None
    assert report.layers["time_ms"].isna().all()
    assert report.reformat.count == 12
    doc = report.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["reformat"]["ms"] is None and doc["total_ms"] is None


def test_to_json(reports):
    doc = reports["qat"].to_json()
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc
    assert doc["layers"] == 37
    assert doc["reformat"]["count"] == 12 and doc["reformat"]["elided"] == 1
    assert doc["reformat"]["ms"] == pytest.approx(0.278528)
    assert doc["reformat"]["total_ms"] == pytest.approx(1.09568)
    assert doc["reformat"]["pct"] == pytest.approx(25.42056, abs=1e-5)
    assert [(r["precision"], r["layers"]) for r in doc["precision"]] == [("INT8", 32), ("FP32", 2), ("FP16", 3)]
    assert len(doc["per_layer"]) == 37
    first = doc["per_layer"][0]
    assert (first["name"], first["precision"], first["is_reformat"]) == ("QuantizeLinear_2", "INT8", True)
    assert first["time_ms"] == pytest.approx(0.06144) and first["qdq_nodes"] == ["QuantizeLinear_2"]


# ---------------------------------------------------------------------------- ONNX names

@pytest.mark.parametrize("name, metadata, expected", [
    ("Conv_5 + Add_6 + Relu_7", None, (["Conv_5", "Add_6", "Relu_7"], [])),
    ("conv1.weight + QuantizeLinear_7 + Conv_9", None, (["conv1.weight", "Conv_9"], ["QuantizeLinear_7"])),
    ("QuantizeLinear_2", None, ([], ["QuantizeLinear_2"])),
    ("Reformatting CopyNode for Input Tensor 0 to Conv_35 + Relu_36", None, ([], [])),
    ("reshape_after_Gemm_48", None, ([], [])),
    ("fc.weight + QuantizeLinear_255 + Gemm_257 + fc.bias + (Unnamed Layer* 306) [Shuffle] + "
     "unsqueeze_node_after_fc.bias + (Unnamed Layer* 306) [Shuffle]_(Unnamed Layer* 306) [Shuffle]_output"
     " + (Unnamed Layer* 307) [ElementWise]", None, (["fc.weight", "Gemm_257", "fc.bias"], ["QuantizeLinear_255"])),
    ("fused", "Conv_1\x1eRelu_2", (["Conv_1", "Relu_2"], [])),
    ("fused", "[ONNX Layer: /m/Conv]\x1f[ONNX Layer: /m/input_quantizer/QuantizeLinear]",
     (["/m/Conv"], ["/m/input_quantizer/QuantizeLinear"])),
    ("fused", "[ONNX Layer: /f/MatMul | Local Function: f]\x1e[ONNX Layer: /f/Add | doc]",
     (["/f/MatMul", "/f/Add"], [])),
])
def test_onnx_names(name, metadata, expected):
    assert onnx_names(name, metadata) == expected


def test_metadata_and_kgen_formats_in_a_layer_info():
    graph = {"Layers": [{
        "Name": "myl_fused", "LayerType": "kgen", "Metadata": "[ONNX Layer: /a/MatMul]\x1e[ONNX Layer: /a/Add]",
        "Inputs": [{"Name": "x", "Format/Datatype": "Half"}],
        "Outputs": [{"Name": "y", "Format/Datatype": "Float"}],
    }], "Bindings": ["x", "y"]}
    profile = [{"count": 10}, {"name": "myl_fused", "timeMs": 1.5, "averageMs": 0.15, "percentage": 100}]
    report = load_engine_report(graph, profile)
    row = report.layers.iloc[0]
    assert (row["precision"], row["onnx_nodes"], row["time_ms"]) == ("FP16", ["/a/MatMul", "/a/Add"], 0.15)
    assert pd.isna(row["median_ms"]) and report.profiled_runs == 10


def test_join_onnx_coverage_and_reformat_neighbours(reports):
    names = ["Conv_9", "MaxPool_12", "Conv_22", "Conv_34", "Add_36", "Relu_37", "Conv_84",
             "GlobalAveragePool_246", "Gemm_257", "QuantizeLinear_2", "Missing_1"]
    join = reports["qat"].join_onnx(names)
    cover = dict(zip(join.coverage["name"], join.coverage["covers"]))
    assert len(cover) == 37
    assert cover["conv1.weight + QuantizeLinear_7 + Conv_9"] == ["Conv_9"]
    assert cover["layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37"] == [
        "Conv_34", "Add_36", "Relu_37"]
    assert cover["QuantizeLinear_2"] == ["QuantizeLinear_2"]
    assert cover["QuantizeLinear_15"] == []
    assert cover["layer2.0.conv2.weight + QuantizeLinear_82 + Conv_84"] == ["Conv_84"]
    assert join.unmatched == ["Missing_1"]

    assert list(join.neighbours.columns) == NEIGHBOUR_COLUMNS
    got = set(join.neighbours[["reformat", "side", "onnx_node"]].itertuples(index=False, name=None))
    copy = "Reformatting CopyNode for Output Tensor 0 to MaxPool_12"
    # The copy after MaxPool_12 feeds QuantizeLinear_15 (looked through) and the residual Add.
    assert {n for r, s, n in got if r == copy} == {"MaxPool_12", "Conv_22", "Conv_34", "Add_36", "Relu_37"}
    assert {(s, n) for r, s, n in got if r == copy and n == "MaxPool_12"} == {("before", "MaxPool_12")}
    assert ("QuantizeLinear_2", "after", "Conv_9") in got
    assert not any(r == "QuantizeLinear_2" and s == "before" for r, s, n in got)  # reads the engine input
    # QuantizeLinear_250 -> NoOp CopyNode -> the fc layer: the NoOp is looked through.
    assert ("QuantizeLinear_250", "after", "Gemm_257") in got
    assert ("QuantizeLinear_250", "before", "GlobalAveragePool_246") in got
    assert not any(n == "Conv_84" for _, _, n in got)  # between two compute layers, no reformat


def test_join_onnx_looks_through_noop_chains(reports):
    join = reports["fp16"].join_onnx(["Gemm_48", "Conv_0", "Relu_1"])
    got = set(join.neighbours[["reformat", "side", "onnx_node"]].itertuples(index=False, name=None))
    assert got == {
        ("Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1", "after", "Conv_0"),
        ("Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1", "after", "Relu_1"),
        # reshape_after_Gemm_48 and its CopyNode are NoOps between Gemm_48 and the last reformat.
        ("Reformatting CopyNode for Output Tensor 0 to reshape_after_Gemm_48", "before", "Gemm_48"),
    }


# ---------------------------------------------------------------------------- bad input

def _error(tmp_path, graph, profile=None) -> str:
    def put(name, content):
        if content is None or not isinstance(content, (str, bytes)):
            return content
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    with pytest.raises(MixprecError) as err:
        load_engine_report(put("g.json", graph), put("p.json", profile))
    return str(err.value)


def test_not_json(tmp_path):
    msg = _error(tmp_path, '{"Layers": [')
    assert "g.json is not JSON" in msg and "--exportLayerInfo" in msg
    with pytest.raises(MixprecError, match="uploaded layer info is not JSON"):
        load_engine_report(b"\xff\xfe\x00garbage")


def test_plain_string_layers_need_detailed_verbosity(tmp_path):
    msg = _error(tmp_path, json.dumps({"Layers": ["Conv_0 + Relu_1", "MaxPool_2"], "Bindings": []}))
    assert "2 of 2" in msg and "--profilingVerbosity=detailed" in msg and "Conv_0 + Relu_1" in msg


def test_profile_from_another_engine(tmp_path, trt_reports_dir):
    graph, _ = paths(trt_reports_dir, "qat")
    _, other = paths(trt_reports_dir, "fp16")
    msg = _error(tmp_path, graph.read_text(), other.read_text())
    assert "does not belong" in msg and "36 of 36 profile records name no layer" in msg
    assert "profile only: Conv_0 + Relu_1" in msg and "layer info only: QuantizeLinear_2" in msg


def test_other_bad_inputs(tmp_path, trt_reports_dir):
    graph, profile = paths(trt_reports_dir, "fp32")
    assert "no \"Layers\" list" in _error(tmp_path, json.dumps({"Bindings": []}))
    assert "no per-layer records" in _error(tmp_path, graph.read_text(), json.dumps([{"count": 1}]))
    assert "looks like" in _error(tmp_path, profile.read_text(), graph.read_text())  # swapped files
    assert "Cannot read" in _error(tmp_path, tmp_path / "absent.json")
    bad = json.loads(profile.read_text())
    del bad[3]["averageMs"]
    assert "MaxPool_2" in _error(tmp_path, graph.read_text(), json.dumps(bad))


# ---------------------------------------------------------------------------- plots

def _labelled(fig: go.Figure) -> None:
    assert isinstance(fig, go.Figure) and fig.layout.title.text
    assert all(axis.title.text for axis in (fig.layout.xaxis, fig.layout.yaxis))


def test_plot_layer_latency(reports):
    layers = reports["qat"].layers
    fig = plot_layer_latency(layers)
    _labelled(fig)
    assert [t.name for t in fig.data] == ["INT8", "FP32", "FP16"]
    assert sum(len(t.x) for t in fig.data) == 37
    int8 = fig.data[0]
    assert sum(int8.y) == pytest.approx(0.943104)
    assert sum(s == "/" for t in fig.data for s in t.marker.pattern.shape) == 12


def test_plot_latency_by_type(reports):
    fig = plot_latency_by_type(reports["qat"].latency_by_type())
    _labelled(fig)
    (bars,) = fig.data
    assert dict(zip(bars.x, bars.y))["Reformat"] == pytest.approx(0.278528)
    assert len(bars.x) == 4


def test_plot_precision_distribution(reports):
    fig = plot_precision_distribution(reports["fp16"].precision_distribution())
    _labelled(fig)
    layers, pct = fig.data
    assert list(layers.x) == ["FP16", "FP32"] and list(layers.y) == [35, 1]
    assert sum(pct.y) == pytest.approx(100)


def test_plot_reformat_overhead(reports):
    table = reformat_table(list(reports.values()))
    assert list(table.columns) == REFORMAT_COLUMNS
    fig = plot_reformat_overhead(table)
    _labelled(fig)
    reformat, other = fig.data
    assert list(reformat.x) == [f"a100-resnet-{r}" for r in RUNS]
    assert list(reformat.y) == pytest.approx([EXPECTED[r][2] for r in RUNS])
    assert [a + b for a, b in zip(reformat.y, other.y)] == pytest.approx([EXPECTED[r][3] for r in RUNS])


def test_plots_reject_other_tables(reports):
    with pytest.raises(MixprecError, match="not a layers table"):
        plot_layer_latency(reports["qat"].precision_distribution())
