"""Polygraphy's layer-wise comparison: FP32 against a candidate policy, with the output of every layer
marked as a graph output (``polygraphy run --onnx-outputs mark all``), built from Polygraphy's loaders,
runners and ``Comparator`` (:mod:`core.sensitivity.runners`): ``ModifyOutputs`` marks a chunk's tensors,
``OnnxrtRunner`` runs FP32 and the candidate on ONNX Runtime, or, where TensorRT runs, ``TrtRunner`` runs
the candidate's TensorRT engine (``runner``: ``auto``, ``onnxruntime``, ``tensorrt``), and
``Comparator.run`` streams each sample's outputs through both.

The comparison is *cumulative*: a layer's output error includes the error of every
quantized layer before it. ``added_cos_drop`` (this layer's cosine drop minus the worst
drop among its inputs) separates the error a layer adds from the error it inherits.

Memory: every marked output stays alive until a run ends, so on a big model marking them all at
once does not fit. The marked outputs are compared in chunks that fit a memory budget
(``max_memory``, default :data:`core.sensitivity.memory.COMPARE_BUDGET_SHARE` of the memory budget),
one FP32/candidate runner pair per chunk; errors accumulate sample by sample from the Comparator's
RunResults (nothing is kept per sample), rows stream out after each chunk (``on_rows``), and the ranking
records the peak. On TensorRT a marked output cannot be fused into the layer after it, so the engine
that is compared fuses less than the deployed one (and each chunk's engine fuses differently)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx
import pandas as pd

from core.backends.tensorrt import require_trt_opset
from core.errors import MixprecError
from core.measure.metrics import StreamingError
from core.model.inventory import main_graph_layers, require_eligible, tensor_shapes
from core.project import Project
from core.quant.calibration import calibrate_policy
from core.quant.compile import compile_policy
from core.quant.policy import Policy, uniform_policy
from core.records import check_format, frame_from_json, frame_to_json
from core.sensitivity.memory import SESSION_COPIES, ChunkPlan, PeakMemory, bound_heap, comparison_budget, plan_chunks, release_memory
from core.sensitivity.runners import chunk_runners, compare_chunk, polygraphy_quiet, resolve_runner
from core.workspace import cache_note

FLOAT_ELEM = {1: 4, 10: 2, 11: 8}  # ONNX float element types marked for comparison, and their bytes

RANK_COLUMNS = ["rank", "name", "op_type", "precision", "eligible", "macs", "cosine", "cos_drop",
                "added_cos_drop", "snr_db", "max_abs"]
RANK_METRICS = ("cos_drop", "added_cos_drop", "snr_db", "max_abs")


@dataclass
class Ranking:
    """A cumulative ranking (:func:`rank_layers`), stored as a ``"ranking"`` document. Memory of the
    comparison (calibrating and compiling the candidate come before it, and are not counted):
    ``peak_bytes`` is this process's peak resident memory during it, ``added_bytes`` the part it
    added, ``budget_bytes`` its budget for that part, ``chunks`` how many runner pairs it took
    (documents written before these fields read them as unknown). ``runner``: where the candidate ran,
    ``onnxruntime`` or ``tensorrt`` (documents written before it ran on ONNX Runtime)."""

    FORMAT_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "ranking"

    table: pd.DataFrame  # RANK_COLUMNS, most sensitive first
    metric: str
    samples: int
    seconds: float
    calibration_cache_hit: bool | None
    method: str = "minmax"
    peak_bytes: int | None = None
    added_bytes: int | None = None
    budget_bytes: int | None = None
    chunks: int | None = None
    runner: str = "onnxruntime"

    @property
    def title(self) -> str:
        """What this table is, in a sentence's words (a run's warning names the ranking it used)."""
        return f"the cached cumulative ranking ({self.method})"

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "metric": self.metric,
                "method": self.method, "samples": self.samples, "seconds": self.seconds,
                "calibration_cache_hit": self.calibration_cache_hit, "peak_bytes": self.peak_bytes,
                "added_bytes": self.added_bytes, "budget_bytes": self.budget_bytes, "chunks": self.chunks,
                "runner": self.runner, "table": frame_to_json(self.table)}

    @classmethod
    def from_json(cls, doc: dict) -> "Ranking":
        doc = check_format(doc, cls.KIND, cls.FORMAT_VERSION, "ranking")
        opt = {k: (None if doc.get(k) is None else int(doc[k]))
               for k in ("peak_bytes", "added_bytes", "budget_bytes", "chunks")}
        return cls(frame_from_json(doc["table"], RANK_COLUMNS, "ranking"), doc["metric"], int(doc["samples"]),
                   float(doc["seconds"]), doc["calibration_cache_hit"], doc["method"], **opt,
                   runner=str(doc.get("runner") or "onnxruntime"))


def _plan(project: Project, compiled_proto: onnx.ModelProto, marked: list[str], types: dict,
          budget: tuple[int, str]) -> ChunkPlan:
    """The chunks of ``marked`` that fit the comparison's memory ``budget`` (bytes, where it comes
    from), with the tensor sizes at the project's shapes."""
    budget, where = budget
    shapes = tensor_shapes(project.model, project.input_shapes)
    batch = max(project.batch, 1)  # the comparison runs one sample at a time
    sizes = {t: int(np.prod(shapes[t], dtype=np.int64)) * FLOAT_ELEM[types[t]] // batch
             for t in marked if t in shapes}
    weights = project.model.proto.ByteSize() + compiled_proto.ByteSize()
    if project.model.external:  # weights kept in data files: each of the two sessions holds them once
        weights += 2 * project.model.size_bytes // SESSION_COPIES  # (no serialized copy; plan_chunks counts 3)
    plan = plan_chunks(marked, sizes, weights, budget)
    if plan.note:
        cache_note(f"rank: {plan.note} (budget from {where})")
    return plan


