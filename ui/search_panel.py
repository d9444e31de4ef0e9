"""Precision page, search under a quality budget: the budget, the GPU of the estimate (for the
TensorRT target: the estimate panel's GPU unless picked here), a full or a quick search (one calibration
method, no put-back pass) with the time each is expected to take, the search job (from the draft's network
default: an FP16-default draft's search is its own, stored apart), its Pareto front
(points failing the budget marked) and "Use this policy" for a front point: the chosen point
preselected, applied after a confirmation, as one undoable edit. The panel stays open while a search of
the model runs (a reload does not hide it)."""
from __future__ import annotations

import math

import streamlit as st

from core.display.charts import plot_pareto
from core.display.precision_edit import policy_diff
from core.display.tables import front_table
from core.errors import MixprecError
from core.estimate.gpus import FIXTURE_GPU, GPU, GPUS
from core.jobs import search_params
from core.measure.runs import GENERATED_NOTE
from core.project import Project
from core.search import BUDGET_METRICS
from core.quant.policy import CALIB_METHODS
from core.search.progress import minutes_text
from core.search.duration import expected_text, expected_trials, per_trial_seconds
from core.search.searcher import MAC_SHARE_NOTE, QUICK_NOTE, TRT_ESTIMATE_NOTE, search_objective
from core.sensitivity.isolated import sensitivity_file
from core.store.results import searched_gpu_name
from ui import cluster
from ui import draft, job_panel, quality_panel, results, saved_project, session, tables
from ui import estimate_panel
from ui.session import md

DEFAULT_BUDGET = "cosine_mean>=0.99"
GPU_WIDGET = "search_gpu"             # the search's GPU picker
GPU_OWN = "search_gpu:own"            # the GPU picked there (else the search follows the estimate panel's GPU)


def search_gpu(where=st) -> GPU:
    """The GPU of the search's estimated TensorRT time: a picker of the estimate panel's choices (the GPU
    table and the GPUs saved in the workspace) showing, until one is picked here, the estimate panel's GPU
    (``estimate_panel.gpu_key``: the session's pick, else the project's saved one, else the A100)."""
    choices = estimate_panel.gpus()
    own = st.session_state.get(GPU_OWN)
    if own not in choices:  # nothing picked here (or that GPU was removed since): follow the estimate panel
        st.session_state.pop(GPU_OWN, None)
        if st.session_state.get(GPU_WIDGET) != estimate_panel.gpu_key():  # written only when it changes
            st.session_state[GPU_WIDGET] = estimate_panel.gpu_key()
    elif st.session_state.get(GPU_WIDGET) not in choices:
        st.session_state[GPU_WIDGET] = own
    where.selectbox("GPU of the estimate", list(choices), key=GPU_WIDGET,
                    format_func=lambda k: choices[k].name + ("" if k in GPUS else " (added)"),
                    on_change=_picked,
                    help="The search ranks its candidates by the TensorRT time estimated on this GPU (the estimate "
                         "panel's GPU unless you pick another here; add a GPU there). No GPU or TensorRT is "
                         "needed here.")
    return estimate_panel.gpu_of(st.session_state[GPU_WIDGET])


def _picked() -> None:
    st.session_state[GPU_OWN] = st.session_state.get(GPU_WIDGET)


FULL, QUICK = "full", "quick"
KIND_WIDGET = "search_kind"


OPEN = "search_panel:open"  # models whose search this session saw running: the panel stays open after it ends


def search_running(model: str) -> bool:
    """Whether a search of ``model`` is queued or running (any session's)."""
    return any(j.active and j.params.get("model") == model for j in job_panel.jobs(kind="search"))


def keep_open(model: str) -> bool:
    """Whether the panel opens: a search of ``model`` runs (a reload shows it), or ran while this session looked
    (it stays open when the search ends: the expander follows ``expanded`` when it changes, and would close
    on the result)."""
    opened = st.session_state.setdefault(OPEN, [])
    if search_running(model) and model not in opened:
        opened.append(model)
    return model in opened


def _per_trial(p: Project) -> float | None:
    """The time per trial measured on this model and data: its stored isolated and leave-one-out rankings'
    times (their trials: a baseline and one per layer), None when none was measured here."""
    stored = [results.sensitivity(p, m, mode) for m in CALIB_METHODS for mode in ("isolated", "leave-one-out")]
    return per_trial_seconds((s.seconds, len(s.table) + 1) for s in stored if s is not None and not s.cache_hit)


def _trials(p: Project, methods: tuple[str, ...], smooth: bool, refine: bool) -> int:
    """The trials the draft's search is expected to run: the isolated rankings stored for its base policy (the
    project's default under the draft's network default, where the search starts) are not measured again; those of
    another base are not its (an FP16-default search measures its own)."""
    base = p.default_policy(draft.policy(p).network_default)
    ranked = sum(sensitivity_file(p, "isolated", m, base).is_file() for m in methods)
    return expected_trials(sum(1 for l in p.layers if l.eligible), len(methods), smooth, refine, ranked)


