"""The TensorRT backend without TensorRT: its Polygraphy calls against the installed Polygraphy's
real signatures, and its pure parts. Its TensorRT attributes are checked against the version table
of docs/tensorrt-api-check.md by test_tensorrt_api_scan.py."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import core.backends.tensorrt as trt_backend
from core.backends.base import PER_LAYER_COLUMNS
from core.backends.reports import parse_layers
from core.backends.tensorrt import api, engine_cache, legacy, timing
from core.errors import MixprecError
from core.quant.policy import Policy
from tests.fixtures import ROOT

REPO = ROOT
PACKAGE = sorted(Path(trt_backend.__file__).parent.glob("*.py"))  # the backend's modules, read as one
SOURCE = "\n".join(p.read_text() for p in PACKAGE)
TREE = ast.parse(SOURCE)


# ---------------------------------------------------------------------------- Polygraphy signatures

def _resolve(qualname: str):
    parts = qualname.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(qualname)


def _signature(qualname: str) -> tuple[list[str], set[str], bool]:
    """(positional parameter names, accepted keywords, takes ``*args``) of a Polygraphy callable,
    without ``self``. ``**kwargs`` is followed where Polygraphy forwards it: a class's into its
    bases' ``__init__`` (CreateConfig -> _CreateConfigCommon), a runner method into its ``*_impl``
    (BaseRunner.infer -> TrtRunner.infer_impl)."""
    obj = _resolve(qualname)
    if inspect.isclass(obj):
        bound, funcs = True, [obj.__init__] + [c.__init__ for c in obj.__mro__[1:] if "__init__" in vars(c)]
    else:
        owner_name, attr = qualname.rsplit(".", 1)
        owner = _resolve(owner_name)
        bound = inspect.isclass(owner) and not isinstance(inspect.getattr_static(owner, attr), staticmethod)
        funcs = [obj] + ([getattr(owner, attr + "_impl")] if bound and hasattr(owner, attr + "_impl") else [])
    positional, names, var_pos = None, set(), False
    for i, f in enumerate(funcs):
        params = list(inspect.signature(f).parameters.values())[1 if bound else 0:]  # without self
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if positional is None:
            positional = [p for p in params if p.kind in kinds]
        names |= {p.name for p in params if p.kind in (*kinds[1:], inspect.Parameter.KEYWORD_ONLY)}
        var_pos = var_pos or (i == 0 and any(p.kind == p.VAR_POSITIONAL for p in params))
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return positional, names, var_pos


def _polygraphy_imports() -> dict[str, str]:
    """Local name -> qualified name of everything the module imports from polygraphy."""
    found = {}
    for node in ast.walk(TREE):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("polygraphy"):
            found.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return found


def _calls() -> list[tuple[str, int, set[str]]]:
    """(qualified name, positional count, keywords) of every call to a Polygraphy name in the module:
    ``Name(...)``, ``Name.method(...)``, ``Name(...).method(...)``, and instance methods
    (``x.method(...)``) whose name is a method listed in POLYGRAPHY_CALLS."""
    imported = _polygraphy_imports()
    methods = {q.rsplit(".", 1)[1]: q for q in api.POLYGRAPHY_CALLS
               if _resolve(q.rsplit(".", 1)[0]) is not None and inspect.isclass(_resolve(q.rsplit(".", 1)[0]))}
    found = []
    for node in ast.walk(TREE):
        if not isinstance(node, ast.Call):
            continue
        f, qual = node.func, None
        if isinstance(f, ast.Name) and f.id in imported:
            qual = imported[f.id]
        elif isinstance(f, ast.Attribute):
            base = f.value.func if isinstance(f.value, ast.Call) else f.value
            if isinstance(base, ast.Name) and base.id in imported:
                qual = f"{imported[base.id]}.{f.attr}"
            elif f.attr in methods:
                qual = methods[f.attr]
        if qual:
            found.append((qual, len(node.args), {k.arg for k in node.keywords}))
    return found


def test_polygraphy_table_keywords_exist_in_installed_polygraphy():
    for qualname, keywords in api.POLYGRAPHY_CALLS.items():
        _, names, _ = _signature(qualname)
        assert set(keywords) <= names, f"{qualname} does not accept {set(keywords) - names}"


def test_every_polygraphy_call_is_in_the_table_and_binds():
    calls = _calls()
    seen = {q for q, _, _ in calls}
    assert {"polygraphy.backend.trt.NetworkFromOnnxPath", "polygraphy.backend.trt.CreateConfig",
            "polygraphy.backend.trt.TrtRunner.infer", "polygraphy.backend.trt.Profile.add"} <= seen
    for qual, n_pos, keywords in calls:
        assert qual in api.POLYGRAPHY_CALLS, f"{qual} is called but not listed in POLYGRAPHY_CALLS"
        assert keywords <= set(api.POLYGRAPHY_CALLS[qual]), f"{qual}: {keywords} not listed"
        positional, names, var_pos = _signature(qual)
        assert keywords <= names, f"{qual} does not accept {keywords - names}"
        required = [p.name for p in positional[n_pos:] if p.default is p.empty and p.name not in keywords]
        assert not required, f"{qual}: called without its required {required}"
        assert n_pos <= len(positional) or var_pos, f"{qual}: {n_pos} positional arguments, takes {len(positional)}"


def test_polygraphy_attributes_the_backend_reads():
    from polygraphy.backend.trt import TrtRunner
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    log_file = inspect.getattr_static(type(G_LOGGER), "log_file")
    assert isinstance(log_file, property) and log_file.fset is not None and G_LOGGER.log_file is None
    assert "_log_file" in vars(G_LOGGER)  # the file the setter opens, which _polygraphy_log closes
    assert issubclass(PolygraphyException, Exception)
    activate = inspect.getsource(TrtRunner.activate_impl)  # runner.context / runner.engine, bound for timing
    assert "self.context = " in activate and "self.engine = " in activate


def test_polygraphy_cuda_gives_what_the_timing_uses():
    """CudaEvents calls libcudart through Polygraphy's wrapper: its ``handle`` (the CDLL) and ``check``;
    streams and device arrays expose the ``ptr`` given to TensorRT and to cudaEventRecord."""
    from polygraphy import cuda

    init = inspect.getsource(cuda.Cuda.__init__)
    assert "self.handle = ctypes.CDLL(" in init
    assert "self.ptr = wrapper().create_stream()" in inspect.getsource(cuda.Stream.__init__)
    assert "self.ptr = wrapper().malloc(" in inspect.getsource(cuda.DeviceArray.resize)
    assert inspect.signature(cuda.Cuda.check).parameters.keys() >= {"status"}
    assert "G_LOGGER.critical" in inspect.getsource(cuda.Cuda.check)  # raises PolygraphyException


def test_module_imports_and_reports_unavailable_without_tensorrt():
    code = ("import sys; sys.modules['tensorrt'] = None\n"
            "import core.backends.tensorrt as m\n"
            "ok, why = m.TensorRTBackend.available()\n"
            "assert not ok and why.startswith('TensorRT not installed'), why\n"
            "assert 'tensorrt' not in {k for k, v in sys.modules.items() if v is not None}\n"
            "from core.backends.tensorrt.versions import import_tensorrt\nfrom core.errors import MixprecError\n"
            "try:\n    import_tensorrt()\nexcept MixprecError as e:\n    print(e)\n")
    res = _python(code)
    assert "TensorRT is not installed" in res.stdout and "pip install tensorrt-cu12" in res.stdout


def test_a_failed_tensorrt_import_is_tried_once_but_a_module_put_in_later_is_seen():
    """Issue 23 fault 10: pages ask whether TensorRT runs here several times per run, and a failed import searches
    every path again; after one failure it is not tried again, unless a tensorrt module has appeared since."""
    code = ("import builtins, sys, types\n"
            "from core.backends.tensorrt.versions import tensorrt_available\n"
            "tries = []\nreal = builtins.__import__\n"
            "def counting(name, *a, **k):\n"
            "    if name == 'tensorrt':\n        tries.append(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = counting\n"
            "ok1, why1 = tensorrt_available()\nok2, why2 = tensorrt_available()\n"
            "assert not ok1 and not ok2 and why1 == why2 and why1.startswith('TensorRT not installed'), (why1, why2)\n"
            "assert len(tries) == 1, tries\n"
            "sys.modules['tensorrt'] = types.SimpleNamespace(__version__='9.0.0')\n"
            "ok3, why3 = tensorrt_available()\n"
            "assert not ok3 and 'is installed but mixprec needs TensorRT 10.0' in why3, why3\n")
    _python(code)


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the repository (its own sys.modules); it must succeed."""
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res


