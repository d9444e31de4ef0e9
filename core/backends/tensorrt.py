"""The TensorRT backend (NVIDIA GPUs), built on Polygraphy's TensorRT loaders.

Two build paths, picked by the installed TensorRT version (:func:`build_mode`):

``strongly-typed`` (TensorRT >= 10.12, and 11 where it is the only mode)
    The policy compiled to explicit precision (``compile_policy(..., target="trt")``: int8 Q/DQ
    with zero point 0, real float16 Casts) is parsed as a strongly typed network, so the graph's
    types are the precisions.
``legacy`` (TensorRT 10.0-10.11)
    The original ONNX (the loaded model's proto, with its stable node names) is built with FP16
    and INT8 enabled, per-layer precisions and output types obeyed (``SetLayerPrecisions``,
    ``precision_constraints="obey"``) and INT8 ranges from mixprec's calibration set as tensor
    dynamic ranges: implicit quantization without running a calibrator. The ONNX parser names
    each layer after its node and writes ``[ONNX Layer: <node>]`` into the layer's metadata, so
    those layers get that node's precision. The layers it creates without metadata (weight
    Constants and their Shuffles, broadcast shuffles, Gemm bias/alpha/beta) take the node of the
    layers next to them (:func:`policy_nodes`). Layers of nodes the policy does not list are left
    to TensorRT.

Latency is GPU compute time, as trtexec measures it: each engine's execution context is bound once to
GPU buffers (:func:`bind_engine`) and each ``execute_async_v3`` is bracketed by CUDA events on one
stream (:func:`gpu_times`, :class:`CudaEvents`), never Polygraphy's per-call ``infer`` (issue 11, bug 3).

Engines are bound to the GPU model and the TensorRT version: they are cached in
``engines/tensorrt/`` under a key of everything they depend on (:func:`engine_cache_key`).
Importing this module needs neither TensorRT nor a GPU; ``tensorrt`` and Polygraphy's TensorRT
loaders are imported inside the functions that use them. :func:`tensorrt_available` says whether
this backend can run here.
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from core.backends.base import Backend, Engine, Latency, ProfileRow, Runner, latency_from_pairs, per_layer_frame
from core.backends.reports import _ONNX_LAYER, metadata_nodes, parse_layers  # one metadata parser (issue 11, bug 9)
from core.errors import MixprecError
from core.model.external import saved_sha256
from core.model.shapes import EVAL_BATCH, batch_axes
from core.quant.compile import compile_policy
from core.quant.trt_rules import MIN_OPSET
from core.workspace import (Workspace, atomic_write_bytes, atomic_write_json, cache_note, file_stamp, sha256_bytes,
                            stamps_match)

MODES = ("auto", "strongly-typed", "legacy")
MIN_VERSION = (10, 0)          # TensorRT 10 API: execute_async_v3, ILayer.metadata, named tensors
STRONG_TYPING_FROM = (10, 12)  # per-layer precision APIs deprecated, superseded by strong typing
LEGACY_REMOVED_IN = (11, 0)    # ... and removed
DEFAULT_WORKSPACE_BYTES = 4 << 30
CACHE_FORMAT = 2  # 2: the key covers the parsed ONNX's digest, the legacy constraints and TF32 (issue 11, bugs 4/5)
INT8_COMPUTE = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY")  # the layers of an INT8 node that run int8
NO_PRECISION = ("CONSTANT", "SHAPE")  # layers a precision constraint must not touch
INSTALL = "pip install tensorrt-cu12 or tensorrt-cu13 on a machine with an NVIDIA GPU"
INSTALL_FIX = INSTALL + ", or use --backend onnxruntime"

# Every Polygraphy callable this module calls, with the keywords it passes. tests/backends/
# test_tensorrt_static.py checks them against the installed Polygraphy's signatures, and that
# every Polygraphy call in this file is listed here.
POLYGRAPHY_CALLS = {
    "polygraphy.backend.trt.NetworkFromOnnxPath": ("strongly_typed",),
    "polygraphy.backend.trt.SetLayerPrecisions": (),
    "polygraphy.backend.trt.PostprocessNetwork": ("name",),
    "polygraphy.backend.trt.CreateConfig": ("fp16", "int8", "tf32", "precision_constraints", "profiles",
                                            "profiling_verbosity", "memory_pool_limits"),
    "polygraphy.backend.trt.EngineBytesFromNetwork": ("config",),
    "polygraphy.backend.trt.EngineFromBytes": (),
    "polygraphy.backend.trt.TrtRunner": ("name",),
    "polygraphy.backend.trt.TrtRunner.activate": (),
    "polygraphy.backend.trt.TrtRunner.infer": (),
    "polygraphy.backend.trt.TrtRunner.deactivate": (),
    "polygraphy.backend.trt.Profile": (),
    "polygraphy.backend.trt.Profile.add": ("min", "opt", "max"),
    "polygraphy.cuda.DeviceArray": ("shape", "dtype"),
    "polygraphy.cuda.DeviceArray.raw": (),
    "polygraphy.cuda.DeviceArray.copy_from": (),
    "polygraphy.cuda.Stream": (),
    "polygraphy.cuda.Stream.synchronize": (),
    "polygraphy.cuda.wrapper": (),
    "polygraphy.cuda.Cuda.check": (),
    "polygraphy.datatype.DataType.from_dtype": ("source_module",),
}
# Every TensorRT attribute, method and enum member that this module and the post-process script it exports
# (POSTPROCESS_SCRIPT) use. tests/backends/test_tensorrt_api_scan.py finds the uses in the code itself (an
# AST scan that infers which values are TensorRT objects), checks that they are exactly these, and that
# the version table of docs/tensorrt-api-check.md has a row for each allowing it where it is used: what
# is deprecated (10.12) or removed (11) only in LEGACY_ONLY code.
TENSORRT_API = (
    "trt.__version__", "trt.float32", "trt.float16", "trt.int8", "trt.LayerType.CONVOLUTION",
    "trt.LayerType.DECONVOLUTION", "trt.LayerType.MATRIX_MULTIPLY", "trt.LayerType.CONSTANT",
    "trt.LayerType.SHAPE", "trt.LayerType.SHUFFLE", "trt.IConstantLayer", "trt.IProfiler", "trt.IProfiler.__init__",
    "trt.ProfilingVerbosity.DETAILED", "trt.MemoryPoolType.WORKSPACE", "trt.LayerInformationFormat.JSON",
    "trt.TensorIOMode.INPUT", "trt.BuilderFlag.INT8",
    "INetworkDefinition.num_layers", "INetworkDefinition.get_layer", "INetworkDefinition.num_inputs",
    "INetworkDefinition.get_input", "ILayer.name", "ILayer.metadata", "ILayer.type", "ILayer.num_inputs",
    "ILayer.get_input", "ILayer.num_outputs", "ILayer.get_output", "ILayer.precision", "ILayer.set_output_type",
    "IConstantLayer.weights", "ITensor.name", "ITensor.dtype", "ITensor.dynamic_range",
    "IProfiler.report_layer_time", "IBuilderConfig.set_flag",
    "ICudaEngine.create_engine_inspector", "ICudaEngine.num_io_tensors", "ICudaEngine.get_tensor_name",
    "ICudaEngine.get_tensor_mode", "ICudaEngine.get_tensor_dtype", "ICudaEngine.is_shape_inference_io",
    "IExecutionContext.profiler", "IExecutionContext.set_input_shape", "IExecutionContext.set_tensor_address",
    "IExecutionContext.get_tensor_shape", "IExecutionContext.get_max_output_size",
    "IExecutionContext.execute_async_v3", "IEngineInspector.execution_context",
    "IEngineInspector.get_engine_information",
)
# What Polygraphy's loaders and runner call in TensorRT for this module (documented beside, not scanned).
TENSORRT_VIA_POLYGRAPHY = (
    "ILayer.precision", "NetworkDefinitionCreationFlag.STRONGLY_TYPED", "OnnxParser.parse_from_file",
    "IParserError.__str__", "BuilderFlag.FP16", "BuilderFlag.INT8", "BuilderFlag.OBEY_PRECISION_CONSTRAINTS",
    "IBuilderConfig.set_memory_pool_limit", "IBuilderConfig.profiling_verbosity",
    "Builder.build_serialized_network", "IHostMemory", "Runtime.deserialize_cuda_engine",
)
# The code that runs only on the legacy path (TensorRT 10.0-10.11, build_mode): the only place where a
# TensorRT API deprecated in 10.12 or removed in 11 may be used.
LEGACY_ONLY = ("legacy_constraints", "_source_amax", "_apply_types_and_ranges", "POSTPROCESS_SCRIPT")


# ---------------------------------------------------------------------------- pure helpers

def parse_version(version: str, fix: str | None = None) -> tuple[int, int]:
    """(major, minor) of a TensorRT version; ``fix`` says what to do when it cannot be read (by
    default: the installed TensorRT's version is unreadable, so reinstall it)."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if not m:
        raise MixprecError(f"cannot read the TensorRT version {version!r}", fix or "reinstall TensorRT: " + INSTALL_FIX)
    return int(m[1]), int(m[2])


def build_mode(trt_version: str, requested: str = "auto") -> str:
    """``strongly-typed`` or ``legacy`` for this TensorRT version (``requested`` may force one)."""
    if requested not in MODES:
        raise MixprecError(f"unknown TensorRT build mode {requested!r}", f"use one of {', '.join(MODES)}")
    v = parse_version(trt_version)
    if v < MIN_VERSION:
        raise MixprecError(f"TensorRT {trt_version} is too old (mixprec needs TensorRT 10.0 or newer)",
                           "upgrade: " + INSTALL_FIX)
    if requested == "legacy" and v >= LEGACY_REMOVED_IN:
        raise MixprecError(f"TensorRT {trt_version} has no per-layer precision APIs (removed in TensorRT 11)",
                           "use the strongly typed build (mode 'auto' or 'strongly-typed')")
    if requested != "auto":
        return requested
    return "strongly-typed" if v >= STRONG_TYPING_FROM else "legacy"


TRT_MIN_OPSET = MIN_OPSET  # per-channel DequantizeLinear (``axis``) needs opset 13 (core.quant.trt_rules)


def require_trt_opset(model) -> None:
    """The ``trt`` target's Q/DQ need opset >= 13 (issue 11, bug 8). Models loaded with
    ``core.model.load.load_model`` are upgraded already; this catches one that was not."""
    if int(model.opset) < TRT_MIN_OPSET:
        raise MixprecError(
            f"{model.name} is at opset {model.opset}, but the TensorRT export writes per-channel "
            f"DequantizeLinear (axis), which needs opset >= {TRT_MIN_OPSET}",
            "load the model through mixprec (python -m core, open_project or load_model), which upgrades opset "
            "< 13 with onnx.version_converter, or re-export it at opset 13 or later (torch.onnx.export(..., "
            "opset_version=17))")


def profile_shapes(input_shapes: dict[str, tuple[int, ...]], overrides: dict | None = None,
                   dynamic_batch=(), max_batch: int | None = None) -> dict:
    """``{input: (min, opt, max)}``. By default opt is the project's shape and so are min and max,
    except that inputs in ``dynamic_batch`` (a dynamic batch axis in the model: ``{input: axis}``,
    or input names whose batch is axis 0) take batches from 1 up to ``max_batch`` (default:
    ``core.model.shapes.EVAL_BATCH``, the batch quality is evaluated in) along that axis.
    ``overrides`` replaces an input's range; it must contain the project's shape."""
    if max_batch is None:
        max_batch = EVAL_BATCH
    axes = dict(dynamic_batch) if isinstance(dynamic_batch, dict) else {n: 0 for n in dynamic_batch}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(input_shapes))
    if unknown:
        raise MixprecError("the optimisation profiles name inputs the model does not have",
                           f"give ranges for the model's inputs: {', '.join(input_shapes)}", details=unknown)
    out, bad = {}, []
    for name, shape in input_shapes.items():
        shape = tuple(int(d) for d in shape)
        ax = axes.get(name)
        default = (shape, shape, shape) if ax is None or ax >= len(shape) else \
            (_with_dim(shape, ax, 1), shape, _with_dim(shape, ax, max(shape[ax], max_batch)))
        try:
            lo, opt, hi = (tuple(int(d) for d in s) for s in overrides.get(name, default))
        except (TypeError, ValueError):
            bad.append(f"{name}: {overrides[name]!r} is not three shapes (min, opt, max)")
            continue
        ranks_ok = len(lo) == len(opt) == len(hi) == len(shape)
        if not ranks_ok or not all(a <= b <= c for a, b, c in zip(lo, opt, hi)) \
                or not all(a <= s <= c for a, s, c in zip(lo, shape, hi)):
            bad.append(f"{name}: min {lo} opt {opt} max {hi} (run shape {shape})")
        out[name] = (lo, opt, hi)
    if bad:
        raise MixprecError("some optimisation profiles are not min <= opt <= max around the run's input shape",
                           "give (min, opt, max) shapes of the input's rank with min <= opt <= max, "
                           "each containing the shape the project runs at", details=bad)
    return out


