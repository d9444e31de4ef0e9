"""A latency-aware mixed-precision search under a quality budget.

The search starts from the isolated ranking (``core.sensitivity``) and the measured per-layer
latency gain of INT8 (``core.search.latency``: profiles of the INT8 and FP16 builds), falls back
the layers with the worst quality cost per latency gain until the budget holds (binary search
over the fallback count), then tries to put layers back into INT8. Calibration is part of the
search: MinMax, Percentile, Entropy, and a per-tensor mix of the best method per layer (and,
with ``smooth``, a SmoothQuant-style variant). It chooses on a *dev* half of the evaluation data
and verifies the result with a real build on the other, held-out half. Every evaluated candidate
is kept for the Pareto front. It starts from the project's default policy under ``SearchConfig.network_default``
(the draft's, as ``--network-default`` sets it): the layers the search does not set stay at it, so under FP16 every
layer of the chosen policy that is not INT8 is FP16 (those that default otherwise aside: LayerNorm, Softmax, the
embeddings, control flow).

Steps of :func:`search`: prepare (budget, data halves, FP32 reference), variants (one switchable
model and isolated ranking per calibration variant), fit (the latency model), choose (fallback
search per variant, the best candidate), verify (a real build on the held-out half).

The objective (``SearchConfig.objective``): ``latency`` orders and ranks candidates by the latency
model's estimate (fitted on the measuring backend's profiles); ``trt_estimate`` by each candidate's
estimated TensorRT time on ``SearchConfig.gpu`` (``core.search.estimated``: the engine its compiled
ONNX would build, priced by the cost model), for a TensorRT target where TensorRT does not run
(optimising ONNX Runtime CPU time would optimise the wrong hardware) — candidates whose estimates
differ by less than the estimate's difference band (``core.estimate.validation``: the error of the ratio
of two estimates of one model on one GPU, measured on pairs of validation engines) are a tie, broken
by fewer INT8/float boundaries, then quality, and the verdict says so (:func:`band_ties`); ``mac_share`` by the INT8
share of MACs, then the fewest INT8/float boundaries (hardware-neutral), the fallback when the
estimate cannot be made. ``auto`` picks ``trt_estimate`` for a TensorRT target without TensorRT,
else ``latency`` (:func:`search_objective`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from core.backends import select_backend
from core.errors import MixprecError
from core.estimate.cost import CostParams
from core.estimate.gpus import FIXTURE_GPU, GPU
from core.measure.evaluation import MetricSpec, evaluate
from core.measure.runs import GENERATED_NOTE, WARN_BELOW, RunResult, build_and_measure, is_generated
from core.model.data import Dataset
from core.model.inventory import Layer, require_eligible
from core.project import Project
from core.quant.calibration import calibrate, calibrate_policy
from core.quant.policy import CALIB_METHODS, Policy
from core.search.budget import Budget, default_margin
from core.search.duration import CountedPool, TrialCount, expected_trials, variant_trials
from core.search.estimated import EstimatedLatency, estimated_latency
from core.search.latency import LatencyModel, latency_model
from core.search.result import Candidate, SearchResult, candidate_number, candidate_table, chosen_candidate
from core.sensitivity import Sensitivity, Switchable, TrialData, open_trial_pool, sensitivity, \
    sensitivity_file, split_eval, switchable_model, trial_data

OBJECTIVES = ("auto", "latency", "trt_estimate", "mac_share")
MAC_SHARE_NOTE = ("Objective: INT8 MAC share, then the fewest INT8/float boundaries (hardware-neutral). The target is "
                  "TensorRT and TensorRT is not available here, so the search does not optimise CPU latency; its "
                  "estimated ms are ONNX Runtime CPU estimates, shown for reference only.")
TRT_ESTIMATE_NOTE = ("Objective: the estimated TensorRT time of each candidate (the engine its compiled ONNX would "
                     "build, priced by the cost model), then the fewest INT8/float boundaries. The target is "
                     "TensorRT and TensorRT is not available here, so the search does not optimise CPU latency; its "
                     "ms are {label}.")


def search_objective(objective: str, target: str, backend: str) -> str:
    """The objective a search uses: ``objective`` unless ``auto``; then ``trt_estimate`` when the
    deployment ``target`` is TensorRT and the ``backend`` that measures is not (measured TensorRT time
    wins where TensorRT runs), else ``latency``."""
    if objective not in OBJECTIVES:
        raise MixprecError(f"unknown search objective {objective!r}", f"use one of {', '.join(OBJECTIVES)}")
    if objective != "auto":
        return objective
    return "trt_estimate" if target == "tensorrt" and backend != "tensorrt" else "latency"


@dataclass
class SearchConfig:
    """What to search for and how. ``smooth`` adds a variant with SmoothQuant-style scaling
    (``smooth_alpha``) on the inputs of the ``smooth_top`` most sensitive MatMuls with constant
    weights (default: all of them); it is kept only if its best candidate beats the unsmoothed
    ones. ``backend`` (``auto`` picks TensorRT where it runs) fits the latency model and builds
    the verification run; the quality trials always run on ONNX Runtime's switchable model.
    ``margin``: headroom on the dev half (default :func:`default_margin`). ``warn_below``: the
    verifying build warns below this cosine_mean (the verdict then says so). ``objective``:
    ``latency``, ``trt_estimate``, ``mac_share`` or ``auto`` (:func:`search_objective`); ``gpu``,
    ``cost_params`` and ``tf32`` configure ``trt_estimate``."""

    budget: Budget | str
    methods: tuple = CALIB_METHODS
    margin: float | None = None
    workers: int = 2
    ray: str | None = None  # trials on the Ray cluster at this address (else $MIXPREC_RAY_ADDRESS, else local)
    verify: bool = True
    smooth: bool = False
    smooth_alpha: float = 0.75
    smooth_top: int | None = None
    backend: str = "auto"
    trt_options: dict | None = None
    warn_below: float = WARN_BELOW
    objective: str = "auto"
    gpu: str | GPU = FIXTURE_GPU        # trt_estimate: the GPU of the estimate (a table key, or a GPU of a spec)
    cost_params: CostParams | None = None  # trt_estimate: a calibration for ``gpu`` (default: the fixture fit)
    tf32: bool = True                   # trt_estimate: FP32 layers may use TF32 (trtexec's default)
    metrics: MetricSpec | None = None   # what quality is measured on (core.measure.evaluation): trials and the build
    refine: bool = True                 # the put-back pass after the fallback search (False: a quick search)
    network_default: str = "fp32"       # the base policy's network default (core.quant.policy.NETWORK_DEFAULTS)


QUICK_NOTE = "Quick search"  # what the verdict of a search of one method or without the put-back pass starts with


def quick_note(config: SearchConfig) -> str:
    """What a quick search left out, for its verdict ("" for a full search)."""
    left = ([f"{', '.join(config.methods)} calibration only"] if len(config.methods) < len(CALIB_METHODS) else []) \
        + ([] if config.refine else ["no put-back pass"])
    return f"{QUICK_NOTE}: {'; '.join(left)} (the full search may keep more layers INT8)" if left else ""


def network_default_note(network_default: str) -> str:
    """What the verdict of a search from another network default than FP32 says of it."""
    return (f"Network default {network_default.upper()}: every layer the search does not make INT8 is "
            f"{network_default.upper()} (LayerNorm, Softmax, embeddings and control flow keep their defaults)")


def chosen_policy(base: Policy, pick: Candidate, eligible: list[Layer]) -> Policy:
    """The policy of ``pick`` on its variant's ``base``: its INT8 layers INT8, the other eligible layers FP16 (the
    search's fallback, ``core.search.latency``); every other layer as ``base`` has it (its network default)."""
    return base.with_layers({l.name: ("int8" if l.name in pick.int8 else "fp16") for l in eligible})


