"""Isolated sensitivity and a latency-aware mixed-precision search under a quality budget.

The layer-wise comparison (``core.compare``) is cumulative: late layers look sensitive
because early layers are quantized. Here every INT8-eligible layer is measured *on its own*:

* **isolated**: only that layer INT8 (everything else as in the base policy), quality drop
  against FP32 on held-out data;
* **leave-one-out**: every eligible layer INT8 except that one, quality gain.

All trials run on one *switchable* model (``compile_policy(..., switchable=True)``): each
layer's Q/DQ sits behind a boolean graph input, so a trial is one inference pass with other
flags — calibration happens once and is reused, no re-quantization per layer. Trials run in
parallel worker processes.

The search starts from the isolated ranking and the measured per-layer latency gain of INT8
(ORT profiles of the INT8 and FP32 builds; MACs where a layer has no profile entry), falls
back the layers with the worst quality cost per latency gain until the budget holds (binary
search over the fallback count), then tries to put layers back into INT8. Calibration is part
of the search: MinMax, Percentile, Entropy, and a per-tensor mix of the best method per layer.
It chooses on a *dev* half of the evaluation data and verifies the result with a real build on
the other, held-out half. Every evaluated candidate is kept for the Pareto front.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import re
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd

from .calibration import calibrate, calibrate_policy
from .compile import compile_policy
from .data import Dataset
from .errors import MixprecError
from .evaluation import eval_batches, output_name, reference_engine, reference_on, timing_feed
from .inventory import tensor_shapes
from .latency import LatencyModel, fit_latency_model, fusable_edges
from .metrics import Quality, quality
from .policy import CALIB_METHODS, Policy
from .project import Project
from .workspace import atomic_write_bytes, atomic_write_json, sha256_bytes

SEARCH_FORMAT_VERSION = 2  # 2: one shared QuantizeLinear per tensor
MODES = ("isolated", "leave-one-out")
BUDGET_METRICS = {"cosine_mean": "max", "cosine_min": "max", "snr_db": "max", "knn5_overlap": "max",
                  "top1_agreement": "max", "top1_drop": "min"}
SENSITIVITY_COLUMNS = ["rank", "name", "op_type", "macs", "mode", "method", "cosine", "delta", "snr_db"]
CANDIDATE_COLUMNS = ["candidate", "method", "n_int8", "n_fallback", "quality", "est_ms", "int8_mac_share",
                     "est_reformat_pct", "boundaries", "meets_budget", "pareto", "fallback", "int8_layers"]


# --- budget -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> "Budget":
        m = re.fullmatch(r"\s*([a-z0-9_]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(%?)\s*", text or "")
        if not m or m.group(1) not in BUDGET_METRICS:
            raise MixprecError(f"cannot read the budget {text!r}",
                               "write METRIC>=VALUE or METRIC<=VALUE with METRIC one of "
                               + ", ".join(BUDGET_METRICS) + ", e.g. --budget 'cosine_mean>=0.99' or 'top1_drop<=0.5%'")
        metric, op, value = m.group(1), m.group(2), float(m.group(3)) / (100.0 if m.group(4) else 1.0)
        want = ">=" if BUDGET_METRICS[metric] == "max" else "<="
        if op != want:
            raise MixprecError(f"the budget {text!r} bounds {metric} the wrong way",
                               f"write {metric}{want}{m.group(3)}{m.group(4)}")
        return cls(metric, op, value)

    def value_of(self, q: Quality) -> float:
        if self.metric == "top1_drop":  # accuracy drop with labels, else disagreement with FP32's top-1
            if q.top1_accuracy is not None:
                return q.fp32_top1_accuracy - q.top1_accuracy
            return float("nan") if q.top1_agreement is None else 1.0 - q.top1_agreement
        v = getattr(q, self.metric)
        return float("nan") if v is None else float(v)

    def met(self, q: Quality, margin: float = 0.0) -> bool:
        v = self.value_of(q)
        return v >= self.value + margin if self.op == ">=" else v <= self.value - margin

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


# --- trials on the switchable model, in worker processes -----------------------------------
_W: dict = {}


def _worker_init(model_path: str, batches, switch_inputs: list[str], ref: list, out_name: str, threads: int,
                 labels=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    _W.update(sess=ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"]), batches=batches,
              switches=switch_inputs, ref=ref, out=out_name, labels=labels)


def _worker_eval(on: frozenset) -> Quality:
    sess, outs = _W["sess"], []
    flags = {name: np.array(name in on) for name in _W["switches"]}
    for b in _W["batches"]:
        outs.append(sess.run([_W["out"]], {**b, **flags})[0])
    return quality(_W["ref"], outs, _W["out"], _W["labels"])


class TrialPool:
    """Worker processes that each hold one session of the switchable model."""

    def __init__(self, model_path, batches, switch_inputs: dict[str, str], ref, out_name, workers: int = 2,
                 labels=None):
        self.names = switch_inputs  # layer -> input name
        threads = 1 if workers > 1 else 0
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                        initializer=_worker_init,
                                        initargs=(str(model_path), batches, list(switch_inputs.values()), ref,
                                                  out_name, threads, labels))

    def evaluate(self, int8_sets: list[set[str]], progress=None, should_stop=None) -> list[Quality]:
        futures = [self.pool.submit(_worker_eval, frozenset(self.names[l] for l in s)) for s in int8_sets]
        results = []
        for i, f in enumerate(futures):
            if should_stop and should_stop():
                for g in futures:
                    g.cancel()
                raise MixprecError("the search was cancelled", "start it again when you are ready")
            try:
                results.append(f.result())
            except BrokenProcessPool as e:
                raise MixprecError("a search worker process died (out of memory, or a crash in ONNX Runtime)",
                                   "run with --workers 1, or free memory, and try again") from e
            if progress:
                progress((i + 1) / len(futures), f"trial {i + 1}/{len(futures)}")
        return results

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def split_eval(ds: Dataset) -> tuple[Dataset, Dataset]:
    """Dev half (used for choosing) and test half (held out for verifying)."""
    n = ds.num_samples
    if n < 4:
        raise MixprecError(f"the evaluation data has {n} samples: too few to split into dev and held-out halves",
                           "give at least 4 evaluation samples (--eval)")
    cut = n // 2
    return ds.slice(0, cut), ds.slice(cut)


def _batches(project: Project, ds: Dataset):
    return eval_batches(project, ds)


@dataclass
class _Switchable:
    path: str
    switches: dict[str, str]


def _switchable(project: Project, base: Policy, calib, method_tag: str) -> _Switchable:
    """All eligible layers INT8-switchable on top of ``base``; cached in the workspace."""
    pol = base.with_layers({l.name: "int8" for l in project.layers if l.eligible})
    key = sha256_bytes(f"{SEARCH_FORMAT_VERSION}|{project.model.sha256}|{pol.sha256}|{calib.key}".encode())[:24]
    folder = project.ws.sub("search", project.model.sha256[:16])
    path = folder / f"switch-{method_tag}-{key}.onnx"
    meta = path.with_suffix(".json")
    if path.is_file() and meta.is_file():
        return _Switchable(str(path), json.loads(meta.read_text()))
    compiled = compile_policy(project.model, pol, calib, target="ort", switchable=True)
    atomic_write_bytes(path, compiled.serialized())
    atomic_write_json(meta, compiled.switch_inputs)
    return _Switchable(str(path), compiled.switch_inputs)


def _reference(project: Project, ds: Dataset, batches):
    """FP32 outputs on ``ds`` (cached per model and data by runs._reference_outputs)."""
    from .backends import select_backend

    be, _ = select_backend("onnxruntime")
    return reference_on(be, project, ds, batches), output_name(project)


# --- isolated / leave-one-out sensitivity ---------------------------------------------------
@dataclass
class Sensitivity:
    table: pd.DataFrame  # SENSITIVITY_COLUMNS, most harmful first
    mode: str
    method: str
    baseline: Quality  # all switches off (isolated) / all on (leave-one-out)
    seconds: float
    cache_hit: bool


def _sensitivity_key(project, base: Policy, calib_key: str, mode: str, ds: Dataset) -> str:
    return sha256_bytes(f"{SEARCH_FORMAT_VERSION}|{project.model.sha256}|{ds.sha256}|{calib_key}|{base.sha256}|{mode}"
                        .encode())[:24]


def sensitivity(project: Project, mode: str = "isolated", method: str = "minmax", base: Policy | None = None,
                data: Dataset | None = None, workers: int = 2, progress=None, should_stop=None,
                pool: TrialPool | None = None) -> Sensitivity:
    """Per-layer quality drop with only that layer INT8 (isolated), or gain with every other
    eligible layer INT8 (leave-one-out); cached per model, data, calibration and base policy."""
    if mode not in MODES:
        raise MixprecError(f"unknown sensitivity mode {mode!r}", f"use one of {', '.join(MODES)}")
    step = progress or (lambda f, t: None)
    t0 = time.perf_counter()
    base = base or project.default_policy(method=method)
    base = base.with_calibration(replace(base.calibration, method=method))
    data = data or split_eval(project.eval_data)[0]
    eligible = [l for l in project.layers if l.eligible]
    calib = calibrate_policy(project.model, project.calib_data, base.with_layers({l.name: "int8" for l in eligible}),
                             project.layers, project.ws)
    key = _sensitivity_key(project, base, calib.key, mode, data)
    cache = project.ws.sub("search", project.model.sha256[:16]) / f"sensitivity-{mode}-{key}.json"
    if cache.is_file():
        doc = json.loads(cache.read_text())
        return Sensitivity(pd.DataFrame(doc["table"], columns=SENSITIVITY_COLUMNS), mode, method,
                           Quality(**doc["baseline"]), time.perf_counter() - t0, True)
    all_on = {l.name for l in eligible}
    sets = [set() if mode == "isolated" else all_on] + \
        [{l.name} if mode == "isolated" else all_on - {l.name} for l in eligible]
    own = pool is None
    if own:
        step(0.05, "compiling the switchable model")
        sw = _switchable(project, base, calib, method)
        batches = _batches(project, data)
        ref, out_name = _reference(project, data, batches)
        pool = TrialPool(sw.path, batches, sw.switches, ref, out_name, workers, data.labels)
    try:
        res = pool.evaluate(sets, lambda f, t: step(0.1 + 0.9 * f, f"{mode}: {t}"), should_stop)
    finally:
        if own:
            pool.close()
    baseline, trials = res[0], res[1:]
    sign = -1.0 if mode == "isolated" else 1.0  # drop (isolated) / gain (leave-one-out): positive = sensitive
    rows = [(l.name, l.op_type, l.macs, mode, method, q.cosine_mean, sign * (q.cosine_mean - baseline.cosine_mean),
             q.snr_db) for l, q in zip(eligible, trials)]
    df = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS[1:]).sort_values("delta", ascending=False, kind="stable",
                                                                          ignore_index=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    atomic_write_json(cache, {"table": df.to_dict(orient="records"), "baseline": asdict(baseline)})
    return Sensitivity(df, mode, method, baseline, time.perf_counter() - t0, False)


# --- latency model (core.latency) ---------------------------------------------------------------
def latency_model(project: Project, base: Policy, calib, backend: str = "onnxruntime",
                  trt_options: dict | None = None) -> LatencyModel:
    """Fit ``core.latency.LatencyModel`` on the backend's profiles of ``base`` with every eligible
    layer FP16 (the search's fallback), with every eligible layer INT8, and of the FP32 reference,
    with their wall-clock medians (interleaved with the reference). On TensorRT the per-element
    conversion costs come out zero (its Reformat layers do not carry mixprec's node names), so
    only the per-layer gains order the candidates there."""
    from .backends import select_backend

    be, _ = select_backend(backend, **(trt_options or {}))
    eligible = [l for l in project.layers if l.eligible]
    feed = timing_feed(project)
    profiles, wall, refs = {}, {}, []
    ref = reference_engine(be, project)
    for prec in ("int8", "fp16"):
        pol = base.with_layers({l.name: prec for l in eligible})
        folder = project.ws.sub("search", project.model.sha256[:16], "latency", be.name, prec)
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


# --- the search -------------------------------------------------------------------------------
@dataclass
class Candidate:
    method: str
    int8: frozenset
    quality: Quality
    est_ms: float
    int8_mac_share: float
    est_reformat_pct: float
    meets_budget: bool
    boundaries: int = 0  # edges between an INT8 layer and an FP16 one (core.latency)


@dataclass
class SearchResult:
    budget: Budget
    policy: Policy
    met_on_dev: bool
    met_on_holdout: bool | None
    holdout: Quality | None
    message: str
    candidates: pd.DataFrame  # CANDIDATE_COLUMNS, with the Pareto flag
    sensitivity: Sensitivity
    run: object | None = None  # RunResult of the verifying build
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)  # calibration variant -> its base Policy

    def policy_for(self, candidate: int) -> Policy:
        """The policy of any evaluated candidate (e.g. a point of the front the user picks)."""
        return candidate_policy(self.variants, self.candidates.set_index("candidate").loc[candidate])

    def to_json(self) -> dict:
        q = self.holdout
        return {
            "budget": str(self.budget), "met_on_dev": self.met_on_dev, "met_on_holdout": self.met_on_holdout,
            "message": self.message, "seconds": self.seconds, "timings": self.timings,
            "policy": self.policy.to_dict(),
            "precision_counts": self.policy.precision_counts(),
            "holdout_quality": asdict(q) if q else None,
            "build": {k: v for k, v in self.run.to_json().items() if k != "per_layer"} if self.run else None,
            "front": self.candidates[self.candidates.pareto].drop(columns=["fallback"]).to_dict(orient="records"),
            "candidates": len(self.candidates),
            "variants": {k: v.to_dict() for k, v in self.variants.items()},
        }


def candidate_policy(variants: dict, row) -> Policy:
    """Policy of a candidate row (``method``, ``int8_layers``) on top of its variant's base policy:
    its INT8 layers INT8, the other eligible layers FP16."""
    base = variants[row["method"]]
    int8 = set(filter(None, str(row["int8_layers"]).split(",")))
    eligible_now = {n for n, p in base.layers.items() if p == "int8"}
    return base.with_layers({n: ("int8" if n in int8 else "fp16") for n in eligible_now | int8})


def front_policy(doc: dict, candidate: int, project: Project) -> Policy:
    """From a stored ``SearchResult.to_json()`` document: the policy of one front point, validated."""
    from .policy import policy_from_dict

    rows = {r["candidate"]: r for r in doc["front"]}
    if candidate not in rows:
        raise MixprecError(f"candidate {candidate} is not on the stored Pareto front",
                           "pick one of the front's points: " + ", ".join(map(str, sorted(rows))))
    variants = {k: policy_from_dict(v, project.model, project.layers) for k, v in doc["variants"].items()}
    return candidate_policy(variants, rows[candidate])


def pareto_flags(quality_vals: np.ndarray, latency_vals: np.ndarray) -> np.ndarray:
    """Non-dominated points for (quality ↑, latency ↓)."""
    n = len(quality_vals)
    flags = np.ones(n, dtype=bool)
    for i in range(n):
        better_eq = (quality_vals >= quality_vals[i]) & (latency_vals <= latency_vals[i])
        strictly = (quality_vals > quality_vals[i]) | (latency_vals < latency_vals[i])
        flags[i] = not np.any(better_eq & strictly)
    return flags


class _Searcher:
    def __init__(self, budget, pool, lat: LatencyModel, method, margin, eligible):
        self.budget, self.pool, self.lat, self.method, self.margin = budget, pool, lat, method, margin
        self.macs = {l.name: l.macs for l in eligible}
        self.total_macs = max(sum(self.macs.values()), 1)
        self.seen: dict[frozenset, Candidate] = {}

    def eval(self, sets: list[set[str]]) -> list[Candidate]:
        todo = [frozenset(s) for s in sets if frozenset(s) not in self.seen]
        if todo:
            for s, q in zip(todo, self.pool.evaluate([set(s) for s in todo])):
                est, rf = self.lat.estimate(set(s))
                self.seen[s] = Candidate(self.method, s, q, est, sum(self.macs[l] for l in s) / self.total_macs, rf,
                                         self.budget.met(q, self.margin), self.lat.boundaries(set(s)))
        return [self.seen[frozenset(s)] for s in sets]

    def run(self, order: list[str]) -> Candidate:
        """``order``: fallback priority, worst quality cost per latency gain first. Layers whose
        INT8 saves no time start in the fallback set and never return."""
        slow = [l for l in order if self.lat.wall.gain_ms.get(l, 0.0) <= 0]
        order = slow + [l for l in order if l not in slow]
        lo, hi = len(slow), len(order)  # smallest fallback count k that meets the budget (binary search)
        if self.eval([set(order[lo:])])[0].meets_budget:
            return self.best()
        if not self.eval([set()])[0].meets_budget:
            return self.best()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = self.eval([set(order[mid:])])[0].meets_budget
            lo, hi = (lo, mid) if ok else (mid, hi)
        # refinement: try the fallback layers back in INT8, the one that saves the most time
        # *now* first — a layer next to an INT8 neighbour also saves the conversions between them
        int8 = set(order[hi:])
        todo = [l for l in order[:hi] if l not in slow]
        while todo:
            now = self.lat.estimate(int8)[0]
            layer = max(todo, key=lambda l: now - self.lat.estimate(int8 | {l})[0])
            todo.remove(layer)
            if self.eval([int8 | {layer}])[0].meets_budget:
                int8 = int8 | {layer}
        return self.best()

    def best(self) -> Candidate:
        """The fastest (estimated) candidate that meets the budget — at equal time the one with
        fewer INT8/FP16 boundaries, then the better quality — else the best quality."""
        ok = [c for c in self.seen.values() if c.meets_budget]
        if ok:
            return min(ok, key=_preference(self.budget))
        return max(self.seen.values(), key=lambda c: self.budget.value_of(c.quality))


def _preference(budget: Budget):
    """Sort key among candidates that meet the budget: estimated time (to 0.1 %), then fewer
    boundaries (contiguous INT8 regions), then quality."""
    def key(c: Candidate):
        return (round(math.log(max(c.est_ms, 1e-9)), 3), c.boundaries, -budget.value_of(c.quality))
    return key


def default_margin(budget: Budget) -> float:
    """0.5 dB for SNR; a tenth of the distance to perfect for the bounded metrics."""
    if budget.metric == "snr_db":
        return 0.5
    return 0.1 * (budget.value if budget.metric == "top1_drop" else 1.0 - budget.value)


def search(project: Project, budget: Budget | str, methods=CALIB_METHODS, margin: float | None = None,
           workers: int = 2, verify: bool = True, smooth: bool = False, smooth_alpha: float = 0.75,
           smooth_top: int | None = None, progress=None, should_stop=None, backend: str = "auto",
           trt_options: dict | None = None) -> SearchResult:
    """A policy meeting ``budget`` on held-out data with the most INT8 latency benefit.

    ``smooth`` adds a variant with SmoothQuant-style scaling (``smooth_alpha``) on the inputs of
    the ``smooth_top`` most sensitive MatMuls with constant weights (default: all of them); it is
    kept only if its best candidate beats the unsmoothed ones. ``backend`` (``auto`` picks
    TensorRT where it runs) fits the latency model and builds the verification run; the quality
    trials always run on ONNX Runtime's switchable model. (MiniLM, cosine_mean>=0.995:
    alpha 0.5 on all 36 → 76 % of MACs INT8; alpha 0.75 → 97 %.)"""
    from .backends import select_backend

    t_start = time.perf_counter()
    budget = Budget.parse(budget) if isinstance(budget, str) else budget
    select_backend(backend, **(trt_options or {}))  # a backend that cannot run fails now, not minutes in
    if margin is None:  # headroom on dev so the held-out half meets the budget too
        margin = default_margin(budget)
    step = progress or (lambda f, t: None)
    dev, test = split_eval(project.eval_data)
    base = project.default_policy()
    eligible = [l for l in project.layers if l.eligible]
    if not eligible:
        raise MixprecError(f"{project.model.name} has no INT8-eligible layers (MatMul, Gemm, Conv, ConvTranspose)",
                           "there is nothing to search: build the FP16 policy instead")
    batches = _batches(project, dev)
    ref, out_name = _reference(project, dev, batches)
    if math.isnan(budget.value_of(quality(ref, ref, out_name, dev.labels))):
        raise MixprecError(f"the budget metric {budget.metric} does not apply to {project.model.name}'s output",
                           "use cosine_mean, cosine_min or snr_db (top-1 needs logits, knn5_overlap needs embeddings)")
    timings = {}
    # 1) isolated sensitivity per calibration method (one switchable model each)
    sens, switch = {}, {}
    for k, m in enumerate(methods):
        t0 = time.perf_counter()
        pol_m = base.with_calibration(replace(base.calibration, method=m))
        calib = calibrate(project.model, project.calib_data, pol_m.calibration, project.ws)
        switch[m] = (_switchable(project, pol_m, calib, m), pol_m)
        sw = switch[m][0]
        with TrialPool(sw.path, batches, sw.switches, ref, out_name, workers, dev.labels) as pool:
            sens[m] = sensitivity(project, "isolated", m, base, dev, workers,
                                  lambda f, t, k=k: step(0.02 + 0.4 * (k + f) / len(methods), f"isolated ({m}): {t}"),
                                  should_stop, pool)
        timings[f"isolated_{m}_s"] = time.perf_counter() - t0
    # per-tensor mix: each layer's activation ranges from the method with the smallest isolated drop
    best = {}
    for m in methods:  # (the smoothed variant is not part of the mix)
        for row in sens[m].table.itertuples():
            if row.name not in best or row.delta < best[row.name][1]:
                best[row.name] = (m, row.delta)
    variants = list(methods)
    first = methods[0]
    per_tensor = tuple(sorted({(i, best[l.name][0]) for l in eligible for i in l.inputs
                               if best[l.name][0] != first and i not in project.model.initializer_names()}))
    if per_tensor:
        pol_mix = base.with_calibration(replace(base.calibration, method=first, per_tensor=per_tensor))
        calib_mix = calibrate(project.model, project.calib_data, pol_mix.calibration, project.ws)
        switch["mixed"] = (_switchable(project, pol_mix, calib_mix, "mixed"), pol_mix)
        variants.append("mixed")
    if smooth:
        weighted = {l.name for l in eligible if l.op_type == "MatMul" and len(l.inputs) > 1
                    and l.inputs[1] in project.model.initializer_names()}
        targets = [n for n in sens[first].table.name if n in weighted][:smooth_top or len(weighted)]
        pol_s = switch[first][1].with_smoothing({n: smooth_alpha for n in targets})
        calib_s = calibrate_policy(project.model, project.calib_data,
                                   pol_s.with_layers({l.name: "int8" for l in eligible}), project.layers, project.ws)
        sw = _switchable(project, pol_s, calib_s, "smoothed")
        switch["smoothed"] = (sw, pol_s)
        with TrialPool(sw.path, batches, sw.switches, ref, out_name, workers, dev.labels) as pool:
            sens["smoothed"] = sensitivity(project, "isolated", first, pol_s, dev, workers,
                                           lambda f, t: step(0.43, f"isolated (smoothed): {t}"), should_stop, pool)
        variants.append("smoothed")
    # 2) latency model from measured profiles
    t0 = time.perf_counter()
    step(0.45, "profiling INT8 and FP32 per layer")
    lat = latency_model(project, switch[first][1], calibrate(project.model, project.calib_data,
                                                               switch[first][1].calibration, project.ws),
                        backend, trt_options)
    timings["latency_model_s"] = time.perf_counter() - t0
    # 3) greedy fallback + refinement per calibration variant
    chosen: list[Candidate] = []
    all_candidates: list[Candidate] = []
    for k, v in enumerate(variants):
        t0 = time.perf_counter()
        step(0.5 + 0.35 * k / len(variants), f"searching with {v} calibration")
        if should_stop and should_stop():
            raise MixprecError("the search was cancelled", "start it again when you are ready")
        drop = {row.name: max(row.delta, 0.0) for row in sens[v if v in sens else first].table.itertuples()}
        if v == "mixed":
            drop = {name: max(d, 0.0) for name, (_, d) in best.items()}
        # harm per benefit: layers whose INT8 saves no time go first, then the worst drop per ms saved
        eps = 1e-6
        order = sorted((l.name for l in eligible),
                       key=lambda n: (lat.wall.gain_ms[n] > eps, -(drop[n] / max(lat.wall.gain_ms[n], eps))))
        sw = switch[v][0]
        with TrialPool(sw.path, batches, sw.switches, ref, out_name, workers, dev.labels) as pool:
            s = _Searcher(budget, pool, lat, v, margin, eligible)
            chosen.append(s.run(order))
            all_candidates.extend(s.seen.values())
        timings[f"search_{v}_s"] = time.perf_counter() - t0
    ok = [c for c in chosen if c.meets_budget]
    if ok:
        pick = min(ok, key=_preference(budget))
        message = (f"meets {budget} on the dev half with {len(pick.int8)}/{len(eligible)} layers INT8 "
                   f"({100 * pick.int8_mac_share:.0f}% of eligible MACs), {pick.method} calibration")
    else:
        pick = max(all_candidates, key=lambda c: budget.value_of(c.quality))
        message = (f"NO policy meets {budget}: the best candidate reaches {budget.metric}="
                   f"{budget.value_of(pick.quality):.4f} ({len(pick.int8)} layers INT8). Relax the budget, or "
                   "add calibration data")
    pol_pick = switch[pick.method][1]
    policy = pol_pick.with_layers({l.name: ("int8" if l.name in pick.int8 else "fp16") for l in eligible})
    table = _candidate_table(all_candidates, budget, [l.name for l in eligible])
    run, holdout, met_holdout = None, None, None
    if verify:
        from .runs import build_and_measure

        step(0.88, "verifying the chosen policy on the held-out half")
        held = replace(project, eval_data=test)
        run = build_and_measure(held, policy, backend=backend, label=f"search {budget}", trt_options=trt_options)
        holdout = run.quality
        met_holdout = budget.met(holdout)
        message += f"; held-out half: {budget.metric}={budget.value_of(holdout):.4f} " + \
            ("(meets the budget)" if met_holdout else "(does NOT meet the budget)")
    step(1.0, "done")
    return SearchResult(budget, policy, bool(ok), met_holdout, holdout, message, table, sens[first], run,
                        time.perf_counter() - t_start, timings, {v: switch[v][1] for v in variants})


def _candidate_table(cands: list[Candidate], budget: Budget, eligible: list[str]) -> pd.DataFrame:
    rows = [(i, c.method, len(c.int8), 0, budget.value_of(c.quality), c.est_ms, c.int8_mac_share, c.est_reformat_pct,
             c.boundaries, c.meets_budget, False, "", ",".join(sorted(c.int8))) for i, c in enumerate(cands)]
    df = pd.DataFrame(rows, columns=CANDIDATE_COLUMNS).drop_duplicates(["quality", "est_ms"], ignore_index=True)
    cands = [cands[i] for i in df.candidate]
    q = df.quality.to_numpy() if budget.op == ">=" else -df.quality.to_numpy()
    df["pareto"] = pareto_flags(q, df.est_ms.to_numpy())
    df["n_fallback"] = [len(eligible) - len(c.int8) for c in cands]
    df["fallback"] = [",".join(sorted(set(eligible) - set(c.int8))) for c in cands]
    return df
