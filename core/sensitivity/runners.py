"""Polygraphy's loaders, runners and ``Comparator`` for one chunk of the layer-wise comparison
(:mod:`core.sensitivity.cumulative`).

A chunk's tensors are marked as graph outputs with Polygraphy's ``ModifyOutputs`` (after the model's own
outputs, so the graph ONNX Runtime optimises is the one the ranking always compared), and both models run
under ``Comparator.run(..., streaming=True)``: one sample at a time through both runners, the outputs of a
sample dropped once its errors are accumulated (what ``polygraphy run --onnx-outputs mark all`` does, in
chunks that fit the memory budget).

``onnxruntime``
    FP32 and the candidate each in an ``OnnxrtRunner`` over ``SessionFromOnnx`` (CPU).
``tensorrt``
    The FP32 reference in an ``OnnxrtRunner``, the candidate (compiled for TensorRT: explicit precision)
    in a ``TrtRunner`` over ``EngineFromNetwork(NetworkFromOnnxBytes(..., strongly_typed=True))``: the
    ranking measures the engine itself. A marked output must be written to memory, so TensorRT cannot
    fuse its producer into the next layer: the engine compared fuses less than the deployed one, and a
    chunk's engine differs from the next chunk's.

TensorRT and Polygraphy's TensorRT loaders are imported only when the ``tensorrt`` runner is built."""
from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from polygraphy import config as polygraphy_config
from polygraphy import util
from polygraphy.backend.onnx import BytesFromOnnx, ModifyOutputs
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.comparator import Comparator
from polygraphy.exception import PolygraphyException
from polygraphy.logger import G_LOGGER

from core.backends.tensorrt import build_mode, tensorrt_available
from core.backends.tensorrt.profiles import trt_profile
from core.errors import MixprecError
from core.model.data_errors import ort_feed_errors
from core.measure.metrics import StreamingError

RUNNERS = ("auto", "onnxruntime", "tensorrt")
RUNNER_LABELS = {"onnxruntime": "ONNX Runtime (CPU)", "tensorrt": "the candidate's TensorRT engine"}
RANKING_NOTE = ("Polygraphy's layer-wise comparison: every layer's output is marked as a graph output (ModifyOutputs, "
                "a chunk of layers at a time under the memory budget) and FP32 runs beside the all-INT8 candidate "
                "(Comparator, one sample at a time): on ONNX Runtime, or where TensorRT runs, on the candidate's "
                "TensorRT engine. On TensorRT, marking outputs changes what TensorRT fuses: a marked tensor has to be "
                "written out, so its layer is not fused into the next one, and the engine compared fuses less than "
                "the one you deploy.")
ORT_ERRORS_ONLY = 3  # ONNX Runtime's log severity: errors only
NEVER_SWAP_MB = 1 << 40  # a Polygraphy array swap threshold no array reaches (see polygraphy_quiet)


def resolve_runner(runner: str = "auto") -> str:
    """``onnxruntime`` or ``tensorrt``: ``auto`` is TensorRT where it runs (TensorRT >= 10.12, whose
    strongly typed networks take the candidate's explicit precision as it is, and a CUDA device),
    ONNX Runtime elsewhere."""
    if runner not in RUNNERS:
        raise MixprecError(f"unknown ranking runner {runner!r}", f"use one of {', '.join(RUNNERS)}")
    if runner == "onnxruntime":
        return runner
    ok, why = tensorrt_available()
    if ok:
        import tensorrt as trt

        if build_mode(str(trt.__version__)) == "strongly-typed":
            return "tensorrt"
        why = f"TensorRT {trt.__version__} builds no strongly typed networks (10.12 or newer does)"
    if runner == "auto":
        return "onnxruntime"
    raise MixprecError(f"the ranking cannot run on TensorRT here: {why}",
                       "run it where TensorRT 10.12+ and an NVIDIA GPU are, or on onnxruntime")


def literal(name: str) -> str:
    """``name`` as a pattern that matches only itself: ModifyOutputs reads ``*``, ``?`` and ``[`` as wildcards."""
    return re.sub(r"([*?\[])", r"[\1]", name)


