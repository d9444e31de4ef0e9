"""Export page components: which policy to export (the session's or any past run's), its
downloads (the policy JSON and the build scripts at once; the compiled ONNX, the calibration
cache, the Polygraphy check and the bundle zip once calibrated and compiled) and the commands,
shown folded with the whole script a click away."""
from __future__ import annotations

from concurrent.futures import TimeoutError as NotReady
from dataclasses import dataclass, replace

import streamlit as st

from core.display.markdown import md_text
from core.display.tables import local_time, ms_text, run_title
from core.errors import MixprecError
from core.export import (BUNDLE_SCRIPTS, BUNDLE_STEM, DEFAULT_ATOL, DEFAULT_TRT_VERSION, ESTIMATE_NAME, POLICY_NAME,
                         README_NAME, SCRIPT_HEAD, TYPED_HEADER, bundle_filename, export_bundle, fold_command,
                         legacy_script, policy_filename, polygraphy_command, typed_script)
from core.measure.runs import RunResult, shapes_text
from core.model.profiles import range_text
from core.project import Project
from core.quant.policy import Policy
from core.store.runs import list_runs, load_run, run_dir, run_policy
from ui import draft, estimate_panel, saved_project
from ui.session import code, md

SESSION = "session"  # the picker's entry for the session's own policy
PICK_KEY = "export_pick"  # another page asks for a run to be preselected (``choose_run``)
_MIME = {".onnx": "application/octet-stream", ".sh": "text/x-shellscript", ".json": "application/json",
         ".md": "text/markdown", ".py": "text/x-python", ".cache": "text/plain", ".zip": "application/zip"}


@dataclass(frozen=True)
class Choice:
    """The policy to export, where it comes from (said in the README) and its run, if any (its id, and the run:
    its estimate is for the run's recorded shapes and GPU)."""
    policy: Policy
    source: str
    run_id: str | None = None
    run: RunResult | None = None


def choose_run(run_id: str) -> None:
    """Preselect ``run_id`` the next time the Export page runs (then switch to it)."""
    st.session_state[PICK_KEY] = run_id


def pick(p: Project) -> Choice:
    """The run picker: the session's policy (edited on the Precision page) or any stored run's."""
    runs = list_runs(p.ws, p.model.sha256)
    options = [SESSION, *runs["run_id"]]
    pending = st.session_state.pop(PICK_KEY, None)
    if pending in options:
        st.session_state["export_run"] = pending
    elif st.session_state.get("export_run") not in options:
        st.session_state.pop("export_run", None)
    names = {SESSION: "This session's policy (edited on the Precision page)",
             **{r: f"Run {run_title(runs, r)}" for r in runs["run_id"]}}
    choice = st.selectbox("Policy to export", options, format_func=names.get, key="export_run",
                          help="Any past run of this model: its policy is exported, calibrated on this session's "
                               "calibration data.")
    if choice == SESSION:
        return Choice(draft.policy(p), "The policy of a mixprec session (edited on its Precision page)")
    row = runs.set_index("run_id").loc[choice]
    try:
        pol = run_policy(p, run_dir(p.ws, choice))
        run = load_run(p.ws, choice)
    except (OSError, MixprecError) as e:
        st.error(f"Run {md(row['label'])}: {md(e)}")
        st.stop()
    if pol.calibration.data_sha256 and pol.calibration.data_sha256 != p.calib_data.sha256:
        st.warning(f"Run {md(row['label'])} was calibrated on other data (sha256 "
                   f"{code(pol.calibration.data_sha256[:12])}). The exported INT8 ranges come from this "
                   "session's calibration data: load that data on the Model page to export the run's own ranges.",
                   icon=":material/warning:")
    return Choice(pol, f"Run {row['label']} ({choice}), built {local_time(row['created'])} on {row['backend']}",
                  choice, run)


