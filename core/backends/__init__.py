"""Backends behind one interface. ``auto`` picks TensorRT where it can run, else ONNX Runtime."""
from __future__ import annotations

from ..errors import MixprecError
from .base import Backend, Engine, Latency, Runner
from .onnxruntime import OnnxRuntimeBackend

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def tensorrt_available() -> tuple[bool, str]:
    """Whether the TensorRT backend can run here (TensorRT >= 10, Polygraphy, a CUDA device), and why (not)."""
    from .tensorrt import INSTALL, MIN_VERSION, cuda_device, parse_version

    try:
        import tensorrt as trt

        version = str(trt.__version__)
    except Exception:  # noqa: BLE001 - the PyPI stub raises at import
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


def select_backend(name: str = "auto", **trt_options) -> tuple[Backend, str]:
    """The backend to use, and a sentence saying why it was chosen. ``trt_options`` (profiles,
    workspace_bytes, mode) configure the TensorRT backend when it is the one chosen."""
    if name not in BACKENDS:
        raise MixprecError(f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    trt_ok, trt_why = tensorrt_available()
    if name == "tensorrt" or (name == "auto" and trt_ok):
        if not trt_ok:
            raise MixprecError(f"the TensorRT backend cannot run here: {trt_why}",
                               "use --backend onnxruntime, or run on a machine with an NVIDIA GPU and TensorRT")
        from .tensorrt import TensorRTBackend

        return TensorRTBackend(**trt_options), f"tensorrt: {trt_why}"
    ok, why = OnnxRuntimeBackend.available()
    if not ok:
        raise MixprecError(f"no backend can run here: {why}", "pip install -r requirements.txt")
    reason = why if name == "onnxruntime" else f"{why}; TensorRT not chosen: {trt_why}"
    return OnnxRuntimeBackend(), f"onnxruntime: {reason}"


__all__ = ["Backend", "Engine", "Latency", "Runner", "select_backend",
           "tensorrt_available", "BACKENDS"]
