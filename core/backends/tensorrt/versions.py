"""TensorRT versions and availability: which TensorRT mixprec runs on and how it builds there.

Two build paths, picked by the installed TensorRT version (:func:`build_mode`): ``strongly-typed``
(TensorRT >= 10.12, and 11 where it is the only mode: the policy compiled to explicit precision is
parsed as a strongly typed network) and ``legacy`` (TensorRT 10.0-10.11: the original ONNX with
per-layer precisions, :mod:`core.backends.tensorrt.legacy`). Importing this module needs neither
TensorRT nor a GPU: :func:`import_tensorrt` imports it when a function needs it, and
:func:`tensorrt_available` says whether the backend can run here.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys

from core.errors import MixprecError
from core.quant.trt_rules import MIN_OPSET

MODES = ("auto", "strongly-typed", "legacy")
MIN_VERSION = (10, 0)          # TensorRT 10 API: execute_async_v3, ILayer.metadata, named tensors
STRONG_TYPING_FROM = (10, 12)  # per-layer precision APIs deprecated, superseded by strong typing
LEGACY_REMOVED_IN = (11, 0)    # ... and removed
INSTALL = "pip install tensorrt-cu12 or tensorrt-cu13 on a machine with an NVIDIA GPU"
INSTALL_FIX = INSTALL + ", or use --backend onnxruntime"
TRT_MIN_OPSET = MIN_OPSET  # per-channel DequantizeLinear (``axis``) needs opset 13 (core.quant.trt_rules)


def parse_version(version: str, fix: str | None = None) -> tuple[int, int]:
    """(major, minor) of a TensorRT version; ``fix`` says what to do when it cannot be read (by
    default: the installed TensorRT's version is unreadable, so reinstall it)."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if not m:
        raise MixprecError(f"cannot read the TensorRT version {version!r}", fix or "reinstall TensorRT: " + INSTALL_FIX)
    return int(m[1]), int(m[2])


def build_mode(trt_version: str, requested: str = "auto") -> str:
    """``strongly-typed`` or ``legacy`` for this TensorRT version (``requested`` may force one)."""
    if requested not in MODES:
        raise MixprecError(f"unknown TensorRT build mode {requested!r}", f"use one of {', '.join(MODES)}")
    v = parse_version(trt_version)
    if v < MIN_VERSION:
        raise MixprecError(f"TensorRT {trt_version} is too old (mixprec needs TensorRT 10.0 or newer)",
                           "upgrade: " + INSTALL_FIX)
    if requested == "legacy" and v >= LEGACY_REMOVED_IN:
        raise MixprecError(f"TensorRT {trt_version} has no per-layer precision APIs (removed in TensorRT 11)",
                           "use the strongly typed build (mode 'auto' or 'strongly-typed')")
    if requested != "auto":
        return requested
    return "strongly-typed" if v >= STRONG_TYPING_FROM else "legacy"


def require_trt_opset(model) -> None:
    """The ``trt`` target's Q/DQ need opset >= 13 (issue 11, bug 8). Models loaded with
    ``core.model.load.load_model`` are upgraded already; this catches one that was not."""
    if int(model.opset) < TRT_MIN_OPSET:
        raise MixprecError(
            f"{model.name} is at opset {model.opset}, but the TensorRT export writes per-channel "
            f"DequantizeLinear (axis), which needs opset >= {TRT_MIN_OPSET}",
            "load the model through mixprec (python -m core, open_project or load_model), which upgrades opset "
            "< 13 with onnx.version_converter, or re-export it at opset 13 or later (torch.onnx.export(..., "
            "opset_version=17))")


def import_tensorrt():
    """The ``tensorrt`` module, or a MixprecError saying how to install it."""
    try:
        import tensorrt as trt
    except Exception as e:  # noqa: BLE001 - the PyPI stub raises at import
        raise MixprecError("TensorRT is not installed", INSTALL_FIX) from e
    return trt


_import_failed = False  # ``import tensorrt`` has failed in this process (pages ask often)


def tensorrt_available() -> tuple[bool, str]:
    """Whether the TensorRT backend can run here (TensorRT >= 10, Polygraphy, a CUDA device), and why (not)."""
    global _import_failed
    if _import_failed and "tensorrt" not in sys.modules:
        return False, f"TensorRT not installed ({INSTALL})"  # a failed import searches every path again: once
    try:
        import tensorrt as trt

        version = str(trt.__version__)
    except Exception:  # noqa: BLE001 - the PyPI stub raises at import
        _import_failed = True
        return False, f"TensorRT not installed ({INSTALL})"
    try:
        too_old = parse_version(version) < MIN_VERSION
    except MixprecError:
        too_old = True
    if too_old:
        return False, f"TensorRT {version} is installed but mixprec needs TensorRT 10.0 or newer ({INSTALL})"
    try:
        import polygraphy.backend.trt  # noqa: F401
    except Exception:  # noqa: BLE001
        return False, f"TensorRT {version} is installed but Polygraphy is not (pip install polygraphy)"
    device = cuda_device()
    if device is None:
        return False, f"TensorRT {version} is installed but no CUDA device is usable (no NVIDIA GPU or driver)"
    return True, f"TensorRT {version} on {device[0]} (compute capability {device[1]})"


def cuda_device(ordinal: int = 0) -> tuple[str, str] | None:
    """``(name, compute capability)`` of a CUDA device through the driver API (libcuda), or None.
    TensorRT and Polygraphy use the current device, which is 0 unless the process changes it."""
    try:
        cuda = ctypes.WinDLL("nvcuda.dll") if os.name == "nt" else ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    failed = (cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count)) or count.value <= ordinal
              or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) or cuda.cuDeviceGetName(name, len(name), dev)
              # 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR (cuda.h)
              or cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
              or cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev))
    return None if failed else (name.value.decode(errors="replace"), f"{major.value}.{minor.value}")
