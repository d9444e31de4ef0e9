"""Build a policy and measure it: latency (interleaved against FP32), per-layer time,
reformat overhead and quality on held-out data. Each run lives in ``runs/<id>/`` with its
policy, metrics, per-layer table, compiled model and the backend's engine artifact."""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .backends import Latency, Reformat, select_backend, summarize_reformat
from .calibration import calibrate_policy
from .errors import MixprecError
from .metrics import Quality, quality
from .policy import Policy
from .project import Project
from .workspace import Workspace, atomic_save_npz, atomic_write_json, atomic_write_text

RUN_FORMAT_VERSION = 1
RUN_COLUMNS = [
    "run_id", "created", "model_name", "model_sha256", "label", "backend", "policy_sha256",
    "latency_median_ms", "latency_p95_ms", "fp32_median_ms", "speedup",
    "reformat_count", "reformat_ms", "reformat_pct",
    "cosine_mean", "cosine_min", "snr_db", "max_abs", "top1_agreement", "knn5_overlap",
    "n_fp32", "n_fp16", "n_int8", "int8_mac_fraction", "build_seconds",
]


@dataclass
class RunResult:
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
    reformat: Reformat
    quality: Quality
    precision_counts: dict[str, int]
    int8_mac_fraction: float
    build_seconds: float
    calibration_method: str
    calibration_cache_hit: bool | None
    per_layer: pd.DataFrame

    def to_json(self) -> dict:
        q = asdict(self.quality)
        if q["snr_db"] == float("inf"):
            q["snr_db"] = None
        return {
            "format_version": RUN_FORMAT_VERSION,
            "run_id": self.run_id, "run_dir": str(self.run_dir), "created": self.created, "label": self.label,
            "model": {"name": self.model_name, "sha256": self.model_sha256},
            "backend": self.backend, "backend_reason": self.backend_reason, "policy_sha256": self.policy_sha256,
            "latency_ms": {"median": self.latency.median_ms, "p95": self.latency.p95_ms,
                           "fp32_median": self.latency.ref_median_ms, "fp32_p95": self.latency.ref_p95_ms,
                           "iterations": self.latency.iterations},
            "speedup": self.latency.speedup,
            "reformat": {"count": self.reformat.count, "ms": self.reformat.ms, "pct": self.reformat.pct},
            "quality": q,
            "precision_counts": self.precision_counts,
            "int8_mac_fraction": self.int8_mac_fraction,
            "build_seconds": self.build_seconds,
            "calibration": {"method": self.calibration_method, "cache_hit": self.calibration_cache_hit},
            "per_layer": self.per_layer.to_dict(orient="records"),
        }

    def row(self) -> dict:
        q, lat, rf, pc = self.quality, self.latency, self.reformat, self.precision_counts
        return dict(zip(RUN_COLUMNS, [
            self.run_id, self.created, self.model_name, self.model_sha256, self.label, self.backend,
            self.policy_sha256, lat.median_ms, lat.p95_ms, lat.ref_median_ms, lat.speedup,
            rf.count, rf.ms, rf.pct, q.cosine_mean, q.cosine_min, q.snr_db, q.max_abs, q.top1_agreement,
            q.knn5_overlap, pc.get("fp32", 0), pc.get("fp16", 0), pc.get("int8", 0), self.int8_mac_fraction,
            self.build_seconds,
        ]))


def int8_mac_fraction(project: Project, policy: Policy) -> float:
    total = project.eligible_macs
    int8 = sum(l.macs for l in project.layers if policy.layers.get(l.name) == "int8")
    return int8 / total if total else 0.0


EVAL_BATCH = 16


def _reference(backend, project: Project):
    """The FP32 engine, built once per model and backend."""
    ref_dir = project.ws.sub("reference", backend.name, project.model.sha256[:16])
    return backend.reference(project.model, ref_dir, project.input_shapes)


def _outputs(backend, engine, batches, name):
    with backend.runner(engine) as r:
        return [np.asarray(r.infer(b)[name]) for b in batches]


def _reference_outputs(backend, reference, project: Project, batches, name) -> list[np.ndarray]:
    """FP32 outputs on the evaluation data, cached by model + data + output + format version."""
    key = f"outputs-v{RUN_FORMAT_VERSION}-{project.eval_data.sha256[:16]}-{len(batches)}-{name.replace('/', '_')}.npz"
    path = Path(reference.compiled_path).parent / key
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            return [z[f"b{i}"] for i in range(len(z.files))]
    outs = _outputs(backend, reference, batches, name)
    atomic_save_npz(path, {f"b{i}": o for i, o in enumerate(outs)})
    return outs


