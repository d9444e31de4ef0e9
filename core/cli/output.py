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
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _DOCUMENT_OUT, py_stdout = os.fdopen(os.dup(saved), "w"), sys.stdout
    sys.stdout = sys.stderr  # this process's prints too (sys.stdout need not be fd 1)
    try:
        yield
    finally:
        sys.stdout = py_stdout
        sys.stderr.flush()
        _DOCUMENT_OUT.close()
        _DOCUMENT_OUT = None
        os.dup2(saved, 1)
        os.close(saved)
