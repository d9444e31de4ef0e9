"""Model page, what mixprec did with the model and data: the normalisation steps of loading
(or "nothing changed") and which data is generated (calibration / evaluation)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.measure.runs import GENERATED_NOTE, is_generated
from core.project import Project
from ui.labels import widget
from ui.session import md


def normalization(p: Project) -> None:
    """The steps normalisation made on load (each one's user-facing sentence), or that nothing changed."""
    m = p.model
    steps = list(getattr(m, "normalization", []) or [])
    opset = getattr(m, "original_opset", 0) or m.opset
    st.subheader("Normalisation on load")
    if not steps:
        st.caption(f"Nothing changed: the model is used as it is (opset {m.opset}).")
        return
    upgraded = f" Opset {opset} → {m.opset}." if opset != m.opset else ""
    st.caption(f"{len(steps)} step(s) made the model fit for mixprec; layer names stay the model's own.{upgraded}")
    st.dataframe(pd.DataFrame([s.to_dict() for s in steps], columns=["step", "detail"]), hide_index=True,
                 key="normalization_table")


def branches(p: Project) -> None:
    """A merged decoder (an If on a boolean input, optimum's ``use_cache_branch``): which branch was fixed
    on load, and the choice of the other one (the model is then loaded again with it)."""
    from core.model.branches import is_cache_branch
    from ui import saved_project

    m = p.model
    if not m.branch_inputs:
        return
    st.subheader("Merged decoder: the branch to quantize")
    st.caption("The compute inside an If stays FP32 (no Q/DQ goes into a subgraph), so the If is folded on load to "
               "the branch picked: with the cache (then) for the generation steps, or without it (else) for the "
               "first step. Each branch is a model of its own: its runs, rankings and drafts are kept apart.")
    for name in m.branch_inputs:
        fixed = m.branches.get(name)
        options = [saved_project.BRANCH_TRUE, saved_project.BRANCH_FALSE]
        options += [] if is_cache_branch(name) else [saved_project.BRANCH_OPEN]  # a cache branch is always fixed
        if fixed is None:
            st.warning(f"{md(name)} picks the branch at run time: the If's compute stays FP32 until a branch is fixed.",
                       icon=":material/warning:")
        key = f"branch_pick:{name}"
        st.session_state.setdefault(key, options[2] if fixed is None else options[0] if fixed else options[1])
        widget(st, "radio", name, options, key=key, horizontal=True, on_change=saved_project.set_branch, args=(name, key))


def data_origin(p: Project) -> None:
    """Where the calibration and evaluation data come from; generated data is said as such."""
    calib, evald = is_generated(p.calib_data), is_generated(p.eval_data)
    rows = [("calibration", p.calib_data.num_samples, "generated" if calib else "given", p.calib_data.source),
            ("evaluation", p.eval_data.num_samples, "generated" if evald else "given", p.eval_data.source)]
    st.dataframe(pd.DataFrame(rows, columns=["data", "samples", "origin", "source"]), hide_index=True,
                 key="data_origin_table")
    which = " and ".join(w for w, g in (("calibration", calib), ("evaluation", evald)) if g)
    if p.data_problem is not None:
        st.warning(f"Data needed before a build: {md(p.data_problem)}", icon=":material/warning:")
    elif which:
        st.info(f"The {which} data is generated (values that fit the inputs' shapes and dtypes, not real inputs). "
                f"Quality numbers computed on it are marked \"{GENERATED_NOTE}\": give .npz files above for "
                "numbers that hold on real inputs.")