class MarkedModel:
    """``proto`` with ``outputs`` marked as graph outputs after its own, for a Polygraphy loader.
    ``model`` (the LoadedModel or CompiledModel of ``proto``) when its weights stay external
    (``core.model.external``): the loader then reads a file written beside links of its data files."""

    def __init__(self, proto: onnx.ModelProto, outputs: list[str], model=None):
        self.proto, self.model = proto, model
        markable = _markable(proto)
        own = [o.name for o in proto.graph.output if o.name in markable]  # ModifyOutputs refuses the others
        self.outputs = [literal(t) for t in dict.fromkeys(own + list(outputs))]
        self.external = model is not None and model.weights is not None

    def to_bytes(self) -> bytes:
        """The marked model serialized (Polygraphy's ``BytesFromOnnx(ModifyOutputs(...))``). ModifyOutputs
        marks the proto itself (``copy=False``: a copy would hold the weights once more, MiniLM's 87 MiB)
        and the proto's own outputs are put back once it is serialized."""
        saved = [_copy(o) for o in self.proto.graph.output]
        try:
            return BytesFromOnnx(ModifyOutputs(self.proto, outputs=self.outputs, copy=False))()
        finally:
            del self.proto.graph.output[:]
            self.proto.graph.output.extend(saved)

    @contextmanager
    def path(self):
        """The marked model as a file beside links of the model's data files (external weights: the
        proto is the graph only, so ModifyOutputs' copy costs nothing); removed after the block."""
        marked = ModifyOutputs(self.proto, outputs=self.outputs, copy=True)()
        with self.model.scratch("rank-") as tmp:  # external/<sha>/tmp, claimed by this process
            yield str(self.model.save(Path(tmp) / "marked.onnx", marked))

    def loader(self, from_bytes, from_path=None, **kw):
        """A loader of the marked model: ``from_bytes(self.to_bytes, **kw)`` (a Polygraphy loader class
        taking a serialized model or a callable returning one), or with external weights a callable that
        runs ``from_path`` (default ``from_bytes``, which takes a path too) on the file while it exists."""
        if not self.external:
            return from_bytes(self.to_bytes, **kw)

        def load():
            with self.path() as path:
                return (from_path or from_bytes)(path, **kw)()
        return load


