"""Calibration: activation ranges from ONNX Runtime's calibrators (MinMax, Entropy,
Percentile), computed once and cached in the workspace under a key of model sha256 +
data sha256 + method (+ its settings) + format version. A stale cache silently ruins
quality, so the key covers everything the ranges depend on."""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import Dataset
from .errors import MixprecError
from .inventory import INT8_ELIGIBLE
from .model import LoadedModel
from .policy import CALIB_METHODS, CalibrationSettings
from .workspace import Workspace, atomic_write_json, sha256_bytes

CALIB_FORMAT_VERSION = 2


@dataclass(frozen=True)
class CalibrationResult:
    """Per-tensor activation ranges (``lo``, ``hi``) and where they came from."""

    ranges: dict[str, tuple[float, float]]
    settings: CalibrationSettings
    key: str
    cache_hit: bool
    seconds: float
    path: Path

    def amax(self, tensor: str) -> float:
        lo, hi = self.ranges[tensor]
        return max(abs(lo), abs(hi))


def cache_key(model_sha: str, data_sha: str, method: str, percentile: float) -> str:
    parts = [f"v{CALIB_FORMAT_VERSION}", model_sha, data_sha, method]
    if method == "percentile":
        parts.append(repr(float(percentile)))
    return sha256_bytes("|".join(parts).encode())[:32]


class _Reader:
    """``CalibrationDataReader`` over a dataset's batch-1 feeds."""

    def __init__(self, ds: Dataset, progress=None):
        self.feeds = ds.batches(1)
        self.i = 0
        self.progress = progress

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        if self.progress:
            self.progress(self.i / len(self.feeds), f"calibrating {self.i}/{len(self.feeds)}")
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


def _run_calibrator(model: LoadedModel, ds: Dataset, method: str, percentile: float, progress=None):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    extra = {"symmetric": True}
    if method == "percentile":
        extra["percentile"] = float(percentile)
    # ORT's calibrators print progress on stdout; keep stdout clean for --json.
    with tempfile.TemporaryDirectory(prefix="mixprec-calib-") as tmp, contextlib.redirect_stdout(sys.stderr):
        src = Path(tmp) / "model.onnx"
        src.write_bytes(model.serialized())
        cal = create_calibrator(src, list(INT8_ELIGIBLE), augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=methods[method], providers=["CPUExecutionProvider"],
                                extra_options=extra)
        cal.collect_data(_Reader(ds, progress))
        data = cal.compute_data()
    ranges = {}
    for name, td in data.data.items():
        lo, hi = td.range_value
        ranges[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
    return ranges


def calibrate(model: LoadedModel, ds: Dataset, settings: CalibrationSettings | str = "minmax",
              ws: Workspace | None = None, progress=None) -> CalibrationResult:
    """Ranges for every activation input of an INT8-eligible layer, from cache when possible."""
    if isinstance(settings, str):
        settings = CalibrationSettings(method=settings)
    if settings.method not in CALIB_METHODS:
        raise MixprecError(f"unknown calibration method {settings.method!r}",
                           f"use one of {', '.join(CALIB_METHODS)}")
    if ds.num_samples == 0:
        raise MixprecError("the calibration data holds no samples", "give a .npz with at least one sample per input")
    ws = ws or Workspace.default()
    data_sha = ds.sha256
    settings = CalibrationSettings(settings.method, settings.percentile, ds.num_samples, data_sha)
    key = cache_key(model.sha256, data_sha, settings.method, settings.percentile)
    path = ws.calib / f"{key}.json"
    t0 = time.perf_counter()
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
            if (doc.get("format_version") == CALIB_FORMAT_VERSION and doc.get("model_sha256") == model.sha256
                    and doc.get("data_sha256") == data_sha and doc.get("method") == settings.method):
                ranges = {k: (float(v[0]), float(v[1])) for k, v in doc["ranges"].items()}
                return CalibrationResult(ranges, settings, key, True, time.perf_counter() - t0, path)
        except (ValueError, KeyError, TypeError, IndexError):
            pass  # a corrupt cache entry is recomputed and overwritten
    ranges = _run_calibrator(model, ds, settings.method, settings.percentile, progress)
    atomic_write_json(path, {
        "format_version": CALIB_FORMAT_VERSION, "model_sha256": model.sha256, "data_sha256": data_sha,
        "method": settings.method, "percentile": settings.percentile, "num_samples": ds.num_samples,
        "ranges": {k: [lo, hi] for k, (lo, hi) in sorted(ranges.items())},
    })
    return CalibrationResult(ranges, settings, key, False, time.perf_counter() - t0, path)


def trt_calibration_cache(result: CalibrationResult, version_tag: str = "TRT-100100-EntropyCalibration2") -> str:
    """The ranges as a TensorRT calibration cache (``name: hex(float32 scale)``, scale = amax/127),
    readable by trtexec ``--calib`` for implicit-quantization builds (TensorRT ≤ 10.11)."""
    lines = [version_tag]
    for name, (lo, hi) in sorted(result.ranges.items()):
        scale = np.float32(max(abs(lo), abs(hi), 1e-12) / 127.0)
        lines.append(f"{name}: {scale.view(np.uint32):08x}")
    return "\n".join(lines) + "\n"
