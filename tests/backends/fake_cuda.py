"""A simulated GPU behind Polygraphy's real ``polygraphy.cuda`` (``Stream``, ``DeviceArray``, ``wrapper()``):
a fake CUDA runtime (the ``libcudart`` functions Polygraphy and mixprec call through ctypes) with one
virtual clock per stream, and a fake TensorRT engine and execution context whose ``execute_async_v3``
puts an inference of a given GPU duration on that clock. Events recorded on a stream take the
stream's clock, so ``cudaEventElapsedTime`` gives exactly the GPU time enqueued between them, as on
a real GPU, while host-side time (Python, ``time.perf_counter``) never reaches it."""
from __future__ import annotations

import ctypes
import itertools

import numpy as np
from polygraphy.datatype import DataType


def _set(ref, value) -> None:
    """Write through a ``ctypes.byref`` argument, as the C function would."""
    ref._obj.value = value


def _int(p) -> int:
    return p.value if isinstance(p, ctypes.c_void_p) else int(p or 0)


class FakeCudart:
    """The libcudart entry points used here. Every call returns cudaSuccess (0) and is logged."""

    def __init__(self):
        self._ids = itertools.count(0x1000, 0x100)
        self.clock: dict[int, float] = {}      # stream -> ms of GPU work enqueued on it so far
        self.events: dict[int, float | None] = {}  # event -> the stream clock when recorded
        self.memory: dict[int, int] = {}
        self.calls: list[str] = []
        self.blocking_flags: list[int] = []
        self.unsynced: set[int] = set()  # streams with GPU work enqueued since their last synchronisation

    def __getattr__(self, name):
        raise AttributeError(f"the fake CUDA runtime has no {name}")

    def _log(self, name):
        self.calls.append(name)
        return 0

    def cudaStreamCreate(self, ref):
        s = next(self._ids)
        self.clock[s] = 0.0
        _set(ref, s)
        return self._log("cudaStreamCreate")

    def cudaStreamSynchronize(self, s):
        self.unsynced.discard(_int(s))
        return self._log("cudaStreamSynchronize")

    def cudaStreamDestroy(self, s):
        del self.clock[_int(s)]
        return self._log("cudaStreamDestroy")

    def cudaMalloc(self, ref, nbytes):
        p = next(self._ids)
        self.memory[p] = nbytes.value
        _set(ref, p)
        return self._log("cudaMalloc")

    def cudaFree(self, p):
        assert not (_int(p) in self.memory and self.unsynced), "GPU memory freed while a stream may still use it"
        self.memory.pop(_int(p), None)
        return self._log("cudaFree")

    def cudaMemcpy(self, dst, src, nbytes, kind):
        return self._log("cudaMemcpy")

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        return self._log("cudaMemcpyAsync")

    def cudaEventCreateWithFlags(self, ref, flags):
        e = next(self._ids)
        self.events[e] = None
        self.blocking_flags.append(flags.value)
        _set(ref, e)
        return self._log("cudaEventCreateWithFlags")

    def cudaEventRecord(self, e, s):
        self.events[_int(e)] = self.clock[_int(s)]
        return self._log("cudaEventRecord")

    def cudaEventSynchronize(self, e):
        assert self.events[_int(e)] is not None, "synchronizing an event never recorded"
        return self._log("cudaEventSynchronize")

    def cudaEventElapsedTime(self, ref, start, end):
        _set(ref, self.events[_int(end)] - self.events[_int(start)])
        return self._log("cudaEventElapsedTime")

    def cudaEventDestroy(self, e):
        del self.events[_int(e)]
        return self._log("cudaEventDestroy")


def install(monkeypatch) -> FakeCudart:
    """Polygraphy's global CUDA wrapper over a :class:`FakeCudart` (``Stream``, ``DeviceArray`` and
    ``wrapper()`` all use it) for the rest of the test."""
    import polygraphy.cuda.cuda as pcc

    lib = FakeCudart()
    fake = object.__new__(pcc.Cuda)  # Cuda.__init__ would load libcudart
    fake.handle = lib
    monkeypatch.setattr(pcc, "G_CUDA", fake)
    return lib


class FakeContext:
    """An ``IExecutionContext``: input shapes and tensor addresses as set, and ``execute_async_v3``
    adding the next of ``durations`` (ms) to the stream's GPU clock. It can only run with every I/O
    tensor bound; ``profiler`` (when set) gets the engine's layer times at each run."""

    def __init__(self, engine, lib: FakeCudart, durations):
        self.engine, self.lib, self.durations = engine, lib, iter(durations)
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.set_address_calls = 0
        self.runs = 0
        self.profiler = None

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, ptr):
        self.set_address_calls += 1
        self.addresses[name] = int(ptr)
        return True

    def get_tensor_shape(self, name):
        return self.engine.output_shapes[name]

    def get_max_output_size(self, name):
        return 4096

    def execute_async_v3(self, stream_handle):
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        assert set(self.addresses) == set(names), f"unbound tensors: {set(names) - set(self.addresses)}"
        assert all(self.addresses[n] in self.lib.memory for n in self.engine.output_shapes), "outputs not on the GPU"
        self.lib.clock[int(stream_handle)] += next(self.durations)
        self.lib.unsynced.add(int(stream_handle))
        self.runs += 1
        if self.profiler is not None:
            for i, layer in enumerate(self.engine.layer_names):
                self.profiler.report_layer_time(layer, 0.1 * (i + 1))
        return True


class FakeEngine:
    """An ``ICudaEngine`` with named I/O tensors (``inputs``/``outputs``: name -> (shape, numpy dtype));
    ``durations`` are the GPU times of its successive runs, ``layer_names`` what a profiler sees."""

    def __init__(self, inputs: dict, outputs: dict, durations, layer_names=()):
        self.inputs, self.outputs, self.durations = inputs, outputs, durations
        self.output_shapes = {n: shape for n, (shape, _) in outputs.items()}
        self.layer_names = list(layer_names)
        self.num_io_tensors = len(inputs) + len(outputs)

    def get_tensor_name(self, i):
        return [*self.inputs, *self.outputs][i]

    def get_tensor_mode(self, name):
        return "INPUT" if name in self.inputs else "OUTPUT"

    def get_tensor_dtype(self, name):
        return DataType.from_dtype(np.dtype({**self.inputs, **self.outputs}[name][1]))

    def is_shape_inference_io(self, name):
        return False

    def create_execution_context(self, lib: FakeCudart):
        return FakeContext(self, lib, self.durations)
