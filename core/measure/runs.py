"""Build a policy and measure it: latency (interleaved against FP32), per-layer time,
reformat overhead and quality on held-out data. Each run lives in its folder (``runs/<id>/``,
named by ``core.workspace``) with its policy, metrics, per-layer table, compiled model and the
backend's engine artifact: a build writes it in a temp folder it claims, renamed when complete.
Listing and reading stored runs is the store's (``core.store.runs``).

No silent quality loss: a run whose ``cosine_mean`` falls below ``warn_below`` carries a warning
that names the worst INT8 layers of a ranking the caller passes (the cached cumulative ranking,
or the search's isolated one), or says how to compute one. A run on generated evaluation data
says so (``data_generated``)."""
from __future__ import annotations

import math
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import pandas as pd

from core.backends import Latency, select_backend
from core.backends.base import PER_LAYER_COLUMNS
from core.backends.reports import ReformatSummary, reformat_summary
from core.backends.tensorrt import project_trt_options
from core.errors import MixprecError
from core.measure.evaluation import MetricSpec, evaluate, project_outputs
from core.measure.metrics import Quality
from core.measure.reference import (REFERENCE_STAMPS, engine_outputs_of, eval_batch, reference_engine, reference_outputs,
                                    settle_eval_batch,
                                    timing_feed)
from core.project import DEFAULT_TARGET, TARGET_LABELS, Project
from core.quant.calibration import calibrate_policy
from core.quant.policy import Policy
from core.records import check_format
from core.workspace import (METRICS_FILE, PER_LAYER_FILE, POLICY_FILE, Workspace, atomic_write_json, atomic_write_text,
                            claim_folder, clean_temp_runs, free_bytes, human_bytes, is_space_error, publish_folder,
                            space_error)

RUN_COLUMNS = [
    "run_id", "created", "model_name", "model_sha256", "label", "backend", "target", "latency_source", "policy_sha256",
    "latency_median_ms", "latency_p95_ms", "fp32_median_ms", "speedup",
    "reformat_count", "reformat_ms", "reformat_pct",
    "cosine_mean", "cosine_min", "snr_db", "max_abs", "top1_agreement", "kl_div", "perplexity", "knn5_overlap",
    "n_fp32", "n_fp16", "n_int8", "int8_mac_fraction", "build_seconds", "data_generated", "warnings",
    "speedup_low", "speedup_high", "timed_pairs", "input_shapes",
]
# speedup_low/high: the 95 % interval of the speedup (:func:`speedup_interval`; NaN when the run kept no pair
# times); timed_pairs: how many interleaved pairs it rests on; input_shapes: :func:`shapes_text` of the shapes the
# run was built and measured at ("" when not recorded)
WARN_BELOW = 0.98  # default threshold of the quality warning (cosine_mean)
GENERATED_NOTE = "on generated data"  # said next to every quality number computed on generated data
ORT_CPU_SOURCE = "ONNX Runtime CPU, measured"
_TRT_REASON = re.compile(r"TensorRT (?P<version>[0-9][^\s]*) on (?P<gpu>.+?)(?: \(compute capability|$)")


_MEASURED_GPU = re.compile(r"^TensorRT \S+ on (?P<gpu>.+), measured$")
CI_LEVEL = 0.95  # the level of a speedup's interval
CI_RESAMPLES = 2000


