"""The CLI's stdout with ``--json``: one JSON document and nothing else."""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

from core.records import json_safe

_DOCUMENT_OUT = None  # with --json: the real stdout, which carries the JSON document only


def print_document(doc) -> None:
    """Print the command's JSON document on the real stdout (with ``--json`` every other write to fd 1, of
    this process or a child it starts — a raylet's log line, a worker's print, a C library — goes to stderr)."""
    out = _DOCUMENT_OUT or sys.stdout
    out.write(json.dumps(json_safe(doc), indent=2) + "\n")
    out.flush()


@contextmanager
def stdout_for_the_document(on: bool):
    """With ``--json``: fd 1 (which children inherit) and ``sys.stdout`` point at stderr while the command runs,
    and the JSON document goes to a duplicate of the original stdout (``print_document``)."""
    global _DOCUMENT_OUT
    if not on:
        yield
        return
    py_stdout = sys.stdout
    py_stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    # The document goes where sys.stdout went: through fd 1's duplicate when sys.stdout wrote to fd 1 (now
    # stderr), else to that stream itself (an embedding program's or a test's capture, which owns it).
    own = _writes_to_fd1(py_stdout)
    _DOCUMENT_OUT = os.fdopen(os.dup(saved), "w") if own else py_stdout
    sys.stdout = sys.stderr  # this process's prints too (sys.stdout need not be fd 1)
    try:
        yield
    finally:
        sys.stdout = py_stdout
        sys.stderr.flush()
        if own:
            _DOCUMENT_OUT.close()
        _DOCUMENT_OUT = None
        os.dup2(saved, 1)
        os.close(saved)


def _writes_to_fd1(stream) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return False