def _with_dim(shape: tuple[int, ...], axis: int, value: int) -> tuple[int, ...]:
    return (*shape[:axis], value, *shape[axis + 1:])


def dynamic_batch_axes(model) -> dict[str, int]:
    """Inputs whose batch axis (``core.model.shapes.batch_axes``, not necessarily axis 0) is dynamic."""
    specs = {s.name: s for s in model.inputs}
    return {n: ax for n, ax in batch_axes(model).items() if ax is not None and ax in specs[n].dynamic_axes}


def engine_cache_key(parts: dict) -> str:
    """Cache key over everything an engine depends on (model, policy, calibration, TensorRT
    version, GPU, profiles, build settings); ``parts`` must be JSON-serialisable."""
    doc = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=list)
    return sha256_bytes(doc.encode())[:32]


def cached_engine(cache: Path, key: str) -> bool:
    """Whether the cached engine ``cache`` (``<key>.plan``) can be used: the record beside it
    (``<key>.json``, written after the plan) names ``key`` and the stamp (size, mtime) the plan had
    when it was written, and the plan still has it. A plan without its record (a write cut short, a
    cache from before the records had stamps) or truncated, rewritten or replaced since is not used:
    it is noted and built again (the new build replaces it atomically)."""
    if not cache.exists():
        return False
    try:
        record = json.loads(cache.with_suffix(".json").read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("key") == key and stamps_match(record.get("stamps"), cache.parent):
        return True
    cache_note(f"the cached TensorRT engine {cache.name} does not match the record written with it (missing, "
               "partial or changed since); it is built again")
    return False


def store_engine(cache: Path, key: str, parts: dict, data) -> None:
    """Write the engine ``data`` to ``cache``, then its record with the plan's stamp (:func:`cached_engine`)."""
    atomic_write_bytes(cache, memoryview(data))
    atomic_write_json(cache.with_suffix(".json"), {"key": key, **parts, "stamps": {cache.name: file_stamp(cache)}})


def layer_node(layer_name: str, metadata: str | None = None) -> str:
    """The ONNX node a network layer was parsed from: the first ``[ONNX Layer: <node> | ...]`` in its
    metadata (TensorRT >= 10.0's parser, read by :func:`core.backends.reports.metadata_nodes`), else the
    layer's name (the parser names layers after nodes)."""
    nodes = metadata_nodes(metadata)
    return nodes[0] if nodes else layer_name


class LayerTimes:
    """What an ``IProfiler`` reports, per layer in engine order. A run is one pass over the
    layers; a name equal to the first layer's starts the next run (trtexec's rule)."""

    def __init__(self):
        self.names: list[str] = []
        self.times: list[list[float]] = []
        self._pos = 0

    def report(self, name: str, ms: float) -> None:
        if self._pos == len(self.names):
            if self.names and self.names[0] == name:
                self._pos = 0
            else:
                self.names.append(name)
                self.times.append([])
        self.times[self._pos].append(float(ms))
        self._pos += 1

    def records(self) -> list[dict]:
        """trtexec's ``--exportProfile`` format:
        ``[{"count": runs}, {name, timeMs, averageMs, medianMs, percentage}, ...]``."""
        total = sum(sum(t) / len(t) for t in self.times) or 1.0
        rows = [{"name": n, "timeMs": sum(t), "averageMs": sum(t) / len(t), "medianMs": float(np.median(t)),
                 "percentage": 100.0 * sum(t) / len(t) / total} for n, t in zip(self.names, self.times)]
        return [{"count": max((len(t) for t in self.times), default=0)}, *rows]


def per_layer_from_reports(graph: dict, profile: list, layers, policy) -> pd.DataFrame:
    """``PER_LAYER_COLUMNS`` from the engine inspector's JSON and the profiler's records (trtexec's
    ``--exportLayerInfo``/``--exportProfile``, read by :func:`core.backends.reports.parse_layers`): each engine
    layer with the policy layer it runs (the first of its ONNX nodes, or the Q/DQ and Cast nodes
    compiled for a layer, that names one) and that layer's policy precision."""
    try:
        table = parse_layers(graph, aux_tolerant_profile(graph, profile))[0]
    except MixprecError as e:
        raise MixprecError(f"the engine's layer information and its profile do not match: {e.what}",
                           "rebuild the engine (delete it from engines/tensorrt/) so it is built with "
                           "detailed profiling verbosity") from e
    columns = ("name", "layer_type", "onnx_nodes", "qdq_nodes", "time_ms", "is_reformat")
    rows = [ProfileRow(name, kind, (*nodes, *qdq), ms, bool(reformat))
            for name, kind, nodes, qdq, ms, reformat in zip(*(table[c] for c in columns))]
    return per_layer_frame(rows, layers, policy)


def aux_tolerant_profile(graph: dict, profile: list) -> list:
    """``profile`` without the records of layers the layer information does not list, when every
    listed layer has a record: the signal/wait layers of auxiliary streams, which an ``IProfiler``
    reports but the inspector may not (issue 11, bug 12). Anything else is left for the strict match."""
    layers = graph.get("Layers") if isinstance(graph, dict) else None
    if not isinstance(layers, list) or not isinstance(profile, list):
        return profile
    names = {str(l.get("Name")) if isinstance(l, dict) else str(l) for l in layers}
    timed = {str(r["name"]) for r in profile if isinstance(r, dict) and "name" in r}
    if not names <= timed:
        return profile
    return [r for r in profile if not (isinstance(r, dict) and "name" in r) or str(r["name"]) in names]


def constraints_digest(precisions: dict, outputs: dict, ranges: dict) -> str:
    """A digest of the legacy path's per-layer precisions, output types and INT8 ranges."""
    doc = {"precisions": {k: str(v) for k, v in precisions.items()},
           "outputs": {k: str(v) for k, v in outputs.items()}, "ranges": {k: float(v) for k, v in ranges.items()}}
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())[:32]


