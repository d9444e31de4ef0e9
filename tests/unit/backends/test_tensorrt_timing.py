"""Issue 11, bug 3: TensorRT latency is the GPU compute time of ``execute_async_v3`` on buffers bound
once, read from CUDA events (as trtexec's "GPU Compute Time"), not the wall-clock time of Polygraphy's
``TrtRunner.infer`` (Python setup, output-allocator callbacks and a synchronisation on every call,
which pushed speedups towards 1x).

No GPU here: Polygraphy's real ``Stream``/``DeviceArray``/``wrapper()`` run over a simulated CUDA
runtime (``fake_cuda``) whose streams keep a virtual GPU clock. An engine's runs take known GPU
times, so the expected median, p95 and speedup follow from them; a timing taken around ``infer``
(the old path) sees only host time and fails these tests."""
from __future__ import annotations

import itertools
import sys
import types

import numpy as np
import pytest

import core.backends.tensorrt as tb
from core.backends.base import Engine
from core.backends.tensorrt import runner, timing
from core.errors import MixprecError
from tests.fixtures.fake_cuda import FakeEngine, install


class _Events:
    """The event half of :class:`core.backends.tensorrt.timing.CudaEvents` over a virtual clock, checking that
    an event is read, or recorded again, only after the GPU has passed it (a wait on it or on a later one)."""

    def __init__(self, clock):
        self.clock, self.stamps, self.seq, self.passed, self.log = clock, {}, {}, set(), []

    def create(self):
        e = len(self.stamps)
        self.stamps[e] = None
        return e

    def record(self, e, stream_ptr):
        assert self.stamps[e] is None or e in self.passed, "event recorded again before the GPU passed it"
        self.stamps[e], self.seq[e] = self.clock[0], len(self.log)
        self.passed.discard(e)
        self.log.append(("record", e))

    def wait(self, e):
        self.passed |= {x for x, n in self.seq.items() if n <= self.seq[e]}
        self.log.append(("wait", e))

    def elapsed_ms(self, a, b):
        assert {a, b} <= self.passed, "elapsed time read before the GPU passed the events"
        return self.stamps[b] - self.stamps[a]


def test_gpu_times_pairs_events_around_each_enqueue_and_skips_the_warmup():
    clock, order = [0.0], []
    cand = iter([50.0, 40.0, 2.0, 2.5, 1.5, 2.0, 3.0])  # two slow warm-up runs, then the timed ones
    ref = iter([90.0, 80.0, 5.0, 6.0, 4.0, 5.5, 5.0])

    def launch(name, durations):
        def run(stream_ptr):
            assert stream_ptr == 7
            order.append(name)
            clock[0] += next(durations)
        return run

    events, stream = _Events(clock), types.SimpleNamespace(ptr=7, synced=0)
    stream.synchronize = lambda: setattr(stream, "synced", stream.synced + 1)
    tc, tr = timing.gpu_times([launch("c", cand), launch("r", ref)], stream, events, warmup=2, iterations=5)
    assert tc == [2.0, 2.5, 1.5, 2.0, 3.0] and tr == [5.0, 6.0, 4.0, 5.5, 5.0]
    assert order == ["c", "r"] * 7 and stream.synced == 1
    assert len(events.stamps) == 2 * 3  # IN_FLIGHT slots of (start, between, end) events, reused
    # never more than IN_FLIGHT rounds enqueued ahead of the one being read
    ahead, worst = 0, 0
    for kind, e in events.log:
        ahead += kind == "record" and e % 3 == 0
        ahead -= kind == "wait"
        worst = max(worst, ahead)
    assert worst == timing.IN_FLIGHT


@pytest.mark.parametrize("warmup, iterations", [(0, 0), (-1, 5)])
def test_gpu_times_refuses_nothing_to_time(warmup, iterations):
    with pytest.raises(MixprecError, match="cannot time"):
        timing.gpu_times([lambda p: None], types.SimpleNamespace(ptr=1), _Events([0.0]), warmup, iterations)


def test_cuda_events_call_the_cuda_runtime(monkeypatch):
    lib = install(monkeypatch)
    from polygraphy.cuda import Stream

    with Stream() as stream, timing.CudaEvents() as ev:
        a, b = ev.create(), ev.create()
        ev.record(a, stream.ptr)
        lib.clock[stream.ptr] += 1.25
        ev.record(b, stream.ptr)
        ev.wait(b)
        assert ev.elapsed_ms(a, b) == pytest.approx(1.25)
    assert lib.blocking_flags == [timing.CUDA_EVENT_BLOCKING_SYNC] * 2 and not lib.events  # destroyed
    assert lib.calls.count("cudaEventDestroy") == 2


# ---------------------------------------------------------------------------- the backend's timing

class _TrtRunner:
    """Stands in for Polygraphy's TrtRunner over a FakeEngine: ``activate`` makes the context; ``infer``,
    the per-call path the old timing wrapped with ``time.perf_counter``, is only logged."""

    engines: dict[bytes, FakeEngine] = {}
    lib = None
    infer_calls: list = []

    def __init__(self, engine, name=None):
        self.loader, self.name = engine, name

    def activate(self):
        self.engine = self.engines[self.loader()]
        self.context = self.engine.create_execution_context(self.lib)

    def infer(self, feed, **kwargs):
        _TrtRunner.infer_calls.append(self.name)
        return {}

    def deactivate(self):
        del self.context, self.engine


