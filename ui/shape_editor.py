"""Model page, input shapes: every dynamic dimension of every input (named or not) with its value
and where the value came from (defaults and guesses said as such), editable; Apply reopens the
project at those shapes, which every job then uses (calibration, evaluation, timing, export)."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from core.errors import MixprecError
from core.model.kv_cache import describe as describe_kv, kv_cache
from core.model.shapes import shape_text
from core.project import Project
from ui import saved_project, session
from ui.session import code, md

_SOURCE_TEXT = {"given": "set by you", "batch": "batch", "data": "from the data", "default": "default",
                "guessed": "guessed"}


def status(c) -> str:
    """What the editor says about one dimension: e.g. "guessed: 224 — set it"."""
    if c.source in ("default", "guessed"):
        why = c.note.split(" — ")[0] if c.note else c.source
        return f"{why if why.startswith(c.source) else c.source} — set it"
    return _SOURCE_TEXT.get(c.source, c.source) + (f": {c.value}" if c.source != "given" else "")


def _label(c) -> str:
    sym = "unnamed" if c.symbol in (None, "?") else c.symbol
    return f"{c.input} · axis {c.axis} · {sym}"  # no brackets: md() would escape them in the aria-label


def section(p: Project) -> None:
    st.subheader("Input shapes")
    choices = list(p.shape_choices)
    dynamic = [c for c in choices if c.source != "fixed"]
    given = saved_project.source().shapes
    if not dynamic:
        st.caption("Every dimension of every input is fixed by the model: nothing to set.")
        return
    st.caption("Every dynamic dimension needs a value for calibration, evaluation, timing and the exported "
               "trtexec shapes. Defaults and guesses are marked: set the size your model really runs at, then Apply.")
    kv = kv_cache(p.model)
    if kv is not None:  # a decoder with its KV cache: set past and seq; the mask follows them
        st.info(md(describe_kv(kv, p.input_shapes).replace("; set them with", "; set") + " here (the mask "
                   f"follows them), and the generated data's cache holds the model's own keys and values of a prompt"),
                icon=":material/memory:")
    version = st.session_state.get("shapes_version", 0)
    keys = {}
    with st.form("shapes_form"):
        for name in dict.fromkeys(c.input for c in dynamic):
            dims = [c for c in choices if c.input == name]
            st.markdown(f"**{md(name)}** · now {code(shape_text(c.value for c in dims))}")
            cols = st.columns(min(4, max(1, sum(c.source != "fixed" for c in dims))))
            for k, c in enumerate(d for d in dims if d.source != "fixed"):
                keys[(c.input, c.axis)] = key = f"shape:{p.model.sha256[:12]}:{version}:{c.input}:{c.axis}"
                cols[k % len(cols)].number_input(md(_label(c)), min_value=1, value=int(c.value), step=1,
                                                 help=md(c.note) or None, key=key)
                cols[k % len(cols)].caption(md(status(c)))
        # on_click: the shapes are applied at the start of the run that carries the click (kept even if that
        # run is interrupted); what went wrong is shown here, in the next drawing
        st.form_submit_button("Apply shapes", type="primary", key="apply_shapes", on_click=_apply_typed,
                              args=(choices, keys, given))
    if given:
        st.button("Back to the default shapes", key="reset_shapes", on_click=_apply, args=(None,))
    if st.session_state.get(SHAPES_ERROR):
        st.error(st.session_state.pop(SHAPES_ERROR))


SHAPES_ERROR = "shapes_error"  # why the last Apply was refused, for the next drawing


def _apply_typed(choices, keys: dict, given: dict | None) -> None:
    """The Apply button's callback: the shapes typed in the form's inputs (``keys``: their widget keys)."""
    values = {k: st.session_state[w] for k, w in keys.items() if st.session_state.get(w) is not None}
    _apply(_shapes(choices, values, given))


def _shapes(choices, values: dict, given: dict | None) -> dict[str, list[int]] | None:
    """The per-input shapes to open the project with: the inputs set before, and those edited now."""
    edited = {k: int(v) for k, v in values.items()}
    by_key = {(c.input, c.axis): c for c in choices}
    for key, v in list(edited.items()):  # a named dim changed in one place changes everywhere it appears
        c = by_key[key]
        if c.symbol not in (None, "?") and v != c.value:
            for o in choices:
                if o.symbol == c.symbol and edited.get((o.input, o.axis), o.value) == o.value:
                    edited[(o.input, o.axis)] = v
    values = edited
    full: dict[str, list[int]] = {}
    for c in choices:
        full.setdefault(c.input, []).append(int(values.get((c.input, c.axis), c.value)))
    changed = {c.input for c in choices if (c.input, c.axis) in values and int(values[(c.input, c.axis)]) != c.value}
    keep = set(given or {}) | changed
    return {name: shape for name, shape in full.items() if name in keep} or None


def _apply(shapes: dict | None) -> None:
    """Open the project at ``shapes`` first (an error is shown and nothing changes), then use them."""
    try:
        saved_project.open_source(replace(saved_project.source(), shapes=shapes))
    except MixprecError as e:
        st.session_state[SHAPES_ERROR] = md(e)
        return
    st.session_state.pop(SHAPES_ERROR, None)
    saved_project.set_shapes(shapes)
    st.session_state["shapes_version"] = st.session_state.get("shapes_version", 0) + 1
    text = ", ".join(f"{n}={shape_text(s)}" for n, s in shapes.items()) if shapes else "the default shapes"
    session.flash(f"Input shapes: {md(text)}. Jobs started from now on use them.", rerun=True)
