"""Latency model for the search: the estimated time of a policy that runs a set of eligible
layers in INT8 and every other eligible layer in the FP16 fallback.

It is fitted on three measured ORT profiles of the same model: all eligible layers FP16 (the
search's fallback), all INT8, and the FP32 reference, each with its wall-clock time. The
profiler inflates every node's time by a per-node overhead (measured on MiniLM: the kernel
times of the all-FP16 build sum to 17.9 ms per run where the run takes 15.2 ms without
profiling; the FP16 build has the most nodes), so each profile is first brought to its
wall-clock total by subtracting one per-node overhead. Per eligible layer:

* ``gain_ms`` — time saved by INT8 over its FP16 fallback, its own conversions included
  (``t16 − t8`` of the nodes it owns). Whatever the per-layer attribution misses (conversions
  that ORT moved onto non-layer nodes, fused nodes) is spread over the layers by MACs, so the
  two ends are exact: ``estimate(all) == t8_total`` and ``estimate(none) == t16_total``.

and per **edge** — an eligible layer whose output reaches another eligible layer's activation
input through data movement only (Reshape, Transpose, Relu, …):

* both INT8: the consumer's QuantizeLinear fuses into the producer (ORT: QLinearMatMul /
  QLinearConv with uint8 output; TensorRT: int8 output of the producer's kernel);
* producer FP16, consumer INT8: the consumer pays a separate QuantizeLinear;
* producer INT8, consumer FP16: the consumer rounds its input to float16 (two Casts on ORT,
  a Reformat on TensorRT).

So an INT8 island between FP16 layers costs extra conversions, and contiguous INT8 regions
are cheaper: the search prefers them when quality is equal. Conversion costs per element are
measured from the same profiles (QuantizeLinear and Cast nodes)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.backends import select_backend
from core.backends.tensorrt import project_trt_options
from core.measure.reference import reference_engine, timing_feed
from core.model.inventory import Layer, tensor_shapes
from core.model.load import LoadedModel
from core.project import Project
from core.quant.policy import Policy

# ops between two eligible layers across which the consumer's QuantizeLinear still fuses into
# the producer (ORT's QDQ propagation/ReluQuantFusion; TensorRT's Q/DQ fusion)
DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Relu",
                           "MaxPool"})


@dataclass(frozen=True)
class Edge:
    producer: str
    consumer: str
    tensor: str  # the consumer's activation input
    numel: int


@dataclass
class Ends:
    """One fit of the per-layer model on the all-FP16 and all-INT8 profiles."""

    fp16_total_ms: float  # every eligible layer in the FP16 fallback
    int8_total_ms: float  # every eligible layer INT8
    gain_ms: dict[str, float]  # per layer: INT8 over FP16, own conversions included, residual spread
    fp16_reformat_ms: float  # conversion time of the all-FP16 build
    reformat_delta_ms: dict[str, float]  # per layer: its INT8 conversions minus its FP16 conversions
    q_ms_per_element: float
    cast_ms_per_element: float

    def island_ms(self, edges: list[Edge], int8: set[str]) -> float:
        ms = 0.0
        for e in edges:
            a, b = e.producer in int8, e.consumer in int8
            if b and not a:
                ms += self.q_ms_per_element * e.numel
            elif a and not b:
                ms += 2 * self.cast_ms_per_element * e.numel
        return ms

    def total(self, edges, int8: set[str]) -> float:
        return self.fp16_total_ms - sum(self.gain_ms.get(l, 0.0) for l in int8) + self.island_ms(edges, int8)

    def reformat(self, edges, int8: set[str]) -> float:
        rf = self.fp16_reformat_ms + sum(self.reformat_delta_ms.get(l, 0.0) for l in int8)
        return max(rf + self.island_ms(edges, int8), 0.0)


@dataclass
class LatencyModel:
    """``wall``: fitted on the profiles brought to wall-clock time (latency estimates);
    ``profiled``: on the raw profiles, for the reformat share as the builds report it (the
    profiler's per-node overhead weighs on the many small conversion nodes)."""

    wall: Ends
    profiled: Ends
    fp32_total_ms: float  # the original model, wall-clock
    edges: list[Edge] = field(default_factory=list)

    def island_ms(self, int8: set[str]) -> float:
        """Extra conversion time (wall-clock) where an edge changes precision."""
        return self.wall.island_ms(self.edges, int8)

    def boundaries(self, int8: set[str]) -> int:
        """Edges whose two layers run in different precisions (INT8 vs the fallback)."""
        return sum((e.producer in int8) != (e.consumer in int8) for e in self.edges)

    def estimate(self, int8: set[str]) -> tuple[float, float]:
        """Estimated latency (ms) and reformat share (%) with these layers INT8, the other eligible ones FP16."""
        total = self.wall.total(self.edges, int8)
        raw_total = self.profiled.total(self.edges, int8)
        rf = self.profiled.reformat(self.edges, int8)
        return total, 100.0 * rf / raw_total if raw_total > 0 else 0.0


def fusable_edges(model: LoadedModel, layers: list[Layer], shapes: dict[str, tuple[int, ...]]) -> list[Edge]:
    """Edges between eligible layers: the producer's output reaches the consumer's activation
    input through ``DATA_MOVEMENT`` ops only."""
    eligible = {l.name for l in layers if l.eligible}
    producer = {o: n for n in model.proto.graph.node for o in n.output}
    inits = model.initializer_names()
    edges = []
    for layer in layers:
        if not layer.eligible:
            continue
        for tensor in layer.inputs[:2]:
            if not tensor or tensor in inits:
                continue
            t, node = tensor, producer.get(tensor)
            while node is not None and node.op_type in DATA_MOVEMENT and node.input:
                t = node.input[0]
                node = producer.get(t)
            if node is not None and node.name in eligible and node.name != layer.name:
                edges.append(Edge(node.name, layer.name, tensor, int(np.prod(shapes.get(tensor, (0,)), dtype=np.int64))))
    return edges


_Q_NAME = re.compile(r"^(?P<layer>.+)/x(?P<i>\d)/QuantizeLinear$")
_CAST_NAME = re.compile(r"^(?P<tensor>.+?)(__acc)?/Cast_(fp16|fp32|r16)$")


def per_element_ms(profile: pd.DataFrame, op: str, layers: list[Layer], shapes: dict[str, tuple[int, ...]]) -> float:
    """Mean ms per tensor element of the ``op`` conversion nodes of a profile (QuantizeLinear or
    Cast) whose tensor the compiler's naming identifies; 0 where there are none."""
    by_name = {l.name: l for l in layers}
    ms, n = 0.0, 0
    for row in profile[profile.op_type == op].itertuples():
        tensor = None
        if op == "QuantizeLinear" and (m := _Q_NAME.match(row.name)) and m["layer"] in by_name:
            ins = by_name[m["layer"]].inputs
            tensor = ins[int(m["i"])] if int(m["i"]) < len(ins) else None
        elif op == "Cast" and (m := _CAST_NAME.match(row.name)):
            tensor = m["tensor"]
        if tensor in shapes:
            ms += float(row.ms)
            n += int(np.prod(shapes[tensor], dtype=np.int64))
    return ms / n if n else 0.0


def to_wall_clock(profile: pd.DataFrame, wall_ms: float | None) -> pd.DataFrame:
    """The profile with one per-node overhead subtracted (the profiler's) or added (the
    framework's time between nodes) so that it sums to ``wall_ms``; a node's time never goes
    below zero. Unchanged without a wall-clock time."""
    if wall_ms is None or profile.empty:
        return profile
    overhead = (float(profile.ms.sum()) - wall_ms) / len(profile)
    return profile.assign(ms=(profile.ms - overhead).clip(lower=0.0))


def fit_ends(p16: pd.DataFrame, p8: pd.DataFrame, layers: list[Layer], shapes: dict[str, tuple[int, ...]]) -> Ends:
    eligible = [l for l in layers if l.eligible]
    t16, t8 = p16.groupby("layer").ms.sum(), p8.groupby("layer").ms.sum()
    r16 = p16[p16.is_reformat].groupby("layer").ms.sum()
    r8 = p8[p8.is_reformat].groupby("layer").ms.sum()
    total16, total8 = float(p16.ms.sum()), float(p8.ms.sum())
    rf16, rf8 = float(p16[p16.is_reformat].ms.sum()), float(p8[p8.is_reformat].ms.sum())
    gain = {l.name: float(t16.get(l.name, 0.0) - t8.get(l.name, 0.0)) for l in eligible}
    rdelta = {l.name: float(r8.get(l.name, 0.0) - r16.get(l.name, 0.0)) for l in eligible}
    # what the attribution misses, spread by MACs, so that the all-INT8 end is exact
    macs = np.array([max(l.macs, 0) for l in eligible], dtype=np.float64)
    share = macs / macs.sum() if macs.sum() > 0 else np.full(len(eligible), 1.0 / max(len(eligible), 1))
    residual = (total16 - total8) - sum(gain.values())
    rf_residual = (rf8 - rf16) - sum(rdelta.values())
    for l, s in zip(eligible, share):
        gain[l.name] += residual * s
        rdelta[l.name] += rf_residual * s
    return Ends(total16, total8, gain, rf16, rdelta, per_element_ms(p8, "QuantizeLinear", layers, shapes),
                per_element_ms(p16, "Cast", layers, shapes))


def fit_latency_model(p16: pd.DataFrame, p8: pd.DataFrame, p32: pd.DataFrame, layers: list[Layer],
                      edges: list[Edge], shapes: dict[str, tuple[int, ...]],
                      wall_ms: dict[str, float] | None = None) -> LatencyModel:
    """From per-layer profiles (``core.backends.base.PER_LAYER_COLUMNS``) of the all-FP16,
    all-INT8 and FP32 builds, and their wall-clock medians ``wall_ms`` (keys ``fp16``, ``int8``,
    ``fp32``) where measured."""
    wall_ms = wall_ms or {}
    w16, w8 = to_wall_clock(p16, wall_ms.get("fp16")), to_wall_clock(p8, wall_ms.get("int8"))
    return LatencyModel(fit_ends(w16, w8, layers, shapes), fit_ends(p16, p8, layers, shapes),
                        float(to_wall_clock(p32, wall_ms.get("fp32")).ms.sum()), edges)


def latency_model(project: Project, base: Policy, calib, backend: str = "onnxruntime",
                  trt_options: dict | None = None) -> LatencyModel:
    """Fit the :class:`LatencyModel` on the backend's profiles of ``base`` with every eligible
    layer FP16 (the search's fallback), with every eligible layer INT8, and of the FP32 reference,
    with their wall-clock medians (interleaved with the reference). On TensorRT the per-element
    conversion costs come out zero (its Reformat layers do not carry mixprec's node names), so
    only the per-layer gains order the candidates there."""
    be, _ = select_backend(backend, **project_trt_options(project, trt_options))
    eligible = [l for l in project.layers if l.eligible]
    feed = timing_feed(project)
    profiles, wall, refs = {}, {}, []
    ref = reference_engine(be, project)
    for prec in ("int8", "fp16"):
        pol = base.with_layers({l.name: prec for l in eligible})
        folder = project.ws.latency_dir(project.model.sha256, be.name, prec)
        eng = be.build(project.model, pol, calib, folder, project.input_shapes)
        profiles[prec] = be.profile(eng, feed, 10, project.layers, pol)
        t = be.time_interleaved(eng, ref, feed, warmup=10, iterations=40)
        wall[prec] = t.median_ms
        refs.append(t.ref_median_ms)
    fp32 = base.with_layers({l.name: "fp32" for l in project.layers})
    profiles["fp32"] = be.profile(ref, feed, 10, project.layers, fp32)
    wall["fp32"] = float(np.median(refs))
    shapes = tensor_shapes(project.model, project.input_shapes)
    return fit_latency_model(profiles["fp16"], profiles["int8"], profiles["fp32"], project.layers,
                             fusable_edges(project.model, project.layers, shapes), shapes, wall)