def summary(p: Project, choice: Choice) -> None:
    c = choice.policy.precision_counts()
    st.caption(f"{md(p.model.name)}: fp32 {c['fp32']} · fp16 {c['fp16']} · int8 {c['int8']} · "
               f"policy sha256 {code(choice.policy.sha256[:16] + '…')}")
    if choice.run_id:
        st.caption(md(choice.source))
    if p.profiles:  # the dynamic-shape profiles (Model page, input shapes): the commands build for these ranges
        st.caption("Optimisation profile (min:opt:max; the project runs at opt): "
                   + md(", ".join(f"{n}={range_text(r)}" for n, r in p.profiles.items())))


def _other_shapes(p: Project, run: RunResult | None) -> bool:
    """Whether ``run`` was built at shapes other than the project's (which the export's files are for)."""
    if run is None or not run.input_shapes:
        return False
    return run.input_shapes != {k: [int(d) for d in v] for k, v in p.input_shapes.items()}


def project_for(p: Project, choice: Choice) -> Project:
    """The project the exported files are made for: a run built at other shapes than today's is exported at its own
    (the engine that was measured and estimated: the compiled ONNX, the scripts' shapes, the bundle), the project
    opened again at them (today's shapes on the Model page stay); the session's policy, a run at today's shapes, a
    project with dynamic-shape profiles (exported for those ranges) or one that cannot be opened at the run's shapes
    (said) at today's."""
    run = choice.run
    if not _other_shapes(p, run) or p.profiles:
        return p
    src = saved_project.source()
    try:
        q = saved_project.open_source(replace(src, shapes={k: tuple(v) for k, v in run.input_shapes.items()},
                                              dims=None))
    except MixprecError as e:
        st.warning(f"Run {md(run.label)} was built at {md(run.shapes_label)}, but the model cannot be opened at those "
                   f"shapes now ({md(e)}): the files below are for today's shapes, {md(shapes_text(p.input_shapes))}.",
                   icon=":material/warning:")
        return p
    st.info(f"Run {md(run.label)} was built at {md(run.shapes_label)}: the files below are for those shapes, the "
            f"engine that was measured (today's shapes, {md(shapes_text(p.input_shapes))}, stay on the Model page).",
            icon=":material/info:")
    return q


def _estimate(p: Project, choice: Choice, wait: bool):
    """(the estimate, its caption) of the policy to export (``estimate_panel.export_estimate``: a run's at its
    shapes, on its GPU), or None with no estimate; raises MixprecError, or NotReady (``wait``)."""
    return estimate_panel.export_estimate(p, choice.policy, choice.run, wait=wait)


def _quiet_estimate(p: Project, choice: Choice):
    """:func:`_estimate` once made (``wait=False``: no page-run time limit, it waits until the estimate is done), or
    None when there is none: the export goes on without it."""
    try:
        return _estimate(p, choice, wait=False)
    except Exception:  # noqa: BLE001 - the export goes on without an estimate
        return None


def estimate(p: Project, choice: Choice) -> None:
    """The TensorRT estimate of the policy to export, as its bundle states it: a run's at the run's recorded shapes
    on the GPU it was measured on (else the session's), the session's policy at today's shapes; the caption says
    which ("Estimated for 4×3×32×32, policy X (3f2a1c9e), NVIDIA T4 (the GPU the run was measured on).")."""
    try:
        got = _estimate(p, choice, wait=True)
    except NotReady:
        st.caption("The TensorRT estimate of this policy is being computed; it shows on the next refresh.")
        return
    except Exception as e:  # noqa: BLE001 - an estimate that fails must not break the page
        st.caption(f"No TensorRT estimate of this policy: {md(e)}")
        return
    if got is None:
        return
    r, what = got
    c = st.columns([1, 2.5])
    c[0].metric(f"Estimated TensorRT time on {md(r.gpu_name)}", ms_text(r.total_ms), estimate_panel.band_delta(r),
                delta_color="off", delta_arrow="off", help=f"{estimate_panel.ESTIMATE}: {md(r.caption())}")
    c[1].caption(f"{md(what)} {estimate_panel.ESTIMATE}: {md(r.caption())}. The bundle's {README_NAME} and "
                 f"{ESTIMATE_NAME} state it.")
    if _other_shapes(p, choice.run):
        st.info(f"Run {md(choice.run.label)} was built at {md(choice.run.shapes_label)}; the files below are for "
                f"today's shapes, {md(shapes_text(p.input_shapes))} (set on the Model page): set the run's shapes "
                "there to export the engine that was measured and estimated.", icon=":material/info:")