# ---------------------------------------------------------------------------- TensorRT and the GPU

def _trt():
    try:
        import tensorrt as trt
    except Exception as e:  # noqa: BLE001 - the PyPI stub raises at import
        raise MixprecError("TensorRT is not installed", INSTALL_FIX) from e
    return trt


def tensorrt_available() -> tuple[bool, str]:
    """Whether the TensorRT backend can run here (TensorRT >= 10, Polygraphy, a CUDA device), and why (not)."""
    try:
        import tensorrt as trt

        version = str(trt.__version__)
    except Exception:  # noqa: BLE001 - the PyPI stub raises at import
        return False, f"TensorRT not installed ({INSTALL})"
    try:
        too_old = parse_version(version) < MIN_VERSION
    except MixprecError:
        too_old = True
    if too_old:
        return False, f"TensorRT {version} is installed but mixprec needs TensorRT 10.0 or newer ({INSTALL})"
    try:
        import polygraphy.backend.trt  # noqa: F401
    except Exception:  # noqa: BLE001
        return False, f"TensorRT {version} is installed but Polygraphy is not (pip install polygraphy)"
    device = cuda_device()
    if device is None:
        return False, f"TensorRT {version} is installed but no CUDA device is usable (no NVIDIA GPU or driver)"
    return True, f"TensorRT {version} on {device[0]} (compute capability {device[1]})"