def speedup_interval(candidate_ms, reference_ms, level: float = CI_LEVEL, resamples: int = CI_RESAMPLES,
                     seed: int = 0) -> tuple[float, float] | None:
    """The ``level`` confidence interval of a run's speedup (the median of its pairwise ratios reference /
    candidate): a percentile bootstrap over the interleaved pairs (resampled as pairs, so what slowed both
    engines of a pair cancels), seeded, so a run reads the same interval every time. None with fewer than 5
    pairs or no finite positive one."""
    c, r = np.asarray(candidate_ms, dtype=float), np.asarray(reference_ms, dtype=float)
    if c.shape != r.shape or c.ndim != 1:
        return None
    ok = np.isfinite(c) & np.isfinite(r) & (c > 0) & (r > 0)
    ratios = r[ok] / c[ok]
    if len(ratios) < 5:
        return None
    rng = np.random.default_rng(seed)
    medians = np.median(ratios[rng.integers(0, len(ratios), size=(resamples, len(ratios)))], axis=1)
    lo, hi = np.percentile(medians, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def shapes_text(shapes: dict) -> str:
    """The input shapes of a run as said beside its numbers: ``1×3×640×640`` for one input, ``input_ids 1×128,
    attention_mask 1×128`` for several; "" when none are recorded."""
    dims = {str(k): "×".join(str(int(d)) for d in v) or "scalar" for k, v in (shapes or {}).items()}
    if len(dims) == 1:
        return next(iter(dims.values()))
    return ", ".join(f"{k} {v}" for k, v in dims.items())


class RankedLayers(Protocol):
    """A sensitivity table, most sensitive layer first (the sensitivity wing's Ranking and Sensitivity):
    what a run's quality warning reads of it."""

    table: pd.DataFrame  # has a "name" column
    title: str  # e.g. "the isolated ranking (minmax)"


def latency_source(backend: str, backend_reason: str = "") -> str:
    """What produced a build's latency numbers: ``ONNX Runtime CPU, measured`` or ``TensorRT
    <version> on <GPU>, measured`` (read from the backend's reason, e.g. ``tensorrt: TensorRT 10.13
    on NVIDIA A100 (compute capability 8.0)``)."""
    if backend == "tensorrt":
        m = _TRT_REASON.search(backend_reason or "")
        return f"TensorRT {m['version']} on {m['gpu']}, measured" if m else "TensorRT (GPU), measured"
    if backend == "onnxruntime":
        return ORT_CPU_SOURCE
    return f"{backend}, measured"


def latency_caveat(target: str, backend: str) -> str:
    """What a latency measured on ``backend`` says about the deployment ``target`` ("" when it is
    measured there)."""
    if target == "tensorrt" and backend != "tensorrt":
        return ("Latency measured on ONNX Runtime's CPU does not predict TensorRT latency on the GPU (the target): "
                "FP16 is simulated on the CPU for every op but LayerNormalization, and the CPU's INT8 kernels are "
                "not TensorRT's. The quality numbers do transfer.")
    if target == "onnxruntime" and backend == "tensorrt":
        return "Latency measured on TensorRT does not predict ONNX Runtime CPU latency (the target)."
    return ""


def speedup_text(speedup: float | None) -> tuple[str, str]:
    """A speedup against FP32 as words and a direction, said once: ``("1.50× faster than FP32", "up")``,
    ``("1.28× slower than FP32", "down")`` (a speedup of 0.78), ``("1.00× · same as FP32", "off")``; a slowdown
    always reads as one."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return "no FP32 reference", "off"
    if round(speedup, 2) == 1.0:
        return f"{speedup:.2f}× · same as FP32", "off"
    if speedup > 1:
        return f"{speedup:.2f}× faster than FP32", "up"
    return f"{1 / speedup:.2f}× slower than FP32", "down"


@dataclass
class RunResult:
    """One build and its measurements. ``to_json()`` is the run's document (``metrics.json``
    is it without ``per_layer``, which is stored beside it as ``per_layer.csv``)."""

    # 4: "latency_source", "target"; 3: "warnings", "data_generated", "input_shapes"; 2: "kind"; 1 (no kind).
    # Older ones are migrated by from_json.
    FORMAT_VERSION: ClassVar[int] = 4
    KIND: ClassVar[str] = "run"

    run_id: str
    run_dir: Path
    created: float
    label: str
    model_name: str
    model_sha256: str
    backend: str
    backend_reason: str
    policy_sha256: str
    latency: Latency
    reformat: ReformatSummary
    quality: Quality
    precision_counts: dict[str, int]
    int8_mac_fraction: float
    build_seconds: float
    calibration_method: str
    calibration_cache_hit: bool | None
    per_layer: pd.DataFrame
    warnings: list[str] = field(default_factory=list)  # e.g. quality below the warning threshold
    data_generated: bool = False  # the evaluation data was generated: the quality numbers say so
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # the shapes it was built and measured at
    latency_source: str = ORT_CPU_SOURCE  # what produced the latency numbers (:func:`latency_source`)
    target: str = DEFAULT_TARGET  # the deployment target of the project it was built for

    @property
    def latency_note(self) -> str:
        """What this run's latency says about its target ("" when it was measured on the target)."""
        return latency_caveat(self.target, self.backend)

    @property
    def latency_label(self) -> str:
        """The latency source with the target, e.g. ``ONNX Runtime CPU, measured · target TensorRT (GPU)``."""
        return f"{self.latency_source} · target {TARGET_LABELS.get(self.target, self.target)}"

    @property
    def measured_gpu(self) -> str:
        """The GPU the latency was measured on (a TensorRT run: ``NVIDIA T4``), "" for any other backend."""
        m = _MEASURED_GPU.match(self.latency_source or "")
        return m["gpu"] if m else ""

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        """The 95 % interval of the speedup from the run's pair times (:func:`speedup_interval`), None without."""
        return speedup_interval(self.latency.candidate_ms, self.latency.reference_ms)

    @property
    def shapes_label(self) -> str:
        """:func:`shapes_text` of the shapes the run was built at."""
        return shapes_text(self.input_shapes)

    def to_json(self) -> dict:
        q = asdict(self.quality)
        q["outputs"] = self.quality.to_dict()["outputs"]  # per metric output (None: the first float output only)
        if q["snr_db"] == float("inf"):
            q["snr_db"] = None
        return {
            "kind": self.KIND, "format_version": self.FORMAT_VERSION,
            "run_id": self.run_id, "run_dir": str(self.run_dir), "created": self.created, "label": self.label,
            "model": {"name": self.model_name, "sha256": self.model_sha256},
            "backend": self.backend, "backend_reason": self.backend_reason, "policy_sha256": self.policy_sha256,
            "latency_ms": {"median": self.latency.median_ms, "p95": self.latency.p95_ms,
                           "fp32_median": self.latency.ref_median_ms, "fp32_p95": self.latency.ref_p95_ms,
                           "iterations": self.latency.iterations,
                           # each interleaved pair's times, in order (the speedup's interval is computed from them)
                           "candidate_ms": list(self.latency.candidate_ms),
                           "reference_ms": list(self.latency.reference_ms)},
            "speedup": self.latency.speedup, "latency_source": self.latency_source, "target": self.target,
            "reformat": asdict(self.reformat),
            "quality": q,
            "precision_counts": self.precision_counts,
            "int8_mac_fraction": self.int8_mac_fraction,
            "build_seconds": self.build_seconds,
            "calibration": {"method": self.calibration_method, "cache_hit": self.calibration_cache_hit},
            "warnings": list(self.warnings), "data_generated": self.data_generated,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "per_layer": self.per_layer.to_dict(orient="records"),
        }

    @classmethod
    def from_json(cls, doc: dict) -> "RunResult":
        """The run of a :meth:`to_json` document; ``per_layer`` is optional (an empty
        PER_LAYER_COLUMNS table without it). Older formats are migrated (:func:`_migrate`);
        anything else that is not a run of this format is a MixprecError."""
        doc = _migrate(doc, cls.KIND)
        check_format(doc, cls.KIND, cls.FORMAT_VERSION, "run")
        try:
            lat, q, rf = doc["latency_ms"], dict(doc["quality"]), doc["reformat"]
            q["snr_db"] = float("inf") if q.get("snr_db") is None else q["snr_db"]
            rows = doc.get("per_layer")
            return cls(
                run_id=doc["run_id"], run_dir=Path(doc["run_dir"]), created=doc["created"],
                label=doc.get("label", ""), model_name=doc["model"]["name"], model_sha256=doc["model"]["sha256"],
                backend=doc["backend"], backend_reason=doc.get("backend_reason", ""),
                policy_sha256=doc["policy_sha256"],
                latency=Latency(lat["median"], lat["p95"], lat["fp32_median"], lat["fp32_p95"], doc["speedup"],
                                lat["iterations"], *_pair_times(lat)),
                reformat=ReformatSummary(rf["count"], rf["ms"], rf["pct"], rf.get("total_ms", float("nan")),
                                         rf.get("elided", 0)),
                quality=Quality(**{f.name: q.get(f.name) for f in dataclass_fields(Quality) if f.name != "outputs"},
                                outputs={str(k): Quality.from_dict(v) for k, v in q["outputs"].items()}
                                if isinstance(q.get("outputs"), dict) else None),
                precision_counts=dict(doc["precision_counts"]), int8_mac_fraction=doc["int8_mac_fraction"],
                build_seconds=doc["build_seconds"], calibration_method=doc["calibration"]["method"],
                calibration_cache_hit=doc["calibration"]["cache_hit"],
                per_layer=pd.DataFrame(rows or [], columns=PER_LAYER_COLUMNS),
                warnings=[str(w) for w in doc["warnings"]], data_generated=bool(doc["data_generated"]),
                input_shapes={k: [int(d) for d in v] for k, v in doc["input_shapes"].items()},
                latency_source=str(doc["latency_source"]), target=str(doc["target"]))
        except (KeyError, TypeError) as e:
            raise MixprecError(f"the stored run {doc.get('run_id', '?')} lacks the field {e}",
                               "delete the run and build the policy again") from e

    def row(self) -> dict:
        """The run as one row of :func:`list_runs` (RUN_COLUMNS; an infinite SNR is None, as stored)."""
        q, lat, rf, pc = self.quality, self.latency, self.reformat, self.precision_counts
        row = {"run_id": self.run_id, "created": self.created, "model_name": self.model_name,
               "model_sha256": self.model_sha256, "label": self.label, "backend": self.backend,
               "target": self.target, "latency_source": self.latency_source,
               "policy_sha256": self.policy_sha256, "latency_median_ms": lat.median_ms,
               "latency_p95_ms": lat.p95_ms, "fp32_median_ms": lat.ref_median_ms, "speedup": lat.speedup,
               "reformat_count": rf.count, "reformat_ms": rf.ms, "reformat_pct": rf.pct,
               "cosine_mean": q.cosine_mean, "cosine_min": q.cosine_min,
               "snr_db": None if q.snr_db == float("inf") else q.snr_db, "max_abs": q.max_abs,
               "top1_agreement": q.top1_agreement, "kl_div": q.kl_div, "perplexity": q.perplexity,
               "knn5_overlap": q.knn5_overlap,
               "n_fp32": pc.get("fp32", 0), "n_fp16": pc.get("fp16", 0), "n_int8": pc.get("int8", 0),
               "int8_mac_fraction": self.int8_mac_fraction, "build_seconds": self.build_seconds,
               "data_generated": self.data_generated, "warnings": " ".join(self.warnings)}
        ci = self.speedup_ci
        row.update(speedup_low=ci[0] if ci else math.nan, speedup_high=ci[1] if ci else math.nan,
                   timed_pairs=len(self.latency.candidate_ms), input_shapes=self.shapes_label)
        return {c: row[c] for c in RUN_COLUMNS}


