"""TensorRT on an NVIDIA GPU (marked tensorrt; skipped where TensorRT is missing)."""