def cuda_device(ordinal: int = 0) -> tuple[str, str] | None:
    """``(name, compute capability)`` of a CUDA device through the driver API (libcuda), or None.
    TensorRT and Polygraphy use the current device, which is 0 unless the process changes it."""
    try:
        cuda = ctypes.WinDLL("nvcuda.dll") if os.name == "nt" else ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    failed = (cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count)) or count.value <= ordinal
              or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) or cuda.cuDeviceGetName(name, len(name), dev)
              # 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR (cuda.h)
              or cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
              or cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev))
    return None if failed else (name.value.decode(errors="replace"), f"{major.value}.{minor.value}")


@contextmanager
def _polygraphy_log(path: Path):
    """Copy Polygraphy's log (which carries TensorRT's) to ``path`` unless the user logs to a file."""
    from polygraphy.logger import G_LOGGER

    mine = G_LOGGER.log_file is None
    if mine:
        G_LOGGER.log_file = str(path)
    try:
        yield path if mine else None
    finally:
        if mine:  # Polygraphy's setter opens the file and never closes it (issue 11, bug 11)
            opened = getattr(G_LOGGER, "_log_file", None)
            G_LOGGER.log_file = None
            if opened is not None and hasattr(opened, "close"):
                opened.close()


def _logged_errors(log: Path | None) -> list[str]:
    if log is None or not log.is_file():
        return []
    lines = (re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in log.read_text(errors="replace").splitlines())
    return [line for line in lines if line.startswith(("[E]", "[!]"))]


def _polygraphy_step(step, what: str, fix: str, log: Path | None):
    """Run a Polygraphy loader; its failures become a MixprecError with TensorRT's logged errors."""
    from polygraphy.exception import PolygraphyException

    try:
        return step()
    except PolygraphyException as e:
        raise MixprecError(what, fix, details=_logged_errors(log) or [str(e)]) from e


def _source_amax(tensor, amax: dict, producers: dict, trt) -> float | None:
    """|range| of an INT8 layer input: calibrated, or the weights of the Constant it comes from
    (through Shuffles, which keep values)."""
    while tensor is not None and tensor.name not in amax:
        layer = producers.get(tensor.name)
        if layer is None or layer.type not in (trt.LayerType.SHUFFLE, trt.LayerType.CONSTANT):
            return None
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer  # Polygraphy's idiom to reach subclass attributes
            return float(np.abs(np.asarray(layer.weights, dtype=np.float32)).max(initial=0.0))
        tensor = layer.get_input(0)
    return None if tensor is None else amax[tensor.name]


def policy_nodes(network, known) -> list[str | None]:
    """The policy node (one of ``known``) of each layer, by index: the ONNX node in its metadata, or
    its name (the parser names a node's layers after it). The parser creates some layers with no
    metadata (weight Constants and their Shuffles, ``ONNXTRT_Broadcast`` shuffles, Gemm's bias/alpha/
    beta): those take the one policy node of the layers that feed them, else of the layers they feed
    (issue 11, bug 7), so a Gemm's bias add follows its MatMul and a weight Shuffle its consumer."""
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    nodes = [n if n in known else None for n in (layer_node(l.name, l.metadata) for l in layers)]
    producer, consumers = {}, {}
    for i, layer in enumerate(layers):
        producer.update((layer.get_output(k).name, i) for k in range(layer.num_outputs))
        for k in range(layer.num_inputs):
            if layer.get_input(k) is not None:
                consumers.setdefault(layer.get_input(k).name, []).append(i)
    bare = [i for i, layer in enumerate(layers) if nodes[i] is None and not metadata_nodes(layer.metadata)]
    changed = True
    while changed:
        changed = False
        for i in (i for i in bare if nodes[i] is None):
            ins = [layers[i].get_input(k) for k in range(layers[i].num_inputs)]
            up = {nodes[producer[t.name]] for t in ins if t is not None and t.name in producer} - {None}
            down = {nodes[j] for k in range(layers[i].num_outputs)
                    for j in consumers.get(layers[i].get_output(k).name, ())} - {None}
            pick = up if len(up) == 1 else down if len(down) == 1 else None
            if pick:
                nodes[i], changed = next(iter(pick)), True
    return nodes


def legacy_constraints(network, policy, calib, trt):
    """For the policy on a parsed original (weakly typed) network: ``{layer: compute dtype}``,
    ``{layer: output dtype}`` and ``{tensor: amax}`` for the inputs of INT8 layers. INT8 nodes run
    int8 in their Convolution/Deconvolution/MatrixMultiply layers, fp32 in their other layers, and
    output fp32 whatever the network default, as the compiled model of the strongly typed path does
    (its DequantizeLinear outputs float32; issue 11, bug 6), and as trtexec --layerOutputTypes in
    export.trtexec_legacy_command."""
    dtype = {"fp32": trt.float32, "fp16": trt.float16, "int8": trt.int8}  # policy precision -> TensorRT type
    int8_kinds = {getattr(trt.LayerType, n) for n in INT8_COMPUTE}
    skip = {getattr(trt.LayerType, n) for n in NO_PRECISION}
    amax = {t: calib.amax(t) for t in calib.ranges} if calib is not None else {}
    precisions, outputs, producers, int8_layers = {}, {}, {}, []
    for i, node in enumerate(policy_nodes(network, policy.layers)):
        layer = network.get_layer(i)
        outs = [layer.get_output(k) for k in range(layer.num_outputs)]
        producers.update((t.name, layer) for t in outs)
        prec = policy.layers.get(node)
        if prec is None or layer.type in skip or not all(t.dtype in (trt.float32, trt.float16) for t in outs):
            continue
        if prec == "int8" and layer.type not in int8_kinds:
            prec = "fp32"
        precisions[layer.name] = dtype[prec]
        outputs[layer.name] = dtype["fp32" if prec == "int8" else prec]
        if prec == "int8":
            int8_layers.append(layer)
    ranges, missing = {}, []
    for layer in int8_layers:
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            if t is not None:
                a = _source_amax(t, amax, producers, trt)
                if a is None:
                    missing.append(f"{layer.name}: input {k} ({t.name})")
                else:
                    ranges[t.name] = a
    if missing:
        raise MixprecError("some INT8 layers have inputs with no calibrated range, which TensorRT "
                           "<= 10.11 needs for implicit INT8", "set these layers to fp16/fp32, or use "
                           "TensorRT >= 10.12 (strongly typed, Q/DQ)", details=missing)
    return precisions, outputs, ranges