# ---------------------------------------------------------------------------- pure parts

@pytest.mark.parametrize("version, mode", [("10.0.1.6", "legacy"), ("10.11.0.33", "legacy"),
                                           ("10.12.0.36", "strongly-typed"), ("10.16.1", "strongly-typed"),
                                           ("11.0.0.114", "strongly-typed"), ("11.1", "strongly-typed")])
def test_build_mode_by_version(version, mode):
    assert trt_backend.build_mode(version) == mode


def test_build_mode_forced_and_refused():
    assert trt_backend.build_mode("10.11.0", "strongly-typed") == "strongly-typed"
    assert trt_backend.build_mode("10.13.0", "legacy") == "legacy"
    for version, requested, text in (("11.0.0", "legacy", "removed in TensorRT 11"), ("8.6.1", "auto", "too old"),
                                     ("10.8", "fp8", "unknown TensorRT build mode"), ("dev", "auto", "cannot read")):
        with pytest.raises(MixprecError, match=text):
            trt_backend.build_mode(version, requested)


def test_profile_shapes_default_and_override():
    shapes = {"input_ids": (1, 64), "image": (1, 3, 32, 32)}
    got = trt_backend.profile_shapes(shapes)
    assert got == {"input_ids": ((1, 64),) * 3, "image": ((1, 3, 32, 32),) * 3}
    got = trt_backend.profile_shapes(shapes, {"input_ids": ([1, 16], [1, 64], [8, 128])})
    assert got["input_ids"] == ((1, 16), (1, 64), (8, 128)) and got["image"] == ((1, 3, 32, 32),) * 3