def _fake_trt():
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.12.0.36"
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    return trt


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    import polygraphy.backend.trt as pt

    lib = install(monkeypatch)
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_trt())
    monkeypatch.setattr(pt, "EngineFromBytes", lambda data: lambda: data)
    monkeypatch.setattr(pt, "TrtRunner", _TrtRunner)
    monkeypatch.setattr(_TrtRunner, "lib", lib)
    monkeypatch.setattr(_TrtRunner, "engines", {})
    monkeypatch.setattr(_TrtRunner, "infer_calls", [])

    def engine(name, durations):
        plan = tmp_path / f"{name}.plan"
        plan.write_bytes(name.encode())
        _TrtRunner.engines[name.encode()] = FakeEngine(
            {"x": ((2, 8), np.float32), "mask": ((2, 8), np.int64)}, {"y": ((2, 4), np.float32)}, durations)
        return Engine("tensorrt", tmp_path / "c.onnx", plan, 0.0, {"x": (2, 8), "mask": (2, 8)})

    return types.SimpleNamespace(lib=lib, engine=engine)


FEED = {"x": np.ones((2, 8), np.float32), "mask": np.ones((2, 8), np.int64)}


def test_time_interleaved_reports_the_gpu_time_of_bound_execute_async_v3(gpu):
    rng = np.random.default_rng(0)
    warmup, iterations = 3, 40
    cand_ms = rng.uniform(1.8, 2.6, iterations)   # e.g. an INT8 engine
    ref_ms = rng.uniform(4.5, 6.5, iterations)    # the FP32 reference
    cand = gpu.engine("cand", [30.0] * warmup + list(cand_ms))  # slow first runs: excluded
    ref = gpu.engine("ref", [60.0] * warmup + list(ref_ms))
    lat = tb.TensorRTBackend().time_interleaved(cand, ref, FEED, warmup=warmup, iterations=iterations)

    assert lat.iterations == iterations
    assert lat.median_ms == pytest.approx(np.median(cand_ms)) and lat.p95_ms == pytest.approx(np.percentile(cand_ms, 95))
    assert lat.ref_median_ms == pytest.approx(np.median(ref_ms))
    assert lat.ref_p95_ms == pytest.approx(np.percentile(ref_ms, 95))
    assert lat.speedup == pytest.approx(np.median(ref_ms / cand_ms))
    assert not _TrtRunner.infer_calls  # never Polygraphy's per-call infer


def test_buffers_are_bound_once_and_everything_is_released(gpu, monkeypatch):
    contexts = []
    real = timing.bind_engine

    def spy(trt, engine, context, feed, device, stack):
        contexts.append(context)
        return real(trt, engine, context, feed, device, stack)

    monkeypatch.setattr(runner, "bind_engine", spy)
    cand, ref = gpu.engine("a", itertools.repeat(1.0)), gpu.engine("b", itertools.repeat(3.0))
    lat = tb.TensorRTBackend().time_interleaved(cand, ref, FEED, warmup=2, iterations=9)
    assert lat.median_ms == pytest.approx(1.0) and lat.speedup == pytest.approx(3.0)
    assert len(contexts) == 2
    for ctx in contexts:
        assert ctx.set_address_calls == 3 and ctx.runs == 2 + 9  # three I/O tensors, bound once
        assert ctx.shapes == {"x": (2, 8), "mask": (2, 8)}
        assert len({ctx.addresses[n] for n in ("x", "mask", "y")}) == 3
    # FakeCudart refuses to free memory while a stream has unsynchronized work
    assert not gpu.lib.memory and not gpu.lib.events and not gpu.lib.clock  # buffers, events, stream released


def test_a_feed_of_the_wrong_type_is_refused_before_timing(gpu):
    cand, ref = gpu.engine("a", itertools.repeat(1.0)), gpu.engine("b", itertools.repeat(1.0))
    bad = {**FEED, "mask": FEED["mask"].astype(np.int32)}
    with pytest.raises(MixprecError, match="cannot bind") as e:
        tb.TensorRTBackend().time_interleaved(cand, ref, bad, warmup=1, iterations=2)
    assert any(d.startswith("mask: fed int32") for d in e.value.details)
    with pytest.raises(MixprecError, match="lacks inputs"):
        tb.TensorRTBackend().time_interleaved(cand, ref, {"x": FEED["x"]}, warmup=1, iterations=2)
    assert not gpu.lib.memory


def test_a_data_dependent_output_gets_tensorrt_s_upper_bound(gpu, monkeypatch):
    cand = gpu.engine("a", itertools.repeat(1.0))
    _TrtRunner.engines[b"a"].output_shapes["y"] = (-1, 4)  # e.g. NonZero
    sizes = []
    real = timing.bind_engine

    def spy(*args):
        bound = real(*args)
        sizes.append(sorted(gpu.lib.memory.values()))
        return bound

    monkeypatch.setattr(runner, "bind_engine", spy)
    tb.TensorRTBackend().time_interleaved(cand, gpu.engine("b", itertools.repeat(1.0)), FEED, warmup=0, iterations=1)
    assert 4096 in sizes[0]  # FakeContext.get_max_output_size