# The network post-process script the TensorRT <= 10.11 export ships (core/export.py): trtexec cannot
# put ranges on the tensors the ONNX parser creates (weight Constants, ONNXTRT_Broadcast shuffles of
# INT8 Gemm/MatMul), so the export builds with ``polygraphy convert --trt-network-postprocess-script``.
# It applies the same constraints as :func:`legacy_constraints`; tests/backends check that they agree.
POSTPROCESS_SCRIPT = """\
\"\"\"mixprec policy {policy_sha} for {model_name}: TensorRT 10.0-10.11 network post-process script.

polygraphy convert MODEL.onnx --fp16 --precision-constraints obey \\\\
    --trt-network-postprocess-script THIS_FILE.py --trt-config-postprocess-script THIS_FILE.py -o model.plan
postprocess() sets each policy layer's precision and output type (INT8 nodes compute int8 in
their convolutions/matrix multiplies and output fp32, as the strongly typed build does), and the
dynamic range of every input of an INT8 layer: calibrated activations from AMAX, weights (the
parser's Constant layers, through Shuffles) from max |w|. postprocess_config()
enables INT8 without a calibrator (Polygraphy's --int8 would add one, calibrating on random data).\"\"\"
import re

import numpy as np
import tensorrt as trt

POLICY = {layers}
AMAX = {amax}
INT8_COMPUTE = {int8_compute!r}
NO_PRECISION = {no_precision!r}
ONNX_LAYER = re.compile({onnx_layer!r})


def _meta(layer):
    return [n.strip() for n in ONNX_LAYER.findall(layer.metadata or "") if n.strip()]


def _nodes(network):
    # the policy node of each layer; layers the parser made without metadata take the one node of
    # the layers that feed them, else of the layers they feed
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    nodes = [n if n in POLICY else None for n in ((_meta(l) or [l.name])[0] for l in layers)]
    producer, consumers = {{}}, {{}}
    for i, layer in enumerate(layers):
        producer.update((layer.get_output(k).name, i) for k in range(layer.num_outputs))
        for k in range(layer.num_inputs):
            if layer.get_input(k) is not None:
                consumers.setdefault(layer.get_input(k).name, []).append(i)
    bare = [i for i, layer in enumerate(layers) if nodes[i] is None and not _meta(layer)]
    changed = True
    while changed:
        changed = False
        for i in [i for i in bare if nodes[i] is None]:
            ins = [layers[i].get_input(k) for k in range(layers[i].num_inputs)]
            up = {{nodes[producer[t.name]] for t in ins if t is not None and t.name in producer}} - {{None}}
            down = {{nodes[j] for k in range(layers[i].num_outputs)
                    for j in consumers.get(layers[i].get_output(k).name, ())}} - {{None}}
            pick = up if len(up) == 1 else down if len(down) == 1 else None
            if pick:
                nodes[i], changed = next(iter(pick)), True
    return nodes


def _amax(tensor, producers):
    while tensor is not None and tensor.name not in AMAX:
        layer = producers.get(tensor.name)
        if layer is None or layer.type not in (trt.LayerType.SHUFFLE, trt.LayerType.CONSTANT):
            return None
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer
            return float(np.abs(np.asarray(layer.weights, dtype=np.float32)).max(initial=0.0))
        tensor = layer.get_input(0)
    return None if tensor is None else AMAX[tensor.name]


def postprocess(network):
    types = {{"fp32": trt.float32, "fp16": trt.float16, "int8": trt.int8}}
    int8_kinds = {{getattr(trt.LayerType, n) for n in INT8_COMPUTE}}
    skip = {{getattr(trt.LayerType, n) for n in NO_PRECISION}}
    producers, int8_layers, ranges, missing = {{}}, [], {{}}, []
    for i, node in enumerate(_nodes(network)):
        layer = network.get_layer(i)
        outs = [layer.get_output(k) for k in range(layer.num_outputs)]
        producers.update((t.name, layer) for t in outs)
        prec = POLICY.get(node)
        if prec is None or layer.type in skip or not all(t.dtype in (trt.float32, trt.float16) for t in outs):
            continue
        if prec == "int8" and layer.type not in int8_kinds:
            prec = "fp32"
        layer.precision = types[prec]
        for k in range(layer.num_outputs):
            layer.set_output_type(k, types["fp32" if prec == "int8" else prec])
        if prec == "int8":
            int8_layers.append(layer)
    for layer in int8_layers:
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            if t is not None:
                a = _amax(t, producers)
                if a is None:
                    missing.append(f"{{layer.name}}: input {{k}} ({{t.name}})")
                else:
                    ranges[t.name] = a
                    t.dynamic_range = (-a, a)
    if missing:
        raise RuntimeError("INT8 layers with inputs that have no range: " + ", ".join(missing))
    return network


def postprocess_config(builder, network, config):
    if "int8" in POLICY.values():
        config.set_flag(trt.BuilderFlag.INT8)
"""


def legacy_postprocess_script(policy, calib) -> str:
    """The Polygraphy network post-process script (``POSTPROCESS_SCRIPT``) for ``policy`` with the
    ranges of ``calib`` (None: a policy without INT8)."""
    amax = {t: calib.amax(t) for t in sorted(calib.ranges)} if calib is not None else {}
    def literal(d: dict) -> str:
        return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in d.items()) + "}"

    return POSTPROCESS_SCRIPT.format(
        policy_sha=policy.sha256[:12], model_name=policy.model_name, layers=literal(dict(policy.layers)),
        amax=literal(amax), int8_compute=INT8_COMPUTE,
        no_precision=NO_PRECISION, onnx_layer=_ONNX_LAYER.pattern)