@dataclass
class Variant:
    """One calibration variant of the search: its base policy, its switchable model and the
    isolated cosine drop per eligible layer (>= 0) that orders its fallback."""

    name: str  # a calibration method, "mixed" or "smoothed"
    policy: Policy
    switchable: Switchable
    drop: dict[str, float]
    calib: object = None  # its calibration (the first variant's fits the latency model)


@dataclass
class _Context:
    """What every step of one search reads."""

    project: Project
    config: SearchConfig
    budget: Budget
    margin: float
    dev: Dataset
    test: Dataset
    eligible: list[Layer]
    base: Policy  # the project's default policy under the config's network default
    data: TrialData  # the dev half's batches and FP32 outputs
    step: object
    should_stop: object
    timings: dict = field(default_factory=dict)
    objective: str = "latency"  # resolved: "latency", "trt_estimate" or "mac_share"
    skipped: list = field(default_factory=list)  # calibration methods that could not run, and why
    trials: TrialCount = field(default_factory=TrialCount)  # over every pool (core.search.duration), in the stage

    def check_stop(self):
        if self.should_stop and self.should_stop():
            raise MixprecError("the search was cancelled", "start it again when you are ready")


class _Searcher:
    def __init__(self, budget, pool, lat: LatencyModel, method, margin, eligible, objective: str = "latency",
                 put_back: bool = True):
        self.budget, self.pool, self.lat, self.method, self.margin = budget, pool, lat, method, margin
        self.put_back = put_back
        self.objective = objective
        self.macs = {l.name: l.macs for l in eligible}
        self.total_macs = max(sum(self.macs.values()), 1)
        self.seen: dict[frozenset, Candidate] = {}

    def eval(self, sets: list[set[str]]) -> list[Candidate]:
        todo = [frozenset(s) for s in sets if frozenset(s) not in self.seen]
        if todo:
            for s, q in zip(todo, self.pool.evaluate([set(s) for s in todo])):
                est, rf = self.lat.estimate(set(s))
                band = self.lat.band(set(s)) if hasattr(self.lat, "band") else None
                self.seen[s] = Candidate(self.method, s, q, est, sum(self.macs[l] for l in s) / self.total_macs, rf,
                                         self.budget.met(q, self.margin), self.lat.boundaries(set(s)),
                                         band.low_ms if band else math.nan, band.high_ms if band else math.nan)
        return [self.seen[frozenset(s)] for s in sets]

    def run(self, order: list[str]) -> Candidate:
        """``order``: fallback priority, worst quality cost per latency gain first. Layers whose
        INT8 saves no time start in the fallback set and never return."""
        slow = [l for l in order if self.gain(l) <= 0]
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
        if self.put_back:
            self.refine(set(order[hi:]), [l for l in order[:hi] if l not in slow])
        return self.best()

    def gain(self, layer: str) -> float:
        """What putting ``layer`` in INT8 gains under the objective: ms saved, or MACs."""
        return self.macs.get(layer, 0) if self.objective == "mac_share" else self.lat.wall.gain_ms.get(layer, 0.0)

    def saving(self, int8: set[str], layer: str, now: float) -> float:
        """Time saved now by adding ``layer`` to ``int8`` (``trt_estimate``: its leave-one-out gain,
        not a new prediction per layer and step)."""
        if self.objective == "trt_estimate":
            return self.gain(layer)
        return now - self.lat.estimate(int8 | {layer})[0]

    def refine(self, int8: set[str], todo: list[str]):
        """Try the fallback layers back in INT8, the one that saves the most time *now* first —
        a layer next to an INT8 neighbour also saves the conversions between them (``mac_share``:
        the most MACs first, then the fewest boundaries it leaves)."""
        while todo:
            now = self.lat.estimate(int8)[0]
            if self.objective == "mac_share":
                layer = max(todo, key=lambda l: (self.macs[l], -self.lat.boundaries(int8 | {l})))
            else:
                layer = max(todo, key=lambda l: self.saving(int8, l, now))
            todo.remove(layer)
            if self.eval([int8 | {layer}])[0].meets_budget:
                int8 = int8 | {layer}

    def best(self) -> Candidate:
        """The fastest (estimated) candidate that meets the budget — at equal time the one with
        fewer INT8/FP16 boundaries, then the better quality — else the best quality (``mac_share``:
        the largest INT8 MAC share instead of the fastest)."""
        ok = [c for c in self.seen.values() if c.meets_budget]
        if ok:
            return min(ok, key=preference_key(self.budget, self.objective))
        return max(self.seen.values(), key=lambda c: _better(self.budget, c))


