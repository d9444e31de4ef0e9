"""The search's latency model when the deployment target is TensorRT and TensorRT does not run here:
each candidate's **estimated TensorRT time** on a GPU of the table (:func:`core.estimate.predict.predict`:
the engine the candidate's compiled ONNX would build, priced by the cost model fitted on the A100
fixture engines or on the user's calibration).

It has the interface the searcher uses of :class:`~core.search.latency.LatencyModel`:
``estimate(int8) -> (ms, reformat %)``, ``boundaries(int8)`` and per-layer ``wall.gain_ms`` (what
putting one layer in INT8 saves, which orders the fallback), and ``band(int8)``: the estimate's
uncertainty band (:mod:`core.estimate.validation`), inside which the search calls two candidates a
tie. Estimates are memoised per INT8 set.

Per-layer gains are leave-one-out from the all-INT8 candidate (est(all but l) − est(all)): the
context the search starts from, boundaries included. Above ``EXACT_GAIN_LAYERS`` eligible layers the
saving of all-INT8 over all-fallback is spread by MACs instead (two predictions in place of one per
layer)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.estimate.cost import FITTED, CostParams
from core.estimate.gpus import GPU, gpu as gpu_entry
from core.estimate.predict import Prediction, placeholder_calibration, predict
from core.estimate.validation import Band
from core.model.inventory import Layer, tensor_shapes
from core.project import Project
from core.quant.policy import Policy
from core.search.latency import Edge, fusable_edges

EXACT_GAIN_LAYERS = 64
FALLBACK = "fp16"


@dataclass
class Gains:
    """``gain_ms`` per eligible layer (the attribute the searcher reads as ``lat.wall.gain_ms``)."""

    gain_ms: dict[str, float]


@dataclass
class EstimatedLatency:
    project: Project
    base: Policy
    eligible: list[Layer]
    gpu: str | GPU  # a table key, or the GPU itself (a --gpu-spec, a GPU saved in the workspace)
    params: CostParams = field(default_factory=lambda: FITTED)
    tf32: bool = True
    edges: list[Edge] = field(default_factory=list)
    cache: dict = field(default_factory=dict, repr=False)
    wall: Gains = field(default_factory=lambda: Gains({}))
    fp32_total_ms: float = 0.0

    def policy(self, int8) -> Policy:
        """The candidate: ``int8`` layers INT8, the other eligible layers in the FP16 fallback."""
        return self.base.with_layers({l.name: ("int8" if l.name in int8 else FALLBACK) for l in self.eligible})

    def predict(self, int8) -> Prediction:
        key = frozenset(int8)
        if key not in self.cache:
            pol = self.policy(key)
            self.cache[key] = predict(self.project.model, pol, self.project.input_shapes, self.gpu, self.params,
                                      placeholder_calibration(self.project.model, pol), self.tf32)
        return self.cache[key]

    def estimate(self, int8) -> tuple[float, float]:
        """Estimated TensorRT ms and reformat share (%) of the candidate with these layers INT8."""
        p = self.predict(int8)
        return p.total_ms, p.reformat_pct

    def band(self, int8) -> Band | None:
        """The uncertainty band of the candidate's estimate."""
        return self.predict(int8).band

    def estimate_text(self, int8) -> str:
        """"0.860 ms, likely 0.785–0.942 ms" of the candidate."""
        return self.predict(int8).estimate_text()

    def boundaries(self, int8) -> int:
        """Edges whose two layers run in different precisions (INT8 vs the fallback)."""
        return sum((e.producer in int8) != (e.consumer in int8) for e in self.edges)

    def label(self) -> str:
        p = self.predict({l.name for l in self.eligible})
        return f"estimated TensorRT ms on the {p.gpu_name} (an estimate; basis: {p.basis_detail})"


def _gains(lat: EstimatedLatency) -> dict[str, float]:
    names = [l.name for l in lat.eligible]
    everything = set(names)
    top = lat.estimate(everything)[0]
    if len(names) <= EXACT_GAIN_LAYERS:
        return {n: lat.estimate(everything - {n})[0] - top for n in names}
    saving = lat.estimate(set())[0] - top
    macs = {l.name: max(l.macs, 0) for l in lat.eligible}
    total = sum(macs.values())
    return {n: saving * (macs[n] / total if total else 1.0 / len(names)) for n in names}


def estimated_latency(project: Project, base: Policy, eligible: list[Layer], gpu: str | GPU,
                      params: CostParams | None = None, tf32: bool = True) -> EstimatedLatency:
    """The estimate-based latency model of a search (raises MixprecError when the model cannot be
    predicted, e.g. shapes that do not infer: the search then falls back to the INT8 MAC share)."""
    shapes = tensor_shapes(project.model, project.input_shapes)
    lat = EstimatedLatency(project, base, eligible, gpu_entry(gpu), params or FITTED, tf32,
                           fusable_edges(project.model, project.layers, shapes))
    lat.wall = Gains(_gains(lat))
    fp32 = base.with_layers({l.name: "fp32" for l in project.layers})
    lat.fp32_total_ms = predict(project.model, fp32, project.input_shapes, lat.gpu, lat.params, None, tf32).total_ms
    return lat