def _apply_types_and_ranges(network, outputs: dict, ranges: dict):
    """A ``PostprocessNetwork`` step: output types of constrained layers, dynamic ranges of INT8 inputs."""
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for k in range(layer.num_outputs):
            if layer.name in outputs:
                layer.set_output_type(k, outputs[layer.name])
            t = layer.get_output(k)
            if t.name in ranges:
                t.dynamic_range = (-ranges[t.name], ranges[t.name])
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t.name in ranges:
            t.dynamic_range = (-ranges[t.name], ranges[t.name])
    return network


def _layer_profiler():
    trt = _trt()

    class _Profiler(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)
            self.times = LayerTimes()

        def report_layer_time(self, layer_name, ms):
            self.times.report(layer_name, ms)

    return _Profiler()


def _device_array(a: np.ndarray):
    from polygraphy.cuda import DeviceArray
    from polygraphy.datatype import DataType

    a = np.ascontiguousarray(a)
    return DeviceArray(shape=a.shape, dtype=DataType.from_dtype(a.dtype)).copy_from(a)


def _place(src: Path, dst: Path) -> Path:
    """``dst`` as a hard link to ``src`` (a copy across file systems)."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


# ---------------------------------------------------------------------------- GPU timing (issue 11, bug 3)

CUDA_EVENT_BLOCKING_SYNC = 0x01  # cudaEventBlockingSync (driver_types.h), trtexec's default; timing stays on
IN_FLIGHT = 2  # rounds enqueued ahead of the one being read: trtexec's default depth (1 + --overlap)


class CudaEvents:
    """CUDA events through the CUDA runtime that Polygraphy loaded (``polygraphy.cuda.wrapper().handle``,
    libcudart): what trtexec's ``TrtCudaEvent`` does (``cudaEventCreateWithFlags``, ``cudaEventRecord``,
    ``cudaEventSynchronize``, ``cudaEventElapsedTime``, ``cudaEventDestroy``). A context manager that
    destroys the events it created."""

    def __init__(self):
        from polygraphy.cuda import wrapper

        self._cuda, self._events = wrapper(), []

    def _call(self, fn: str, *args) -> None:
        self._cuda.check(getattr(self._cuda.handle, fn)(*args))

    def create(self) -> int:
        event = ctypes.c_void_p()
        self._call("cudaEventCreateWithFlags", ctypes.byref(event), ctypes.c_uint(CUDA_EVENT_BLOCKING_SYNC))
        self._events.append(event.value)
        return event.value

    def record(self, event: int, stream_ptr: int) -> None:
        self._call("cudaEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream_ptr))

    def wait(self, event: int) -> None:
        """Block until the GPU has passed ``event``."""
        self._call("cudaEventSynchronize", ctypes.c_void_p(event))

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self._call("cudaEventElapsedTime", ctypes.byref(ms), ctypes.c_void_p(start), ctypes.c_void_p(end))
        return float(ms.value)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        while self._events:
            self._call("cudaEventDestroy", ctypes.c_void_p(self._events.pop()))


def gpu_times(launches, stream, events, warmup: int, iterations: int, depth: int = IN_FLIGHT) -> list[list[float]]:
    """GPU compute time in ms of each of ``launches`` (callables that enqueue one inference on a stream
    pointer), as trtexec measures it: one CUDA event before and one after each enqueue on ``stream``,
    the time between them read once the GPU has passed them. A round runs the launches in order back
    to back (candidate, reference, candidate, ...: both see the same clocks and temperature); the first
    ``warmup`` rounds are not timed. Up to ``depth`` rounds are in flight, so the GPU does not wait for
    Python to enqueue the next round; a round's events are reused only after they were read."""
    if iterations < 1 or warmup < 0 or depth < 1:
        raise MixprecError(f"cannot time {iterations} iterations after {warmup} warm-up rounds",
                           "time at least one iteration, with zero or more warm-up rounds")
    slots = [[events.create() for _ in range(len(launches) + 1)] for _ in range(depth)]
    times: list[list[float]] = [[] for _ in launches]
    pending: list[tuple[list[int], bool]] = []

    def read(slot: list[int], timed: bool) -> None:
        events.wait(slot[-1])
        if timed:
            for k, t in enumerate(times):
                t.append(events.elapsed_ms(slot[k], slot[k + 1]))

    for i in range(warmup + iterations):
        if len(pending) == depth:
            read(*pending.pop(0))
        slot = slots[i % depth]
        events.record(slot[0], stream.ptr)
        for k, launch in enumerate(launches):
            launch(stream.ptr)
            events.record(slot[k + 1], stream.ptr)
        pending.append((slot, i >= warmup))
    for slot, timed in pending:
        read(slot, timed)
    stream.synchronize()
    return times


@contextmanager
def _cuda_errors(what: str):
    """A failed CUDA call (Polygraphy's ``Cuda.check`` raises) as a MixprecError."""
    from polygraphy.exception import PolygraphyException

    try:
        yield
    except PolygraphyException as e:
        raise MixprecError(f"a CUDA call failed while {what}: {e}",
                           "check the GPU and driver (nvidia-smi), then build again") from e


class BoundEngine:
    """An execution context with every input and output bound once to GPU memory (``set_input_shape``,
    ``set_tensor_address``), as trtexec binds its buffers: :meth:`enqueue` is one ``execute_async_v3``,
    with no Python-side setup, no output-allocator callbacks and no synchronisation."""

    def __init__(self, context, host: list):
        self.context, self._host = context, host  # host: shape-tensor inputs read from host memory

    def enqueue(self, stream_ptr: int) -> None:
        if not self.context.execute_async_v3(stream_ptr):
            raise MixprecError("TensorRT's execute_async_v3 failed on the engine's bound buffers",
                               "read TensorRT's errors in the log (Polygraphy prints them); build the engine "
                               "again on this machine")


