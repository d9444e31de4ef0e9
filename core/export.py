"""Exports of a policy for TensorRT: the policy JSON, the compiled explicit-precision ONNX, the
TensorRT calibration cache and the trtexec / Polygraphy command lines. One implementation for
``python -m core export`` and the dashboard's Export page."""
from __future__ import annotations

import io
import json
import math
import re
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.backends.tensorrt import STRONG_TYPING_FROM, legacy_postprocess_script, parse_version, require_trt_opset
from core.display.markdown import code_span, md_text
from core.errors import MixprecError
from core.estimate.predict import Prediction
from core.measure.reference import timing_feed
from core.measure.runs import shapes_text
from core.model.load import LoadedModel
from core.model.profiles import input_ranges, range_text
from core.model.shapes import resolve_input_shapes, shape_text
from core.project import Project
from core.quant.calibration import DEFAULT_CACHE_TRT_VERSION, CalibrationResult, calibrate_policy, trt_calibration_cache, \
    trt_version_number
from core.quant.compile import CompiledModel, compile_policy
from core.quant.policy import Policy
from core.workspace import atomic_write_bytes, atomic_write_text

EXPORT_FORMATS = ("json", "trtexec", "trtexec-typed", "polygraphy", "onnx", "calib-cache")
LEGACY_HEADER = "# TensorRT <= 10.11 (per-layer precision constraints; deprecated in 10.12, removed in 11)"
TYPED_HEADER = "# TensorRT >= 10.12 / 11: strongly typed build of the explicit-precision ONNX"
# The TensorRT the legacy export (its calibration cache header) is for unless --trt-version says otherwise:
# 10.11.0, the last release with the per-layer precision APIs.
DEFAULT_TRT_VERSION = DEFAULT_CACHE_TRT_VERSION
# trtexec splits its lists on ',' and a name from its value on the last ':' (so ':' is fine), reads
# 'quoted' names, and takes '*' in --layerPrecisions/--layerOutputTypes as a wildcard (issue 11, bug 10).
_BAD_TRT_NAME = re.compile(r"[,']")
_BAD_TRT_LAYER_NAME = re.compile(r"[,'*]")
# The `polygraphy run` tolerance: twice the max abs error ONNX Runtime measures for the policy on the
# same inputs, plus 1e-3 of the FP32 output's magnitude (TensorRT's FP32/FP16 kernels round differently).
TOLERANCE_FACTOR, TOLERANCE_FLOOR = 2.0, 1e-3
DEFAULT_ATOL = 0.05  # shown where nothing was measured (the dashboard's preview); the export measures one
# INT8 nodes whose weights the ONNX parser turns into Constant layers: trtexec cannot give those a range.
_CONSTANT_WEIGHT_OPS = ("Gemm", "MatMul")


# --- command lines -----------------------------------------------------------------------------------
def check_trt_names(names, what: str, pattern=_BAD_TRT_NAME) -> None:
    """A MixprecError naming the ``names`` that trtexec's ``name:value,...`` lists would misread."""
    bad = sorted({n for n in names if pattern.search(n)})
    if bad:
        chars = "',', \"'\" or '*'" if pattern is _BAD_TRT_LAYER_NAME else "',' or \"'\""
        raise MixprecError(f"some {what} contain {chars}, which trtexec's name lists cannot express "
                           "(',' separates entries, \"'\" quotes a name, '*' is a wildcard)",
                           "rename them in the ONNX, or use the Polygraphy export (--format polygraphy)",
                           details=bad)


def _ranges(model: LoadedModel, shapes, profiles) -> dict:
    """``{input: (min, opt, max)}`` of every input with a dynamic dim (``core.model.profiles.input_ranges``):
    a profiled input its profile (``--profile``), another min = opt = max = the project's shape
    (``--shape``/``--dim``/``--batch``, defaults shown by ``inspect``) but for the named dims it shares
    with a profiled one."""
    return input_ranges(model, shapes or resolve_input_shapes(model), profiles)


def _shape_flags(model: LoadedModel, shapes: dict[str, tuple[int, ...]] | None,
                 flags=("--minShapes", "--optShapes", "--maxShapes"), profiles: dict | None = None) -> list[str]:
    """trtexec's ``--minShapes/--optShapes/--maxShapes`` of every input with a dynamic dim (:func:`_ranges`;
    a single flag, ``--shapes`` of a built engine, takes the opt shapes); static inputs take no flag."""
    ranges = _ranges(model, shapes, profiles)
    if not ranges:
        return []
    check_trt_names(list(ranges), "input names")
    which = (1,) if len(flags) == 1 else (0, 1, 2)
    return [f"{flag}=" + ",".join(f"{n}:{shape_text(r[i])}" for n, r in ranges.items()) for flag, i in zip(flags, which)]


def _tf32_flag(tf32: bool) -> list[str]:
    """trtexec enables TF32 by default; mixprec's builds do not (issue 11, bug 4)."""
    return [] if tf32 else ["--noTF32"]


