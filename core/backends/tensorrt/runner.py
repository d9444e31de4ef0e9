"""The TensorRT backend: Polygraphy's loaders build an engine for a policy (``NetworkFromOnnxPath``,
``CreateConfig``, ``EngineBytesFromNetwork``, as ``polygraphy/backend/trt/loader.py`` and ``config.py``),
its ``TrtRunner`` runs it (:class:`TrtEngineRunner`), and :class:`TensorRTBackend` times and profiles
it on buffers bound once (:mod:`core.backends.tensorrt.timing`). The build mode comes from the
TensorRT version (:mod:`core.backends.tensorrt.versions`), the ≤ 10.11 constraints from
:mod:`core.backends.tensorrt.legacy`, the shapes from :mod:`core.backends.tensorrt.profiles`, and
built engines are cached (:mod:`core.backends.tensorrt.engine_cache`). ``tensorrt`` and Polygraphy's
TensorRT loaders are imported inside the functions that use them."""
from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from core.backends.base import Backend, Engine, Latency, Runner, latency_from_pairs
from core.backends.tensorrt.engine_cache import (cached_engine, constraints_digest, engine_cache_key, place_engine,
                                                 store_engine)
from core.backends.tensorrt.legacy import constrained_network, legacy_constraints
from core.backends.tensorrt.profiles import dynamic_batch_axes, profile_shapes, trt_profile
from core.backends.tensorrt.timing import (BoundEngine, CudaEvents, LayerTimes, bind_engine, cuda_errors, device_array,
                                           gpu_times, per_layer_from_reports)
from core.backends.tensorrt.versions import (MODES, build_mode, cuda_device, import_tensorrt, require_trt_opset,
                                             tensorrt_available)
from core.errors import MixprecError
from core.model.external import saved_sha256
from core.quant.compile import compile_policy
from core.workspace import Workspace, atomic_write_json

DEFAULT_WORKSPACE_BYTES = 4 << 30


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


def _layer_profiler():
    """An ``IProfiler`` that keeps what TensorRT reports in a :class:`LayerTimes` (``.times``)."""
    trt = import_tensorrt()

    class _Profiler(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)
            self.times = LayerTimes()

        def report_layer_time(self, layer_name, ms):
            self.times.report(layer_name, ms)

    return _Profiler()


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
        return bind_engine(import_tensorrt(), runner.engine, runner.context, feed, device, stack)

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
        return f"tensorrt {import_tensorrt().__version__} on {gpu[0]} (sm {gpu[1]}) tf32={self.tf32}"

    @property
    def ws(self) -> Workspace:
        return self._ws or Workspace.default()

    @classmethod
    def available(cls):
        return tensorrt_available()

    def _config(self, trt, mode: str, shapes: dict, fp16: bool = False, int8: bool = False):
        from polygraphy.backend.trt import CreateConfig

        return CreateConfig(fp16=fp16, int8=int8, tf32=self.tf32,
                            precision_constraints="obey" if mode == "legacy" else None,
                            profiles=[trt_profile(shapes)], profiling_verbosity=trt.ProfilingVerbosity.DETAILED,
                            memory_pool_limits={trt.MemoryPoolType.WORKSPACE: self.workspace_bytes})

    def _parse(self, onnx_path: Path, mode: str, log):
        """The parsed network as Polygraphy's (builder, network, parser)."""
        from polygraphy.backend.trt import NetworkFromOnnxPath

        return _polygraphy_step(
            NetworkFromOnnxPath(str(onnx_path), strongly_typed=mode == "strongly-typed"),
            f"TensorRT's ONNX parser rejects {onnx_path.name} ({mode} build)",
            "set the nodes named here to fp32; if the original model fails too, it uses operators this "
            "TensorRT cannot parse (polygraphy inspect capability MODEL lists them)", log)

    def _build(self, model, policy, calib, out_dir, input_shapes, stem: str) -> Engine:
        import polygraphy
        from polygraphy.backend.trt import EngineBytesFromNetwork

        t0 = time.perf_counter()
        trt = import_tensorrt()
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
            cache = self.ws.engine_cache("tensorrt") / f"{key}.plan"
            hit = cached_engine(cache, key)
            if not hit:
                network, fp16, use_int8 = constrained_network(trt, network or self._parse(onnx_path, mode, log),
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
        plan = place_engine(cache, out_dir / f"{stem}.plan")
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
        device = {k: stack.enter_context(device_array(v)) for k, v in feed.items()}
        bound = [r.bind(feed, device, stack) for r in runners]
        stream = stack.enter_context(Stream())
        stack.callback(stream.synchronize)  # nothing is freed while the GPU may still use it
        return runners, bound, stream

    def time_interleaved(self, candidate, reference, feed, warmup=10, iterations=100) -> Latency:
        """GPU compute time of ``execute_async_v3`` on buffers bound once, from CUDA events (trtexec's
        "GPU Compute Time"; :func:`gpu_times`): candidate and reference alternate on one stream, after
        ``warmup`` untimed rounds; median and p95 of each, and the median of the pairwise ratios."""
        with cuda_errors("timing the engines"), ExitStack() as stack:
            _, bound, stream = self._on_gpu(stack, feed, candidate, reference)
            events = stack.enter_context(CudaEvents())
            tc, tr = gpu_times([b.enqueue for b in bound], stream, events, warmup, iterations)
        return latency_from_pairs([t / 1e3 for t in tc], [t / 1e3 for t in tr])

    def profile(self, engine, feed, iterations, layers, policy) -> pd.DataFrame:
        """Per-layer time from TensorRT's ``IProfiler`` over ``iterations`` runs of the bound context
        (with a profiler attached, ``execute_async_v3`` times each layer and reports before it returns:
        ``enqueue_emits_profile`` is true by default)."""
        trt = import_tensorrt()
        with cuda_errors("profiling the engine"), ExitStack() as stack:
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
