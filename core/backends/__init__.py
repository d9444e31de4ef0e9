"""Backends behind one interface. ``auto`` picks TensorRT where it can run, else ONNX Runtime.

The registry lives here; each backend module says whether it can run (``available()``) and
shares its helpers through :mod:`.base`. Both backend modules import without TensorRT or a GPU
(TensorRT and Polygraphy's TensorRT loaders are imported inside the functions that use them)."""
from __future__ import annotations

from core.backends.base import Backend, Engine, Latency, Runner
from core.backends.onnxruntime import OnnxRuntimeBackend
from core.backends.tensorrt import TensorRTBackend, tensorrt_available
from core.errors import MixprecError

BACKENDS = ("auto", "onnxruntime", "tensorrt")


def select_backend(name: str = "auto", **trt_options) -> tuple[Backend, str]:
    """The backend to use, and a sentence saying why it was chosen. ``trt_options`` (profiles,
    workspace_bytes, mode) configure the TensorRT backend when it is the one chosen."""
    if name not in BACKENDS:
        raise MixprecError(f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    trt_ok, trt_why = TensorRTBackend.available()
    if name == "tensorrt" or (name == "auto" and trt_ok):
        if not trt_ok:
            raise MixprecError(f"the TensorRT backend cannot run here: {trt_why}",
                               "use --backend onnxruntime, or run on a machine with an NVIDIA GPU and TensorRT")
        return TensorRTBackend(**trt_options), f"tensorrt: {trt_why}"
    ok, why = OnnxRuntimeBackend.available()
    if not ok:
        raise MixprecError(f"no backend can run here: {why}", "pip install -r requirements.txt")
    reason = why if name == "onnxruntime" else f"{why}; TensorRT not chosen: {trt_why}"
    return OnnxRuntimeBackend(), f"onnxruntime: {reason}"


__all__ = ["Backend", "Engine", "Latency", "Runner", "OnnxRuntimeBackend", "TensorRTBackend",
           "select_backend", "tensorrt_available", "BACKENDS"]
