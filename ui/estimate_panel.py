"""The estimated TensorRT engine time of a policy on a GPU (core.estimate), without TensorRT or a
GPU: the Precision page's live panel for the draft, the estimate beside a run's measured latency,
and the calibration of the estimator on an imported engine report. Every number is labelled as an
estimate, with its GPU and its basis (the fit on the fixture engines, or the user's calibration)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as NotReady

import streamlit as st

from core.backends.reports import LOG_HINT, ModelMatch, ReportDevice
from core.display.charts import plot_estimate_layers
from core.display.tables import ms_text
from core.errors import MixprecError
from core.estimate.cost import FITTED, CostParams
from core.estimate.engine import class_list
from core.estimate.fit import calibrate, gpus_for
from core.estimate.gpus import FIXTURE_GPU, GPU, GPUS, gpu as gpu_entry
from core.estimate.predict import Prediction
from core.estimate.service import EstimateService
from core.measure.runs import shapes_text
from core.project import Project
from core.quant.policy import Policy
from core.store.results import load_gpu_calibration, save_gpu_calibration
from core.store.runs import run_dir, run_policy
from ui import saved_project, session
from ui import gpu_form
from ui.session import md

GPU_WIDGET = "estimate_gpu"      # the picker (its value is lost on pages that do not draw it)
GPU_STATE = "estimate_gpu:value"  # the session's choice, kept across pages
GPU_SETTING = "estimate_gpu"     # saved with the project's settings (a reload brings it back)
GPU_PENDING = "estimate_gpu:pending"  # a GPU just added: the picker selects it at its next drawing
LIVE_NODES = 3000                # larger models are estimated on demand (a button), not at every rerun
ESTIMATE = "Estimate, not measured"
CHART_ON = "estimate_chart_on"   # the per-layer chart, drawn when asked for


# --- the GPU: picked once, kept for the session and saved with the project --------------------
def gpus() -> dict[str, GPU]:
    """The GPUs to pick from: the table's rows, then the GPUs saved in the workspace ("Add a GPU")."""
    return {**GPUS, **gpu_form.saved_gpus(session.workspace())}


def gpu_of(key: str) -> GPU:
    """The GPU of a key of :func:`gpus` (the A100 of the fixtures if it is no longer there)."""
    return gpus().get(key) or GPUS[FIXTURE_GPU]


def gpu_key() -> str:
    """The session's GPU for estimates: the picker's last value, else the project's saved setting, else the A100."""
    v = st.session_state.get(GPU_STATE)
    if v is None:
        saved = saved_project.saved()
        v = saved.settings.get(GPU_SETTING) if saved is not None else None
    return v if v in gpus() else FIXTURE_GPU


def _picked() -> None:
    v = st.session_state.get(GPU_WIDGET)
    if v not in gpus():
        return
    st.session_state[GPU_STATE] = v
    saved = saved_project.saved()
    old = dict(saved.settings) if saved is not None else {}
    if old.get(GPU_SETTING) != v:
        saved_project.save(settings={**old, GPU_SETTING: v})


def gpu_picker(where=st, key: str = GPU_WIDGET) -> str:
    """A selectbox of the GPU table and the GPUs saved in the workspace; returns the chosen key."""
    choices = gpus()
    keys = list(choices)
    added = st.session_state.pop(GPU_PENDING, None) if key == GPU_WIDGET else None
    if added in choices:  # a GPU just added on the form below: selected before the widget is drawn
        st.session_state[key] = added
    elif key in st.session_state and st.session_state[key] not in choices:  # a GPU removed since
        del st.session_state[key]
    kw = {} if key in st.session_state else {"index": keys.index(gpu_key())}
    where.selectbox("GPU to estimate for", keys, key=key,
                    format_func=lambda k: choices[k].name + ("" if k in GPUS else " (added)"),
                    on_change=_picked if key == GPU_WIDGET else None,
                    help="The estimate prices the engine TensorRT would build on this GPU (from its datasheet "
                         "figures); no GPU or TensorRT is needed here. A GPU that is not in the list can be "
                         "added below.", **kw)
    return st.session_state.get(key) if st.session_state.get(key) in choices else gpu_key()