def _copy(value_info: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(value_info)
    return out


def _markable(proto: onnx.ModelProto) -> set[str]:
    """The tensors ModifyOutputs may mark: graph inputs and outputs of non-Constant nodes."""
    return {i.name for i in proto.graph.input} | {o for n in proto.graph.node if n.op_type != "Constant"
                                                  for o in n.output if o}


class SessionWithoutArena(SessionFromOnnx):
    """Polygraphy's ``SessionFromOnnx`` (CPU) with ONNX Runtime's memory arena off. The arena keeps a run's
    activations (grown in powers of two) until its session goes, which breaks the comparison's budget
    (measured: the wide model of tests/scale/test_comparison_memory.py added 175 MiB under a 96 MiB budget, 84 MiB
    without the arena). Polygraphy's loader takes no session options; this one builds the session as it
    does (as many threads as usable CPUs, its graph optimization level), arena off, logging errors only."""

    def call_impl(self):
        model_bytes, _ = util.invoke_if_callable(self._model_bytes_or_path)
        options = ort.SessionOptions()
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        if self.graph_optimization_level is not None:
            options.graph_optimization_level = self.graph_optimization_level
        options.enable_cpu_mem_arena = False
        options.log_severity_level = ORT_ERRORS_ONLY
        return ort.InferenceSession(model_bytes, sess_options=options, providers=["CPUExecutionProvider"])


class NumpyOnnxrtRunner(OnnxrtRunner):
    """Polygraphy's ``OnnxrtRunner`` for numpy feeds. Its own ``infer_impl`` asks of every input whether it
    is a torch tensor, which imports torch when it is installed (about 200 MiB more resident memory; measured
    on MiniLM's comparison: 835-903 MiB peak with torch imported, 682-691 MiB without); this one runs the
    session as it does, without asking (:func:`polygraphy_quiet` keeps IterationResult from asking too)."""

    def infer(self, feed_dict, check_inputs=False, *args, **kwargs):
        """``OnnxrtRunner.infer`` without checking the inputs again: ``Comparator.run`` has coerced them to
        this runner's input metadata (the check cost ~15 % of a tiny model's chunked comparison, profiled)."""
        return super().infer(feed_dict, check_inputs, *args, **kwargs)

    def infer_impl(self, feed_dict):
        start = time.time()
        with ort_feed_errors(feed_dict, "comparing layer outputs"):
            outputs = self.sess.run(None, feed_dict)
        self.inference_time = time.time() - start
        return OrderedDict(zip((o.name for o in self.sess.get_outputs()), outputs))


def onnxrt_runner(proto: onnx.ModelProto, outputs: list[str], model, name: str) -> OnnxrtRunner:
    """An ``OnnxrtRunner`` over ``SessionFromOnnx`` (:class:`SessionWithoutArena`) of ``proto`` with
    ``outputs`` marked (CPU)."""
    return NumpyOnnxrtRunner(MarkedModel(proto, outputs, model).loader(SessionWithoutArena), name=name)


def trt_runner(proto: onnx.ModelProto, outputs: list[str], model, name: str, feeds: list[dict]):
    """A ``TrtRunner`` over ``EngineFromNetwork(NetworkFromOnnxBytes(...))`` of ``proto`` (compiled for
    TensorRT) with ``outputs`` marked, strongly typed, FP32 layers without TF32, for the shapes of ``feeds``."""
    from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxBytes, NetworkFromOnnxPath, TrtRunner

    network = MarkedModel(proto, outputs, model).loader(NetworkFromOnnxBytes, NetworkFromOnnxPath, strongly_typed=True)
    config = CreateConfig(tf32=False, profiles=[trt_profile(feed_shapes(feeds))])
    return TrtRunner(EngineFromNetwork(network, config=config), name=name)


def feed_shapes(feeds: list[dict]) -> dict[str, tuple]:
    """``{input: (min, opt, max)}`` over ``feeds`` (opt: the largest)."""
    shapes = {}
    for name in feeds[0]:
        dims = np.array([np.shape(f[name]) for f in feeds])
        hi = tuple(int(d) for d in dims.max(axis=0))
        shapes[name] = (tuple(int(d) for d in dims.min(axis=0)), hi, hi)
    return shapes


def chunk_runners(runner: str, reference, candidate, chunk: list[str], feeds: list[dict]) -> list:
    """[FP32, candidate] runners with ``chunk`` marked. ``reference``, ``candidate``: (proto, the model
    whose weights may stay external, or None)."""
    (ref_proto, ref_model), (cand_proto, cand_model) = reference, candidate
    ref = onnxrt_runner(ref_proto, chunk, ref_model, name="fp32")
    if runner == "tensorrt":
        return [ref, trt_runner(cand_proto, chunk, cand_model, name="candidate-tensorrt", feeds=feeds)]
    return [ref, onnxrt_runner(cand_proto, chunk, cand_model, name="candidate")]


def compare_chunk(runners: list, feeds: list[dict], chunk: list[str], on_sample=None) -> dict[str, StreamingError]:
    """The errors of ``chunk``'s tensors, candidate against FP32, accumulated sample by sample from
    ``Comparator.run``'s RunResults (streaming: both runners active, one sample's outputs at a time).
    ``on_sample(i)`` before sample ``i`` runs."""
    part = {t: StreamingError() for t in chunk}
    stream = Comparator.run(runners, data_loader=feeds, streaming=True)
    try:
        for i in range(len(feeds)):
            if on_sample:
                on_sample(i)
            results = next(stream)  # RunResults: [(runner name, [IterationResult])], one per runner
            (_, [ref]), (_, [cand]) = results
            for t in chunk:
                part[t].add(np.asarray(ref[t]), np.asarray(cand[t]))
            del results, ref, cand
    finally:
        stream.close()  # deactivates the runners: the sessions (or engine) go
    return part


@contextmanager
def polygraphy_quiet(runner: str):
    """Polygraphy's logs silenced (the CLI's ``--json`` owns stdout), torch left
    unimported, and a Polygraphy failure turned into a MixprecError.

    Torch: with array swapping off (Polygraphy's default, ``POLYGRAPHY_ARRAY_SWAP_THRESHOLD_MB`` < 0) each
    ``IterationResult`` sums its outputs' sizes to warn about large ones, asking of each whether it is a
    torch tensor, which imports torch (about 200 MiB resident: under a 96 MiB budget the wide model of
    tests/scale/test_comparison_memory.py added 353 MiB with torch imported, 175 MiB without, both with ONNX
    Runtime's arena, 84 MiB without the arena either). A threshold no array reaches skips that sum and
    swaps nothing; a threshold the user set is kept."""
    where = "TensorRT" if runner == "tensorrt" else "ONNX Runtime"
    swap = polygraphy_config.ARRAY_SWAP_THRESHOLD_MB
    if swap < 0:
        polygraphy_config.ARRAY_SWAP_THRESHOLD_MB = NEVER_SWAP_MB
    try:
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
            yield
    except PolygraphyException as e:
        raise MixprecError(f"the layer-wise comparison failed on {where}",
                           "read the error listed here; if a marked tensor is refused, the model's tensor names "
                           "may have changed since it was loaded (load it again)", details=[str(e)]) from e
    finally:
        polygraphy_config.ARRAY_SWAP_THRESHOLD_MB = swap