def test_profile_shapes_cover_the_evaluation_batch_on_dynamic_batch_axes():
    from core.measure.reference import EVAL_BATCH

    got = trt_backend.profile_shapes({"ids": (2, 64), "mask": (2, 64)}, dynamic_batch={"ids"})
    assert got["ids"] == ((1, 64), (2, 64), (EVAL_BATCH, 64)) and got["mask"] == ((2, 64),) * 3
    assert trt_backend.profile_shapes({"x": (32, 8)}, dynamic_batch={"x"}, max_batch=16)["x"] == \
        ((1, 8), (32, 8), (32, 8))


def test_profile_shapes_widen_the_batch_axis_where_it_is():
    """A [2, B, H] recurrent state has its batch on axis 1 (core.model.shapes.batch_axes): the profile
    widens that axis, not axis 0."""
    from core.measure.reference import EVAL_BATCH

    got = trt_backend.profile_shapes({"state": (2, 1, 16), "x": (1, 8)}, dynamic_batch={"state": 1, "x": 0})
    assert got["state"] == ((2, 1, 16), (2, 1, 16), (2, EVAL_BATCH, 16))
    assert got["x"] == ((1, 8), (1, 8), (EVAL_BATCH, 8))


@pytest.mark.parametrize("override, text", [
    ({"nope": ((1,), (1,), (1,))}, "inputs the model does not have"),
    ({"x": ((1, 8), (1, 4), (1, 16))}, "min <= opt <= max"),
    ({"x": ((1, 8), (1, 8), (1, 16))}, "min <= opt <= max"),  # run shape (1, 4) outside
    ({"x": ((1,), (1,), (1,))}, "min <= opt <= max"),  # wrong rank
    ({"x": (1, 4)}, "min <= opt <= max"),  # not three shapes
])
def test_profile_shapes_rejects(override, text):
    with pytest.raises(MixprecError, match=text):
        trt_backend.profile_shapes({"x": (1, 4)}, override)