def trtexec_legacy_command(model: LoadedModel, policy: Policy, onnx_path: str = "model.onnx",
                           calib_cache: str | None = "calibration.cache", shapes=None, *, tf32: bool = False,
                           engine: str = "model.plan", profiles: dict | None = None) -> str:
    """TensorRT ≤ 10.11: the original ONNX with per-layer precision constraints. ``--int8`` and
    ``--calib`` only when the policy has INT8 layers and a cache is given (without one trtexec
    calibrates on random data). trtexec cannot range the weight Constants the parser makes for
    INT8 Gemm/MatMul; :func:`export_policy` builds those with :func:`polygraphy_legacy_build_command`."""
    check_trt_names(policy.layers, "layer names", _BAD_TRT_LAYER_NAME)
    precisions = ",".join(f"{n}:{p}" for n, p in policy.layers.items())
    # INT8 layers compute in int8 and output fp32, as the compiled model's DequantizeLinear does (issue 11, bug 6).
    outputs = ",".join(f"{n}:{'fp32' if p == 'int8' else p}" for n, p in policy.layers.items())
    int8 = ["--int8", f"--calib={calib_cache}"] if calib_cache and "int8" in policy.layers.values() else []
    args = ["trtexec", f"--onnx={onnx_path}", "--fp16", *int8, *_tf32_flag(tf32),
            "--precisionConstraints=obey", f"--layerPrecisions={precisions}",
            f"--layerOutputTypes={outputs}", *_shape_flags(model, shapes, profiles=profiles),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            f"--saveEngine={engine}"]
    return shlex.join(args)


def polygraphy_legacy_build_command(model: LoadedModel, onnx_path: str, script: str, shapes=None, *,
                                    tf32: bool = False, engine: str = "model.plan", profiles: dict | None = None) -> str:
    """TensorRT ≤ 10.11: build the original ONNX with ``script`` (the policy's precisions, output
    types and INT8 ranges on every tensor the parser creates) as a network post-process step, and
    INT8 enabled by its config post-process step, so no calibrator runs (Polygraphy's ``--int8``
    would add one that calibrates on random data)."""
    args = ["polygraphy", "convert", onnx_path, "--convert-to", "trt", "-o", engine, "--fp16",
            *(["--tf32"] if tf32 else []), "--precision-constraints", "obey",
            "--trt-network-postprocess-script", script, "--trt-config-postprocess-script", script,
            "--profiling-verbosity", "detailed",
            *_polygraphy_shapes(model, shapes, profiles)]
    return shlex.join(args)


def trtexec_profile_command(model: LoadedModel, engine: str = "model.plan", shapes=None) -> str:
    """trtexec on a built engine: its layer information and per-layer profile."""
    args = ["trtexec", f"--loadEngine={engine}", *_shape_flags(model, shapes, ("--shapes",)),
            "--exportLayerInfo=layers.json", "--exportProfile=profile.json", "--separateProfileRun"]
    return shlex.join(args)


def trtexec_typed_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None, *,
                          tf32: bool = False, profiles: dict | None = None) -> str:
    """TensorRT ≥ 10.12 / 11: the compiled explicit-precision ONNX, strongly typed."""
    args = ["trtexec", f"--onnx={compiled_path}", "--stronglyTyped", *_tf32_flag(tf32), *_shape_flags(model, shapes, profiles=profiles),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--separateProfileRun", "--saveEngine=model.plan"]
    return shlex.join(args)


def _polygraphy_shapes(model: LoadedModel, shapes, profiles: dict | None = None) -> list[str]:
    """Polygraphy's ``--trt-min-shapes/--trt-opt-shapes/--trt-max-shapes name:[d,...] ...`` of every dynamic
    input (:func:`_ranges`)."""
    ranges = _ranges(model, shapes, profiles)
    if not ranges:
        return []
    return [arg for i, flag in enumerate(("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"))
            for arg in (flag, *(f"{n}:[{','.join(str(d) for d in r[i])}]" for n, r in ranges.items()))]


def polygraphy_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None, *,
                       reference_onnx: str = "model.onnx", inputs: str = "inputs.json",
                       outputs: str = "fp32-outputs.json", atol: float | None = None, tf32: bool = False,
                       profiles: dict | None = None) -> str:
    """Polygraphy, two commands: ONNX Runtime runs the FP32 original on ``inputs`` and saves its
    outputs; then TensorRT builds the compiled ONNX strongly typed and is compared with those FP32
    outputs at an explicit absolute tolerance ``atol`` (``rtol 0``: an element fails when it is
    more than ``atol`` off). Polygraphy's default 1e-5 would fail every FP16/INT8 policy (issue 11, bug 2)."""
    atol = DEFAULT_ATOL if atol is None else float(atol)
    ref = ["polygraphy", "run", reference_onnx, "--onnxrt", "--load-inputs", inputs, "--save-outputs", outputs]
    run = ["polygraphy", "run", compiled_path, "--trt", "--strongly-typed", *(["--tf32"] if tf32 else []),
           *_polygraphy_shapes(model, shapes, profiles), "--load-inputs", inputs, "--load-outputs", outputs,
           "--atol", f"{atol:.6g}", "--rtol", "0", "--check-error-stat", "elemwise"]
    return shlex.join(ref) + "\n" + shlex.join(run)


