"""Model page, calibration data from images (issue 22 §2): a folder or .zip on the server, or an uploaded .zip,
with the preprocessing recipe's fields; Preview shows the first images as the model will see them (the
layout and normalisation undone for display, ``core.model.data_import.preview``); Use writes the .npz and its
recipe in the workspace (``data/<sha256>/``, as an upload) and makes it the project's calibration data.
A model of token ids gets a text file of lines (one sample each, encoded by its tokenizer: ``tokenizer.json``
beside the model, or a path typed); an audio model a folder or .zip of WAV files (resampled to the rate typed);
both as ``python -m core data`` makes them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import streamlit as st

from core.errors import MixprecError
from core.model.data_import import (LAYOUTS, RESIZES, TOKEN_INPUTS, Recipe, import_audio, import_images, import_text,
                                    is_audio_input, preview, save_in_workspace, saved_recipe)
from core.model.shapes import image_layout
from core.project import ProjectSource
from ui import saved_project, session
from ui.session import code, md

PREVIEW_COUNT = 8
MODEL_LAYOUT = "the input's"


def _numbers(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace(":", ",").split(",") if v.strip())
    except ValueError as e:
        raise MixprecError(f"the {what} {text!r} is not a list of numbers", f"write e.g. 0.485, 0.456, 0.406") from e


def _recipe(image_input: str) -> Recipe:
    """The recipe typed in the form's fields."""
    ss = st.session_state
    return Recipe(resize=ss["img_resize"], pad=ss["img_pad"], channels=ss["img_channels"], scale=ss["img_scale"],
                  mean=_numbers(ss["img_mean"], "mean"), std=_numbers(ss["img_std"], "std"),
                  layout=None if ss["img_layout"] == MODEL_LAYOUT else ss["img_layout"], input=image_input)


def _fields(kept: Recipe) -> None:
    c = st.columns(4)
    c[0].selectbox("Resize", RESIZES, index=RESIZES.index(kept.resize), key="img_resize",
                   help="stretch to the input's H×W; letterbox keeps the aspect ratio (border: Pad); center_crop "
                        "resizes the short side, then takes the middle")
    c[1].slider("Pad (letterbox border)", 0, 255, int(round(kept.pad)), key="img_pad")
    c[2].selectbox("Channels", ("RGB", "BGR"), index=("RGB", "BGR").index(kept.channels), key="img_channels",
                   help="grayscale for a 1-channel input")
    options = (MODEL_LAYOUT, *LAYOUTS)
    c[3].selectbox("Layout", options, index=options.index(kept.layout or MODEL_LAYOUT), key="img_layout")
    c = st.columns(3)
    c[0].text_input("Scale (first)", value=str(round(kept.scale, 10)) if abs(kept.scale - 1 / 255) > 1e-12 else "1/255",
                    key="img_scale", help="e.g. 1/255: pixel values 0–255 to 0–1")
    c[1].text_input("Mean (after scale, per channel)", value=", ".join(f"{v:g}" for v in kept.mean), key="img_mean",
                    help="in the input's channel order, e.g. 0.485, 0.456, 0.406")
    c[2].text_input("Std (per channel)", value=", ".join(f"{v:g}" for v in kept.std), key="img_std",
                    help="e.g. 0.229, 0.224, 0.225")


def _source():
    """(the source of the images, its name): an uploaded .zip's bytes, else the typed server path."""
    up = st.session_state.get("img_zip")
    if up is not None:
        return up.getvalue(), Path(up.name).stem
    typed = (st.session_state.get("img_path") or "").strip()
    if not typed:
        raise MixprecError("no images given", "type the path of a folder or .zip on the server, or upload a .zip")
    return typed, Path(typed).stem or "images"


def _show_preview(imported) -> None:
    st.caption(f"The first {min(PREVIEW_COUNT, imported.num_samples)} images as the model sees them "
               f"({md(imported.input)}, {imported.layout}, {'x'.join(map(str, imported.arrays[imported.input].shape[1:]))}; "
               "normalisation undone for display):")
    cols = st.columns(4)
    for i, (img, name) in enumerate(zip(preview(imported, PREVIEW_COUNT), imported.sources)):
        cols[i % 4].image(img, caption=md(name), width="stretch")
    for note in imported.notes:
        st.caption(md(note))