def _better(budget: Budget, c: Candidate) -> float:
    """The candidate's quality under the budget's metric, larger is better (a ``<=`` metric negated)."""
    v = budget.value_of(c.quality)
    return v if budget.op == ">=" else -v


def preference_key(budget: Budget, objective: str = "latency"):
    """Sort key among candidates that meet the budget: estimated time (to 0.1 %) — or, for
    ``mac_share``, the INT8 MAC share (to 0.01 %, larger first) — then fewer boundaries
    (contiguous INT8 regions), then quality."""
    def key(c: Candidate):  # latency and trt_estimate: by estimated time
        if objective == "mac_share":
            return (-round(c.int8_mac_share, 4), c.boundaries, -_better(budget, c))
        return (round(math.log(max(c.est_ms, 1e-9)), 3), c.boundaries, -_better(budget, c))
    return key


@dataclass
class Tie:
    """Candidates within the estimate's difference band of the fastest one (or, without one, within its
    band), and the one chosen among them."""

    fastest: Candidate
    pick: Candidate
    ties: list            # every candidate within the window of the fastest (the fastest included)
    pct: float            # the window's half-width, % (the fastest's difference band, else its band)
    kind: str = "band"    # "difference band": the error of an estimated ratio; "band": the absolute estimate's
    qualifier: str = ""   # what the window rests on when it is not validated ("unvalidated on Hopper GPUs")

    @property
    def window(self) -> str:
        """"the estimate's ±14 % difference band" / "the estimate's band (±12 %)"."""
        if self.kind == "difference band":
            return f"the estimate's ±{self.pct:.0f} % difference band" + \
                (f" ({self.qualifier})" if self.qualifier else "")
        return f"the estimate's band (±{self.pct:.0f} %)"

    @property
    def reason(self) -> str:
        """Why ``pick`` won the tie: "boundaries" (fewer) or "quality" (better, at equal boundaries);
        "" when the fastest stays."""
        if self.pick is self.fastest:
            return ""
        return "boundaries" if self.pick.boundaries < self.fastest.boundaries else "quality"