def expected_caption(full: int, quick: int, per_trial: float | None) -> str:
    """What each search is expected to take, from the trials it runs (``full``, ``quick``) and the time per trial
    measured on this model (None: not measured yet, so the time is unknown)."""
    if per_trial is None:
        return (f"Expected time unknown: no trial of this model has been timed yet (an isolated ranking on the "
                f"Sensitivity page times them). The full search runs about {full} trials, the quick one about "
                f"{quick}.")
    return (f"Expected: full search {expected_text(full, per_trial)}; quick search "
            f"{minutes_text(quick * per_trial)} (about {quick} trials).")


def _kind(p: Project, smooth: bool) -> tuple[bool, str]:
    """The full / quick choice with the time each is expected to take; (quick?, the quick search's method)."""
    method = draft.policy(p).calibration.method
    labels = {FULL: f"Full: {', '.join(CALIB_METHODS)} calibration and their per-tensor mix, with the put-back pass",
              QUICK: f"Quick: {method} calibration only (the draft's), no put-back pass"}
    kind = st.radio("Search", (FULL, QUICK), key=KIND_WIDGET, format_func=labels.get, horizontal=True,
                    persist_state="session",
                    help="The quick search measures one isolated ranking instead of three and stops once the fallback "
                         "search meets the budget; the full one may keep more layers INT8.")
    st.caption(expected_caption(_trials(p, CALIB_METHODS, smooth, True), _trials(p, (method,), smooth, False),
                                _per_trial(p)))
    return kind == QUICK, method


def section(p: Project) -> None:
    src = saved_project.source()
    with st.expander("Search under a budget", expanded=keep_open(src.model)):
        objective = search_objective("auto", saved_project.target(), session.auto_backend_name())
        trt = objective == "trt_estimate"
        s1, s2, s3 = st.columns([3, 2, 1]) if trt else (*st.columns([3, 1]), None)
        # one source of truth: the session state (a project's saved budget, else the default), the widget without
        # a value of its own; kept across pages by the widget, saved with the project (saved_project.keep_settings)
        st.session_state.setdefault("search_budget", DEFAULT_BUDGET)
        budget = s1.text_input("Quality budget", key="search_budget", persist_state="session",
                               help="METRIC>=VALUE, or top1_drop<=VALUE (e.g. 0.5%); METRIC: "
                                    + ", ".join(BUDGET_METRICS))
        g = search_gpu(s2) if trt else GPUS[FIXTURE_GPU]
        smooth = (s3 or s2).checkbox("SmoothQuant-style smoothing", key="search_smooth", persist_state="session")
        quick, method = _kind(p, smooth)
        nd = draft.policy(p).network_default  # the search starts from it (the layers it does not set keep it)
        try:
            metrics = quality_panel.current()  # what the Build page measures quality on (outputs, slices, task, user)
            params = search_params(src, budget, smooth, gpu=g, ray=cluster.ray_address(), metrics=metrics,
                                   methods=[method] if quick else None, refine=not quick, network_default=nd)
        except MixprecError as e:
            st.error(md(e))
            return
        if objective == "mac_share":
            st.info(MAC_SHARE_NOTE)
        elif trt:
            st.info(TRT_ESTIMATE_NOTE.format(label=f"estimated TensorRT ms on the {md(g.name)} (an "
                                                   "estimate from the cost model, not a measurement)"))
        else:
            st.caption(f"Objective: the estimated latency on {session.auto_backend_name()} (the latency model "
                       "fitted on its profiles), then the fewest INT8/float boundaries.")
        if metrics:
            st.caption("Quality as the Build page measures it: " + md(quality_panel.describe(metrics)))
        st.caption(f"Starts from the draft's network default, {nd.upper()} (Bulk actions): the layers the search "
                   f"does not choose (not INT8-eligible) stay {nd.upper()}; eligible layers it falls back are FP16.")
        result = results.search_result(p, params["budget"], smooth, g, metrics, nd)  # each GPU's, spec's, default's
        other = searched_gpu_name(result) if result is not None and trt else None
        if other is not None and other != g.name:  # never expected (searches are stored per GPU): a safety net
            st.caption(f"The search stored for this budget estimated on the {md(other)}, not the "
                       f"{md(g.name)}: start it for the {md(g.name)}.")
            result = None
        for_text = (f" on the {g.name}" if trt else "") + (f", network default {nd.upper()}" if nd != "fp32" else "")
        stored_quick = result is not None and QUICK_NOTE in result.message
        missing = (f"The stored search for this budget{md(for_text)} is a quick one: start the full search for a "
                   "policy that may keep more layers INT8." if stored_quick else
                   f"Not searched yet for this budget{md(for_text)}: the search chooses on half of the evaluation "
                   "data and verifies on the other half.")
        job_panel.job_button("search", params,
                             f"{'quick ' if quick else ''}search {params['budget']}{for_text} · {p.model.name}",
                             "Start the quick search" if quick else "Start the search", "start_search",
                             result is not None and (quick or not stored_quick), missing)
        if result is not None:
            _result(p, result, objective)