def section(src: ProjectSource) -> None:
    """The images form under the .npz uploads (nothing but a caption when the model has no image input)."""
    st.markdown("**Or make the calibration data from images**")
    try:
        p = saved_project.open_source(src)
    except MixprecError:
        st.caption("Open the model first (its error is shown below).")
        return
    inputs = [s.name for s in p.model.inputs if image_layout(s) is not None]
    if not inputs:
        names = {s.name for s in p.model.inputs}
        if "input_ids" in names and names <= set(TOKEN_INPUTS):
            _text_form(src, p)
        elif len(p.model.inputs) == 1 and is_audio_input(p.model.inputs[0]):
            _audio_form(src, p)
        else:
            st.caption("This model takes neither images, token ids nor audio samples: give an .npz of its inputs.")
        return
    kept = (saved_recipe(src.data) if src.data else None) or Recipe()
    if src.data and saved_recipe(src.data):
        st.caption(f"The calibration data was made from images with the recipe beside {code(Path(src.data).name)}.")
    with st.form("image_import_form"):
        c1, c2 = st.columns(2)
        c1.text_input("Folder or .zip of images on the server", key="img_path")
        c2.file_uploader("…or upload a .zip of images", type=["zip"], key="img_zip")
        name = st.selectbox("Image input", inputs, key="img_input") if len(inputs) > 1 else inputs[0]
        _fields(kept)
        shape = p.input_shapes[name]
        st.caption(f"Resized to the input shape {code('x'.join(map(str, shape)))} (set it under Input shapes); "
                   "files in sorted path order, anything not an image skipped.")
        b1, b2, _ = st.columns([1, 2, 3])
        show = b1.form_submit_button("Preview", key="img_preview")
        use = b2.form_submit_button("Use as calibration data", type="primary", key="img_use")
    if not (show or use):
        return
    try:
        source, label = _source()
        recipe = _recipe(name)
        if show:
            _show_preview(import_images(source, p.model, p.input_shapes, recipe, p.ws.root, limit=PREVIEW_COUNT))
            return
        result = save_in_workspace(session.workspace(), import_images(source, p.model, p.input_shapes, recipe,
                                                                      p.ws.root), label, p.model)
    except MixprecError as e:
        st.error(md(e))
        return
    saved_project.set_source(replace(src, data=str(result.path)))
    session.flash(f"Calibration data: {result.num_samples} images from {md(label)} (recipe saved beside it)"
                  + "".join(f" · {md(n)}" for n in result.notes), rerun=True)


def _use(src: ProjectSource, p, widget: str, make, what: str) -> None:
    """Write the data ``make(path)`` imports from the server path typed in ``widget`` into the workspace and use
    it as the calibration data (an error, or no path, is shown)."""
    path = (st.session_state.get(widget) or "").strip()
    if not path:
        st.error(md(MixprecError(f"no {what} given", "type its path on the server")))
        return
    label = Path(path).stem or what
    try:
        result = save_in_workspace(session.workspace(), make(path), label, p.model)
    except MixprecError as e:
        st.error(md(e))
        return
    saved_project.set_source(replace(src, data=str(result.path)))
    session.flash(f"Calibration data: {result.num_samples} samples from {md(label)}"
                  + "".join(f" · {md(n)}" for n in result.notes), rerun=True)


def _text_form(src: ProjectSource, p) -> None:
    st.markdown("**Or make the calibration data from text lines**")
    with st.form("text_import_form"):
        c1, c2 = st.columns(2)
        c1.text_input("Text file on the server (one sample per line)", key="text_path")
        c2.text_input("tokenizer.json (optional: default beside the model)", key="tokenizer_path")
        st.caption(f"Each line is encoded by the model's tokenizer, truncated and padded to the sequence length of "
                   f"the input shape {code('x'.join(map(str, p.input_shapes['input_ids'])))}.")
        use = st.form_submit_button("Use as calibration data", type="primary", key="text_use")
    if use:
        tok = (st.session_state.get("tokenizer_path") or "").strip() or None
        _use(src, p, "text_path", lambda path: import_text(path, p.model, p.input_shapes, tok, ws_root=p.ws.root),
             "text file")


def _audio_form(src: ProjectSource, p) -> None:
    st.markdown("**Or make the calibration data from WAV files**")
    with st.form("audio_import_form"):
        c1, c2 = st.columns(2)
        c1.text_input("Folder or .zip of WAV files on the server", key="audio_path")
        c2.number_input("Sample rate the model takes (Hz)", min_value=1000, max_value=192000, value=16000, step=1000,
                        key="audio_rate")
        st.caption("Mixed down to mono, resampled, cut or zero-padded to the input's length.")
        use = st.form_submit_button("Use as calibration data", type="primary", key="audio_use")
    if use:
        recipe = Recipe(rate=int(st.session_state["audio_rate"]))
        _use(src, p, "audio_path", lambda path: import_audio(path, p.model, p.input_shapes, recipe, ws_root=p.ws.root),
             "WAV folder")