def _added(key: str) -> None:
    """A GPU saved on the "Add a GPU" form (its button's callback, before the page is drawn): the session's GPU
    from now on (and the project's)."""
    st.session_state[GPU_PENDING] = key
    st.session_state[GPU_STATE] = key
    saved = saved_project.saved()
    old = dict(saved.settings) if saved is not None else {}
    if old.get(GPU_SETTING) != key:
        saved_project.save(settings={**old, GPU_SETTING: key})


# --- the prediction, cached per model, policy, shapes, GPU and cost-model parameters ----------
def params_for(p: Project, gpu: str) -> CostParams:
    """The user's calibration stored for ``gpu``, else the shipped fit on the fixture engines."""
    return load_gpu_calibration(p.ws, gpu) or FITTED


def _tag(params: CostParams) -> str:
    return hashlib.sha256(json.dumps(params.to_json(), sort_keys=True, default=str).encode()).hexdigest()[:16]


@st.cache_resource(show_spinner=False, on_release=EstimateService.close)
def _service(ws_root: str) -> EstimateService:
    """One estimate child process per server and workspace (``core.estimate.service``): the estimate's
    pure-Python compile and graph walk run there, not under the server's GIL, off every page run. A cleared
    cache stops its child (``_service.clear()``: the AppTest files do it after each test, which has its own
    workspace)."""
    return EstimateService(ws_root)


@st.cache_resource(max_entries=64, show_spinner=False)
def _predicted(model_sha: str, policy_sha: str, shapes: str, gpu: str, params_tag: str,
               _p: Project, _pol: Policy, _params: CostParams, _gpu: GPU | None = None,
               _shapes: dict | None = None) -> Future:
    return _service(str(_p.ws.root)).submit(_p.model, _pol, _shapes or _p.input_shapes, _gpu or gpu, _params)


def _wait() -> float:
    """How long a page run waits for a new estimate before drawing "estimating…" and polling for it
    (``MIXPREC_ESTIMATE_WAIT`` seconds; AppTests set it long, since their fragments do not poll).
    Short by default: a cached estimate is ready at once, a new one (about a second on MiniLM, in
    the estimate process) arrives through the poll, and a page run that waits holds up the page."""
    try:
        return max(0.0, float(os.environ.get("MIXPREC_ESTIMATE_WAIT", "0.05")))
    except ValueError:
        return 0.05


def pending(p: Project, pol: Policy, gpu: str, shapes: dict | None = None) -> Future:
    """The (cached) prediction of ``pol`` on ``gpu`` as a future, computed in the background, at ``shapes``
    (a run's recorded shapes; None: the project's)."""
    params = params_for(p, gpu)
    at = {k: [int(d) for d in v] for k, v in (shapes or p.input_shapes).items()}
    key = json.dumps(at, sort_keys=True)
    g = gpu_of(gpu)
    if gpu in GPUS:
        return _predicted(p.model.sha256, pol.sha256, key, gpu, _tag(params), p, pol, params, None, at)
    # a GPU added in the workspace: keyed by its figures too (editing it is another estimate)
    spec = hashlib.sha256(json.dumps(g.to_json(), sort_keys=True).encode()).hexdigest()[:16]
    return _predicted(p.model.sha256, pol.sha256, key, f"{g.key}:{spec}", _tag(params), p, pol, params, g, at)


def estimate(p: Project, pol: Policy, gpu: str, timeout: float | None = None, shapes: dict | None = None) -> Prediction:
    """The prediction of ``pol`` on ``gpu`` at ``shapes`` (None: the project's; waits up to ``timeout`` s, None:
    until done); raises MixprecError, or TimeoutError when it is not ready in time."""
    return pending(p, pol, gpu, shapes).result(timeout=timeout)


def large_model_waits(p: Project) -> bool:
    """True for a model too large to estimate at every rerun whose estimate was not asked for yet."""
    return len(p.model.proto.graph.node) > LIVE_NODES and not st.session_state.get(f"estimate_on:{p.model.sha256}")