def band_ties(ok: list[Candidate], budget: Budget, band_of=None) -> Tie:
    """Among the candidates that meet the budget: the fastest (:func:`preference_key`) and the ones whose
    estimate is within the fastest's *difference band* (``band_of(candidate)``: its
    :class:`~core.estimate.validation.Band`, whose ``diff_log_spread`` is the error of the ratio of two
    estimates of one model on one GPU: |log(est / est_fastest)| <= it) — a tie, broken by fewer
    boundaries, then better quality, then the estimate. Without a difference band, the fastest's band
    (``est_high_ms`` / ``est_ms``: the error of one absolute estimate); without either, no tie."""
    fastest = min(ok, key=preference_key(budget, "trt_estimate"))
    b = band_of(fastest) if band_of is not None else None
    if b is not None and getattr(b, "has_diff", False) and b.diff_log_spread > 0:
        spread, kind, qualifier = b.diff_log_spread, "difference band", b.diff_qualifier()
    else:
        spread = math.log(fastest.est_high_ms / fastest.est_ms) if fastest.est_ms > 0 and \
            math.isfinite(fastest.est_high_ms) and fastest.est_high_ms > fastest.est_ms else 0.0
        kind, qualifier = "band", ""
    ties = [c for c in ok if c is fastest or (c.est_ms > 0 and abs(math.log(c.est_ms / fastest.est_ms)) <= spread)]
    pick = min(ties, key=lambda c: (c.boundaries, -_better(budget, c), c.est_ms))
    if (pick.boundaries, -_better(budget, pick)) == (fastest.boundaries, -_better(budget, fastest)):
        pick = fastest  # nothing beats the fastest on the tie-breaks: it stays
    return Tie(fastest, pick, ties, 100.0 * math.expm1(spread), kind, qualifier)


def _point(number: int | None, c: Candidate) -> str:
    return (f"#{number}" if number is not None else "a candidate") + \
        f" ({c.est_ms:.4g} ms est., {_n(len(c.int8), 'layer')} INT8, {_n(c.boundaries, 'boundary', 'boundaries')})"


