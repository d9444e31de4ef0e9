"""The backend interface. A backend builds a policy into an engine, runs it (a runner with
activate/infer/deactivate, as in Polygraphy), times it interleaved against a reference
engine, and profiles it per layer. Callers only see these types, so the TensorRT backend
plugs in without touching them."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..calibration import CalibrationResult
from ..inventory import Layer
from ..model import LoadedModel
from ..policy import Policy

PER_LAYER_COLUMNS = ["name", "op_type", "layer", "precision", "ms", "pct", "is_reformat"]


@dataclass
class Engine:
    """A built candidate: the compiled explicit-precision ONNX and the backend's artifact."""

    backend: str
    compiled_path: Path
    artifact_path: Path
    build_seconds: float
    input_shapes: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Latency:
    median_ms: float
    p95_ms: float
    ref_median_ms: float
    ref_p95_ms: float
    speedup: float  # median of the pairwise ratios reference/candidate
    iterations: int


class Runner(ABC):
    """Polygraphy-style runner: ``activate()``, ``infer(feed)``, ``deactivate()``; also a context manager."""

    @abstractmethod
    def activate(self) -> None: ...

    @abstractmethod
    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def deactivate(self) -> None: ...

    def __enter__(self):
        self.activate()
        return self

    def __exit__(self, *exc):
        self.deactivate()


class Backend(ABC):
    name: str = "?"

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """Whether the backend can run here, and why (not)."""

    @abstractmethod
    def build(self, model: LoadedModel, policy: Policy, calib: CalibrationResult | None, out_dir: Path,
              input_shapes: dict[str, tuple[int, ...]]) -> Engine: ...

    @abstractmethod
    def reference(self, model: LoadedModel, out_dir: Path, input_shapes: dict[str, tuple[int, ...]]) -> Engine:
        """The FP32 engine of the original model."""

    @abstractmethod
    def runner(self, engine: Engine) -> Runner: ...

    @abstractmethod
    def time_interleaved(self, candidate: Engine, reference: Engine, feed: dict[str, np.ndarray],
                         warmup: int, iterations: int) -> Latency: ...

    @abstractmethod
    def profile(self, engine: Engine, feed: dict[str, np.ndarray], iterations: int,
                layers: list[Layer], policy: Policy) -> pd.DataFrame:
        """Per-layer time, columns ``PER_LAYER_COLUMNS``; conversion nodes flagged ``is_reformat``."""


def latency_from_pairs(cand: list[float], ref: list[float]) -> Latency:
    c, r = np.asarray(cand) * 1e3, np.asarray(ref) * 1e3
    return Latency(float(np.median(c)), float(np.percentile(c, 95)), float(np.median(r)),
                   float(np.percentile(r, 95)), float(np.median(r / c)), len(c))