def bind_engine(trt, engine, context, feed: dict, device: dict, stack: ExitStack) -> BoundEngine:
    """``context`` of ``engine`` bound to the inputs ``feed`` (host arrays) / ``device`` (their GPU copies)
    and to output buffers allocated here (freed when ``stack`` closes). Outputs whose shape depends on
    the data get the upper bound TensorRT gives (``get_max_output_size``)."""
    from polygraphy.cuda import DeviceArray
    from polygraphy.datatype import DataType

    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    missing = sorted(set(inputs) - set(feed))
    if missing:
        raise MixprecError("the timing feed lacks inputs of the engine", "feed every input of the model",
                           details=missing)
    host, failed = [], []
    for name in inputs:
        a = np.ascontiguousarray(feed[name])
        if DataType.from_dtype(a.dtype) != DataType.from_dtype(engine.get_tensor_dtype(name), source_module="tensorrt"):
            failed.append(f"{name}: fed {a.dtype}, the engine takes {engine.get_tensor_dtype(name)}")
            continue
        shape_io = engine.is_shape_inference_io(name)  # shape tensors are read from host memory
        host += [a] if shape_io else []
        ptr = a.ctypes.data if shape_io else device[name].ptr
        if not (context.set_input_shape(name, a.shape) and context.set_tensor_address(name, ptr)):
            failed.append(f"{name}: shape {a.shape} not accepted")
    for name in (n for n in names if n not in inputs):
        shape = tuple(context.get_tensor_shape(name))
        if all(d >= 0 for d in shape):
            buf = DeviceArray(shape=shape, dtype=DataType.from_dtype(engine.get_tensor_dtype(name),
                                                                     source_module="tensorrt"))
        else:  # a data-dependent shape: TensorRT's upper bound in bytes (-1: none known)
            nbytes = int(context.get_max_output_size(name))
            if nbytes < 0:
                failed.append(f"{name}: its shape depends on the data and TensorRT gives no upper bound")
                continue
            buf = DeviceArray.raw((nbytes,))
        stack.enter_context(buf)
        if not context.set_tensor_address(name, buf.ptr):
            failed.append(f"{name}: output address not accepted")
    if failed:
        raise MixprecError("cannot bind the engine's inputs and outputs for timing", "feed inputs of the model's "
                           "types and shapes within the engine's optimisation profile", details=failed)
    return BoundEngine(context, host)


# ---------------------------------------------------------------------------- runner and backend

