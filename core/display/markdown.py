"""User text (a model, tensor or layer name, a shape, a run label) literal inside Markdown, with as few
escapes as it needs: ``input_ids=1x63`` and ``sample:minilm`` stay as they are, ``_x_`` or ``**b**`` get
the backslashes that keep them from being read as emphasis.

- :func:`code_span` — the text as inline code: literal whatever it holds (no escapes inside a code span;
  a longer run of backticks fences backticks), line breaks and other control characters shown as ``\\n``,
  ``\\x00``… (a real line break would end a paragraph or start a heading). The way names go into the
  export bundle's README.
- :func:`md_text` — the text as prose: a backslash only before what CommonMark / GitHub-flavoured Markdown
  and Streamlit's Markdown would read (emphasis, code, links, HTML, math, strikethrough, emoji and colour
  directives, autolinks, a list or heading marker at its start).
- :func:`renders_literally` — whether the text needs no escape at all: a widget label can then be the text
  itself (its accessible name is exactly the name) — else ``ui.labels`` draws the label beside a widget
  whose own label is the plain text.

Pure text functions: no Streamlit here (``core`` never imports it)."""
from __future__ import annotations

import re
import unicodedata

_CONTROL_NAMES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp")


def visible_controls(text) -> str:
    """``text`` with each control character or line separator written as its Python escape (``\\n``, ``\\x1b``,
    ``\\u2028``), so it stays on one line and can be seen."""
    text = str(text)
    if not any(_is_control(ch) for ch in text):
        return text
    return "".join(_CONTROL_NAMES.get(ch) or (repr(ch)[1:-1] if _is_control(ch) else ch) for ch in text)


def code_span(text) -> str:
    """``text`` as a Markdown code span: literal, whatever it holds (see the module's note)."""
    text = visible_controls(text)
    if not text:
        return "` `"
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    # CommonMark strips one space each side when both are there: pad so the text keeps its own
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    if not text.strip(" "):
        pad = ""  # a span of spaces only is kept as it is
    return f"{ticks}{pad}{text}{pad}{ticks}"


# always read as Markdown wherever they stand: code, emphasis, links and images, HTML and autolinks, math,
# strikethrough
_ALWAYS = set("`*[]<$~")
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")
# ':' that starts an emoji or icon shortcode (:smile:, :material/home:), a colour directive (:red[...]) or
# sits in a URL's "://"
_COLON = re.compile(r":(?:[A-Za-z0-9_+\-/]+:|[A-Za-z-]+\[|//)")
_WWW = re.compile(r"(?i)(?<![A-Za-z0-9])www\.")
_EMAIL = re.compile(r"(?<=[A-Za-z0-9._+\-])@(?=[A-Za-z0-9_\-]+\.[A-Za-z0-9])")
# at the start: a heading ("# "), a block quote (">"), a list item ("- ", "+ ", "1. ", "1) ") or a rule ("---")
_LEADING = re.compile(r"^\s*(?:#{1,6}(?=\s|$)|[-+](?=\s|$)|\d{1,9}[.)](?=\s|$)|>|-(?=(?:\s*-){2,}\s*$))")


def _alnum(ch: str) -> bool:
    return ch.isalnum()


def md_text(text) -> str:
    """``text`` literal in Markdown prose, escaped only where Markdown would read it (see the module's note)."""
    text = visible_controls(text)
    marks: set[int] = set()  # positions that get a backslash
    for i, ch in enumerate(text):
        if ch in _ALWAYS:
            marks.add(i)
        elif ch == "\\":
            nxt = text[i + 1] if i + 1 < len(text) else ""
            if not nxt or (nxt.isascii() and not nxt.isalnum() and not nxt.isspace()):
                marks.add(i)  # before punctuation (or at the end) a backslash is itself an escape
        elif ch == "_":
            before = text[i - 1] if i else ""
            after = text[i + 1] if i + 1 < len(text) else ""
            if not (before and after and _alnum(before) and _alnum(after)):
                marks.add(i)  # only an underscore inside a word can never be emphasis
    marks.update(m.start() for m in _ENTITY.finditer(text))
    marks.update(m.start() for m in _COLON.finditer(text))
    marks.update(m.start() + 3 for m in _WWW.finditer(text))  # the '.' of "www."
    marks.update(m.start() for m in _EMAIL.finditer(text))
    lead = _LEADING.match(text)
    if lead:
        marks.add(lead.end() - 1)  # "# ", "- ", "1. " at the start: a heading or a list
    return "".join("\\" + ch if i in marks else ch for i, ch in enumerate(text))


def renders_literally(text) -> bool:
    """True when ``text`` shows as itself in Markdown with no escape (and holds no control character)."""
    return md_text(text) == str(text)
