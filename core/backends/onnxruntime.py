"""The embedded default backend: ONNX Runtime on the CPU.

"Build" compiles the policy (target ``ort``: U8S8 Q/DQ, simulated FP16), creates a session
with full graph optimization and keeps the optimized model as the run's engine artifact.
Per-layer time comes from ORT's profiler; Q/DQ and Cast nodes left after optimization are
the CPU analogue of TensorRT's Reformat layers.

Every session is created from a file. A model with external weights (``core.model.external``) is written
as its graph beside links of its data files (and, compiled, its own data file of new weights): ORT
maps them. Its optimized model is not kept (it would write every weight again): the artifact is
the compiled model itself, and its session is first created when it is run."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

from core.backends.base import Backend, Engine, Latency, ProfileRow, Runner, latency_from_pairs, per_layer_frame
from core.errors import MixprecError
from core.model.data_errors import ort_feed_errors
from core.quant.compile import CONVERSION_OPS, compile_policy
from core.workspace import atomic_write_bytes


def session_options(optimized_path: Path | None = None, profile_prefix: str | None = None,
                    spinning: bool = True):
    """``spinning=False`` for measurement sessions: two sessions timed interleaved in one process
    each have their own intra-op pool, and a pool that spins after its run steals the cores of
    the next run of the other session. Measured on MiniLM (2 cores, FP32 vs all-INT8): with
    spinning the FP32 median rose from 15.4 to 23.2 ms when interleaved, and the speedup read
    2.41× instead of 1.71×."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 4  # fatal only: errors are raised, and translated (core.model.data_errors)
    threads = int(os.environ.get("MIXPREC_THREADS", "0"))
    if threads:
        so.intra_op_num_threads = threads
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model_path: Path, **kw):
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(model_path), sess_options=session_options(**kw),
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise MixprecError(f"ONNX Runtime cannot create a session for {Path(model_path).name}: {str(e)[:300]}",
                           "set the layers named in the message to fp32, or check the model runs in onnxruntime") from e


class OnnxrtRunner(Runner):
    def __init__(self, model_path: Path):
        self.model_path = Path(model_path)
        self.session = None

    def activate(self):
        self.session = make_session(self.model_path)

    def infer(self, feed):
        if self.session is None:
            raise MixprecError("the runner is not active", "call activate() or use it as a context manager")
        names = [o.name for o in self.session.get_outputs()]
        with ort_feed_errors(feed, "running the model"):
            return dict(zip(names, self.session.run(names, feed)))

    def deactivate(self):
        self.session = None


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    @classmethod
    def available(cls):
        try:
            import onnxruntime as ort
        except ImportError:
            return False, "onnxruntime is not installed"
        return True, f"ONNX Runtime {ort.__version__} on the CPU (the embedded default backend)"

    def _engine(self, write, out_dir: Path, stem: str, shapes, external: bool = False) -> Engine:
        """``write(path)`` writes the model to run at ``path``; then ORT's optimized model is saved as
        the artifact (with external weights: the compiled model is the artifact, see the module doc)."""
        t0 = time.perf_counter()
        compiled_path = write(out_dir / f"{stem}.onnx")
        if external:
            return Engine(self.name, compiled_path, compiled_path, time.perf_counter() - t0, shapes)
        artifact = out_dir / f"{stem}.ort-optimized.onnx"
        make_session(compiled_path, optimized_path=artifact)
        return Engine(self.name, compiled_path, artifact, time.perf_counter() - t0, shapes)

    def build(self, model, policy, calib, out_dir, input_shapes):
        t0 = time.perf_counter()
        compiled = compile_policy(model, policy, calib, target="ort")
        eng = self._engine(compiled.save, Path(out_dir), "compiled", input_shapes, model.external)
        eng.build_seconds = time.perf_counter() - t0
        return eng

    def build_from_onnx(self, data: bytes, out_dir, input_shapes) -> Engine:
        """An engine from an explicit-precision ONNX made elsewhere (e.g. ORT's quantize_static)."""
        return self._engine(lambda p: atomic_write_bytes(p, data), Path(out_dir), "compiled", input_shapes)

    def reference(self, model, out_dir, input_shapes):
        out_dir = Path(out_dir)
        compiled = out_dir / "reference-fp32.onnx"
        artifact = compiled if model.external else out_dir / "reference-fp32.ort-optimized.onnx"
        if compiled.is_file() and artifact.is_file():  # built once per model
            return Engine(self.name, compiled, artifact, 0.0, input_shapes)
        return self._engine(model.save, out_dir, "reference-fp32", input_shapes, model.external)

    def runner(self, engine):
        return OnnxrtRunner(engine.compiled_path)

    def time_interleaved(self, candidate, reference, feed, warmup=10, iterations=100) -> Latency:
        sc, sr = make_session(candidate.compiled_path, spinning=False), make_session(reference.compiled_path, spinning=False)
        with ort_feed_errors(feed, "timing the model"):  # the first runs: the inputs' shapes are checked there
            for _ in range(max(warmup, 1)):
                sc.run(None, feed)
                sr.run(None, feed)
        tc, tr = [], []
        for i in range(iterations):  # A B, B A, A B, …: interleaved, and neither always goes first
            first, second = (sc, sr) if i % 2 == 0 else (sr, sc)
            t0 = time.perf_counter()
            first.run(None, feed)
            t1 = time.perf_counter()
            second.run(None, feed)
            t2 = time.perf_counter()
            c, r = (t1 - t0, t2 - t1) if i % 2 == 0 else (t2 - t1, t1 - t0)
            tc.append(c)
            tr.append(r)
        return latency_from_pairs(tc, tr)

    def profile(self, engine, feed, iterations, layers, policy) -> pd.DataFrame:
        prefix = str(Path(engine.compiled_path).parent / "ort-profile")
        sess = make_session(engine.compiled_path, profile_prefix=prefix, spinning=False)
        for _ in range(3):
            sess.run(None, feed)
        for _ in range(iterations):
            sess.run(None, feed)
        trace = Path(sess.end_profiling())
        try:
            events = json.loads(trace.read_text())
        finally:
            final = Path(engine.compiled_path).parent / "ort-profile.json"
            os.replace(trace, final)
        return per_layer_from_trace(events, iterations + 3, layers, policy)


def per_layer_from_trace(events: list, runs: int, layers, policy) -> pd.DataFrame:
    """``PER_LAYER_COLUMNS`` from ONNX Runtime's profiler trace (``events``, over ``runs`` runs):
    mean ms per node per run, each node mapped back to its layer; Q/DQ and Cast nodes are the
    conversions."""
    totals: dict[str, float] = {}
    ops: dict[str, str] = {}
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        node = ev["name"][: -len("_kernel_time")]
        totals[node] = totals.get(node, 0.0) + ev.get("dur", 0) / 1e3
        ops[node] = ev.get("args", {}).get("op_name", "?")
    rows = [ProfileRow(node, ops[node], (node,), ms / runs, ops[node] in CONVERSION_OPS)
            for node, ms in totals.items()]
    return per_layer_frame(rows, layers, policy)