def build_and_measure(project: Project, policy: Policy, backend: str = "auto", label: str = "",
                      progress=None, warmup: int = 3, iterations: int = 30,
                      profile_iterations: int = 5, onnx_bytes: bytes | None = None,
                      trt_options: dict | None = None) -> RunResult:
    """Compile, build, evaluate, time and profile one policy; store the run atomically.
    ``onnx_bytes`` measures an ONNX made elsewhere (e.g. by ORT's quantize_static) instead of
    compiling ``policy``, which then only describes it (precision counts, MAC share)."""
    step = progress or (lambda f, t: None)
    be, reason = select_backend(backend, **(trt_options or {}))
    ws = project.ws
    t_start = time.perf_counter()
    step(0.05, f"calibrating ({policy.calibration.method})")
    calib = None if onnx_bytes else calibrate_policy(project.model, project.calib_data, policy, project.layers, ws)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    tmp_dir = ws.runs / f".tmp-{run_id}"
    tmp_dir.mkdir(parents=True)
    try:
        step(0.15, f"building on {be.name}")
        if onnx_bytes is None:
            engine = be.build(project.model, policy, calib, tmp_dir, project.input_shapes)
        elif hasattr(be, "build_from_onnx"):
            engine = be.build_from_onnx(onnx_bytes, tmp_dir, project.input_shapes)
        else:
            raise MixprecError(f"the {be.name} backend cannot measure a prebuilt ONNX", "use --backend onnxruntime")
        build_seconds = time.perf_counter() - t_start
        reference = _reference(be, project)
        out_name = next(o.name for o in project.model.outputs if o.is_float)
        batches = project.eval_data.batches(_eval_batch(project))
        step(0.35, f"evaluating quality on {project.eval_data.num_samples} held-out samples")
        q = quality(_reference_outputs(be, reference, project, batches, out_name),
                    _outputs(be, engine, batches, out_name), out_name, project.eval_data.labels)
        feed = project.eval_data.batches(project.input_shapes[project.model.inputs[0].name][0])[0]
        step(0.6, f"timing candidate vs FP32 interleaved ({iterations} pairs)")
        lat = be.time_interleaved(engine, reference, feed, warmup, iterations)
        step(0.85, "profiling per layer")
        per_layer = be.profile(engine, feed, profile_iterations, project.layers, policy)
        result = RunResult(
            run_id=run_id, run_dir=ws.runs / run_id, created=time.time(), label=label or _auto_label(policy),
            model_name=project.model.name, model_sha256=project.model.sha256, backend=be.name,
            backend_reason=reason, policy_sha256=policy.sha256, latency=lat, reformat=summarize_reformat(per_layer),
            quality=q, precision_counts=policy.precision_counts(), int8_mac_fraction=int8_mac_fraction(project, policy),
            build_seconds=build_seconds, calibration_method=policy.calibration.method,
            calibration_cache_hit=calib.cache_hit if calib else None, per_layer=per_layer,
        )
        atomic_write_text(tmp_dir / "policy.json", policy.to_json())
        per_layer.to_csv(tmp_dir / "per_layer.csv", index=False)
        atomic_write_json(tmp_dir / "metrics.json", {k: v for k, v in result.to_json().items() if k != "per_layer"})
        os.replace(tmp_dir, result.run_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    step(1.0, "done")
    return result


def _eval_batch(project: Project) -> int:
    """Evaluate in batches where every input's batch axis is dynamic (same numerics, less time)."""
    dynamic = all(0 in s.dynamic_axes for s in project.model.inputs)
    n = project.eval_data.num_samples
    return max(d for d in range(1, min(EVAL_BATCH, n) + 1) if n % d == 0) if dynamic else \
        project.input_shapes[project.model.inputs[0].name][0]


def _auto_label(policy: Policy) -> str:
    c = policy.precision_counts()
    return f"int8={c['int8']} fp16={c['fp16']} fp32={c['fp32']}"


def list_runs(ws: Workspace | None = None, model_sha256: str | None = None) -> pd.DataFrame:
    """All stored runs (newest first) as a table with ``RUN_COLUMNS``."""
    ws = ws or Workspace.default()
    rows = []
    for p in ws.runs.glob("*/metrics.json"):
        try:
            rows.append(_row_from_metrics(json.loads(p.read_text())))
        except (ValueError, KeyError, TypeError):
            continue  # a damaged run is skipped, never fatal
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    if model_sha256:
        df = df[df["model_sha256"] == model_sha256]
    return df.sort_values("created", ascending=False, ignore_index=True)


def _row_from_metrics(m: dict) -> dict:
    q, pc = m["quality"], m["precision_counts"]
    return dict(zip(RUN_COLUMNS, [
        m["run_id"], m["created"], m["model"]["name"], m["model"]["sha256"], m.get("label", ""), m["backend"],
        m["policy_sha256"], m["latency_ms"]["median"], m["latency_ms"]["p95"], m["latency_ms"]["fp32_median"],
        m["speedup"], m["reformat"]["count"], m["reformat"]["ms"], m["reformat"]["pct"], q["cosine_mean"],
        q["cosine_min"], q["snr_db"], q["max_abs"], q.get("top1_agreement"), q.get("knn5_overlap"),
        pc.get("fp32", 0), pc.get("fp16", 0), pc.get("int8", 0), m["int8_mac_fraction"], m["build_seconds"],
    ]))


def load_run_per_layer(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / "per_layer.csv"
    if not path.is_file():
        raise MixprecError(f"run {Path(run_dir).name} has no per-layer table", "rebuild the policy")
    return pd.read_csv(path, keep_default_na=False)
