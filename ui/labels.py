"""Widget labels that hold user text (an input's, a dimension's, a branch input's name). Streamlit renders a
label as Markdown and gives the input the label string itself as its accessible name (``aria-label``), so a
label escaped for Markdown (``input\\_dim\\_0``) is read out, and found by a browser test, with its
backslashes. :func:`widget` keeps the accessible name the text itself: a text that shows as it is in
Markdown (``input_dim_0``, ``sample:minilm``, ``images · axis 2 · H``: ``core.display.markdown``) is the
label; any other has its widget label collapsed (still its accessible name) and is drawn above it, escaped.
"""
from __future__ import annotations

from core.display.markdown import md_text, renders_literally


def widget(where, kind: str, text, *args, help: str | None = None, **kwargs):
    """``where.<kind>(text, *args, **kwargs)`` (``kind``: ``"number_input"``, ``"text_input"``, ``"checkbox"``,
    ``"radio"``…) with ``text`` as its label and its exact accessible name; ``help`` (Markdown) goes with the
    label that is shown. Returns the widget's value."""
    text = str(text)
    make = getattr(where, kind)
    if renders_literally(text):
        return make(text, *args, help=help, **kwargs)
    where.markdown(md_text(text), help=help)
    return make(text, *args, label_visibility="collapsed", **kwargs)