def test_engine_cache_key():
    parts = {"model_sha256": "a" * 64, "policy_sha256": "b" * 64, "calibration": None, "mode": "legacy",
             "tensorrt": "10.11.0.33", "polygraphy": "0.53.6", "gpu": "NVIDIA A100-SXM4-80GB",
             "compute_capability": "8.0", "profiles": {"x": ((1, 4),) * 3}, "workspace_bytes": 4 << 30,
             "onnx_sha256": "e" * 64, "legacy_constraints": "f" * 32, "tf32": False}
    key = engine_cache.engine_cache_key(parts)
    assert len(key) == 32 and key == engine_cache.engine_cache_key(dict(reversed(list(parts.items()))))
    assert key == engine_cache.engine_cache_key({**parts, "profiles": {"x": [[1, 4]] * 3}})
    for field, value in (("model_sha256", "c" * 64), ("policy_sha256", "d" * 64), ("calibration", "k"),
                         ("tensorrt", "10.11.0.34"), ("gpu", "NVIDIA H100"), ("compute_capability", "9.0"),
                         ("profiles", {"x": ((1, 4), (1, 4), (2, 4))}), ("mode", "strongly-typed"),
                         ("onnx_sha256", "0" * 64), ("legacy_constraints", None), ("tf32", True)):
        assert engine_cache.engine_cache_key({**parts, field: value}) != key, field


@pytest.mark.parametrize("name, metadata, node", [
    ("conv1", None, "conv1"),
    ("fc_1", "[ONNX Layer: fc]", "fc"),
    ("x", "[ONNX Layer: /encoder/layer.0/MatMul | Local Function: f]", "/encoder/layer.0/MatMul"),
    ("node_of_y", "", "node_of_y"),
    ("q + c", "[ONNX Layer: /q/QuantizeLinear]\x1f[ONNX Layer: /m/Conv]", "/q/QuantizeLinear"),
])
def test_layer_node(name, metadata, node):
    assert legacy.layer_node(name, metadata) == node


def test_layer_times_follow_trtexec_run_rule():
    t = timing.LayerTimes()
    for run in range(3):
        for name, ms in (("a", 1.0), ("b", 2.0 + run), ("a + c", 0.5)):
            t.report(name, ms)
    records = t.records()
    assert records[0] == {"count": 3}
    assert [r["name"] for r in records[1:]] == ["a", "b", "a + c"]
    b = records[2]
    assert b["timeMs"] == 9.0 and b["averageMs"] == 3.0 and b["medianMs"] == 3.0
    assert sum(r["percentage"] for r in records[1:]) == pytest.approx(100.0)


def _fixture(name):
    d = REPO.parent / "shared" / "fixtures" / "trt-engine-reports"
    return json.loads((d / f"{name}.graph.json").read_text()), json.loads((d / f"{name}.profile.json").read_text())