def _compare(project: Project, compiled_proto: onnx.ModelProto, plan: ChunkPlan, feeds: list, step,
             on_chunk, compiled_model=None, runner: str = "onnxruntime") -> dict[str, StreamingError]:
    """FP32 against the candidate, chunk by chunk (a runner pair each, :func:`chunk_runners`), sample by
    sample (Polygraphy's ``Comparator.run``, :func:`compare_chunk`)."""
    acc: dict[str, StreamingError] = {}
    n = len(plan.chunks) * len(feeds)
    if len(plan.chunks) > 1:
        bound_heap()
    with polygraphy_quiet(runner):
        for c, chunk in enumerate(plan.chunks):
            runners = chunk_runners(runner, (project.model.proto, project.model), (compiled_proto, compiled_model),
                                    chunk, feeds)
            part = compare_chunk(runners, feeds, chunk, lambda i: step(
                0.3 + 0.65 * (c * len(feeds) + i) / n, f"comparing chunk {c + 1}/{len(plan.chunks)}, "
                                                         f"sample {i + 1}/{len(feeds)}"))
            del runners
            release_memory()
            acc.update(part)
            on_chunk(acc)
    return acc


def _rows(layers, policy: Policy, acc: dict[str, StreamingError], metric: str) -> pd.DataFrame:
    """One row per layer whose (first float) output was compared, sorted by ``metric``."""
    drop = {t: 1.0 - a.cosine for t, a in acc.items()}
    rows = []
    for l in layers:
        outs = [o for o in l.outputs if o in acc]
        if not outs:
            continue
        a = acc[outs[0]]
        inherited = max((drop[i] for i in l.inputs if i in drop), default=0.0)
        rows.append((l.name, l.op_type, policy.layers.get(l.name, ""), l.eligible, l.macs, a.cosine,
                     drop[outs[0]], drop[outs[0]] - inherited, a.snr_db, a.max_abs))
    df = pd.DataFrame(rows, columns=RANK_COLUMNS[1:])
    df = df.sort_values(metric, ascending=metric == "snr_db", kind="stable", ignore_index=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    return df


def rank_layers(project: Project, policy: Policy | None = None, method: str = "minmax",
                metric: str = "cos_drop", max_samples: int = 16, progress=None, max_memory=None,
                on_rows=None, runner: str = "auto") -> Ranking:
    """Rank layers by how far their outputs drift from FP32 under ``policy`` (default: every
    INT8-eligible layer INT8, everything else FP32). ``max_memory``: the comparison's budget (bytes,
    ``"4G"``, ``"40%"``; default :func:`core.sensitivity.memory.comparison_budget`); ``on_rows``
    gets the rows measured so far (a RANK_COLUMNS frame) after each chunk; ``runner``: where the
    candidate runs (:data:`core.sensitivity.runners.RUNNERS`; ``auto``: TensorRT where it runs)."""
    if metric not in RANK_METRICS:
        raise MixprecError(f"unknown ranking metric {metric!r}", f"use one of {', '.join(RANK_METRICS)}")
    step = progress or (lambda f, t: None)
    t0 = time.perf_counter()
    budget = comparison_budget(max_memory)  # a bad --max-memory fails before any work
    runner = resolve_runner(runner)  # ... and so does TensorRT asked for where it does not run
    model, layers = project.model, main_graph_layers(project.layers)  # subgraph tensors cannot be marked
    require_eligible(model.name, project.layers, "rank")
    if policy is None:
        policy = uniform_policy(model, project.layers, "int8").with_calibration(project.default_policy(method=method).calibration)
    step(0.05, f"calibrating ({policy.calibration.method})")
    calib = calibrate_policy(model, project.calib_data, policy, project.layers, project.ws)
    step(0.2, "compiling candidate")
    if runner == "tensorrt":
        require_trt_opset(model)
    # kept: its weights' file goes with it
    candidate = compile_policy(model, policy, calib, target="trt" if runner == "tensorrt" else "ort")
    compiled = candidate.proto
    release_memory()  # what compiling freed goes back to the OS first: the peak below is the comparison's
    with PeakMemory() as peak:  # the comparison's memory: the sessions and the marked outputs
        types = model.tensor_types()  # the main graph's tensors only
        marked = list(dict.fromkeys(o for l in layers for o in l.outputs if types.get(o) in FLOAT_ELEM))
        plan = _plan(project, compiled, marked, types, budget)
        feeds = project.eval_data.batches(1)[:max_samples]
        acc = _compare(project, compiled, plan, feeds, step,
                       (lambda a: on_rows(_rows(layers, policy, a, metric))) if on_rows else (lambda a: None), candidate,
                       runner)
        del compiled, candidate
    df = _rows(layers, policy, acc, metric)
    step(1.0, "done")
    return Ranking(df, metric, len(feeds), time.perf_counter() - t0, calib.cache_hit if calib else None,
                   policy.calibration.method, peak.peak, peak.added, plan.budget, len(plan.chunks), runner)
