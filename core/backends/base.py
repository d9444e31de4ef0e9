"""The backend interface. A backend builds a policy into an engine, runs it (a runner with
activate/infer/deactivate, as in Polygraphy), times it interleaved against a reference
engine, and profiles it per layer. Callers only see these types, so the TensorRT backend
plugs in without touching them."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import pandas as pd

from core.model.inventory import Layer
from core.model.load import LoadedModel
from core.quant.calibration import CalibrationResult
from core.quant.policy import Policy

PER_LAYER_COLUMNS = ["name", "op_type", "layer", "precision", "ms", "pct", "is_reformat"]
"""Columns of a backend's per-layer profile (:meth:`Backend.profile`, built by :func:`per_layer_frame`)."""


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
    # each interleaved pair's times (ms), in order: what the speedup's interval is computed from (empty: not kept)
    candidate_ms: tuple[float, ...] = ()
    reference_ms: tuple[float, ...] = ()


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
                   float(np.percentile(r, 95)), float(np.median(r / c)), len(c),
                   tuple(float(v) for v in c), tuple(float(v) for v in r))


# ---------------------------------------------------------------------------- per-layer profiles

class ProfileRow(NamedTuple):
    """One timed unit of a backend's profile: an ONNX Runtime node, or a TensorRT engine layer."""

    name: str
    op_type: str
    nodes: tuple[str, ...]  # ONNX node names it runs; the first that a policy layer owns names its layer
    ms: float               # mean time per run
    is_reformat: bool       # a conversion (Q/DQ, Cast, TensorRT Reformat), not compute


def owner_layer(node: str, names_longest_first: list[str]) -> str | None:
    """The inventory layer a node came from: compiled node names start with their layer's name
    (``<layer>/x0/QuantizeLinear``); ONNX Runtime's fusions and TensorRT's layer names keep or
    extend them. ``names_longest_first``: the layer names sorted by length, longest first."""
    for n in names_longest_first:
        if node == n or node.startswith(n + "/") or node.startswith(n + "_"):
            return n
    return None


def per_layer_frame(rows: Iterable[ProfileRow], layers: list[Layer], policy: Policy) -> pd.DataFrame:
    """A backend's profile as ``PER_LAYER_COLUMNS``, slowest first: each row with the policy layer
    that owns it (:func:`owner_layer` of its first owned node, ``""`` for none), that layer's
    policy precision, and its share of the per-layer sum in ``pct``."""
    names = sorted((layer.name for layer in layers), key=len, reverse=True)
    out = []
    for r in rows:
        layer = next((o for o in (owner_layer(n, names) for n in r.nodes) if o), "")
        out.append((r.name, r.op_type, layer, policy.layers.get(layer, "") if layer else "", r.ms, r.is_reformat))
    df = pd.DataFrame(out, columns=[c for c in PER_LAYER_COLUMNS if c != "pct"])
    total = df["ms"].sum()
    df["pct"] = 100.0 * df["ms"] / total if total > 0 else 0.0
    return df[PER_LAYER_COLUMNS].sort_values("ms", ascending=False, ignore_index=True)