# --- files ---------------------------------------------------------------------------------------
def policy_filename(policy: Policy, suffix: str = ".policy.json") -> str:
    """A file name for an export of ``policy``: its model's name made file-safe, plus ``suffix``."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", policy.model_name).strip("_") or "model"
    return stem + suffix


def policy_calibration(project: Project, policy: Policy) -> CalibrationResult | None:
    """What the compiler needs to calibrate ``policy`` (None without INT8 layers)."""
    return calibrate_policy(project.model, project.calib_data, policy, project.layers, project.ws)


def compiled_onnx(project: Project, policy: Policy, target: str = "trt",
                  calib: CalibrationResult | None = None) -> bytes:
    """The explicit-precision ONNX (``target="trt"``: for TensorRT ≥ 10.12), calibrating first
    when the policy has INT8 layers and ``calib`` is not given."""
    return _compiled(project, policy, target, calib).serialized()


def _compiled(project: Project, policy: Policy, target: str = "trt",
              calib: CalibrationResult | None = None) -> CompiledModel:
    if target == "trt":
        require_trt_opset(project.model)
    if calib is None:
        calib = policy_calibration(project, policy)
    return compile_policy(project.model, policy, calib, target=target)


def _onnx_file(model: LoadedModel | CompiledModel):
    """A model as an export entry: its bytes, or, when its weights stay external (``core.model.external``),
    a writer of the model with copies of its data files beside it (``_write_files`` calls it)."""
    if model.weights is None:
        return model.serialized()
    return lambda path: model.save(path, copy=True)


def _in_memory(files: dict) -> dict:
    """``files`` if every entry is text or bytes (a bundle zips them in memory); else a MixprecError."""
    if any(callable(d) for d in files.values()):
        raise MixprecError("the model keeps its weights as external data, too big for a bundle made in memory",
                           "export to files instead: python -m core export MODEL --policy P --format "
                           "trtexec-typed|polygraphy|trtexec --out DIR/model.sh (the ONNX with its data files)")
    return files


def _tolerance(project: Project, compiled: bytes | CompiledModel, feeds: list[dict]) -> tuple[float, float]:
    """:func:`measured_tolerance` of ``compiled``; with external weights on files in a temp folder."""
    if isinstance(compiled, bytes) or compiled.weights is None:
        data = compiled if isinstance(compiled, bytes) else compiled.serialized()
        return measured_tolerance(project.model.serialized(), data, feeds)
    with project.model.scratch("mixprec-tolerance-") as tmp:
        return measured_tolerance(project.model.save(Path(tmp) / "fp32.onnx"),
                                  compiled.save(Path(tmp) / "compiled.onnx"), feeds)


def measured_tolerance(original: bytes, compiled: bytes, feeds: list[dict]) -> tuple[float, float]:
    """``(atol, max abs error)``: ONNX Runtime's max abs error of ``compiled`` against the FP32
    ``original`` over every float output on ``feeds``, and the tolerance derived from it
    (``TOLERANCE_FACTOR`` × error + ``TOLERANCE_FLOOR`` × max |FP32 output|)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref, cand = (ort.InferenceSession(m if isinstance(m, bytes) else str(m), so, providers=["CPUExecutionProvider"])
                 for m in (original, compiled))  # bytes, or files (a model whose weights stay external)
    err, mag = 0.0, 0.0
    for feed in feeds:
        for r, c in zip(ref.run(None, feed), cand.run(None, feed)):
            r, c = np.asarray(r), np.asarray(c)
            if r.dtype.kind == "f" and r.size:
                err = max(err, float(np.max(np.abs(r.astype(np.float64) - c.astype(np.float64)))))
                mag = max(mag, float(np.max(np.abs(r))))
    return TOLERANCE_FACTOR * err + TOLERANCE_FLOOR * mag, err


# --- the files of an export (name -> content; "" is the script itself) ------------------------------
SCRIPT_HEAD = '#!/usr/bin/env bash\nset -euo pipefail\ncd "$(dirname "$0")"  # the files it names sit beside it\n'


def _constant_int8(project: Project, policy: Policy) -> list[str]:
    """INT8 Gemm/MatMul layers: their weights become Constant layers no calibration cache names."""
    by_name = {l.name: l for l in project.layers}
    return sorted(n for n, p in policy.layers.items()
                  if p == "int8" and n in by_name and by_name[n].op_type in _CONSTANT_WEIGHT_OPS)


def _check_legacy_version(trt_version: str) -> None:
    if parse_version(trt_version, "give the TensorRT version that will build it, e.g. --trt-version 10.11.0") \
            >= STRONG_TYPING_FROM:
        raise MixprecError(f"--format trtexec is the TensorRT <= 10.11 export, not for TensorRT {trt_version}",
                           "use --format trtexec-typed or polygraphy for TensorRT 10.12 and newer, or give "
                           "--trt-version 10.0 ... 10.11")