def _n(k: int, one: str, many: str | None = None) -> str:
    return f"{k} {one if k == 1 else (many or one + 's')}"


def tie_note(tie: Tie | None, budget: Budget, number) -> str:
    """What the verdict says about a tie inside the estimate's difference band (or band): "… are within the
    estimate's ±14 % difference band: a tie; chose #3, …" (``number``: candidate -> its number)."""
    if tie is None or len(tie.ties) < 2:
        return ""
    f, p, band = tie.fastest, tie.pick, tie.window
    if p is f:
        return (f"{len(tie.ties)} candidates are within {band} of the fastest, {_point(number(f), f)}: a tie; "
                f"it has the fewest boundaries (then the best quality) among them, so it stays chosen")
    why = ("fewer boundaries" if tie.reason == "boundaries" else
           f"the same boundaries and the better quality ({budget.metric} {budget.value_of(p.quality):.4f} vs "
           f"{budget.value_of(f.quality):.4f})")
    who = (f"the fastest, {_point(number(f), f)}, and {_point(number(p), p)} are within {band}" if len(tie.ties) == 2
           else f"{len(tie.ties)} candidates, among them the fastest, {_point(number(f), f)}, and "
                f"{_point(number(p), p)}, are within {band} of the fastest")
    return f"{who[0].upper()}{who[1:]}: a tie; chose {'#' + str(number(p)) if number(p) is not None else 'it'}, " \
        f"the one with {why}"


# --- the steps ------------------------------------------------------------------------------
def _prepare(project: Project, config: SearchConfig, progress, should_stop) -> _Context:
    """Check what can fail early (budget, backend, eligible layers, budget metric) and split the data."""
    budget = Budget.parse(config.budget) if isinstance(config.budget, str) else config.budget
    base = project.default_policy(config.network_default)  # a network default that is not fp32/fp16 fails here
    be, _ = select_backend(config.backend, **(config.trt_options or {}))  # a backend that cannot run fails now
    objective = search_objective(config.objective, project.target, be.name)
    margin = default_margin(budget) if config.margin is None else config.margin  # so the held-out half meets it too
    dev, test = split_eval(project.eval_data)
    eligible = require_eligible(project.model.name, project.layers, "search")
    data = trial_data(project, dev, config.metrics)
    ref = {data.out_name: data.ref, **(data.extra or {})}
    fp32 = evaluate(config.metrics, ref, ref, dev.labels, data.batches)  # a user metric's errors show before any trial
    if math.isnan(budget.value_of(fp32)):
        if budget.output is not None and budget.output not in (fp32.outputs or {}):
            raise MixprecError(f"the budget {budget} names the metric output {budget.output!r}, which is not measured",
                               "give it with --metric-output NAME=OUTPUT[...,A:B]" + (
                                   f" (measured: {', '.join(fp32.outputs)})" if fp32.outputs else ""))
        raise MixprecError(f"the budget metric {budget.metric} does not apply to {project.model.name}'s output",
                           "use cosine_mean, cosine_min or snr_db (top-1 needs logits, knn5_overlap needs embeddings, "
                           "mask_iou a dense map, score_cosine/score_topk/box_iou a detection head, user --metric-file)")
    trials = TrialCount(0, expected_trials(len(eligible), len(config.methods), config.smooth, config.refine))
    return _Context(project, config, budget, margin, dev, test, eligible, base, data,
                    _Step(progress, trials), should_stop, objective=objective, trials=trials)


class _Step:
    """The search's progress: each stage text with its count over every trial (``core.search.progress``, where the job
    list reads the time left); a finished trial says the last stage again with the new count."""

    def __init__(self, progress, trials: TrialCount):
        self.progress, self.trials, self.last = progress, trials, (0.0, "starting")

    def __call__(self, fraction: float, text: str) -> None:
        self.last = (fraction, text)
        if self.progress is not None:
            count = self.trials.text()
            self.progress(fraction, f"{text} · {count}" if count else text)

    def trial(self) -> None:
        self.trials.add()
        self(*self.last)


def _counted(ctx: _Context, pool) -> CountedPool:
    return CountedPool(pool, ctx.step.trial if isinstance(ctx.step, _Step) else ctx.trials.add)