def export_estimate(p: Project, pol: Policy, run=None, wait: bool = False) -> tuple[Prediction, str] | None:
    """The estimate an export states (the Export page and its bundle) and its caption: a run's (a ``RunResult``)
    policy at the run's recorded shapes on the GPU it was measured on (else the session's), as beside the run on
    Build and results; the session's policy at today's shapes on the session's GPU. None for a large model whose
    estimate was not asked for. ``wait``: as long as a page run waits for a new estimate (else until it is made);
    raises MixprecError, or TimeoutError (``NotReady``) when it is not ready by then."""
    if large_model_waits(p):
        return None
    timeout = _wait() if wait else None
    if run is None:
        r = estimate(p, pol, gpu_key(), timeout)
        return r, draft_estimate_caption(p, pol, r, "this session's policy", "the GPU picked on the Precision page")
    gpu, note = run_gpu(run)
    r = estimate(p, pol, gpu, timeout, shapes=run.input_shapes or None)
    return r, run_estimate_caption(run, r, note)


def _label(r: Prediction) -> str:
    return f"{ESTIMATE}: {md(r.caption())}"


def band_delta(r: Prediction) -> str:
    """The metric's delta: "estimate · likely 0.785–0.942 ms" ("estimate · unvalidated: likely …")."""
    return f"estimate · {r.band.short()}" if r.band is not None else "estimate"


# --- the Precision page's panel ------------------------------------------------------------------
def _on_demand(p: Project) -> bool:
    """True when the estimate may be computed now: small models always, large ones once asked for."""
    if len(p.model.proto.graph.node) <= LIVE_NODES:
        return True
    key = f"estimate_on:{p.model.sha256}"
    if st.session_state.get(key):
        return True
    st.caption(f"The model has {len(p.model.proto.graph.node)} nodes: the estimate is computed on demand.")
    st.button("Estimate the TensorRT time", key="estimate_now", icon=":material/speed:",
              on_click=st.session_state.__setitem__, args=(key, True))  # kept even if this run is interrupted
    return False


def section(p: Project, pol: Policy) -> Prediction | None:
    """"Estimated TensorRT latency on <GPU>" for the draft: total, predicted reformats, the basis
    and the per-layer chart; redrawn at every edit (cached), no build needed."""
    gpu = gpu_key()
    st.subheader(f"Estimated TensorRT latency on {md(gpu_of(gpu).name)}")
    c = st.columns([1.6, 1, 1])
    gpu = gpu_picker(c[0])
    gpu_form.section(p.ws, _added)
    if not _on_demand(p):
        return None
    fut = pending(p, pol, gpu)
    try:
        r = fut.result(timeout=_wait())
    except NotReady:
        _poll(fut, p, pol)
        return None
    except Exception as e:  # noqa: BLE001 - an estimate that fails must not break the page
        _failed(e)
        return None
    _draft_shown(p, pol, r, c)
    return r


def _failed(e: Exception) -> None:
    st.warning(f"No estimate for this policy: {md(e)}", icon=":material/warning:")


def _draft_shown(p: Project, pol: Policy, r: Prediction, c) -> None:
    _show(r, c, draft_estimate_caption(p, pol, r, "the draft policy", "the GPU picked here"),
          f"for {shapes_text(p.input_shapes) or 'static shapes'}, the draft policy ({pol.sha256[:8]})")


POLL_DONE = "estimate_poll_done"  # (the estimate's future, when the polling fragment first drew it)
POLL_AFTER_DONE_S = 10.0


@st.fragment(run_every=0.5)
def _poll(fut: Future, p: Project, pol: Policy) -> None:
    """While the estimate of a new policy is computed in the background: a note; once it is made, the estimate in
    the note's place, drawn by the fragment's own run, not by a rerun of the whole page (which a click made meanwhile
    waited behind: issue 23 fault 10), until the page's next run draws it in its own place; if none comes within
    POLL_AFTER_DONE_S, the page runs once, which ends the polling. With the per-layer chart asked for, the page runs at
    once instead (a chart redrawn at every poll would cost more). Never ``st.rerun`` inline in a page run: it would
    stop that run here and lose the clicks it carries for the widgets below (Rebuild)."""
    if not (fut.done() and session.fragment_rerun()):
        st.caption("Estimating the TensorRT engine for this policy… (the page stays usable)")
        return
    try:
        r = fut.result(timeout=0)
    except Exception as e:  # noqa: BLE001 - an estimate that fails must not break the page
        _failed(e)
        return
    if st.session_state.get(POLL_DONE, (None,))[0] is not fut:
        st.session_state[POLL_DONE] = (fut, time.monotonic())
    if st.session_state.get(CHART_ON) or time.monotonic() - st.session_state[POLL_DONE][1] > POLL_AFTER_DONE_S:
        st.session_state.pop(POLL_DONE)
        st.rerun(scope="app")
    _draft_shown(p, pol, r, st.columns([1.6, 1, 1]))