def test_per_layer_from_reports_maps_engine_layers_to_policy_layers():
    graph, profile = _fixture("a100-resnet-qat")
    layers = [SimpleNamespace(name=n) for n in ("Conv_9", "Conv_22", "Conv_34", "MaxPool_12", "Conv_95")]
    policy = Policy("resnet", "0" * 64, "fp32", {"Conv_9": "int8", "Conv_22": "int8", "Conv_34": "fp16",
                                                  "MaxPool_12": "fp32", "Conv_95": "int8"})
    df = timing.per_layer_from_reports(graph, profile, layers, policy)
    assert list(df.columns) == PER_LAYER_COLUMNS and len(df) == len(graph["Layers"])
    row = df.set_index("name").loc["conv1.weight + QuantizeLinear_7 + Conv_9"]
    assert (row.layer, row.precision, row.op_type, bool(row.is_reformat)) == \
        ("Conv_9", "int8", "CaskConvolution", False)
    fused = "layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37"
    assert df.set_index("name").loc[fused].layer == "Conv_34"
    copy = df.set_index("name").loc["Reformatting CopyNode for Output Tensor 0 to MaxPool_12"]
    assert bool(copy.is_reformat) and copy.layer == ""  # a copy node is no ONNX node's layer
    assert df["is_reformat"].sum() == parse_layers(graph)[0]["is_reformat"].sum()
    assert df["pct"].sum() == pytest.approx(100.0) and df["ms"].is_monotonic_decreasing


def test_per_layer_from_reports_maps_compiled_qdq_names_to_their_layer():
    graph = {"Layers": [
        {"Name": "conv1/x0/QuantizeLinear", "LayerType": "Reformat", "Origin": "QDQ",
         "Inputs": [{"Name": "image", "Format/Datatype": "Row major linear FP32"}],
         "Outputs": [{"Name": "q", "Format/Datatype": "Row major Int8 format"}]},
        {"Name": "conv1/w1/DequantizeLinear + conv1 + relu1", "LayerType": "CaskConvolution",
         "Inputs": [{"Name": "q", "Format/Datatype": "Row major Int8 format"}],
         "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}]}], "Bindings": ["image", "y"]}
    profile = [{"count": 2}, {"name": "conv1/x0/QuantizeLinear", "averageMs": 0.01, "medianMs": 0.01},
               {"name": "conv1/w1/DequantizeLinear + conv1 + relu1", "averageMs": 0.03, "medianMs": 0.03}]
    policy = Policy("m", "0" * 64, "fp32", {"conv1": "int8", "relu1": "fp32"})
    df = timing.per_layer_from_reports(graph, profile, [SimpleNamespace(name="conv1"),
                                                             SimpleNamespace(name="relu1")], policy)
    assert df["layer"].tolist() == ["conv1", "conv1"] and df["is_reformat"].tolist() == [False, True]
    assert df["precision"].tolist() == ["int8", "int8"] and df["ms"].tolist() == [0.03, 0.01]


def test_per_layer_from_reports_names_a_mismatched_profile():
    graph, profile = _fixture("a100-resnet-fp16")
    with pytest.raises(MixprecError, match="layer information and its profile do not match"):
        timing.per_layer_from_reports(graph, profile[:-1], [], Policy("m", "0" * 64, "fp32", {}))


def test_profile_records_of_auxiliary_stream_layers_are_tolerated():
    """Issue 11, bug 12: with auxiliary streams an IProfiler also reports signal/wait layers that the
    inspector's layer information does not list, which broke the strict profile-to-layer-info match."""
    graph, profile = _fixture("a100-resnet-fp16")
    extra = [{"name": "Signal aux stream 1", "timeMs": 0.01, "averageMs": 0.001, "medianMs": 0.001,
              "percentage": 0.0}, {"name": "Wait aux stream 1", "timeMs": 0.01, "averageMs": 0.001,
                                   "medianMs": 0.001, "percentage": 0.0}]
    with_aux = [profile[0], *profile[1:3], extra[0], *profile[3:], extra[1]]
    df = timing.per_layer_from_reports(graph, with_aux, [], Policy("m", "0" * 64, "fp32", {}))
    assert len(df) == len(graph["Layers"]) and "Signal aux stream 1" not in set(df["name"])
    # a profile that misses one of the engine's layers is still refused
    with pytest.raises(MixprecError, match="do not match"):
        timing.per_layer_from_reports(graph, with_aux[:-3] + with_aux[-1:], [], Policy("m", "0" * 64, "fp32", {}))