def _isolated(ctx: _Context, method: str, base: Policy, sw: Switchable, progress) -> Sensitivity:
    with open_trial_pool(sw, ctx.data, ctx.config.workers, ctx.config.ray, ctx.project.ws) as pool:
        sens = sensitivity(ctx.project, "isolated", method, base, ctx.dev, ctx.config.workers, progress,
                           ctx.should_stop, _counted(ctx, pool), metrics=ctx.config.metrics)
    if sens.cache_hit:  # stored already: its trials are not run
        ctx.trials.expect(-(len(ctx.eligible) + 1))
    return sens


def _drops(sens: Sensitivity) -> dict[str, float]:
    return {row.name: max(row.delta, 0.0) for row in sens.table.itertuples()}


def _method_variants(ctx: _Context) -> tuple[list[Variant], dict[str, Sensitivity]]:
    """One variant per calibration method, with its isolated ranking."""
    p, base, methods = ctx.project, ctx.base, ctx.config.methods
    variants, sens = [], {}
    for k, m in enumerate(methods):
        t0 = time.perf_counter()
        pol = base.with_calibration(replace(base.calibration, method=m))
        try:
            calib = calibrate(p.model, p.calib_data, pol.calibration, p.ws)
        except MixprecError as e:
            if k == 0:
                raise
            ctx.skipped.append(f"{m} calibration skipped: {e.what}")  # the other methods still search
            continue
        sw = switchable_model(p, pol, calib, m)
        sens[m] = _isolated(ctx, m, base, sw, lambda f, t, k=k, m=m: ctx.step(
            0.02 + 0.4 * (k + f) / len(methods), f"isolated ({m}): {t}"))
        variants.append(Variant(m, pol, sw, _drops(sens[m]), calib))
        ctx.timings[f"isolated_{m}_s"] = time.perf_counter() - t0
    return variants, sens


def _mixed_variant(ctx: _Context, sens: dict[str, Sensitivity]) -> Variant | None:
    """A per-tensor mix: each layer's activation ranges from the method with the smallest isolated
    drop; None where the first method is best everywhere."""
    p, methods = ctx.project, [m for m in ctx.config.methods if m in sens]
    best = {}
    for m in methods:
        for row in sens[m].table.itertuples():
            if row.name not in best or row.delta < best[row.name][1]:
                best[row.name] = (m, row.delta)
    first, inits = methods[0], p.model.initializer_names()
    per_tensor = tuple(sorted({(i, best[l.name][0]) for l in ctx.eligible for i in l.inputs
                               if best[l.name][0] != first and i not in inits}))
    if not per_tensor:
        return None
    pol = ctx.base.with_calibration(replace(ctx.base.calibration, method=first, per_tensor=per_tensor))
    calib = calibrate(p.model, p.calib_data, pol.calibration, p.ws)
    return Variant("mixed", pol, switchable_model(p, pol, calib, "mixed"),
                   {name: max(d, 0.0) for name, (_, d) in best.items()}, calib)


def _smoothed_variant(ctx: _Context, first: Variant, sens: Sensitivity) -> tuple[Variant, Sensitivity]:
    """SmoothQuant-style scaling on the inputs of the most sensitive MatMuls with constant weights."""
    p, cfg = ctx.project, ctx.config
    inits = p.model.initializer_names()
    weighted = {l.name for l in ctx.eligible if l.op_type == "MatMul" and len(l.inputs) > 1 and l.inputs[1] in inits}
    targets = [n for n in sens.table.name if n in weighted][:cfg.smooth_top or len(weighted)]
    pol = first.policy.with_smoothing({n: cfg.smooth_alpha for n in targets})
    calib = calibrate_policy(p.model, p.calib_data, pol.with_layers({l.name: "int8" for l in ctx.eligible}),
                             p.layers, p.ws)
    sw = switchable_model(p, pol, calib, "smoothed")
    s = _isolated(ctx, first.name, pol, sw, lambda f, t: ctx.step(0.43, f"isolated (smoothed): {t}"))
    return Variant("smoothed", pol, sw, _drops(s), calib), s


