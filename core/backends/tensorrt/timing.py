"""Timing: GPU compute time of whole engines and TensorRT's time per layer.

Latency is GPU compute time, as trtexec measures it: each engine's execution context is bound once to
GPU buffers (:func:`bind_engine`) and each ``execute_async_v3`` is bracketed by CUDA events on one
stream (:func:`gpu_times`, :class:`CudaEvents`), never Polygraphy's per-call ``infer`` (issue 11, bug 3).
Per-layer time is what an ``IProfiler`` reports (:class:`LayerTimes`, in trtexec's ``--exportProfile``
format), joined to the engine inspector's layer information (:func:`per_layer_from_reports`).
"""
from __future__ import annotations

import ctypes
from contextlib import ExitStack, contextmanager

import numpy as np
import pandas as pd

from core.backends.base import ProfileRow, per_layer_frame
from core.backends.reports import parse_layers
from core.errors import MixprecError

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
def cuda_errors(what: str):
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



def device_array(a: np.ndarray):
    """A GPU copy of the host array ``a`` (Polygraphy's ``DeviceArray``; a context manager that frees it)."""
    from polygraphy.cuda import DeviceArray
    from polygraphy.datatype import DataType

    a = np.ascontiguousarray(a)
    return DeviceArray(shape=a.shape, dtype=DataType.from_dtype(a.dtype)).copy_from(a)



# ---------------------------------------------------------------------------- per-layer time

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
