"""Calibration: activation ranges from ONNX Runtime's calibrators (MinMax, Entropy,
Percentile), computed once and cached in the workspace under a key of model sha256 +
data sha256 + method (+ its settings) + format version. A stale cache silently ruins
quality, so the key covers everything the ranges depend on."""
from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
import unicodedata
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from core.errors import MixprecError
from core.model.data import Dataset
from core.model.data_errors import ort_feed_errors
from core.model.kv_cache import kv_relation
from core.model.inventory import INT8_ELIGIBLE
from core.model.load import LoadedModel
from core.model.placement import placement_tensors
from core.model.shapes import fixed_batch, memory_budget
from core.quant.policy import CALIB_METHODS, CalibrationSettings
from core.workspace import Workspace, atomic_save_npz, atomic_write_json, discard_corrupt, sha256_bytes

CALIB_FORMAT_VERSION = 4  # 4: also the inputs/outputs of placement Adds, pooling and Concats (core.model.placement)
# 3: entropy over ENTROPY_BINS histogram bins (before: ORT's 128, i.e. MinMax)
# ORT's entropy calibrator defaults to 128 histogram bins and 128 quantized bins, which leaves one
# candidate threshold — the full range — so "entropy" silently equals MinMax. TensorRT's entropy
# calibrator uses 2048 bins; ORT's Python KL search took 102 s at 2048 bins and 16 s at 512 on
# MiniLM (96 tensors), so mixprec uses 512 (thresholds in steps of amax/256).
ENTROPY_BINS = 512
ENTROPY_QUANTIZED_BINS = 128


@dataclass(frozen=True)
class CalibrationResult:
    """Per-tensor activation ranges (``lo``, ``hi``) and where they came from."""

    ranges: dict[str, tuple[float, float]]
    settings: CalibrationSettings
    key: str
    cache_hit: bool
    seconds: float
    path: Path
    channels: dict = field(default_factory=dict)  # tensor -> per-channel amax (last axis), for smoothing

    def amax(self, tensor: str) -> float:
        lo, hi = self.ranges[tensor]
        return max(abs(lo), abs(hi))


def cache_key(model_sha: str, data_sha: str, method: str, percentile: float) -> str:
    parts = [f"v{CALIB_FORMAT_VERSION}", model_sha, data_sha, method]
    if method == "percentile":
        parts.append(repr(float(percentile)))
    return sha256_bytes("|".join(parts).encode())[:32]


class _Reader:
    """``CalibrationDataReader`` over a dataset's feeds: one sample each along every input's batch
    axis (the model's fixed batch when it has one); ``feeds``: those feeds already cut (a part of them)."""

    def __init__(self, ds: Dataset | None, progress=None, batch: int = 1, feeds: list | None = None):
        self.feeds = feeds if feeds is not None else ds.batches(batch)
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


_ORT_LOADER_LOCK = threading.Lock()


@contextlib.contextmanager
def _graph_only_loading(ortc):
    """ORT's calibrators load the model with ``onnx.load``, weights and all: for a model whose weights
    stay external (``core.model.external``) a second copy of them. While one is made, it loads the graph
    only; the augmented model it writes keeps the references, and its session maps the data files."""
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    def load(model_path):
        inferred = Path(model_path).with_name(Path(model_path).stem + "-inferred.onnx")
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
        m = onnx.load(str(inferred), load_external_data=False)
        add_infer_metadata(m)
        inferred.unlink()
        return m

    with _ORT_LOADER_LOCK:
        saved, ortc.load_model_with_shape_infer = ortc.load_model_with_shape_infer, load
        try:
            yield
        finally:
            ortc.load_model_with_shape_infer = saved


