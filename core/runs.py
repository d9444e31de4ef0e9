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

from .backends import Latency, select_backend
from .calibration import calibrate_policy
from .errors import MixprecError
from .evaluation import engine_outputs, eval_batch, output_name, reference_engine, reference_outputs, timing_feed
from .metrics import Quality, quality
from .policy import Policy
from .project import Project
from .reports import ReformatSummary, reformat_summary
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
    reformat: ReformatSummary
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
        reference = reference_engine(be, project)
        out_name = output_name(project)
        batches = project.eval_data.batches(eval_batch(project))
        step(0.35, f"evaluating quality on {project.eval_data.num_samples} held-out samples")
        q = quality(reference_outputs(be, reference, project, batches, out_name),
                    engine_outputs(be, engine, batches, out_name), out_name, project.eval_data.labels)
        feed = timing_feed(project)
        step(0.6, f"timing candidate vs FP32 interleaved ({iterations} pairs)")
        lat = be.time_interleaved(engine, reference, feed, warmup, iterations)
        step(0.85, "profiling per layer")
        per_layer = be.profile(engine, feed, profile_iterations, project.layers, policy)
        result = RunResult(
            run_id=run_id, run_dir=ws.runs / run_id, created=time.time(), label=label or _auto_label(policy),
            model_name=project.model.name, model_sha256=project.model.sha256, backend=be.name,
            backend_reason=reason, policy_sha256=policy.sha256, latency=lat, reformat=reformat_summary(per_layer),
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