def legacy_script(project: Project, policy: Policy, stem: str, trt_version: str = DEFAULT_TRT_VERSION,
                  tf32: bool = False) -> str:
    """The TensorRT ≤ 10.11 build script for ``policy``, naming the files of :func:`legacy_files`
    (``<stem>.named.onnx``, ``<stem>.calib.cache`` or ``<stem>.postprocess.py``). Needs no calibration."""
    _check_legacy_version(trt_version)
    named = f"{stem}.named.onnx"
    lines = [LEGACY_HEADER, f"# for TensorRT {trt_version}"]
    constant_int8 = _constant_int8(project, policy)
    if not constant_int8:
        cache = None
        if "int8" in policy.layers.values():  # --calib only with a cache, whose header names the TensorRT that reads it
            cache = f"{stem}.calib.cache"
            lines[-1] += (f": calibration cache {cache}, header TRT-{trt_version_number(trt_version)}-"
                          "EntropyCalibration2; another TensorRT version rejects it (export again with --trt-version)")
        lines.append(trtexec_legacy_command(project.model, policy, named, cache, project.input_shapes, tf32=tf32,
                                            profiles=project.profiles))
        return SCRIPT_HEAD + "\n".join(lines) + "\n"
    script = f"{stem}.postprocess.py"
    lines += [f"# INT8 {'/'.join(_CONSTANT_WEIGHT_OPS)} ({len(constant_int8)} layers): TensorRT's parser turns "
              "their weights into Constant layers that no calibration cache names, and trtexec cannot range them.",
              f"# Build with Polygraphy and {script}, which sets the policy's precisions and every INT8 "
              "input's range (weights from max |w|), then profile with trtexec:",
              polygraphy_legacy_build_command(project.model, named, script, project.input_shapes, tf32=tf32,
                                              profiles=project.profiles),
              trtexec_profile_command(project.model, "model.plan", project.input_shapes)]
    return SCRIPT_HEAD + "\n".join(lines) + "\n"


def legacy_files(project: Project, policy: Policy, calib, stem: str, trt_version: str = DEFAULT_TRT_VERSION,
                 tf32: bool = False) -> dict[str, str | bytes]:
    """The TensorRT ≤ 10.11 export: the script (key ""), the named original ONNX, and the
    calibration cache (INT8 convolutions) or the Polygraphy post-process script (INT8 Gemm/MatMul)."""
    files: dict[str, str | bytes] = {"": legacy_script(project, policy, stem, trt_version, tf32),
                                     f"{stem}.named.onnx": _onnx_file(project.model)}
    if _constant_int8(project, policy):
        files[f"{stem}.postprocess.py"] = legacy_postprocess_script(policy, calib)
    elif calib is not None:
        files[f"{stem}.calib.cache"] = trt_calibration_cache(calib, trt_version)
    return files


def typed_script(project: Project, stem: str, tf32: bool = False) -> str:
    """The TensorRT ≥ 10.12 / 11 build script of ``<stem>.mixprec.onnx`` (strongly typed). Needs no calibration."""
    cmd = trtexec_typed_command(project.model, f"{stem}.mixprec.onnx", project.input_shapes, tf32=tf32,
                                profiles=project.profiles)
    return f"{SCRIPT_HEAD}{TYPED_HEADER}\n{cmd}\n"


def polygraphy_files(project: Project, compiled: bytes | CompiledModel, stem: str, atol: float | None = None,
                     tf32: bool = False) -> dict[str, str | bytes]:
    """The Polygraphy comparison against FP32: the script (key ""), the named original ONNX and the
    inputs it compares on; the tolerance measured with ONNX Runtime unless ``atol`` is given. The
    compiled ONNX it checks is ``<stem>.mixprec.onnx``."""
    from polygraphy.json import to_json

    feeds = [timing_feed(project)]
    inputs = f"{stem}.inputs.json"
    measured_atol, err = _tolerance(project, compiled, feeds)
    basis = (f"given (--atol); ONNX Runtime measures max abs error {err:.3g} for this policy" if atol is not None
             else f"{TOLERANCE_FACTOR:g} x the max abs error ONNX Runtime measures for this policy on "
                  f"{inputs} ({err:.3g}) + {TOLERANCE_FLOOR:g} x max |FP32 output|")
    cmd = polygraphy_command(project.model, f"{stem}.mixprec.onnx", project.input_shapes,
                             reference_onnx=f"{stem}.named.onnx", inputs=inputs, outputs=f"{stem}.fp32-outputs.json",
                             atol=measured_atol if atol is None else atol, tf32=tf32, profiles=project.profiles)
    return {"": f"{SCRIPT_HEAD}{TYPED_HEADER}\n# compared with FP32 ONNX Runtime outputs; tolerance: {basis}\n{cmd}\n",
            f"{stem}.named.onnx": _onnx_file(project.model),
            inputs: to_json(feeds)}  # what `polygraphy run --save-inputs` writes