class TrtEngineRunner(Runner):
    """Polygraphy's ``TrtRunner`` over a serialized engine (a ``.plan`` file)."""

    def __init__(self, plan: Path):
        self.plan = Path(plan)
        self.trt_runner = None

    def activate(self):
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        try:
            data = self.plan.read_bytes()
        except OSError as e:
            raise MixprecError(f"cannot read the TensorRT engine {self.plan}: {e.strerror}",
                               "build the policy again") from e
        runner = TrtRunner(EngineFromBytes(data), name=self.plan.stem)
        _polygraphy_step(runner.activate, f"TensorRT cannot load the engine {self.plan.name}",
                         "engines run only on the GPU model and TensorRT version they were built with: "
                         "build again on this machine (or delete the engine from engines/tensorrt/)", None)
        self.trt_runner = runner

    def _active(self):
        if self.trt_runner is None:
            raise MixprecError("the runner is not active", "call activate() or use it as a context manager")
        return self.trt_runner

    def infer(self, feed):
        return {k: np.array(v, copy=True) for k, v in self._active().infer(feed).items()}

    def bind(self, feed: dict, device: dict, stack: ExitStack) -> BoundEngine:
        """This runner's execution context bound once to ``device`` (the GPU copies of ``feed``) and to
        output buffers that ``stack`` frees (:func:`bind_engine`), for timing and profiling."""
        runner = self._active()
        return bind_engine(_trt(), runner.engine, runner.context, feed, device, stack)

    def deactivate(self):
        if self.trt_runner is not None:
            self.trt_runner.deactivate()
            self.trt_runner = None


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, ws: Workspace | None = None, profiles: dict | None = None,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, mode: str = "auto", tf32: bool = False):
        """``profiles``: ``{input: (min, opt, max)}`` replacing the default ranges of :func:`profile_shapes`
        (quality is evaluated in batches of up to ``core.model.shapes.EVAL_BATCH`` where the batch axis is dynamic, so a
        range should reach that); ``workspace_bytes``: the builder's workspace pool; ``mode``: ``auto``
        (by TensorRT version), ``strongly-typed`` or ``legacy``; ``tf32``: let FP32 layers use TF32
        (off by default, as in Polygraphy; trtexec needs ``--noTF32`` to match)."""
        if mode not in MODES:
            raise MixprecError(f"unknown TensorRT build mode {mode!r}", f"use one of {', '.join(MODES)}")
        self._ws, self.profiles, self.workspace_bytes, self.mode = ws, profiles, int(workspace_bytes), mode
        self.tf32 = bool(tf32)

    def identity(self) -> str:
        """What this backend's outputs depend on besides the engine's inputs: TensorRT version, GPU
        and TF32 (the FP32 reference-output cache is keyed by it, issue 11, bug 5)."""
        gpu = cuda_device() or ("no GPU", "?")
        return f"tensorrt {_trt().__version__} on {gpu[0]} (sm {gpu[1]}) tf32={self.tf32}"

    @property
    def ws(self) -> Workspace:
        return self._ws or Workspace.default()

    @classmethod
    def available(cls):
        return tensorrt_available()

    def _config(self, trt, mode: str, shapes: dict, fp16: bool = False, int8: bool = False):
        from polygraphy.backend.trt import CreateConfig, Profile

        profile = Profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.add(name, min=lo, opt=opt, max=hi)
        return CreateConfig(fp16=fp16, int8=int8, tf32=self.tf32,
                            precision_constraints="obey" if mode == "legacy" else None,
                            profiles=[profile], profiling_verbosity=trt.ProfilingVerbosity.DETAILED,
                            memory_pool_limits={trt.MemoryPoolType.WORKSPACE: self.workspace_bytes})

    def _parse(self, onnx_path: Path, mode: str, log):
        """The parsed network as Polygraphy's (builder, network, parser)."""
        from polygraphy.backend.trt import NetworkFromOnnxPath

        return _polygraphy_step(
            NetworkFromOnnxPath(str(onnx_path), strongly_typed=mode == "strongly-typed"),
            f"TensorRT's ONNX parser rejects {onnx_path.name} ({mode} build)",
            "set the nodes named here to fp32; if the original model fails too, it uses operators this "
            "TensorRT cannot parse (polygraphy inspect capability MODEL lists them)", log)

    def _network(self, trt, network, constraints):
        """The parsed network with the legacy ``constraints`` applied (None: as parsed), and the FP16/INT8
        flags it needs."""
        from polygraphy.backend.trt import PostprocessNetwork, SetLayerPrecisions

        if constraints is None:
            return network, False, False
        precisions, outputs, ranges = constraints
        apply = functools.partial(_apply_types_and_ranges, outputs=outputs, ranges=ranges)
        network = PostprocessNetwork(SetLayerPrecisions(network, precisions), apply,
                                     name="mixprec output types and INT8 ranges")()
        used = set(precisions.values()) | set(outputs.values())
        return network, trt.float16 in used, trt.int8 in used

    def _build(self, model, policy, calib, out_dir, input_shapes, stem: str) -> Engine:
        import polygraphy
        from polygraphy.backend.trt import EngineBytesFromNetwork

        t0 = time.perf_counter()
        trt = _trt()
        mode = build_mode(trt.__version__, self.mode)
        shapes = profile_shapes(input_shapes, self.profiles, dynamic_batch_axes(model))
        gpu = cuda_device()
        if gpu is None:
            raise MixprecError("TensorRT is installed but no CUDA device is usable",
                               "run on a machine with an NVIDIA GPU and driver, or use --backend onnxruntime")
        int8 = policy is not None and "int8" in policy.layers.values()
        if policy is not None and policy.model_sha256 != model.sha256:  # compile_policy's checks, for both paths
            raise MixprecError(f"the policy was made for another model ({policy.model_name})",
                               f"build it with the model it was made for, or make a new policy for {model.name}")
        if int8 and calib is None:
            raise MixprecError("the policy has INT8 layers but no calibration was given",
                               "calibrate first (core.quant.calibration.calibrate), or set those layers to fp16/fp32")
        out_dir = Path(out_dir)
        if policy is not None and mode == "strongly-typed":
            require_trt_opset(model)
            onnx_path = compile_policy(model, policy, calib, target="trt").save(out_dir / "compiled.onnx")
        else:  # a model whose weights stay external is written with its data files beside it (core.model.external)
            onnx_path = model.save(out_dir / (f"{stem}.onnx" if policy is None else "model.onnx"))
        with _polygraphy_log(out_dir / f"{stem}.tensorrt-build.log") as log:
            # the legacy constraints depend on the parsed network, so it is parsed before the cache lookup
            network = self._parse(onnx_path, mode, log) if mode == "legacy" and policy is not None else None
            constraints = None if network is None else legacy_constraints(network[1], policy, calib, trt)
            # the key covers what is parsed and how it is constrained: a compiler change is a new engine
            parts = {"model_sha256": model.sha256, "policy_sha256": policy.sha256 if policy else "reference-fp32",
                     "calibration": calib.key if int8 and calib is not None else None, "mode": mode,
                     "onnx_sha256": saved_sha256(onnx_path, model.weights),
                     "legacy_constraints": None if constraints is None else constraints_digest(*constraints),
                     "tf32": self.tf32, "tensorrt": trt.__version__, "polygraphy": polygraphy.__version__,
                     "gpu": gpu[0], "compute_capability": gpu[1], "profiles": shapes,
                     "workspace_bytes": self.workspace_bytes}
            key = engine_cache_key(parts)
            cache = self.ws.sub("engines", "tensorrt") / f"{key}.plan"
            hit = cached_engine(cache, key)
            if not hit:
                network, fp16, use_int8 = self._network(trt, network or self._parse(onnx_path, mode, log),
                                                        constraints)
                config = self._config(trt, mode, shapes, fp16=fp16, int8=use_int8)
                data = _polygraphy_step(
                    EngineBytesFromNetwork(network, config=config),
                    f"TensorRT could not build the engine ({mode} build, TensorRT {trt.__version__})",
                    "read TensorRT's errors listed here; usually a layer has no kernel in the precision the "
                    "policy obeys (set it to fp16/fp32) or the builder workspace is too small "
                    "(TensorRTBackend(workspace_bytes=...))", log)
        if not hit:
            store_engine(cache, key, parts, data)
        plan = _place(cache, out_dir / f"{stem}.plan")
        atomic_write_json(out_dir / f"{stem}.tensorrt.json", {"key": key, "cache_hit": hit, "engine_cache": str(cache),
                                                              **parts})
        return Engine(self.name, onnx_path, plan, time.perf_counter() - t0, dict(input_shapes))

    def build(self, model, policy, calib, out_dir, input_shapes):
        return self._build(model, policy, calib, out_dir, input_shapes, "compiled")

    def reference(self, model, out_dir, input_shapes):
        return self._build(model, None, None, out_dir, input_shapes, "reference-fp32")

    def runner(self, engine):
        return TrtEngineRunner(engine.artifact_path)

    def _on_gpu(self, stack: ExitStack, feed: dict, *engines):
        """For each of ``engines``: an active runner's context bound to ``feed`` copied to the GPU, and one
        stream to run them on; all released when ``stack`` closes (the stream synchronized first)."""
        from polygraphy.cuda import Stream

        runners = [stack.enter_context(self.runner(e)) for e in engines]
        device = {k: stack.enter_context(_device_array(v)) for k, v in feed.items()}
        bound = [r.bind(feed, device, stack) for r in runners]
        stream = stack.enter_context(Stream())
        stack.callback(stream.synchronize)  # nothing is freed while the GPU may still use it
        return runners, bound, stream

    def time_interleaved(self, candidate, reference, feed, warmup=10, iterations=100) -> Latency:
        """GPU compute time of ``execute_async_v3`` on buffers bound once, from CUDA events (trtexec's
        "GPU Compute Time"; :func:`gpu_times`): candidate and reference alternate on one stream, after
        ``warmup`` untimed rounds; median and p95 of each, and the median of the pairwise ratios."""
        with _cuda_errors("timing the engines"), ExitStack() as stack:
            _, bound, stream = self._on_gpu(stack, feed, candidate, reference)
            events = stack.enter_context(CudaEvents())
            tc, tr = gpu_times([b.enqueue for b in bound], stream, events, warmup, iterations)
        return latency_from_pairs([t / 1e3 for t in tc], [t / 1e3 for t in tr])

    def profile(self, engine, feed, iterations, layers, policy) -> pd.DataFrame:
        """Per-layer time from TensorRT's ``IProfiler`` over ``iterations`` runs of the bound context
        (with a profiler attached, ``execute_async_v3`` times each layer and reports before it returns:
        ``enqueue_emits_profile`` is true by default)."""
        trt = _trt()
        with _cuda_errors("profiling the engine"), ExitStack() as stack:
            (r,), (b,), stream = self._on_gpu(stack, feed, engine)
            for _ in range(3):
                b.enqueue(stream.ptr)
            stream.synchronize()
            profiler = _layer_profiler()
            b.context.profiler = profiler
            for _ in range(iterations):
                b.enqueue(stream.ptr)
                stream.synchronize()
            inspector = r.trt_runner.engine.create_engine_inspector()
            inspector.execution_context = b.context
            graph = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        records = profiler.times.records()
        out = Path(engine.artifact_path).parent
        atomic_write_json(out / "trt-layers.json", graph)  # trtexec --exportLayerInfo / --exportProfile
        atomic_write_json(out / "trt-profile.json", records)
        return per_layer_from_reports(graph, records, layers, policy)
