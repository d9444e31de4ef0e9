"""Model page, input shapes: every dynamic dimension of every input (named or not) with its value
and where the value came from (defaults and guesses said as such), editable; Apply reopens the
project at those shapes, which every job then uses (calibration, evaluation, timing, export). Each dynamic
input takes an optional min and max shape beside it: the dynamic-shape profile of the exported TensorRT
engine (``core.model.profiles``), whose opt is the shape set here."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from core.errors import MixprecError
from core.model.kv_cache import describe as describe_kv, kv_cache
from core.model.profiles import profile_from_text, range_text
from core.model.shapes import batch_axes, shape_text, stacked_inputs
from core.project import Project
from ui import saved_project, session
from ui.labels import widget
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
    return f"{c.input} · axis {c.axis} · {sym}"  # plain text (ui.labels): it is the input's accessible name


def section(p: Project) -> None:
    st.subheader("Input shapes")
    choices = list(p.shape_choices)
    dynamic = [c for c in choices if c.source != "fixed"]
    given = saved_project.source().shapes
    profiles = saved_project.source().profiles or {}
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
    keys, ranges, flags = {}, {}, {}
    axes, stacked = batch_axes(p.model), stacked_inputs(p.model)
    marked = set(saved_project.source().no_batch or ())
    with st.form("shapes_form"):
        for name in dict.fromkeys(c.input for c in dynamic):
            dims = [c for c in choices if c.input == name]
            st.markdown(f"**{md(name)}** · now {code(shape_text(c.value for c in dims))}")
            cols = st.columns(min(4, max(1, sum(c.source != "fixed" for c in dims))))
            for k, c in enumerate(d for d in dims if d.source != "fixed"):
                keys[(c.input, c.axis)] = key = f"shape:{p.model.sha256[:12]}:{version}:{c.input}:{c.axis}"
                widget(cols[k % len(cols)], "number_input", _label(c), min_value=1, value=int(c.value), step=1,
                       help=md(c.note) or None, key=key)
                cols[k % len(cols)].caption(md(status(c)))
            ranges[name] = _range_fields(p, name, version, profiles.get(name))
            flags[name] = _no_batch_field(p, name, version, axes.get(name), name in stacked, name in marked)
        # on_click: the shapes are applied at the start of the run that carries the click (kept even if that
        # run is interrupted); what went wrong is shown here, in the next drawing
        st.form_submit_button("Apply shapes", type="primary", key="apply_shapes", on_click=_apply_typed,
                              args=(choices, keys, given, ranges, flags))
    if given or profiles or marked:
        st.button("Back to the default shapes", key="reset_shapes", on_click=_apply, args=(None,))
    if st.session_state.get(SHAPES_ERROR):
        st.error(st.session_state.pop(SHAPES_ERROR))


SHAPES_ERROR = "shapes_error"  # why the last Apply was refused, for the next drawing


def _range_fields(p: Project, name: str, version: int, saved) -> tuple[str, str]:
    """The optional min and max shape of input ``name`` (text like ``1x16``; empty: the shape above), for
    the exported engine's optimisation profile; returns their widget keys."""
    keys = tuple(f"profile:{p.model.sha256[:12]}:{version}:{name}:{end}" for end in ("min", "max"))
    lo, hi = st.columns(2)
    for col, key, what, value in zip((lo, hi), keys, ("min", "max"), (saved[0], saved[2]) if saved else ("", "")):
        widget(col, "text_input", f"{name} · {what} shape (optional)", value=shape_text(value) if saved else "",
               key=key, placeholder="the shape above",
               help=f"The {what} shape of {md(name)} in the exported TensorRT engine's optimisation profile "
                    "(trtexec --minShapes/--maxShapes), e.g. 1x16; the shape above is its opt, which "
                    "mixprec calibrates, evaluates and times at. Empty: the shape above.")
    return keys


def _no_batch_field(p: Project, name: str, version: int, axis, stacked: bool, marked: bool) -> str | None:
    """The "no batch axis" checkbox of input ``name`` (``--no-batch``): checked, the input is fed whole, one
    sample per array along a new leading axis of the data; returns its widget key (None: nothing to choose, the
    model itself has no batch axis there)."""
    if stacked and not marked:
        st.caption(f"{md(name)} has no batch axis: it is fed whole, one sample per array along a new axis 0 of "
                   "the data.")
        return None
    key = f"nobatch:{p.model.sha256[:12]}:{version}:{name}"
    widget(st, "checkbox", f"{name} · no batch axis", value=marked, key=key,
           help=(f"mixprec reads axis {axis} as the batch. " if axis is not None else "")
           + "Checked: this input has no batch axis (e.g. an audio model's [frames, bins]); it is fed whole, "
             "one sample per array along a new leading axis of the .npz (python -m core … --no-batch INPUT).")
    return key


def _apply_typed(choices, keys: dict, given: dict | None, ranges: dict | None = None, flags: dict | None = None) -> None:
    """The Apply button's callback: the shapes typed in the form's inputs (``keys``: their widget keys),
    each input's min and max shape (``ranges``: input -> their widget keys) and its "no batch axis"
    checkbox (``flags``: input -> its widget key)."""
    values = {k: st.session_state[w] for k, w in keys.items() if st.session_state.get(w) is not None}
    shapes = _shapes(choices, values, given)
    try:
        profiles = _profiles(choices, shapes, {n: tuple(st.session_state.get(w) for w in ws)
                                               for n, ws in (ranges or {}).items()})
    except MixprecError as e:
        st.session_state[SHAPES_ERROR] = md(e)
        return
    no_batch = sorted(n for n, w in (flags or {}).items() if w and st.session_state.get(w))
    _apply(shapes, profiles, no_batch)


def _profiles(choices, shapes: dict | None, typed: dict) -> dict | None:
    """The profiles of the min and max shapes ``typed`` (input -> (min text, max text)) around each input's
    opt: the shape it is opened at (``shapes``, else its value now)."""
    now: dict[str, list[int]] = {}
    for c in choices:
        now.setdefault(c.input, []).append(int(c.value))
    out = {}
    for name, (lo, hi) in typed.items():
        r = profile_from_text(name, (shapes or {}).get(name) or now[name], lo, hi)
        if r is not None:
            out[name] = r
    return out or None


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


def _apply(shapes: dict | None, profiles: dict | None = None, no_batch=None) -> None:
    """Open the project at ``shapes``, ``profiles`` and ``no_batch`` first (an error is shown and nothing
    changes), then use them."""
    try:
        saved_project.open_source(replace(saved_project.source(), shapes=shapes, profiles=profiles,
                                          no_batch=no_batch or None))
    except MixprecError as e:
        st.session_state[SHAPES_ERROR] = md(e)
        return
    st.session_state.pop(SHAPES_ERROR, None)
    saved_project.set_shapes(shapes, profiles, no_batch)
    st.session_state["shapes_version"] = st.session_state.get("shapes_version", 0) + 1
    text = ", ".join(f"{n}={shape_text(s)}" for n, s in shapes.items()) if shapes else "the default shapes"
    if profiles:
        text += "; profile " + ", ".join(f"{n}={range_text(r)}" for n, r in profiles.items())
    if no_batch:
        text += "; no batch axis: " + ", ".join(no_batch)
    session.flash(f"Input shapes: {md(text)}. Jobs started from now on use them.", rerun=True)