def _write_files(out: Path, files: dict) -> Path:
    """The side files beside ``out``, then ``out`` itself (key ""); an entry is text, bytes, or a writer
    of the file at a path (:func:`_onnx_file`)."""
    for name, data in [*((n, d) for n, d in files.items() if n), ("", files[""])]:
        path = out.with_name(name) if name else out
        if callable(data):
            data(path)
        else:
            (atomic_write_bytes if isinstance(data, bytes) else atomic_write_text)(path, data)
    return out


def export_policy(project: Project, policy: Policy, fmt: str, out: str | Path, target: str = "trt", *,
                  trt_version: str = DEFAULT_TRT_VERSION, tf32: bool = False, atol: float | None = None) -> Path:
    """Write ``policy`` to ``out`` in one of EXPORT_FORMATS. ``trtexec`` (TensorRT ``trt_version``,
    ≤ 10.11) also writes the named ONNX, the calibration cache (INT8 only) and, for INT8
    Gemm/MatMul, a Polygraphy post-process script beside ``out``; ``trtexec-typed`` / ``polygraphy``
    the compiled ONNX (``polygraphy`` also the original ONNX and the inputs it compares on, at
    ``atol``, by default measured). ``tf32``: let FP32 layers use TF32 (off, as in mixprec's
    builds). Scripts are bash scripts that run from their own folder. Returns ``out``."""
    if fmt not in EXPORT_FORMATS:
        raise MixprecError(f"unknown export format {fmt!r}", f"use one of {', '.join(EXPORT_FORMATS)}")
    out = Path(out)
    if fmt == "json":  # needs no data: a policy of a model whose inputs need an .npz still exports
        return atomic_write_text(out, policy.to_json())
    if fmt == "trtexec":
        _check_legacy_version(trt_version)
    calib = policy_calibration(project, policy)
    if fmt == "onnx":  # with external weights, their data files beside it
        return _write_files(out, {"": _onnx_file(_compiled(project, policy, target, calib))})
    if fmt == "calib-cache":
        if calib is None:
            raise MixprecError("the policy has no INT8 layer, so there is no calibration cache to export",
                               "set some layers to int8, or export --format json")
        return atomic_write_text(out, trt_calibration_cache(calib, trt_version))
    if fmt == "trtexec":
        return _write_files(out, legacy_files(project, policy, calib, out.stem, trt_version, tf32))
    data = _compiled(project, policy, "trt", calib)
    files: dict = {f"{out.stem}.mixprec.onnx": _onnx_file(data)}
    if fmt == "trtexec-typed":
        files[""] = typed_script(project, out.stem, tf32)
    else:
        files.update(polygraphy_files(project, data, out.stem, atol, tf32))
    return _write_files(out, files)


# --- the bundle: everything a GPU user needs, in one zip --------------------------------------------
BUNDLE_STEM = "model"
BUNDLE_SCRIPTS = {"typed": "build-trt-10.12.sh", "legacy": "build-trt-10.11.sh", "polygraphy": "check-polygraphy.sh"}
README_NAME, POLICY_NAME, ESTIMATE_NAME = "README.md", "policy.json", "estimate.json"
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed entry times: the same export gives the same zip


@dataclass(frozen=True)
class ExportBundle:
    """The files of one export (name → content, README first) and what was left out and why."""
    files: dict[str, bytes]
    left_out: tuple[str, ...] = ()

    def zip(self) -> bytes:
        """The bundle as a zip; ONNX files stored, text compressed. Scripts are executable."""
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, data in self.files.items():
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_STORED if name.endswith(".onnx") else zipfile.ZIP_DEFLATED
                info.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
                z.writestr(info, data)
        return buf.getvalue()


def bundle_filename(policy: Policy, run_id: str | None = None) -> str:
    """``<model>.mixprec-export.zip``, with the run's id when it is a run's policy."""
    return policy_filename(policy, f".{run_id}.mixprec-export.zip" if run_id else ".mixprec-export.zip")


def _attempt(left_out: list[str], what: str, make):
    """``make()``, or None with ``what`` and the reason noted in ``left_out`` (a MixprecError)."""
    try:
        return make()
    except MixprecError as e:
        left_out.append(f"{what}: {e}")
        return None


