"""The sidebar's compute settings: where the trials of the isolated / leave-one-out sensitivity and
of the search run (this server's local process pool, or Ray tasks: ``core.sensitivity.distributed``), and the
memory budget of the rank's layer-wise comparison (``rank --max-memory``). Both are checked by the
job builders' own checks (``core.jobs.params``), kept for the session and saved with the project
(as the GPU picker of ``ui.estimate_panel`` is): a reload of the project's URL brings them back."""
from __future__ import annotations

import importlib.util
import os

import streamlit as st

from core.errors import MixprecError
from core.jobs.params import IsolatedParams, memory_param, ray_param
from core.sensitivity import parse_memory
from core.sensitivity.distributed import LOCAL, RAY_ENV, RAY_PIN
from core.workspace import human_bytes
from ui import saved_project
from ui.session import code, md

RAY_WIDGET = "ray_address_field"          # the text field (sidebar)
RAY_STATE = "ray_address:value"           # the session's last valid address ("" = the local process pool)
RAY_SETTING = "ray_address"               # saved with the project's settings
MEMORY_WIDGET = "compare_memory_field"
MEMORY_STATE = "compare_memory:value"     # the session's last valid budget ("" = the default)
MEMORY_SETTING = "compare_memory"
ERROR = "{}:error"                        # the error of a field's text, shown under it


def _saved(setting: str) -> str | None:
    saved = saved_project.saved()
    v = saved.settings.get(setting) if saved is not None else None
    return v if isinstance(v, str) else None


def _initial_ray() -> str:
    """The field's first text: the project's saved address, else the server's ``$MIXPREC_RAY_ADDRESS``."""
    saved = _saved(RAY_SETTING)
    return saved if saved is not None else os.environ.get(RAY_ENV, "").strip()


def _check(widget: str, state: str, setting: str, parse) -> None:
    """Check a field's text (``parse``: a builder check, MixprecError on garbage): a valid one becomes
    the session's value and is saved with the project; a bad one is kept as the field's error."""
    text = st.session_state.get(widget, "")
    try:
        value = parse(text) or ""
    except MixprecError as e:
        st.session_state[ERROR.format(widget)] = str(e)
        return
    st.session_state.pop(ERROR.format(widget), None)
    st.session_state[state] = value
    saved = saved_project.saved()
    old = dict(saved.settings) if saved is not None else {}
    if old.get(setting) != value:
        saved_project.save(settings={**old, setting: value})


def _start(widget: str, state: str, initial: str, parse) -> None:
    """At a session's first run: the field holds ``initial`` and the value is its check (or empty)."""
    if widget in st.session_state:
        return
    st.session_state[widget] = st.session_state.get(state, initial)
    if state not in st.session_state:
        try:
            st.session_state[state] = parse(initial) or ""
        except MixprecError as e:
            st.session_state[state] = ""
            st.session_state[ERROR.format(widget)] = str(e)


def ray_address() -> str:
    """Where the session's trial jobs run, as their ``ray`` param: ``""`` (the local process pool),
    ``local`` or a Ray address."""
    _start(RAY_WIDGET, RAY_STATE, _initial_ray(), ray_param)
    return st.session_state[RAY_STATE]


def max_memory() -> str | None:
    """The session's comparison memory budget for rank jobs (``2G``, ``40%``), None for the default."""
    _start(MEMORY_WIDGET, MEMORY_STATE, _saved(MEMORY_SETTING) or "", memory_param)
    return st.session_state[MEMORY_STATE] or None


def where_trials_run(address: str) -> str:
    """Where the trials of a job with this ``ray`` param run (Markdown, user text literal)."""
    if not address:
        return f"this server's local process pool ({IsolatedParams.workers} worker processes per job)"
    if address == LOCAL:
        return "Ray tasks on a Ray instance each job starts on this server"
    return f"Ray tasks on the cluster at {code(address)} (connected when the job starts)"


def _memory_text(value: str | None) -> str:
    if value is None:
        return "The rank compares layer outputs within half of the memory budget (80 % of the memory " \
               "available when the job starts), in chunks."
    budget = parse_memory(value)
    amount = f"{100 * budget:g} % of the memory budget" if isinstance(budget, float) else human_bytes(budget)
    return f"The rank compares layer outputs within {amount}, in chunks."


def _error(widget: str) -> None:
    if st.session_state.get(ERROR.format(widget)):
        st.error(md(st.session_state[ERROR.format(widget)]))


def sidebar_fields() -> None:
    """The two fields and what they mean, in the sidebar (call inside ``with st.sidebar``)."""
    address, memory = ray_address(), max_memory()
    bad = any(st.session_state.get(ERROR.format(w)) for w in (RAY_WIDGET, MEMORY_WIDGET))
    short = "local process pool" if not address else "local Ray instance" if address == LOCAL else \
        f"Ray {code(address)}"
    with st.expander(f"Trials: {short}", expanded=bool(address or memory or bad)):
        env = os.environ.get(RAY_ENV, "").strip()
        st.text_input("Ray cluster address", key=RAY_WIDGET, on_change=_check,
                      args=(RAY_WIDGET, RAY_STATE, RAY_SETTING, ray_param), placeholder="empty: local process pool",
                      help="Where the isolated / leave-one-out sensitivity and the search run their trials: empty "
                           "for this server's worker processes, `local` for a Ray instance each job starts here, "
                           "`auto`, `HOST:6379` or `ray://HOST:10001` for a Ray cluster (as the CLI's --ray)."
                           + (f" The server's `${RAY_ENV}` is the default." if env else ""))
        _error(RAY_WIDGET)
        st.caption(f"Trials run as {where_trials_run(address)}." if address else
                   f"Trials run in {where_trials_run(address)}.")
        if env:
            st.caption(f"Server default (`${RAY_ENV}`): {code(env)}")
        if address and importlib.util.find_spec("ray") is None:
            st.warning(f"Ray is not installed on this server, so these jobs will fail. Fix: install it "
                       f"(scripts/setup.sh, or .venv/bin/pip install {RAY_PIN}), or leave the address empty.")
        st.text_input("Comparison memory budget", key=MEMORY_WIDGET, on_change=_check,
                      args=(MEMORY_WIDGET, MEMORY_STATE, MEMORY_SETTING, memory_param),
                      placeholder="optional, e.g. 2G",
                      help="Memory the rank's layer-wise comparison may use (as the CLI's rank --max-memory): a "
                           "size such as 2G or 512M, or a share of the memory budget such as 40%. Empty: the default.")
        _error(MEMORY_WIDGET)
        st.caption(_memory_text(memory))
