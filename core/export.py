"""Exports of a policy for TensorRT: the policy JSON, the compiled explicit-precision ONNX, the
TensorRT calibration cache and the trtexec / Polygraphy command lines. One implementation for
``python -m core export`` and the dashboard's Export page."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np

from .backends.tensorrt import STRONG_TYPING_FROM, legacy_postprocess_script, parse_version, require_trt_opset
from .calibration import DEFAULT_CACHE_TRT_VERSION, CalibrationResult, calibrate_policy, trt_calibration_cache
from .compile import compile_policy
from .errors import MixprecError
from .evaluation import timing_feed
from .model import LoadedModel
from .policy import Policy
from .project import Project
from .shapes import resolve_input_shapes, shape_text
from .workspace import atomic_write_bytes, atomic_write_text

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


def _dynamic(model: LoadedModel):
    return [s for s in model.inputs if s.dynamic_axes]


def _shape_flags(model: LoadedModel, shapes: dict[str, tuple[int, ...]] | None,
                 flags=("--minShapes", "--optShapes", "--maxShapes")) -> list[str]:
    """min = opt = max = the project's shapes (``--shape``/``--dim``/``--batch``, defaults shown by
    ``inspect``) for every input with a dynamic dim; static inputs take no flag."""
    shapes = shapes or resolve_input_shapes(model)
    dynamic = _dynamic(model)
    if not dynamic:
        return []
    check_trt_names([s.name for s in dynamic], "input names")
    spec = ",".join(f"{s.name}:{shape_text(shapes[s.name])}" for s in dynamic)
    return [f"{flag}={spec}" for flag in flags]


def _tf32_flag(tf32: bool) -> list[str]:
    """trtexec enables TF32 by default; mixprec's builds do not (issue 11, bug 4)."""
    return [] if tf32 else ["--noTF32"]


def trtexec_legacy_command(model: LoadedModel, policy: Policy, onnx_path: str = "model.onnx",
                           calib_cache: str | None = "calibration.cache", shapes=None, *, tf32: bool = False,
                           engine: str = "model.plan") -> str:
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
            f"--layerOutputTypes={outputs}", *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            f"--saveEngine={engine}"]
    return shlex.join(args)


def polygraphy_legacy_build_command(model: LoadedModel, onnx_path: str, script: str, shapes=None, *,
                                    tf32: bool = False, engine: str = "model.plan") -> str:
    """TensorRT ≤ 10.11: build the original ONNX with ``script`` (the policy's precisions, output
    types and INT8 ranges on every tensor the parser creates) as a network post-process step, and
    INT8 enabled by its config post-process step, so no calibrator runs (Polygraphy's ``--int8``
    would add one that calibrates on random data)."""
    args = ["polygraphy", "convert", onnx_path, "--convert-to", "trt", "-o", engine, "--fp16",
            *(["--tf32"] if tf32 else []), "--precision-constraints", "obey",
            "--trt-network-postprocess-script", script, "--trt-config-postprocess-script", script,
            "--profiling-verbosity", "detailed",
            *_polygraphy_shapes(model, shapes)]
    return shlex.join(args)


def trtexec_profile_command(model: LoadedModel, engine: str = "model.plan", shapes=None) -> str:
    """trtexec on a built engine: its layer information and per-layer profile."""
    args = ["trtexec", f"--loadEngine={engine}", *_shape_flags(model, shapes, ("--shapes",)),
            "--exportLayerInfo=layers.json", "--exportProfile=profile.json", "--separateProfileRun"]
    return shlex.join(args)