def export_bundle(project: Project, policy: Policy, *, trt_version: str = DEFAULT_TRT_VERSION, tf32: bool = False,
                  atol: float | None = None, source: str = "", estimate: Prediction | None = None,
                  estimate_for: str = "", estimate_shapes: dict | None = None) -> ExportBundle:
    """Every export of ``policy`` in one bundle (:data:`BUNDLE_SCRIPTS` and ``model.*`` files, see
    :func:`bundle_readme`): calibrated and compiled once. A part that cannot be made for this
    model (e.g. names trtexec cannot express, an opset below 13) is left out and the README says
    why; the rest is still there. ``source`` says where the policy comes from (a run, the session).
    ``estimate``: the policy's TensorRT estimate, written as ``estimate.json`` and in the README,
    labelled as an estimate with its GPU and basis; ``estimate_for`` says what it is for ("Estimated for
    4×3×32×32, policy X (3f2a1c9e), NVIDIA T4 (the GPU the run was measured on)."), ``estimate_shapes`` the
    shapes it was made at (a run's recorded shapes; None: the project's, which the bundle builds at)."""
    stem, left_out = BUNDLE_STEM, []
    calib = policy_calibration(project, policy)
    compiled = _attempt(left_out, "the compiled ONNX and the TensorRT >= 10.12 scripts",
                        lambda: compiled_onnx(project, policy, "trt", calib))
    files: dict[str, str | bytes] = {POLICY_NAME: policy.to_json()}
    if estimate is not None:
        files[ESTIMATE_NAME] = estimate_json(estimate, estimate_shapes or project.input_shapes, estimate_for)
    cache = None if calib is None else _attempt(left_out, f"{stem}.calib.cache",
                                                lambda: trt_calibration_cache(calib, trt_version))
    if cache is not None:
        files[f"{stem}.calib.cache"] = cache
    if compiled is not None:
        files[f"{stem}.mixprec.onnx"] = compiled
        typed = _attempt(left_out, BUNDLE_SCRIPTS["typed"], lambda: typed_script(project, stem, tf32))
        if typed:
            files[BUNDLE_SCRIPTS["typed"]] = typed
        poly = _attempt(left_out, BUNDLE_SCRIPTS["polygraphy"],
                        lambda: polygraphy_files(project, compiled, stem, atol, tf32))
        if poly:
            files.update({BUNDLE_SCRIPTS["polygraphy"] if n == "" else n: d for n, d in poly.items()})
    legacy = _attempt(left_out, BUNDLE_SCRIPTS["legacy"],
                      lambda: _in_memory(legacy_files(project, policy, calib, stem, trt_version, tf32)))
    if legacy:
        files.update({BUNDLE_SCRIPTS["legacy"] if n == "" else n: d for n, d in legacy.items()})
    readme = bundle_readme(project, policy, files, left_out, trt_version=trt_version, source=source,
                           estimate=estimate, tf32=tf32, estimate_for=estimate_for, estimate_shapes=estimate_shapes)
    ordered = {README_NAME: readme, **files}
    return ExportBundle({n: d.encode() if isinstance(d, str) else d for n, d in ordered.items()}, tuple(left_out))


def estimate_json(estimate: Prediction, shapes: dict | None = None, estimated_for: str = "") -> str:
    """The estimate as the bundle stores it: ``Prediction.to_json`` (label "estimate", GPU, basis), NaN as null,
    with the input shapes it was made at and what it is for (``estimated_for``, when said)."""
    doc = estimate.to_json()
    if shapes is not None:
        doc["input_shapes"] = {str(k): [int(d) for d in v] for k, v in shapes.items()}
    if estimated_for:
        doc["estimated_for"] = estimated_for
    if not math.isfinite(doc["reformats"]["pct"]):
        doc["reformats"]["pct"] = None
    return json.dumps(doc, indent=2, default=str) + "\n"


def _same_shapes(a: dict, b: dict) -> bool:
    return {str(k): [int(d) for d in v] for k, v in a.items()} == {str(k): [int(d) for d in v] for k, v in b.items()}


def _estimate_lines(project: Project, estimate: Prediction | None, estimate_for: str = "",
                    estimate_shapes: dict | None = None) -> list[str]:
    if estimate is None:
        return []
    lines = ["## Estimated TensorRT time (an estimate, not measured)", "",
             (f"{md_text(estimate_for)} " if estimate_for else "")
             + f"{md_text(estimate.caption())}. Made by mixprec without a GPU (`{ESTIMATE_NAME}` has it per predicted "
             "engine layer); the Profile step below measures the real engine.", ""]
    if estimate_shapes and not _same_shapes(estimate_shapes, project.input_shapes):
        lines += [f"The estimate is at the run's shapes ({code_span(shapes_text(estimate_shapes))}); the files of "
                  f"this bundle are for the project's ({code_span(shapes_text(project.input_shapes))}), so the "
                  "engine they build is not the one estimated.", ""]
    return lines