def _variants(ctx: _Context) -> tuple[list[Variant], Sensitivity]:
    """Every calibration variant, and the first method's isolated ranking (the search's sensitivity)."""
    variants, sens = _method_variants(ctx)
    mixed = _mixed_variant(ctx, sens)
    if mixed:
        variants.append(mixed)
    elif len(ctx.config.methods) > 1:  # expected, not made: its search is not run
        ctx.trials.expect(-variant_trials(len(ctx.eligible), ctx.config.refine))
    n, skipped = len(ctx.eligible), len(ctx.config.methods) - len(sens)  # methods whose calibration failed
    ctx.trials.expect(-skipped * (n + 1 + variant_trials(n, ctx.config.refine)))
    if ctx.config.smooth:
        variants.append(_smoothed_variant(ctx, variants[0], sens[variants[0].name])[0])
    return variants, sens[variants[0].name]


def _fit(ctx: _Context, first: Variant) -> LatencyModel | EstimatedLatency:
    """The latency model: estimated TensorRT time (``trt_estimate``), else fitted on measured profiles of
    the first variant's base policy. An estimate that cannot be made falls back to the INT8 MAC share."""
    t0 = time.perf_counter()
    cfg = ctx.config
    if ctx.objective == "trt_estimate":
        ctx.step(0.45, f"estimating TensorRT time on {getattr(cfg.gpu, 'name', cfg.gpu)}")
        try:
            lat = estimated_latency(ctx.project, first.policy, ctx.eligible, cfg.gpu, cfg.cost_params, cfg.tf32)
            ctx.timings["latency_model_s"] = time.perf_counter() - t0
            return lat
        except MixprecError as e:
            ctx.objective = "mac_share"
            ctx.skipped.append(f"the TensorRT estimate could not be made ({e.what}), so the INT8 MAC share decides")
    ctx.step(0.45, "profiling INT8 and FP32 per layer")
    lat = latency_model(ctx.project, first.policy, first.calib, cfg.backend, cfg.trt_options)
    ctx.timings["latency_model_s"] = time.perf_counter() - t0
    return lat


def _search_variant(ctx: _Context, v: Variant, lat: LatencyModel) -> tuple[Candidate, list[Candidate]]:
    """Greedy fallback + refinement on one variant: its best candidate and every one it evaluated."""
    # harm per benefit: layers whose INT8 saves no time go first, then the worst drop per ms saved
    # (mac_share: per MAC)
    eps = 1e-6
    gain = {l.name: (l.macs if ctx.objective == "mac_share" else lat.wall.gain_ms[l.name]) for l in ctx.eligible}
    order = sorted(gain, key=lambda n: (gain[n] > eps, -(v.drop[n] / max(gain[n], eps))))
    with open_trial_pool(v.switchable, ctx.data, ctx.config.workers, ctx.config.ray, ctx.project.ws) as pool:
        s = _Searcher(ctx.budget, _counted(ctx, pool), lat, v.name, ctx.margin, ctx.eligible, ctx.objective,
                      ctx.config.refine)
        best = s.run(order)
    ctx.trials.expect(len(s.seen) - variant_trials(len(ctx.eligible), ctx.config.refine))  # its real count
    return best, list(s.seen.values())


def _choose(ctx: _Context, variants: list[Variant], lat: LatencyModel) \
        -> tuple[Candidate, bool, str, list[Candidate], Tie | None]:
    """The best candidate over all variants, whether it meets the budget on dev, the message, every
    evaluated candidate, and (``trt_estimate``) the tie inside the estimate's band it was chosen from."""
    chosen, everything = [], []
    for k, v in enumerate(variants):
        t0 = time.perf_counter()
        ctx.step(0.5 + 0.35 * k / len(variants), f"searching with {v.name} calibration")
        ctx.check_stop()
        best, seen = _search_variant(ctx, v, lat)
        chosen.append(best)
        everything.extend(seen)
        ctx.timings[f"search_{v.name}_s"] = time.perf_counter() - t0
    budget, n = ctx.budget, len(ctx.eligible)
    ok = [c for c in chosen if c.meets_budget]
    tie = None
    if ok:
        pick = min(ok, key=preference_key(budget, ctx.objective))
        if ctx.objective == "trt_estimate":  # ties inside the band, over every candidate that meets the budget
            tie = band_ties([c for c in everything if c.meets_budget], budget,
                            (lambda c: lat.band(c.int8)) if hasattr(lat, "band") else None)
            pick = tie.pick
        message = (f"meets {budget} on the dev half with {len(pick.int8)}/{n} layers INT8 "
                   f"({100 * pick.int8_mac_share:.0f}% of eligible MACs), {pick.method} calibration")
        if ctx.objective == "trt_estimate" and hasattr(lat, "estimate_text"):
            message += f", estimated TensorRT time {lat.estimate_text(pick.int8)}"
    else:
        pick = max(everything, key=lambda c: _better(budget, c))
        message = (f"NO policy meets {budget}: the best candidate reaches {budget.metric}="
                   f"{budget.value_of(pick.quality):.4f} ({len(pick.int8)} layers INT8). Relax the budget, or "
                   "add calibration data")
    return pick, bool(ok), message, everything, tie