def _make_calibrator(src: Path, augmented: Path, method: str, options: dict, tensors: set[str],
                     external: bool = False):
    """ORT's calibrator for ``method`` (what ``create_calibrator`` builds), collecting the tensors ORT
    selects for the MAC ops (their inputs and outputs) plus ``tensors``: the inputs and outputs of
    the placement Adds, pooling and Concats. Selecting every Add by op type would calibrate each bias
    Add too (MiniLM: 294 tensors instead of 138)."""
    from onnxruntime.quantization import calibrate as ortc

    base = {"minmax": ortc.MinMaxCalibrater, "entropy": ortc.EntropyCalibrater,
            "percentile": ortc.PercentileCalibrater}[method]

    class _Selecting(base):
        def select_tensors_to_calibrate(self, model):
            selected, value_infos = super().select_tensors_to_calibrate(model)
            floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
            more = {t for t in tensors if t in value_infos and value_infos[t].type.HasField("tensor_type")
                    and value_infos[t].type.tensor_type.elem_type in floats}
            return selected | more, value_infos

    with _graph_only_loading(ortc) if external else contextlib.nullcontext():
        cal = _Selecting(src, list(INT8_ELIGIBLE), augmented_model_path=str(augmented), **options)
    cal.augment_graph()
    cal.execution_providers = ["CPUExecutionProvider"]
    cal.create_inference_session()
    return cal