def options() -> tuple[str, bool]:
    """The TensorRT version the ≤ 10.11 files are for, and whether FP32 layers may use TF32."""
    with st.expander("Export options", icon=":material/tune:"):
        a, b = st.columns([1, 2])
        version = a.text_input("TensorRT version of the ≤ 10.11 build", DEFAULT_TRT_VERSION, key="export_trt_version",
                               help="The calibration cache's header names it: another TensorRT version rejects the "
                                    "cache. 10.12 and newer build the explicit-precision ONNX instead.").strip()
        tf32 = b.checkbox("Let FP32 layers use TF32", False, key="export_tf32",
                          help="trtexec enables TF32 by default; mixprec's builds do not, so the scripts pass "
                               "--noTF32 unless this is on.")
    return version or DEFAULT_TRT_VERSION, tf32


def _attempt(make):
    """``(value, None)`` or ``(None, the error)``: an export a model cannot have is said, not raised."""
    try:
        return make(), None
    except MixprecError as e:
        return None, e


def _mime(name: str) -> str:
    return next((m for ext, m in _MIME.items() if name.endswith(ext)), "application/octet-stream")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def downloads(p: Project, choice: Choice, version: str, tf32: bool) -> dict:
    """The downloads; returns the scripts as they are (name → text) for :func:`commands`."""
    pol = choice.policy
    typed, typed_err = _attempt(lambda: typed_script(p, BUNDLE_STEM, tf32))
    legacy, legacy_err = _attempt(lambda: legacy_script(p, pol, BUNDLE_STEM, version, tf32))
    st.subheader("Downloads")
    c = st.columns(3)
    c[0].download_button("Policy JSON", pol.to_json(), policy_filename(pol), "application/json", key="dl_policy",
                         type="primary", icon=":material/download:",
                         help=f"{md(policy_filename(pol))}: import it here or pass it to `python -m core --policy`")
    for col, name, text, err, what in ((c[1], BUNDLE_SCRIPTS["typed"], typed, typed_err, "TensorRT ≥ 10.12 / 11"),
                                       (c[2], BUNDLE_SCRIPTS["legacy"], legacy, legacy_err, "TensorRT ≤ 10.11")):
        col.download_button(f"{md_text(name)} ({what})", text or "", name, _mime(name), key=f"dl_{name}",
                            icon=":material/terminal:", disabled=text is None,
                            help=md(err) if err else "Build + profile script; it names the files of the bundle")
    bundle = _bundle(p, choice, version, tf32)
    if bundle is not None:
        _bundle_downloads(pol, choice, bundle)
    scripts = {BUNDLE_SCRIPTS["typed"]: (typed, typed_err), BUNDLE_SCRIPTS["legacy"]: (legacy, legacy_err)}
    if bundle is not None and BUNDLE_SCRIPTS["polygraphy"] in bundle.files:
        scripts[BUNDLE_SCRIPTS["polygraphy"]] = (bundle.files[BUNDLE_SCRIPTS["polygraphy"]].decode(), None)
    return scripts