def _file_notes(files: dict, trt_version: str) -> dict[str, str]:
    """What each file of a bundle is for (README's list)."""
    post = f"{BUNDLE_STEM}.postprocess.py" in files
    return {
        README_NAME: "this file",
        ESTIMATE_NAME: "mixprec's estimate of this policy's TensorRT engine time (label \"estimate\", its GPU and "
                       "basis), per predicted engine layer: not measured",
        POLICY_NAME: "the precision policy (mixprec.policy JSON): import it on mixprec's Export page, or pass it to "
                     "`python -m core build|export --policy policy.json`",
        f"{BUNDLE_STEM}.mixprec.onnx": "the explicit-precision ONNX (Q/DQ on INT8 layers, float16 FP16 layers) that "
                                       "TensorRT >= 10.12 builds strongly typed",
        f"{BUNDLE_STEM}.named.onnx": "the original FP32 ONNX with mixprec's node names: what TensorRT <= 10.11 builds "
                                     "with per-layer constraints, and the FP32 reference of the Polygraphy check",
        f"{BUNDLE_STEM}.calib.cache": f"the INT8 ranges as a TensorRT calibration cache (header for TensorRT "
                                      f"{trt_version}; trtexec --calib on TensorRT <= 10.11)"
                                      + (": not needed by build-trt-10.11.sh here, which sets every range through "
                                         f"{BUNDLE_STEM}.postprocess.py" if post else ""),
        f"{BUNDLE_STEM}.postprocess.py": "Polygraphy network post-process script: the policy's precisions and every "
                                         "INT8 range, for the TensorRT <= 10.11 build",
        f"{BUNDLE_STEM}.inputs.json": "the inputs the Polygraphy check compares on",
        BUNDLE_SCRIPTS["typed"]: "build + profile, TensorRT 10.12 or newer (11 included)",
        BUNDLE_SCRIPTS["legacy"]: f"build + profile, TensorRT 10.11 or older (written for {trt_version})",
        BUNDLE_SCRIPTS["polygraphy"]: "accuracy check: TensorRT against FP32 ONNX Runtime outputs",
    }


def _profile_lines(project: Project) -> list[str]:
    """The README's statement of the engine's dynamic-shape profile (min:opt:max per dynamic input)."""
    try:
        ranges = _ranges(project.model, project.input_shapes, project.profiles)
    except MixprecError:
        return []
    if not ranges:
        return []
    fixed = all(r[0] == r[1] == r[2] for r in ranges.values())
    return ["Optimisation profile of the engine (min:opt:max per dynamic input; trtexec `--minShapes/--optShapes/"
            "--maxShapes`, Polygraphy `--trt-min-shapes/--trt-opt-shapes/--trt-max-shapes`): "
            + ", ".join(code_span(f"{n}={range_text(r)}") for n, r in ranges.items())
            + (". Every input is fixed at the project's shape (min = opt = max); give `--profile INPUT=MIN:OPT:MAX` "
               "to build for a range." if fixed else
               ". mixprec calibrated, evaluated and estimated this policy at opt."), ""]


def polygraphy_typed_build_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None, *,
                                   tf32: bool = False, engine: str = "model.plan", profiles: dict | None = None) -> str:
    """TensorRT >= 10.12 / 11 through Polygraphy: the compiled explicit-precision ONNX built strongly typed
    (Polygraphy's shape lists take names trtexec's cannot)."""
    args = ["polygraphy", "convert", compiled_path, "--convert-to", "trt", "--strongly-typed", "-o", engine,
            *(["--tf32"] if tf32 else []), "--profiling-verbosity", "detailed",
            *_polygraphy_shapes(model, shapes, profiles)]
    return shlex.join(args)


def _build_lines(project: Project, files: dict, trt_version: str, tf32: bool) -> list[str]:
    """The README's build step: the script for each TensorRT version the bundle has one for; without any,
    why (see *Left out*) and, with the compiled ONNX there, the Polygraphy command that builds it."""
    scripts = []
    if BUNDLE_SCRIPTS["typed"] in files:
        scripts.append(f"- TensorRT 10.12 or newer (11 included): `bash {BUNDLE_SCRIPTS['typed']}`. trtexec builds "
                       f"`{BUNDLE_STEM}.mixprec.onnx` strongly typed: each layer runs at the precision its tensors have.")
    if BUNDLE_SCRIPTS["legacy"] in files:
        scripts.append(f"- TensorRT 10.11 or older: `bash {BUNDLE_SCRIPTS['legacy']}`. It builds the original ONNX "
                       f"with per-layer precision constraints, written for TensorRT {trt_version} (its calibration "
                       "cache header names that version: another one rejects it, so export again for yours).")
    if scripts:
        return ["Copy this folder to the machine with TensorRT and run the script for its version:", "", *scripts, "",
                "Each writes the engine `model.plan`. FP32 layers stay FP32 (`--noTF32`) unless TF32 was allowed "
                "at export."]
    lines = ["This bundle has no build script: mixprec could not write one for this model (*Left out* below says "
             "why; fix that in the ONNX, e.g. rename what it names, and export again)."]
    if f"{BUNDLE_STEM}.mixprec.onnx" in files:
        build = _attempt([], "", lambda: polygraphy_typed_build_command(
            project.model, f"{BUNDLE_STEM}.mixprec.onnx", project.input_shapes, tf32=tf32, profiles=project.profiles))
        if build:
            lines += ["", f"Until then, TensorRT 10.12 or newer builds `{BUNDLE_STEM}.mixprec.onnx` strongly typed "
                          "through Polygraphy (`pip install polygraphy`), writing the engine `model.plan`:", "",
                      "```bash", build, "```"]
    return lines