def _show(r: Prediction, c, what: str, context: str = "") -> None:
    """The estimate's metrics, ``what`` it is for (its caption's first sentence) and the per-layer chart (its title
    says ``context``: the shapes and policy)."""
    c[1].metric("Estimated TensorRT time", ms_text(r.total_ms), band_delta(r), delta_color="off", delta_arrow="off",
                help=f"{_label(r)}")
    c[2].metric("Predicted reformats", f"{r.reformat_count}", f"{r.reformat_pct:.1f}% of the estimated time",
                delta_color="off", delta_arrow="off",
                help="Precision/format conversions TensorRT would insert at the policy's boundaries")
    st.caption(f"{md(what)} {_label(r)}")
    if st.toggle(f"Show the estimated time per engine layer ({len(r.layers)} predicted layers)", key=CHART_ON):
        st.plotly_chart(plot_estimate_layers(r.layers, r.gpu_name, r.basis_detail, context=context),
                        key="estimate_chart")


# --- beside a run's measured latency (Build and results) -------------------------------------------
def run_gpu(run) -> tuple[str, str]:
    """The GPU a run's estimate is for, and what the caption says of it: the GPU its latency was measured on (a
    TensorRT run, when the estimate's table or the workspace has it), else the session's GPU, said to be the one
    picked on the Precision page."""
    picked = gpu_key()
    measured = run.measured_gpu
    if measured:
        try:
            g = gpu_entry(measured, gpu_form.saved_gpus(session.workspace()))
        except MixprecError:
            return picked, (f"the run was measured on {measured}, which the estimate's GPU table does not have: "
                            f"estimated for {gpu_of(picked).name}, the GPU picked on the Precision page")
        key = next((k for k, v in gpus().items() if v.name == g.name), None)
        if key is not None:
            return key, "the GPU the run was measured on"
    return picked, "the GPU picked on the Precision page"


def run_estimate_caption(run, r: Prediction, gpu_note: str) -> str:
    """``Estimated for 1×3×640×640, policy X (3f2a1c9e), NVIDIA T4 (…)``: what a run's estimate is for."""
    shapes = run.shapes_label or "today's shapes (the run did not record its own)"
    return (f"Estimated for {shapes}, policy {run.label} ({run.policy_sha256[:8]}), {r.gpu_name} ({gpu_note}).")


def draft_estimate_caption(p: Project, pol: Policy, r: Prediction, what: str, gpu_note: str) -> str:
    """``Estimated for 1×3×224×224 (today's shapes, set on the Model page), the draft policy (3f2a1c9e), NVIDIA A100
    (the GPU picked here).``: what the estimate of a policy that is no run's is for (``what``: which policy)."""
    shapes = shapes_text(p.input_shapes) or "static shapes"
    return (f"Estimated for {shapes} (today's shapes, set on the Model page), {what} ({pol.sha256[:8]}), "
            f"{r.gpu_name} ({gpu_note}).")


def beside_run(p: Project, run, measured_ms: str) -> None:
    """The estimate of a run (a ``RunResult``) next to its measured latency, each labelled: the run's policy at the
    run's recorded shapes, on the GPU it was measured on (else the session's GPU), and the caption says which."""
    if len(p.model.proto.graph.node) > LIVE_NODES:
        return
    gpu, gpu_note = run_gpu(run)
    try:
        r = estimate(p, run_policy(p, run_dir(p.ws, run.run_id)), gpu, timeout=_wait(),
                     shapes=run.input_shapes or None)
    except NotReady:
        st.caption("The TensorRT estimate of this run is being computed; it shows on the next refresh.")
        return
    except Exception as e:  # noqa: BLE001 - an estimate that fails must not break the page
        st.caption(f"No TensorRT estimate for this run: {md(e)}")
        return
    c = st.columns([1, 1.3, 2])
    c[0].metric("Measured latency", measured_ms, "measured", delta_color="off", delta_arrow="off",
                help=f"Measured: {md(run.latency_source)}")
    c[1].metric(f"Estimated TensorRT time on {md(r.gpu_name)}", ms_text(r.total_ms), band_delta(r),
                delta_color="off", delta_arrow="off", help=_label(r))
    c[2].caption(f"{md(run_estimate_caption(run, r, gpu_note))} Measured: {md(run.latency_source)}. {_label(r)}.")


