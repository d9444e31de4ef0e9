"""Backends behind one interface. ``auto`` picks TensorRT where it can run, else ONNX Runtime."""
from __future__ import annotations

from ..errors import MixprecError
from .base import Backend, Engine, Latency, Reformat, Runner, summarize_reformat
from .onnxruntime import OnnxRuntimeBackend

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def tensorrt_available() -> tuple[bool, str]:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # noqa: BLE001 - the PyPI stub raises at import
        return False, "TensorRT not installed (pip install tensorrt-cu12 on a machine with an NVIDIA GPU)"
    try:
        from cuda import cudart  # type: ignore

        err, count = cudart.cudaGetDeviceCount()
        if int(err) != 0 or count == 0:
            return False, "TensorRT is installed but no CUDA device is present"
    except Exception:  # noqa: BLE001
        try:
            import ctypes

            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return False, "TensorRT is installed but the CUDA driver (libcuda) is missing"
    return True, "TensorRT and a CUDA device are present"


def select_backend(name: str = "auto") -> tuple[Backend, str]:
    """The backend to use, and a sentence saying why it was chosen."""
    if name not in BACKENDS:
        raise MixprecError(f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    trt_ok, trt_why = tensorrt_available()
    if name == "tensorrt" or (name == "auto" and trt_ok):
        if not trt_ok:
            raise MixprecError(f"the TensorRT backend cannot run here: {trt_why}",
                               "use --backend onnxruntime, or run on a machine with an NVIDIA GPU and TensorRT")
        from .tensorrt import TensorRTBackend

        return TensorRTBackend(), f"tensorrt: {trt_why}"
    ok, why = OnnxRuntimeBackend.available()
    if not ok:
        raise MixprecError(f"no backend can run here: {why}", "pip install -r requirements.txt")
    reason = why if name == "onnxruntime" else f"{why}; TensorRT not chosen: {trt_why}"
    return OnnxRuntimeBackend(), f"onnxruntime: {reason}"


__all__ = ["Backend", "Engine", "Latency", "Reformat", "Runner", "select_backend", "summarize_reformat",
           "tensorrt_available", "BACKENDS"]