def _verify(ctx: _Context, policy: Policy, sens: Sensitivity) -> tuple[RunResult, str]:
    """A real build of ``policy`` measured on the held-out half, and what it says about the budget
    (with the build's quality warning, which names the worst INT8 layers of the isolated ranking ``sens``)."""
    ctx.step(0.88, "verifying the chosen policy on the held-out half")
    cfg, budget = ctx.config, ctx.budget
    run = build_and_measure(replace(ctx.project, eval_data=ctx.test), policy, backend=cfg.backend,
                            label=f"search {budget}", trt_options=cfg.trt_options, warn_below=cfg.warn_below,
                            ranking=sens, metrics=cfg.metrics)
    met = budget.met(run.quality)
    verdict = f"; held-out half: {budget.metric}={budget.value_of(run.quality):.4f} " + \
        ("(meets the budget)" if met else "(does NOT meet the budget)")
    return run, verdict + "".join(f". Warning: {w}" for w in run.warnings)


def search(project: Project, config: SearchConfig, progress=None, should_stop=None) -> SearchResult:
    """A policy meeting ``config.budget`` on held-out data with the most INT8 latency benefit.
    (MiniLM, cosine_mean>=0.995 with ``smooth``: alpha 0.5 on all 36 MatMuls → 76 % of MACs INT8;
    alpha 0.75 → 97 %.)"""
    t_start = time.perf_counter()
    ctx = _prepare(project, config, progress, should_stop)
    variants, sens = _variants(ctx)
    lat = _fit(ctx, variants[0])
    pick, met_on_dev, message, everything, tie = _choose(ctx, variants, lat)
    by_name = {v.name: v.policy for v in variants}
    policy = chosen_policy(by_name[pick.method], pick, ctx.eligible)
    table = candidate_table(everything, ctx.budget, [l.name for l in ctx.eligible])
    ties = tie_note(tie, ctx.budget, lambda c: candidate_number(table, c))
    run = None
    if config.verify:
        run, verdict = _verify(ctx, policy, sens)
        message += verdict
    if run.data_generated if run else is_generated(ctx.dev):
        message += f" (quality {GENERATED_NOTE}: give real evaluation data for numbers that hold)"
    if ties:
        message += f". {ties}"
    if ctx.objective == "mac_share":
        message += f". {MAC_SHARE_NOTE}"
    elif ctx.objective == "trt_estimate":
        message += ". " + TRT_ESTIMATE_NOTE.format(label=lat.label())
    if ctx.skipped:
        message += ". " + "; ".join(ctx.skipped)
    if quick_note(config):
        message += ". " + quick_note(config)
    if config.network_default != "fp32":
        message += ". " + network_default_note(config.network_default)
    ctx.step(1.0, "done")
    return SearchResult(ctx.budget, policy, met_on_dev, ctx.budget.met(run.quality) if run else None,
                        run.quality if run else None, message, table, sens, run, time.perf_counter() - t_start,
                        ctx.timings, by_name, chosen_candidate(table, by_name, policy), ctx.objective,
                        lat.label() if isinstance(lat, EstimatedLatency) else "", ties,
                        sensitivity_file(ctx.project, "isolated", variants[0].name, ctx.base, ctx.dev,
                                         config.metrics).stem)
