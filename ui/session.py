"""What every page of a session uses: the workspace and its job manager, the backend ``auto`` picks
here, user text made literal for Markdown (``md``, ``code``), uploads validated into the workspace, and
the widgets that live in the session's state (a message shown at the next run, a destructive action
confirmed first, a speedup said in words). No logic beyond wiring Streamlit state to core."""
from __future__ import annotations

import re

import streamlit as st
import streamlit.emojis  # noqa: F401  (see below)
from streamlit.runtime.scriptrunner import get_script_run_ctx

from core.backends import select_backend
from core.errors import MixprecError
from core.jobs import JobManager
from core.measure.runs import speedup_text
from core.store import results as store
from core.workspace import Workspace

# streamlit.emojis is imported here, once per server process as its first page runs, not by the first
# st.success/st.error/st.info of non-ASCII text (Streamlit looks for a leading emoji there): its import
# compiles a regex of every emoji, 0.3-0.5 s of CPU that landed on a user's first policy edit (its
# "Set policy" message), 2.4 s under load (issue 23 fault 10, bench/server_responsiveness.py round 1).

_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+!|~$:&^=])")


def md(text) -> str:
    """User text (a model, layer or run name, a label, a regex) made literal inside Markdown:
    every character Markdown, math, emoji or colour directives would read is escaped."""
    return _MARKDOWN.sub(r"\\\1", str(text))


def code(text) -> str:
    """User text as inline Markdown code (a path, a queue, a hash): literal, whatever it holds."""
    text = str(text)
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def workspace() -> Workspace:
    return Workspace.default()


def manager() -> JobManager:
    return JobManager.for_workspace(workspace())


@st.cache_resource(show_spinner=False)
def auto_backend() -> str:
    """Which backend `auto` picks here, and why (TensorRT needs the package and a CUDA device)."""
    return select_backend("auto")[1]


def auto_backend_name() -> str:
    """The name of the backend `auto` picks here (``onnxruntime`` or ``tensorrt``)."""
    return auto_backend().split(":", 1)[0]


_DELTA = {"up": "green", "down": "red", "off": "gray"}


def speedup_metric(where, label: str, value: str, speedup, help: str | None = None) -> None:
    """An ``st.metric`` whose delta is the speedup against FP32 in words: green with an up arrow
    when faster, red with a down arrow and "slower than FP32" when slower (``core.measure.runs.speedup_text``)."""
    text, direction = speedup_text(speedup)
    where.metric(label, value, text, delta_color=_DELTA[direction], delta_arrow=direction, help=help)


def upload(file, kind: str, model=None) -> str | None:
    """Store an uploaded model or .npz in the workspace after validating it; None (with an
    error shown) if it is bad."""
    if file is None:
        return None
    try:
        return str(store.store_upload(workspace(), file.getvalue(), file.name, kind, model))
    except MixprecError as e:
        st.error(md(e))
        return None


def confirmed(key: str, label: str, question: str, confirm_label: str, on_confirm, args: tuple = (), box=None,
              **button) -> None:
    """A destructive action's button: pressing ``label`` asks ``question`` (Markdown, user text
    escaped by the caller) with ``confirm_label`` (key ``<key>_confirm``) and Cancel
    (``<key>_cancel``), in ``box`` (a container; here if None). Confirming runs ``on_confirm(*args)`` as the
    button's ``on_click``: at the start of the run that carries the click, so a newer request or a rerun
    higher up the page cannot lose it (``args`` are what the page showed when it asked)."""
    flag = f"confirm:{key}"
    st.button(label, key=key, on_click=_ask, args=(flag, True), **button)
    if not st.session_state.get(flag):
        return
    with (box if box is not None else st.container()).container(border=True):
        st.warning(question)
        c1, c2, _ = st.columns([1, 1, 3])
        c1.button(confirm_label, key=f"{key}_confirm", type="primary", on_click=_confirm,
                  args=(flag, on_confirm, args))
        c2.button("Cancel", key=f"{key}_cancel", on_click=_ask, args=(flag, False))


def _ask(flag: str, ask: bool) -> None:
    st.session_state[flag] = ask


def _confirm(flag: str, on_confirm, args: tuple) -> None:
    on_confirm(*args)
    st.session_state.pop(flag, None)


def fragment_rerun() -> bool:
    """True in a fragment's own run (its ``run_every`` timer or a widget inside it), False in a full run of the
    page (where a fragment is drawn inline, as the page goes)."""
    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def memo(name: str, key, compute):
    """``compute()``, kept in the session for as long as ``key`` (hashable; content hashes) stays the same:
    one slot per ``name``. For what a page draws at every run from the same draft (issue 23 fault 10: the
    draft's boundaries and diff cost most of a rerun under load)."""
    slot = st.session_state.get(f"_memo-{name}")
    if slot is not None and slot[0] == key:
        return slot[1]
    value = compute()
    st.session_state[f"_memo-{name}"] = (key, value)
    return value


def flash(message: str, rerun: bool = False) -> None:
    """A success message shown once, at the next run of the page (``show_flash``). User text in
    ``message`` goes through ``md``."""
    st.session_state["flash"] = message
    if rerun:
        st.rerun()


def show_flash() -> None:
    if "flash" in st.session_state:
        st.success(st.session_state.pop("flash"))