def _pair_times(lat: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The pair times of a run document's ``latency_ms`` (runs built before they were kept have none: empty)."""
    c, r = lat.get("candidate_ms"), lat.get("reference_ms")
    if not isinstance(c, list) or not isinstance(r, list) or len(c) != len(r):
        return (), ()
    try:
        return tuple(float(v) for v in c), tuple(float(v) for v in r)
    except (TypeError, ValueError):
        return (), ()


def _migrate(doc, kind: str):
    """A run document of an older format as the current one: format 1 had no ``kind``; formats 1
    and 2 had no ``warnings`` (none were given), ``data_generated`` (not known: False) and
    ``input_shapes`` (not known: empty); formats 1-3 had no ``latency_source`` (read from the
    backend and its reason) and no ``target`` (TensorRT: the only target mixprec had)."""
    if not isinstance(doc, dict):
        return doc
    if "kind" not in doc and doc.get("format_version") == 1:
        doc = {**doc, "kind": kind, "format_version": 2}  # migration 1 -> 2
    if doc.get("kind") == kind and doc.get("format_version") == 2:  # migration 2 -> 3
        doc = {"warnings": [], "data_generated": False, "input_shapes": {}, **doc, "format_version": 3}
    if doc.get("kind") == kind and doc.get("format_version") == 3:  # migration 3 -> 4
        source = latency_source(str(doc.get("backend", "")), str(doc.get("backend_reason", "")))
        doc = {"latency_source": source, "target": DEFAULT_TARGET, **doc, "format_version": 4}
    return doc


def model_spec(project: Project) -> str:
    """How the CLI names the project's model: ``sample:NAME`` or its path."""
    m = project.model
    return f"sample:{m.sample}" if m.sample else str(m.path)


def worst_int8_layers(ranking: RankedLayers | None, policy: Policy, top: int = 5) -> list[str]:
    """The ``top`` most sensitive layers of ``ranking`` that ``policy`` puts in INT8."""
    if ranking is None:
        return []
    return [n for n in ranking.table["name"] if policy.layers.get(n) == "int8"][:top]


def quality_warnings(project: Project, policy: Policy, q: Quality, warn_below: float = WARN_BELOW,
                     ranking: RankedLayers | None = None, generated: bool = False) -> list[str]:
    """The warnings of a run of ``policy`` with quality ``q``: none unless ``q.cosine_mean`` is
    below ``warn_below``; then one naming the metric (cosine_mean, of the headline metric output) and the worst
    INT8 layers of ``ranking``, or, without one, saying how to compute it. On generated data it says first that
    the number may only reflect the generated inputs."""
    cos = q.cosine_mean
    if cos is not None and not math.isfinite(cos):
        return [f"cosine_mean is {cos}: the outputs are not finite (NaN or inf)"
                + (f" ({GENERATED_NOTE})" if generated else "") + ", so quality could not be measured. The FP32 "
                "model or this policy overflows (FP16's range ends at 65504): check the FP32 outputs on this data, "
                "or keep the layers whose activations are large in FP32."]
    if cos is None or not cos < warn_below:
        return []
    of = q.output or next((o.name for o in project.model.outputs if o.is_float), "the output")
    head = (f"{GENERATED_NOTE[0].upper()}{GENERATED_NOTE[1:]}, this number may only reflect the generated inputs: "
            if generated else "") + f"cosine_mean of {of} (the --warn-below metric) {cos:.4f} is below {warn_below:g}"
    worst = worst_int8_layers(ranking, policy)
    if worst:
        return [f"{head}: the worst INT8 layers in {ranking.title} are {', '.join(worst)}. Set them to "
                "FP16 (Precision page, or a policy JSON) or search under a budget (`python -m core search`)."]
    return [f"{head}: run the ranking (`python -m core rank {model_spec(project)}`, or the Sensitivity page) to "
            "see which layers lose it, or search under a budget (`python -m core search`)."]


def is_generated(data) -> bool:
    """Whether a Dataset (or a slice of one) was generated rather than given."""
    return bool(data.generated)


def int8_mac_fraction(project: Project, policy: Policy) -> float:
    """The INT8 share of all MACs (eligible or not; see ``Project.total_macs``)."""
    total = project.total_macs
    int8 = sum(l.macs for l in project.layers if l.eligible and policy.layers.get(l.name) == "int8")
    return int8 / total if total else 0.0


def build_and_measure(project: Project, policy: Policy, backend: str = "auto", label: str = "",
                      progress=None, warmup: int = 3, iterations: int = 30,
                      profile_iterations: int = 5, onnx_bytes: bytes | None = None,
                      trt_options: dict | None = None, warn_below: float = WARN_BELOW,
                      ranking: RankedLayers | None = None, metrics: MetricSpec | None = None) -> RunResult:
    """Compile, build, evaluate, time and profile one policy; store the run atomically.
    ``onnx_bytes`` measures an ONNX made elsewhere (e.g. by ORT's quantize_static) instead of
    compiling ``policy``, which then only describes it (precision counts, MAC share).
    Below ``warn_below`` (cosine_mean) the run carries a warning (:func:`quality_warnings`)
    naming the worst INT8 layers of ``ranking`` (e.g. ``core.store.results.load_ranking``), if given.
    ``metrics``: what quality is measured on (``core.measure.evaluation``; default the first float output)."""
    step = progress or (lambda f, t: None)
    timing_feed(project)  # enough evaluation samples for the timing batch: fail before any work
    # the batch the graph runs at, tried on ONNX Runtime (the ONNX graph's own limit; a TensorRT profile follows it)
    project = settle_eval_batch(select_backend("onnxruntime")[0], project)
    be, reason = select_backend(backend, **project_trt_options(project, trt_options))  # the project's --profile too
    ws = project.ws
    t_start = time.perf_counter()
    clean_temp_runs(ws)
    needed = check_build_space(project, be.name)
    step(0.05, f"calibrating ({policy.calibration.method})")
    calib = None if onnx_bytes else calibrate_policy(project.model, project.calib_data, policy, project.layers, ws)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    tmp_dir = _make_temp_run(ws, run_id, needed)
    try:
        step(0.15, f"building on {be.name}")
        if onnx_bytes is None:
            engine = be.build(project.model, policy, calib, tmp_dir, project.input_shapes)
        elif hasattr(be, "build_from_onnx"):
            engine = be.build_from_onnx(onnx_bytes, tmp_dir, project.input_shapes)
        else:
            raise MixprecError(f"the {be.name} backend cannot measure a prebuilt ONNX", "use --backend onnxruntime")
        build_seconds = time.perf_counter() - t_start
        reference = reference_engine(be, project)
        names = project_outputs(project, metrics)
        batches = project.eval_data.batches(eval_batch(project))
        step(0.35, f"evaluating quality on {project.eval_data.num_samples} held-out samples")
        ref = {n: reference_outputs(be, reference, project, batches, n) for n in names}  # cached per output name
        q = evaluate(metrics, ref, engine_outputs_of(be, engine, batches, names), project.eval_data.labels, batches)
        feed = timing_feed(project)
        step(0.6, f"timing candidate vs FP32 interleaved ({iterations} pairs)")
        lat = be.time_interleaved(engine, reference, feed, warmup, iterations)
        step(0.85, "profiling per layer")
        per_layer = be.profile(engine, feed, profile_iterations, project.layers, policy)
        generated = is_generated(project.eval_data)
        result = RunResult(
            run_id=run_id, run_dir=ws.run_dir(run_id), created=time.time(), label=label or _auto_label(policy),
            model_name=project.model.name, model_sha256=project.model.sha256, backend=be.name,
            backend_reason=reason, policy_sha256=policy.sha256, latency=lat, reformat=reformat_summary(per_layer),
            quality=q, precision_counts=policy.precision_counts(), int8_mac_fraction=int8_mac_fraction(project, policy),
            build_seconds=build_seconds, calibration_method=policy.calibration.method,
            calibration_cache_hit=calib.cache_hit if calib else None, per_layer=per_layer,
            warnings=quality_warnings(project, policy, q, warn_below, ranking, generated),
            data_generated=generated,
            input_shapes={k: [int(d) for d in v] for k, v in project.input_shapes.items()},
            latency_source=latency_source(be.name, reason), target=project.target,
        )
        _write_run(tmp_dir, result, policy)
        publish_folder(tmp_dir, result.run_dir)
    except BaseException as e:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        said = isinstance(e, MixprecError) and e.what.startswith("no space left")
        if isinstance(e, Exception) and not said and _out_of_space(e, ws, project.model.size_bytes):
            raise space_error(ws.run_dir(run_id), needed) from e
        raise
    step(1.0, "done")
    return result


def _out_of_space(exc: Exception, ws: Workspace, margin: int) -> bool:
    """Whether a failed build failed for want of space: an ENOSPC anywhere in its chain, or a
    workspace left with less than ``margin`` (the model's size) free — ONNX Runtime and protobuf
    report a full disk as a serialisation error."""
    if is_space_error(exc):
        return True
    free = free_bytes(ws.root)
    return free is not None and free < max(margin, 1 << 20)


def build_space_needed(project: Project, backend: str) -> int:
    """Bytes a build writes into the workspace, about: the compiled model and the backend's artifact
    (each at most the model's size), the FP32 reference engine (twice the model) when it is not built
    yet, and a margin for the tables and reference outputs."""
    size = project.model.size_bytes
    ref = project.ws.reference_dir(backend, project.model.sha256, create=False)
    have_ref = (ref / REFERENCE_STAMPS).is_file()
    return 2 * size + (0 if have_ref else 2 * size) + (1 << 20)


def check_build_space(project: Project, backend: str) -> int:
    """The space a build needs (:func:`build_space_needed`); a MixprecError naming the workspace
    when its disk has less free."""
    needed = build_space_needed(project, backend)
    free = free_bytes(project.ws.root)
    if free is not None and free < needed:
        raise MixprecError(f"the workspace {project.ws.root} has {human_bytes(free)} free; this build needs about "
                           f"{human_bytes(needed)} (the compiled model, its engine and the FP32 reference of a "
                           f"{human_bytes(project.model.size_bytes)} model)",
                           "free space on that disk, or set MIXPREC_WORKSPACE to a folder on a disk with more room")
    return needed


# --- the run's folder -----------------------------------------------------------------------------
def _make_temp_run(ws: Workspace, run_id: str, needed: int) -> Path:
    """``runs/.tmp-<id>/``, claimed by this process (so a clean-up spares it while it lives)."""
    tmp_dir = ws.temp_run_dir(run_id)
    try:
        claim_folder(tmp_dir)
    except OSError as e:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if is_space_error(e):
            raise space_error(ws.run_dir(run_id), needed) from e
        raise MixprecError(f"cannot create the run folder {tmp_dir}: {e.strerror}",
                           "make the workspace writable, or set MIXPREC_WORKSPACE to a writable folder") from e
    return tmp_dir


def _auto_label(policy: Policy) -> str:
    c = policy.precision_counts()
    return f"int8={c['int8']} fp16={c['fp16']} fp32={c['fp32']}"


def _write_run(tmp_dir: Path, result: RunResult, policy: Policy) -> None:
    atomic_write_text(tmp_dir / POLICY_FILE, policy.to_json())
    result.per_layer.to_csv(tmp_dir / PER_LAYER_FILE, index=False)
    atomic_write_json(tmp_dir / METRICS_FILE, {k: v for k, v in result.to_json().items() if k != "per_layer"})
