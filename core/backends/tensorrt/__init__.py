"""The TensorRT backend (NVIDIA GPUs) on Polygraphy's TensorRT loaders, split by role as Polygraphy
splits ``backend/trt/``:

``versions``      TensorRT versions and availability: the build mode, ``STRONG_TYPING_FROM``, the opset it needs
``profiles``      optimisation profiles: each input's (min, opt, max) shapes and Polygraphy's ``Profile``
``engine_cache``  built engines cached under a key of everything they depend on
``legacy``        the TensorRT <= 10.11 path: per-layer precisions and INT8 ranges, the export's post-process script
``timing``        GPU compute time from CUDA events on buffers bound once, and TensorRT's time per layer
``runner``        ``TrtEngineRunner`` (Polygraphy's ``TrtRunner``) and ``TensorRTBackend``
``api``           the Polygraphy calls and TensorRT APIs the package uses, checked by tests/unit/backends

This face holds what the rest of mixprec uses. Importing it needs neither TensorRT nor a GPU: ``tensorrt``
and Polygraphy's TensorRT loaders are imported inside the functions that use them."""
from core.backends.tensorrt.legacy import legacy_postprocess_script
from core.backends.tensorrt.profiles import profile_shapes, project_trt_options
from core.backends.tensorrt.runner import TensorRTBackend, TrtEngineRunner
from core.backends.tensorrt.versions import (LEGACY_REMOVED_IN, MODES, STRONG_TYPING_FROM, build_mode, parse_version,
                                             require_trt_opset, tensorrt_available)

__all__ = ["LEGACY_REMOVED_IN", "MODES", "STRONG_TYPING_FROM", "TensorRTBackend", "TrtEngineRunner", "build_mode",
           "legacy_postprocess_script", "parse_version", "profile_shapes", "project_trt_options",
           "require_trt_opset", "tensorrt_available"]