def bundle_readme(project: Project, policy: Policy, files: dict, left_out: list[str], *,
                  trt_version: str = DEFAULT_TRT_VERSION, source: str = "", estimate: Prediction | None = None,
                  tf32: bool = False, estimate_for: str = "", estimate_shapes: dict | None = None) -> str:
    """The bundle's README.md: what each file is, then how to build, check, profile and import the
    reports back into mixprec; each step numbered in turn and never empty. Names, shapes and file names are
    code spans (literal, no escapes); other user text (the source, the estimate's caption, what was left
    out) is escaped only where Markdown would read it (``core.display.markdown``)."""
    c = policy.precision_counts()
    shapes = ", ".join(code_span(f"{n}={shape_text(s)}") for n, s in project.input_shapes.items())
    notes = _file_notes(files, trt_version)
    lines = [f"# mixprec export: {code_span(policy.model_name)}", "",
             (f"{md_text(source)}. " if source else "") + f"Policy sha256 `{policy.sha256[:16]}` of model sha256 "
             f"`{policy.model_sha256[:16]}`: fp32 {c['fp32']} · fp16 {c['fp16']} · int8 {c['int8']} layers. "
             f"Input shapes: {shapes or 'static'}.", "", *_profile_lines(project), "## Files", ""]
    lines += [f"- {code_span(n)}: {notes.get(n, '')}" for n in [README_NAME, *files]]
    lines += ["", *_estimate_lines(project, estimate, estimate_for, estimate_shapes)] if estimate is not None else []
    steps = [("Build the engine (on the GPU machine)", _build_lines(project, files, trt_version, tf32))]
    if BUNDLE_SCRIPTS["polygraphy"] in files:
        steps.append(("Check its accuracy (optional)", [
            f"`bash {BUNDLE_SCRIPTS['polygraphy']}`: Polygraphy runs the FP32 original on ONNX Runtime, then "
            f"TensorRT on `{BUNDLE_STEM}.mixprec.onnx`, and compares the outputs at the tolerance measured for "
            "this policy (the script says how). Needs `pip install polygraphy onnxruntime`."]))
    profile = _attempt([], "", lambda: trtexec_profile_command(project.model, "model.plan", project.input_shapes))
    built_by_script = any(BUNDLE_SCRIPTS[k] in files for k in ("typed", "legacy"))
    steps.append(("Profile", [
        ("The build scripts profile as they build (`--profilingVerbosity=detailed`): " if built_by_script else
         "Build with detailed profiling (`--profilingVerbosity=detailed`, Polygraphy `--profiling-verbosity "
         "detailed`), then export the reports: ")
        + "`layers.json` is each engine layer's precision, formats and tactic (`--exportLayerInfo`), "
          "`profile.json` its time (`--exportProfile`)."
        + ((" To profile the built engine again:" if built_by_script else " With trtexec:") if profile else ""),
        *(["", "```bash", profile, "```"] if profile else [])]))
    steps.append(("Import the reports into mixprec", [
        "Bring `layers.json` and `profile.json` back. In the dashboard: **Build and results** → *Import "
        "TensorRT engine reports*, load both files (per-layer latency by precision, latency by layer type, "
        "reformat overhead, and which of your layers sit next to a reformat). Or on the command line:", "",
        "```bash", "python -m core report layers.json profile.json", "```"]))
    for i, (title, body) in enumerate(steps, 1):
        lines += ["", f"## {i}. {title}", "", *body]
    if left_out:
        lines += ["", "## Left out", "", *(f"- {md_text(n)}" for n in left_out)]
    return "\n".join(lines) + "\n"


# --- display -----------------------------------------------------------------------------------------
def _fold_token(token: str, width: int) -> str:
    """A token as shown: a ``--flag=a,b,c…`` list longer than ``width`` cut to its first entries and a count."""
    flag, eq, value = token.partition("=")
    if len(token) <= width or not eq or "," not in value:
        return shlex.quote(token)
    entries, kept = value.split(","), []
    for e in entries:
        if len(flag) + sum(len(k) + 1 for k in kept) + len(e) > width and kept:
            break
        kept.append(e)
    return f"{flag}={','.join(kept)},… ({len(entries)} entries; all of them in the script)"


def fold_command(text: str, width: int = 100) -> str:
    """A script as shown on a page: its comments, and each command one flag per line (``\\``
    continuations) with every long comma list folded (:func:`_fold_token`). For reading only:
    the file to run is the script itself."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#!", "set -", "cd ")):
            continue
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        parts: list[str] = []
        for token in shlex.split(line):
            shown = _fold_token(token, width)
            if parts and not token.startswith("-") and (parts[-1].startswith("-") or len(parts) == 1):
                parts[-1] += " " + shown  # a flag's value(s), or the program's first argument
            else:
                parts.append(shown)
        out.append(" \\\n    ".join(parts))
    return "\n".join(out)
