"""Exports of a policy for TensorRT: the policy JSON, the compiled explicit-precision ONNX, the
TensorRT calibration cache and the trtexec / Polygraphy command lines. One implementation for
``python -m core export`` and the dashboard's Export page."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from .calibration import CalibrationResult, calibrate_policy, trt_calibration_cache
from .compile import compile_policy
from .errors import MixprecError
from .model import LoadedModel
from .policy import Policy
from .project import Project
from .shapes import resolve_input_shapes, shape_text
from .workspace import atomic_write_bytes, atomic_write_text

EXPORT_FORMATS = ("json", "trtexec", "trtexec-typed", "polygraphy", "onnx", "calib-cache")
LEGACY_HEADER = "# TensorRT <= 10.11 (per-layer precision constraints; deprecated in 10.12, removed in 11)"
TYPED_HEADER = "# TensorRT >= 10.12 / 11: strongly typed build of the explicit-precision ONNX"
_UNSAFE_TRT_NAME = re.compile(r"[,:]")


# --- command lines -----------------------------------------------------------------------------------
def _trt_input_name(name: str) -> str:
    """trtexec reads ``name:1x3`` pairs split on ',' and the last ':'; a name with either is quoted."""
    return f"'{name}'" if _UNSAFE_TRT_NAME.search(name) else name


def _shape_flags(model: LoadedModel, shapes: dict[str, tuple[int, ...]] | None) -> list[str]:
    """min = opt = max = the project's shapes (``--shape``/``--dim``/``--batch``, defaults shown by
    ``inspect``) for every input with a dynamic dim; static inputs take no flag."""
    shapes = shapes or resolve_input_shapes(model)
    dynamic = [s for s in model.inputs if s.dynamic_axes]
    if not dynamic:
        return []
    spec = ",".join(f"{_trt_input_name(s.name)}:{shape_text(shapes[s.name])}" for s in dynamic)
    return [f"--minShapes={spec}", f"--optShapes={spec}", f"--maxShapes={spec}"]


def trtexec_legacy_command(model: LoadedModel, policy: Policy, onnx_path: str = "model.onnx",
                           calib_cache: str = "calibration.cache", shapes=None) -> str:
    """TensorRT ≤ 10.11: the original ONNX with per-layer precision constraints."""
    bad = [n for n in policy.layers if _UNSAFE_TRT_NAME.search(n)]
    if bad:
        raise MixprecError("some layer names contain ',' or ':' which trtexec's --layerPrecisions cannot express",
                           "rename those nodes in the ONNX, or use the typed export (--format trtexec-typed)",
                           details=bad)
    precisions = ",".join(f"{n}:{p}" for n, p in policy.layers.items())
    # INT8 layers compute in int8 but hand a float tensor (the network default) to their consumers.
    outputs = ",".join(f"{n}:{policy.network_default if p == 'int8' else p}" for n, p in policy.layers.items())
    args = ["trtexec", f"--onnx={onnx_path}", "--fp16", "--int8", f"--calib={calib_cache}",
            "--precisionConstraints=obey", f"--layerPrecisions={precisions}",
            f"--layerOutputTypes={outputs}", *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--saveEngine=model.plan"]
    return shlex.join(args)


def trtexec_typed_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None) -> str:
    """TensorRT ≥ 10.12 / 11: the compiled explicit-precision ONNX, strongly typed."""
    args = ["trtexec", f"--onnx={compiled_path}", "--stronglyTyped", *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--separateProfileRun", "--saveEngine=model.plan"]
    return shlex.join(args)


def polygraphy_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None) -> str:
    """Polygraphy: build the compiled ONNX strongly typed and compare it against ONNX Runtime FP32."""
    shapes = shapes or resolve_input_shapes(model)
    args = ["polygraphy", "run", compiled_path, "--trt", "--strongly-typed", "--onnxrt"]
    dynamic = [s for s in model.inputs if s.dynamic_axes]
    if dynamic:
        for flag in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"):
            args += [flag, *(f"{s.name}:[{','.join(str(d) for d in shapes[s.name])}]" for s in dynamic)]
        args += ["--input-shapes", *(f"{s.name}:[{','.join(str(d) for d in shapes[s.name])}]" for s in dynamic)]
    return shlex.join(args)


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
    if calib is None:
        calib = policy_calibration(project, policy)
    return compile_policy(project.model, policy, calib, target=target).serialized()


def export_policy(project: Project, policy: Policy, fmt: str, out: str | Path, target: str = "trt") -> Path:
    """Write ``policy`` to ``out`` in one of EXPORT_FORMATS. ``trtexec`` also writes the named
    ONNX and the calibration cache beside ``out``; ``trtexec-typed`` / ``polygraphy`` the compiled
    ONNX. Returns ``out``."""
    if fmt not in EXPORT_FORMATS:
        raise MixprecError(f"unknown export format {fmt!r}", f"use one of {', '.join(EXPORT_FORMATS)}")
    out = Path(out)
    calib = policy_calibration(project, policy)
    if fmt == "json":
        return atomic_write_text(out, policy.to_json())
    if fmt == "onnx":
        return atomic_write_bytes(out, compiled_onnx(project, policy, target, calib))
    if fmt == "calib-cache":
        if calib is None:
            raise MixprecError("the policy has no INT8 layer, so there is no calibration cache to export",
                               "set some layers to int8, or export --format json")
        return atomic_write_text(out, trt_calibration_cache(calib))
    if fmt == "trtexec":
        named = atomic_write_bytes(out.with_name(out.stem + ".named.onnx"), project.model.serialized())
        cache = out.with_name(out.stem + ".calib.cache")
        if calib is not None:
            atomic_write_text(cache, trt_calibration_cache(calib))
        cmd = trtexec_legacy_command(project.model, policy, named.name, cache.name, project.input_shapes)
        return atomic_write_text(out, f"{LEGACY_HEADER}\n{cmd}\n")
    compiled = out.with_name(out.stem + ".mixprec.onnx")
    atomic_write_bytes(compiled, compiled_onnx(project, policy, "trt", calib))
    cmd = (trtexec_typed_command(project.model, compiled.name, project.input_shapes) if fmt == "trtexec-typed"
           else polygraphy_command(project.model, compiled.name, project.input_shapes))
    return atomic_write_text(out, f"{TYPED_HEADER}\n{cmd}\n")