def trtexec_typed_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None, *,
                          tf32: bool = False) -> str:
    """TensorRT ≥ 10.12 / 11: the compiled explicit-precision ONNX, strongly typed."""
    args = ["trtexec", f"--onnx={compiled_path}", "--stronglyTyped", *_tf32_flag(tf32), *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--separateProfileRun", "--saveEngine=model.plan"]
    return shlex.join(args)


def _polygraphy_shapes(model: LoadedModel, shapes) -> list[str]:
    """min = opt = max = the project's shapes for every dynamic input (Polygraphy's ``name:[d,...]``)."""
    shapes = shapes or resolve_input_shapes(model)
    dynamic = _dynamic(model)
    if not dynamic:
        return []
    spec = [f"{s.name}:[{','.join(str(d) for d in shapes[s.name])}]" for s in dynamic]
    return [arg for flag in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes") for arg in (flag, *spec)]


def polygraphy_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None, *,
                       reference_onnx: str = "model.onnx", inputs: str = "inputs.json",
                       outputs: str = "fp32-outputs.json", atol: float | None = None, tf32: bool = False) -> str:
    """Polygraphy, two commands: ONNX Runtime runs the FP32 original on ``inputs`` and saves its
    outputs; then TensorRT builds the compiled ONNX strongly typed and is compared with those FP32
    outputs at an explicit absolute tolerance ``atol`` (``rtol 0``: an element fails when it is
    more than ``atol`` off). Polygraphy's default 1e-5 would fail every FP16/INT8 policy (issue 11, bug 2)."""
    atol = DEFAULT_ATOL if atol is None else float(atol)
    ref = ["polygraphy", "run", reference_onnx, "--onnxrt", "--load-inputs", inputs, "--save-outputs", outputs]
    run = ["polygraphy", "run", compiled_path, "--trt", "--strongly-typed", *(["--tf32"] if tf32 else []),
           *_polygraphy_shapes(model, shapes), "--load-inputs", inputs, "--load-outputs", outputs,
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
    if target == "trt":
        require_trt_opset(project.model)
    if calib is None:
        calib = policy_calibration(project, policy)
    return compile_policy(project.model, policy, calib, target=target).serialized()


def measured_tolerance(original: bytes, compiled: bytes, feeds: list[dict]) -> tuple[float, float]:
    """``(atol, max abs error)``: ONNX Runtime's max abs error of ``compiled`` against the FP32
    ``original`` over every float output on ``feeds``, and the tolerance derived from it
    (``TOLERANCE_FACTOR`` × error + ``TOLERANCE_FLOOR`` × max |FP32 output|)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref, cand = (ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]) for m in (original, compiled))
    err, mag = 0.0, 0.0
    for feed in feeds:
        for r, c in zip(ref.run(None, feed), cand.run(None, feed)):
            r, c = np.asarray(r), np.asarray(c)
            if r.dtype.kind == "f" and r.size:
                err = max(err, float(np.max(np.abs(r.astype(np.float64) - c.astype(np.float64)))))
                mag = max(mag, float(np.max(np.abs(r))))
    return TOLERANCE_FACTOR * err + TOLERANCE_FLOOR * mag, err


def _legacy_export(project: Project, policy: Policy, calib, out: Path, trt_version: str, tf32: bool) -> str:
    """The ≤ 10.11 files beside ``out`` (named ONNX, calibration cache, post-process script) and the commands."""
    if parse_version(trt_version, "give the TensorRT version that will build it, e.g. --trt-version 10.11.0") \
            >= STRONG_TYPING_FROM:
        raise MixprecError(f"--format trtexec is the TensorRT <= 10.11 export, not for TensorRT {trt_version}",
                           "use --format trtexec-typed or polygraphy for TensorRT 10.12 and newer, or give "
                           "--trt-version 10.0 ... 10.11")
    named = atomic_write_bytes(out.with_name(out.stem + ".named.onnx"), project.model.serialized())
    lines = [LEGACY_HEADER, f"# for TensorRT {trt_version}"]
    by_name = {l.name: l for l in project.layers}
    constant_int8 = sorted(n for n, p in policy.layers.items()
                           if p == "int8" and n in by_name and by_name[n].op_type in _CONSTANT_WEIGHT_OPS)
    if not constant_int8:
        cache = None
        if calib is not None:  # --calib only with a cache, whose header names the TensorRT that reads it
            cache = atomic_write_text(out.with_name(out.stem + ".calib.cache"),
                                      trt_calibration_cache(calib, trt_version))
            lines[-1] += (f": calibration cache {cache.name}, header {cache.read_text().splitlines()[0]}; "
                          "another TensorRT version rejects it (export again with --trt-version)")
        lines.append(trtexec_legacy_command(project.model, policy, named.name, cache.name if cache else None,
                                            project.input_shapes, tf32=tf32))
        return "\n".join(lines) + "\n"
    script = atomic_write_text(out.with_name(out.stem + ".postprocess.py"), legacy_postprocess_script(policy, calib))
    lines += [f"# INT8 {'/'.join(_CONSTANT_WEIGHT_OPS)} ({len(constant_int8)} layers): TensorRT's parser turns "
              "their weights into Constant layers that no calibration cache names, and trtexec cannot range them.",
              f"# Build with Polygraphy and {script.name}, which sets the policy's precisions and every INT8 "
              "input's range (weights from max |w|), then profile with trtexec:",
              polygraphy_legacy_build_command(project.model, named.name, script.name, project.input_shapes,
                                              tf32=tf32),
              trtexec_profile_command(project.model, "model.plan", project.input_shapes)]
    return "\n".join(lines) + "\n"


def _polygraphy_export(project: Project, policy: Policy, calib, out: Path, compiled: bytes,
                       atol: float | None, tf32: bool) -> str:
    """The Polygraphy comparison's files beside ``out`` (original ONNX, inputs) and its commands."""
    from polygraphy.json import to_json

    named = atomic_write_bytes(out.with_name(out.stem + ".named.onnx"), project.model.serialized())
    feeds = [timing_feed(project)]
    inputs = out.with_name(out.stem + ".inputs.json")
    atomic_write_text(inputs, to_json(feeds))  # what `polygraphy run --save-inputs` writes
    measured_atol, err = measured_tolerance(project.model.serialized(), compiled, feeds)
    basis = (f"given (--atol); ONNX Runtime measures max abs error {err:.3g} for this policy" if atol is not None
             else f"{TOLERANCE_FACTOR:g} x the max abs error ONNX Runtime measures for this policy on "
                  f"{inputs.name} ({err:.3g}) + {TOLERANCE_FLOOR:g} x max |FP32 output|")
    cmd = polygraphy_command(project.model, out.stem + ".mixprec.onnx", project.input_shapes,
                             reference_onnx=named.name, inputs=inputs.name,
                             outputs=out.stem + ".fp32-outputs.json",
                             atol=measured_atol if atol is None else atol, tf32=tf32)
    return f"{TYPED_HEADER}\n# compared with FP32 ONNX Runtime outputs; tolerance: {basis}\n{cmd}\n"


def export_policy(project: Project, policy: Policy, fmt: str, out: str | Path, target: str = "trt", *,
                  trt_version: str = DEFAULT_TRT_VERSION, tf32: bool = False, atol: float | None = None) -> Path:
    """Write ``policy`` to ``out`` in one of EXPORT_FORMATS. ``trtexec`` (TensorRT ``trt_version``,
    ≤ 10.11) also writes the named ONNX, the calibration cache (INT8 only) and, for INT8
    Gemm/MatMul, a Polygraphy post-process script beside ``out``; ``trtexec-typed`` / ``polygraphy``
    the compiled ONNX (``polygraphy`` also the original ONNX and the inputs it compares on, at
    ``atol``, by default measured). ``tf32``: let FP32 layers use TF32 (off, as in mixprec's
    builds). Returns ``out``."""
    if fmt not in EXPORT_FORMATS:
        raise MixprecError(f"unknown export format {fmt!r}", f"use one of {', '.join(EXPORT_FORMATS)}")
    out = Path(out)
    if fmt == "json":  # needs no data: a policy of a model whose inputs need an .npz still exports
        return atomic_write_text(out, policy.to_json())
    calib = policy_calibration(project, policy)
    if fmt == "onnx":
        return atomic_write_bytes(out, compiled_onnx(project, policy, target, calib))
    if fmt == "calib-cache":
        if calib is None:
            raise MixprecError("the policy has no INT8 layer, so there is no calibration cache to export",
                               "set some layers to int8, or export --format json")
        return atomic_write_text(out, trt_calibration_cache(calib, trt_version))
    if fmt == "trtexec":
        return atomic_write_text(out, _legacy_export(project, policy, calib, out, trt_version, tf32))
    compiled = out.with_name(out.stem + ".mixprec.onnx")
    data = compiled_onnx(project, policy, "trt", calib)
    atomic_write_bytes(compiled, data)
    if fmt == "trtexec-typed":
        cmd = trtexec_typed_command(project.model, compiled.name, project.input_shapes, tf32=tf32)
        return atomic_write_text(out, f"{TYPED_HEADER}\n{cmd}\n")
    return atomic_write_text(out, _polygraphy_export(project, policy, calib, out, data, atol, tf32))