# --- calibration on an imported engine report (Build and results) -----------------------------------
CALIB_GPU = "calib_gpu"              # the GPU chosen for the report (no default: the user says it)
CALIB_REPORT = "calib_gpu:report"    # the report it was chosen for: another report asks again


def _report_id(graph, name: str) -> str:
    data = bytes(graph) if isinstance(graph, (bytes, bytearray)) else str(graph).encode()
    return hashlib.sha256(name.encode() + b"\0" + data).hexdigest()[:16]


def calibration_offer(p: Project, graph, profile, name: str = "engine", nodes: list[str] | None = None,
                      match: ModelMatch | None = None, device: ReportDevice | None = None) -> None:
    """Offer to refit the estimator on the imported layer-info + profile pair, for the GPU it was built on:
    the GPU the report names (its trtexec log), else one the user chooses among those its kernels can run
    on (never a default). Refused when the report is not of this model (``match``)."""
    if profile is None:
        return
    st.markdown("**Calibrate the estimator for this GPU**")
    if match is not None and not match.enough:
        e = match.refusal(f"engine report {name}")
        st.warning(f"Calibration refused: {md(e.what)}. {md(e.fix[0].upper() + e.fix[1:])}.", icon=":material/block:")
        return
    choices = gpus()
    custom = gpu_form.saved_gpus(session.workspace())
    rid = _report_id(graph, name)
    if st.session_state.get(CALIB_REPORT) != rid:  # a new report: its GPU is asked again
        st.session_state.pop(CALIB_GPU, None)
        st.session_state[CALIB_REPORT] = rid
    named = None
    if device is not None and device.name:
        try:
            named = gpu_entry(device.name, custom)
        except MixprecError:
            named = None
    c = st.columns([2, 1])
    if named is not None and named.key in choices:
        gpu = named.key
        c[0].markdown(f"GPU the engine was built on: **{md(named.name)}**, read from the report "
                      f"({md(device.source)}: {md(device.name)})")
    else:
        fits = gpus_for(device, choices, custom)
        if st.session_state.get(CALIB_GPU) not in fits:  # chosen before a log ruled it out
            st.session_state.pop(CALIB_GPU, None)
        gpu = c[0].selectbox("GPU the engine was built on", fits, index=None, key=CALIB_GPU,
                             placeholder="Choose the GPU the engine was built on",
                             format_func=lambda k: choices[k].name)
        left = len(choices) - len(fits)
        why = (f"the report names the {md(device.name)}, which is not in the GPU table (add it on the Precision "
               "page's 'Add a GPU')") if device is not None and device.name else md(LOG_HINT)
        c[0].caption(f"Choose it: {why}." + (f" {left} GPUs its kernels cannot run on are left out." if left else ""))
    if gpu is not None:
        have = load_gpu_calibration(p.ws, gpu)
        if have is not None:
            st.caption(f"Stored for the {md(choices[gpu].name)}: {md(have.label())}.")
    c[1].write("")
    if not c[1].button("Calibrate the estimator for this GPU", key="calibrate_gpu", icon=":material/tune:",
                       disabled=gpu is None):
        return
    try:
        with st.spinner("Fitting the cost model on your engine (and once per held-out fold)…"):
            params = calibrate((graph, profile), choices[gpu], names=[name], model_nodes=nodes,
                               model=match.model if match is not None else "this model", device=device, custom=custom)
            save_gpu_calibration(p.ws, gpu, params)
    except (MixprecError, OSError) as e:
        st.error(md(e))
        return
    st.success(f"Estimates on the {md(choices[gpu].name)} now use your calibration for "
               f"{md(class_list(params.classes or {}, with_counts=False))}; every other layer class keeps the shipped "
               f"fit. Your calibration: {md(params.label())}.", icon=":material/check:")