def _run_calibrator(model: LoadedModel, ds: Dataset, method: str, percentile: float, progress=None):
    extra = {"symmetric": True}
    if method == "entropy":
        extra.update(num_bins=ENTROPY_BINS, num_quantized_bins=ENTROPY_QUANTIZED_BINS)
    if method == "percentile":
        extra["percentile"] = float(percentile)
    # ORT's calibrators print progress on stdout; keep stdout clean for --json.
    with model.scratch("mixprec-calib-") as tmp, contextlib.redirect_stdout(sys.stderr):
        src = model.save(Path(tmp) / "model.onnx")  # external weights: the graph beside links of the data
        cal = _make_calibrator(src, Path(tmp) / "augmented.onnx", method, extra,
                               placement_tensors(model.proto, model.tensor_types()), model.external)
        try:
            feeds = ds.batches(fixed_batch(model) or 1)
            with ort_feed_errors(lambda: next(iter(feeds), {}), f"calibrating ({method})", kv_relation(model)):
                if method == "minmax":  # keeps a running min and max: nothing grows with the samples
                    cal.collect_data(_Reader(None, progress, feeds=feeds))
                else:
                    for part in _histogram_parts(cal, feeds, model):
                        cal.collect_data(_Reader(None, progress, feeds=part))
            data = cal.compute_data()
        except ValueError as e:
            if "bins" not in str(e):
                raise
            raise MixprecError(f"{method} calibration cannot build its histograms: some activations span a range "
                               f"too wide for finite bins ({e})",
                               "use --calibration minmax, and check the model's FP32 activations on this data "
                               "(they are huge or not finite)") from e
    ranges = {}
    for name, td in data.data.items():
        lo, hi = td.range_value
        ranges[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
    return ranges


def histogram_budget(model: LoadedModel) -> int:
    """The bytes of activations ORT's histogram calibrators may hold at once: they keep every calibrated
    tensor of every sample until the histograms are made (gigabytes on an LLM). Half the model's size (at
    least HIST_MIN_BYTES), within a quarter of the memory budget."""
    return int(min(max(HIST_MIN_BYTES, model.size_bytes // 2), memory_budget()[0] // 4))


HIST_MIN_BYTES = 256 << 20


def _histogram_parts(cal, feeds: list, model: LoadedModel) -> list[list]:
    """``feeds`` cut into parts whose calibrated tensors fit :func:`histogram_budget` (all of them at once
    when they fit: the histograms are then ORT's own one-shot ones; else ORT's collector merges each
    part's histograms into the ones before, widening their range as it needs). The size of one sample's
    outputs is measured by running the augmented model on the first feed."""
    if len(feeds) <= 1:
        return [feeds]
    per = sum(np.asarray(v).nbytes for v in cal.infer_session.run(None, feeds[0]))  # ORT keeps every output
    budget = histogram_budget(model)
    step = len(feeds) if per * len(feeds) <= budget else max(1, budget // max(per, 1))
    return [feeds[i:i + step] for i in range(0, len(feeds), step)]


def _cached_ranges(path: Path, model_sha: str, data_sha: str, method: str) -> dict | None:
    """The ranges of the calibration cache at ``path``, or None: never computed, for other inputs, or
    corrupt (then removed with a note; it is computed again and overwritten)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if not (doc.get("format_version") == CALIB_FORMAT_VERSION and doc.get("model_sha256") == model_sha
                and doc.get("data_sha256") == data_sha and doc.get("method") == method):
            return None
        return {str(k): (float(v[0]), float(v[1])) for k, v in doc["ranges"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        discard_corrupt(path, "calibration", f"{type(e).__name__}: {e}")
        return None


def calibrate(model: LoadedModel, ds: Dataset, settings: CalibrationSettings | str = "minmax",
              ws: Workspace | None = None, progress=None) -> CalibrationResult:
    """Ranges for every activation input (and output) of a MAC layer and of every placement
    Add/pooling/Concat (``core.model.placement``), from cache when possible.
    Per-tensor method overrides (``settings.per_tensor``) merge the ranges of each method used."""
    if isinstance(settings, str):
        settings = CalibrationSettings(method=settings)
    if settings.per_tensor:
        base = calibrate(model, ds, replace(settings, per_tensor=()), ws, progress)
        others = {m: calibrate(model, ds, replace(settings, method=m, per_tensor=()), ws, progress)
                  for m in {m for _, m in settings.per_tensor}}
        ranges = dict(base.ranges)
        for tensor, m in settings.per_tensor:
            if tensor in others[m].ranges:
                ranges[tensor] = others[m].ranges[tensor]
        hit = base.cache_hit and all(o.cache_hit for o in others.values())
        key = sha256_bytes((base.key + repr(settings.per_tensor)).encode())[:32]
        return CalibrationResult(ranges, replace(base.settings, per_tensor=settings.per_tensor), key, hit,
                                 base.seconds + sum(o.seconds for o in others.values()), base.path)
    if settings.method not in CALIB_METHODS:
        raise MixprecError(f"unknown calibration method {settings.method!r}",
                           f"use one of {', '.join(CALIB_METHODS)}")
    if getattr(ds, "problem", None) is not None:  # MissingData: the reason there is none
        raise ds.problem
    if ds.num_samples == 0:
        raise MixprecError("the calibration data holds no samples", "give a .npz with at least one sample per input")
    ws = ws or Workspace.default()
    data_sha = ds.sha256
    settings = CalibrationSettings(settings.method, settings.percentile, ds.num_samples, data_sha)
    key = cache_key(model.sha256, data_sha, settings.method, settings.percentile)
    path = ws.calib / f"{key}.json"
    t0 = time.perf_counter()
    ranges = _cached_ranges(path, model.sha256, data_sha, settings.method)
    if ranges is not None:
        return CalibrationResult(ranges, settings, key, True, time.perf_counter() - t0, path)
    ranges = _run_calibrator(model, ds, settings.method, settings.percentile, progress)
    atomic_write_json(path, {
        "format_version": CALIB_FORMAT_VERSION, "model_sha256": model.sha256, "data_sha256": data_sha,
        "method": settings.method, "percentile": settings.percentile, "num_samples": ds.num_samples,
        "ranges": {k: [lo, hi] for k, (lo, hi) in sorted(ranges.items())},
    })
    return CalibrationResult(ranges, settings, key, False, time.perf_counter() - t0, path)


def trt_version_number(version: str) -> int:
    """TensorRT's ``NV_TENSORRT_VERSION`` of ``"10.11"`` / ``"10.11.0.33"``: major*10000 + minor*100 + patch
    (10.11.0 -> 101100), the number in a calibration cache's ``TRT-<n>-EntropyCalibration2`` header."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)*\s*", str(version))
    if not m or int(m[1]) < 10:
        raise MixprecError(f"cannot read the TensorRT version {version!r} (10.0 or newer expected)",
                           "give the TensorRT version that will read the cache, e.g. --trt-version 10.11.0")
    return int(m[1]) * 10000 + int(m[2]) * 100 + int(m[3] or 0)


# The TensorRT a calibration cache is written for unless told otherwise: the last release with implicit
# INT8 and the per-layer precision APIs (10.12 deprecates them).
DEFAULT_CACHE_TRT_VERSION = "10.11.0"


def _unprintable(name: str) -> bool:
    """A character that ends or bends a line of a text file: C0/C1 controls (``\\n``, ``\\r``, tab, NUL…), DEL,
    and the Unicode line and paragraph separators (``str.splitlines`` splits on all of them)."""
    return any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in name)


def check_cache_names(names) -> None:
    """A MixprecError naming (as Python literals, so a newline shows as ``\\n``) the tensors whose name a
    calibration cache cannot hold: one with a control character or a line separator."""
    bad = sorted(repr(str(n)) for n in names if _unprintable(str(n)))
    if bad:
        raise MixprecError(f"{len(bad)} tensor name(s) contain a line break or another control character, which a "
                           "TensorRT calibration cache (one 'name: scale' line per tensor, no escapes) cannot hold: "
                           "written as they are, they would add lines of their own to the cache",
                           "rename those tensors in the ONNX (onnx-graphsurgeon, or the exporter's names), or build "
                           "for TensorRT 10.12 or newer (--format trtexec-typed / polygraphy), which needs no "
                           "calibration cache", details=bad)


def trt_calibration_cache(result: CalibrationResult, trt_version: str = DEFAULT_CACHE_TRT_VERSION) -> str:
    """The ranges as a TensorRT calibration cache (``name: hex(float32 scale)``, scale = amax/127),
    readable by trtexec ``--calib`` for implicit-quantization builds (TensorRT <= 10.11). The header
    names the TensorRT version that reads it (``TRT-101100-EntropyCalibration2`` for 10.11.0): TensorRT
    rejects a cache written for another version and calibrates again (issue 11, bug 1). The format has one
    tensor a line and no escapes: a tensor name with a line break or another control character would
    write lines of its own (a range TensorRT reads for another tensor), so such names are refused."""
    check_cache_names(result.ranges)
    lines = [f"TRT-{trt_version_number(trt_version)}-EntropyCalibration2"]
    for name, (lo, hi) in sorted(result.ranges.items()):
        scale = np.float32(max(abs(lo), abs(hi), 1e-12) / 127.0)
        lines.append(f"{name}: {scale.view(np.uint32):08x}")
    return "\n".join(lines) + "\n"


def channel_amax(model: LoadedModel, ds: Dataset, tensors: list[str], ws: Workspace | None = None) -> dict:
    """Max |x| per channel (last axis) of each tensor over the calibration data; cached."""
    import onnxruntime as ort
    from onnx import helper

    ws = ws or Workspace.default()
    tensors = sorted(set(tensors))
    key = sha256_bytes("|".join([f"v{CALIB_FORMAT_VERSION}", model.sha256, ds.sha256, *tensors]).encode())[:32]
    path = ws.calib / f"channels-{key}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return {t: z[f"t{i}"] for i, t in enumerate(tensors)}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            discard_corrupt(path, "channel statistics", f"{type(e).__name__}: {e}")  # recomputed below
    m = onnx_copy(model)
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in tensors if t not in known)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    amax = {t: None for t in tensors}
    with model.scratch("mixprec-channels-") as tmp:  # a session from a file (external weights: links)
        sess = ort.InferenceSession(str(model.save(Path(tmp) / "model.onnx", m)), so, providers=["CPUExecutionProvider"])
        for feed in ds.batches(fixed_batch(model) or 1):
            with ort_feed_errors(feed, "measuring per-channel activation ranges", kv_relation(model)):
                got = sess.run(tensors, feed)
            for t, v in zip(tensors, got):
                cur = np.abs(v).reshape(-1, v.shape[-1]).max(axis=0)
                amax[t] = cur if amax[t] is None else np.maximum(amax[t], cur)
        del sess
    atomic_save_npz(path, {f"t{i}": amax[t].astype(np.float32) for i, t in enumerate(tensors)})
    return {t: amax[t].astype(np.float32) for t in tensors}


def onnx_copy(model: LoadedModel):
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model.proto)
    return m


def calibrate_policy(model: LoadedModel, ds: Dataset, policy, layers, ws: Workspace | None = None,
                     progress=None) -> CalibrationResult | None:
    """Everything the compiler needs for ``policy``: activation ranges, and per-channel
    statistics of the smoothed layers' inputs. None when the policy has no INT8 layer."""
    if "int8" not in policy.layers.values():
        return None
    result = calibrate(model, ds, policy.calibration, ws, progress)
    smoothed = {name for name, _ in policy.smoothing if policy.layers.get(name) == "int8"}
    if smoothed:
        tensors = [l.inputs[0] for l in layers if l.name in smoothed]
        result = replace(result, channels=channel_amax(model, ds, tensors, ws))
    return result