def _result(p: Project, result, objective: str) -> None:
    """A stored ``SearchResult``: verdict, Pareto chart, the front and the front point to use
    (``objective``: what a search for the session's target would optimise)."""
    met = result.met_on_dev and result.met_on_holdout is not False
    (st.success if met else st.warning)(md(result.message))
    if result.run is not None and result.run.data_generated and GENERATED_NOTE not in result.message:
        st.caption(f"The search's quality numbers are {GENERATED_NOTE}.")  # a search stored before it said so
    if result.objective == "trt_estimate" and result.latency_label:
        basis = result.latency_label + ("; bars: the estimate's band" if _has_band(result.front) else "")
    else:
        basis = "estimate from " + (result.run.latency_source.replace(", measured", "") if result.run
                                    else "the backend's") \
            + " profiles" + (", not the objective" if MAC_SHARE_NOTE in result.message else "")
    fig = plot_pareto(result.candidates, result.chosen, result.budget, basis)  # it marks the failing candidates
    st.plotly_chart(fig, key="pareto_chart")
    front = result.front
    shown = front if _has_band(front) else front.drop(columns=["est_low_ms", "est_high_ms"])
    tables.show(front_table(shown, getattr(result.budget, "metric", "")), hide_index=True, column_config={
        "meets budget": st.column_config.CheckboxColumn("meets budget", help="on the dev half"),
        "likely from (ms)": st.column_config.NumberColumn("likely from (ms)", help="the estimate's band: low end"),
        "likely to (ms)": st.column_config.NumberColumn("likely to (ms)", help="the estimate's band: high end")})
    fails = {int(r.candidate) for r in front.itertuples() if not bool(r.meets_budget)}
    points = {int(r.candidate): f"#{r.candidate}{' (chosen)' if r.candidate == result.chosen else ''}: "
              f"{r.n_int8} layers INT8, {r.method}, {r.est_ms:.3f} ms est.{_likely(r)}, "
              f"{100 * r.int8_mac_share:.0f}% MACs INT8, "
              f"{r.quality:.4f}{' — fails the budget' if int(r.candidate) in fails else ''}" for r in front.itertuples()}
    if result.chosen is not None and result.chosen not in points:  # chosen by MAC share, or a tie: off the front
        if result.tie_note:  # a tie inside the estimate's difference band, won on boundaries or quality
            window = "difference band" if "difference band" in result.tie_note else "band"
            r = next(result.candidates[result.candidates["candidate"] == result.chosen].itertuples())
            points[result.chosen] = (f"#{result.chosen} (chosen: a tie inside the estimate's {window}, see the "
                                     f"verdict; not on the front of the point estimates): {r.n_int8} layers INT8, {r.method}, "
                                     f"{r.est_ms:.3f} ms est.{_likely(r)}, {r.boundaries} boundaries, {r.quality:.4f}")
        else:
            points[result.chosen] = f"#{result.chosen} (chosen, by INT8 MAC share; not on the latency front)"
    keys = list(points)
    default = keys.index(result.chosen) if result.chosen in points else \
        next((i for i, c in enumerate(keys) if c not in fails), 0)
    if st.session_state.get("front_pick") not in points:
        st.session_state.pop("front_pick", None)
    f1, f2 = st.columns([3, 1])
    below = st.container()  # the confirmation, full width under the picker
    pick = f1.selectbox("Front point", keys, index=default, format_func=points.get, key="front_pick",
                        help="Preselected: the chosen point, the search's answer. Points that fail the budget are marked.")
    f2.write("")
    try:
        new = result.policy if pick == result.chosen else result.front_policy(int(pick))
    except MixprecError as e:
        st.error(md(e))
        return
    differ = len(policy_diff(draft.policy(p), new, p.layers))
    question = (f"Replace your draft with front point #{pick}? {differ} layer(s) change"
                + (" and **it fails the budget** on the dev half" if pick in fails else "") + ". You can undo it.")
    with f2:
        session.confirmed("use_front", "Use this policy", question, "Yes, use it", _use, (p, new, pick, result.budget),
                          box=below, type="primary")


def _use(p: Project, new, pick, budget: str) -> None:
    """"Yes, use it": the front point the question named becomes the draft (one undoable edit)."""
    draft.set_policy(p, new, what=f"front point #{pick} of the search {budget}")
    session.flash(f"Front point #{pick} is now the current policy: Rebuild to measure it.")


def _has_band(frame) -> bool:
    return {"est_low_ms", "est_high_ms"} <= set(frame.columns) and bool(frame["est_high_ms"].notna().any())


def _likely(r) -> str:
    lo, hi = float(getattr(r, "est_low_ms", math.nan)), float(getattr(r, "est_high_ms", math.nan))
    return f" (likely {lo:.3f}–{hi:.3f})" if math.isfinite(lo) and math.isfinite(hi) else ""