def _bundle(p: Project, choice: Choice, version: str, tf32: bool):
    """The calibrated and compiled files of this policy and options (kept for the session), or None
    with the button that makes them."""
    key = (choice.policy.sha256, choice.source, version, tf32, p.model.sha256, p.calib_data.sha256,
           str(p.input_shapes), str(p.profiles), estimate_panel.gpu_key())
    have = st.session_state.get("export_bundle")
    if have is not None and have[0] == key:
        return have[1]
    slot = st.empty()  # the offer to compile, gone once the files are there
    with slot.container():
        st.caption("The compiled ONNX, the calibration cache, the Polygraphy check and the bundle zip (all of it, "
                   "with a README on how to build, profile and import the reports) need the policy calibrated and "
                   "compiled.")
        if p.data_problem is not None:
            st.warning(f"Data needed before compiling: {md(p.data_problem)}", icon=":material/warning:")
            return None
        if not st.button("Calibrate and compile", key="compile", icon=":material/build:"):
            return None
    run = choice.run
    try:
        with st.spinner("Calibrating and compiling…"):
            got = _quiet_estimate(p, choice)
            bundle = export_bundle(p, choice.policy, trt_version=version, tf32=tf32, source=choice.source,
                                   estimate=got[0] if got else None, estimate_for=got[1] if got else "",
                                   estimate_shapes=run.input_shapes if run is not None and run.input_shapes else None)
    except MixprecError as e:
        st.error(md(e))
        return None
    slot.empty()
    st.session_state["export_bundle"] = (key, bundle)
    return bundle


def _bundle_downloads(pol: Policy, choice: Choice, bundle) -> None:
    """The bundle zip, then each of its files (the same names, so the scripts find them side by side)."""
    size = sum(len(d) for d in bundle.files.values())
    zip_name = bundle_filename(pol, choice.run_id)
    st.download_button(f"Bundle: {md_text(zip_name)} ({_size(size)})", bundle.zip, zip_name, _mime(".zip"),
                       key="dl_bundle", type="primary", icon=":material/folder_zip:",
                       help=f"Every file below and a {README_NAME} on how to build, profile and import the reports")
    for note in bundle.left_out:
        st.warning(f"Left out of the bundle: {md(note)}", icon=":material/block:")
    offered = (README_NAME, POLICY_NAME, BUNDLE_SCRIPTS["typed"], BUNDLE_SCRIPTS["legacy"])  # in the zip, or above
    names = [n for n in bundle.files if n not in offered]
    st.caption("Each file on its own (the names the scripts use: keep them side by side):")
    cols = st.columns(3)
    for i, name in enumerate(names):
        data = bundle.files[name]
        cols[i % 3].download_button(f"{md_text(name)} ({_size(len(data))})", lambda d=data: d, name, _mime(name),
                                    key=f"dl_{name}_file", icon=":material/description:")


def commands(p: Project, scripts: dict) -> None:
    """Each command folded (one flag per line, long name lists cut to a count), the whole script
    in an expander."""
    st.subheader("Commands")
    titles = {BUNDLE_SCRIPTS["typed"]: "TensorRT ≥ 10.12 / 11: strongly typed build of the explicit-precision ONNX",
              BUNDLE_SCRIPTS["legacy"]: "TensorRT ≤ 10.11: per-layer precision constraints (deprecated in 10.12, "
                                        "removed in 11)",
              BUNDLE_SCRIPTS["polygraphy"]: "Polygraphy: TensorRT against FP32 ONNX Runtime outputs"}
    if BUNDLE_SCRIPTS["polygraphy"] not in scripts:
        preview, err = _attempt(lambda: SCRIPT_HEAD + TYPED_HEADER + "\n# preview at a fixed tolerance: compile "
                                "to get the tolerance measured for this policy\n"
                                + polygraphy_command(p.model, f"{BUNDLE_STEM}.mixprec.onnx", p.input_shapes,
                                                     reference_onnx=f"{BUNDLE_STEM}.named.onnx",
                                                     inputs=f"{BUNDLE_STEM}.inputs.json",
                                                     outputs=f"{BUNDLE_STEM}.fp32-outputs.json", atol=DEFAULT_ATOL,
                                                     profiles=p.profiles))
        scripts = {**scripts, BUNDLE_SCRIPTS["polygraphy"]: (preview, err)}
    for name, title in titles.items():
        text, err = scripts[name]
        st.markdown(f"**{title}** · {code(name)}")
        if err is not None:
            st.warning(md(err), icon=":material/warning:")
            continue
        st.code(fold_command(text), language="bash")
        with st.expander(f"The whole script ({len(text.splitlines())} lines, {_size(len(text.encode()))})"):
            st.code(text, language="bash", wrap_lines=True)
