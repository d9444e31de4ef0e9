""""Add a GPU" on the Precision page: a form with the fields of a GPU table row, validated by the
same code as ``--gpu-spec`` (``core.estimate.gpus.check_spec``, via ``core.store.results.save_gpu_spec``),
saved in the workspace (``gpus/<key>.json``) and then offered in the estimate's GPU picker beside
the table's rows. A saved file that is not valid is skipped with a note, never fatal."""
from __future__ import annotations

import streamlit as st

from core.errors import MixprecError
from core.estimate.gpus import ARCHITECTURES, FIELD_HELP, FIGURES, GPU
from core.store.results import delete_gpu_spec, read_gpu_specs, save_gpu_spec
from core.workspace import Workspace
from ui.session import code, md

FORM = "add_gpu"
EXPANDED = "add_gpu:open"      # the expander stays open after a save or an error
PREFIX = "gpu_form_"           # widget keys: gpu_form_key, gpu_form_fp32_tflops, …
_NUMBERS = (("sm_count", "SMs", "%d"), ("fp32_tflops", "FP32 TFLOPS (CUDA cores)", "%.2f"),
            ("tf32_tflops", "TF32 tensor TFLOPS (empty before Ampere)", "%.2f"),
            ("fp16_tflops", "FP16 tensor TFLOPS, FP32 accumulate", "%.2f"),
            ("fp16_acc16_tflops", "FP16 tensor TFLOPS, FP16 accumulate", "%.2f"),
            ("int8_tops", "INT8 tensor TOPS", "%.2f"), ("bandwidth_gbs", "Memory bandwidth, GB/s", "%.1f"),
            ("memory_gb", "Memory, GB (optional)", "%.1f"), ("base_clock_mhz", "Base clock, MHz (optional)", "%.0f"),
            ("boost_clock_mhz", "Boost clock, MHz (optional)", "%.0f"))


def saved_gpus(ws: Workspace) -> dict[str, GPU]:
    """The GPUs saved in the workspace, by key (files that are not valid are left out)."""
    return read_gpu_specs(ws)[0]


def _doc() -> dict:
    """The form's values as a GPU spec document (empty fields are left out: the check names them)."""
    s = st.session_state
    doc = {"key": (s.get(PREFIX + "key") or "").strip() or None, "name": (s.get(PREFIX + "name") or "").strip() or None,
           "arch": s.get(PREFIX + "arch")}
    for f, _, _ in _NUMBERS:
        v = s.get(PREFIX + f)
        if v is not None:
            doc[f] = int(v) if f == "sm_count" and float(v).is_integer() else v
    for f in ("halved", "derived"):
        if s.get(PREFIX + f):
            doc[f] = list(s[PREFIX + f])
    return {k: v for k, v in doc.items() if v is not None}


def section(ws: Workspace, on_saved) -> None:
    """The "Add a GPU" expander: the form, what it saved, and the saved GPUs (each can be removed).
    ``on_saved(key)`` is called with the key of a GPU just saved (the picker then selects it)."""
    saved, notes = read_gpu_specs(ws)
    label = f"Add a GPU that is not in the table ({len(saved)} saved)" if saved else "Add a GPU that is not in the table"
    with st.expander(label, expanded=bool(st.session_state.get(EXPANDED)), icon=":material/add:"):
        for n in notes:
            st.warning(md(n), icon=":material/warning:")
        st.caption("The figures of its datasheet, dense (a figure given only with sparsity, marked *, is halved). "
                   "The same fields as a row of the GPU table and as `--gpu-spec FILE.json` on the command line.")
        with st.form(FORM, clear_on_submit=False, border=False):
            c = st.columns(3)
            c[0].text_input("Key", key=PREFIX + "key", placeholder="my-rtx-a6000", help=FIELD_HELP["key"])
            c[1].text_input("Name", key=PREFIX + "name", placeholder="NVIDIA RTX A6000", help=FIELD_HELP["name"])
            c[2].selectbox("Architecture", ARCHITECTURES, index=ARCHITECTURES.index("ampere"), key=PREFIX + "arch",
                           help=FIELD_HELP["arch"])
            c = st.columns(4)
            for i, (f, text, fmt) in enumerate(_NUMBERS):
                c[i % 4].number_input(text, value=None, key=PREFIX + f, format=fmt, help=FIELD_HELP[f],
                                      step=1 if f == "sm_count" else None)
            c = st.columns(2)
            c[0].multiselect("Halved (given with sparsity only)", FIGURES, key=PREFIX + "halved",
                             help=FIELD_HELP["halved"])
            c[1].multiselect("Derived (not in the datasheet)", FIGURES, key=PREFIX + "derived",
                             help=FIELD_HELP["derived"])
            st.form_submit_button("Save the GPU", icon=":material/save:", key=PREFIX + "save", on_click=_save,
                                  args=(ws, on_saved))
        if st.session_state.get(ERROR):
            st.error(st.session_state.pop(ERROR), icon=":material/error:")
        if st.session_state.get("add_gpu:saved") in saved:
            st.success(f"Saved {md(saved[st.session_state['add_gpu:saved']].name)}: it is in the GPU picker.",
                       icon=":material/check:")
        for key, g in saved.items():
            row = st.columns([4, 1])
            row[0].caption(f"{md(g.name)} ({code(key)}, {md(g.arch)}, {g.sm_count} SMs, FP16 "
                           f"{g.fp16_acc16_tflops:g} TFLOPS, INT8 {g.int8_tops:g} TOPS, {g.bandwidth_gbs:g} GB/s)")
            row[1].button("Remove", key=f"gpu_form_remove:{key}", icon=":material/delete:", on_click=_remove,
                          args=(ws, key))


ERROR = PREFIX + "error"  # why the last save or removal failed, for the next drawing of the form


# The buttons act in their on_click callbacks: at the start of the run that carries the click, so the click is
# kept even if that run is interrupted; what went wrong is shown in the next drawing (ERROR).
def _save(ws: Workspace, on_saved) -> None:
    st.session_state[EXPANDED] = True
    try:
        g = save_gpu_spec(ws, _doc())
    except MixprecError as e:
        st.session_state[ERROR] = md(e)
    except OSError as e:
        st.session_state[ERROR] = md(f"the GPU could not be saved: {e.strerror or e}")
    else:
        st.session_state.pop(ERROR, None)
        st.session_state["add_gpu:saved"] = g.key
        on_saved(g.key)


def _remove(ws: Workspace, key: str) -> None:
    try:
        delete_gpu_spec(ws, key)
    except MixprecError as e:
        st.session_state[ERROR] = md(e)
    else:
        st.session_state.pop(ERROR, None)
        st.session_state.pop("add_gpu:saved", None)
