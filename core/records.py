"""Building blocks of the typed result records (``to_json``/``from_json`` with a format
version): tables as JSON that keep their dtypes, and one check of a document's kind and format
version with a message that says what to do. Used by ``runs``, ``sensitivity``, ``search`` and
``store``; imports nothing of mixprec but its error type."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from core.errors import MixprecError


def _plain(v):
    """A JSON-safe scalar: numpy scalars to Python, NaN to None, inf to "inf"/"-inf"."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    if v is pd.NA or v is pd.NaT:
        return None
    return v


def frame_to_json(df: pd.DataFrame) -> dict:
    """``{"columns", "dtypes", "rows"}``: rows as lists, dtypes as pandas names, so that
    :func:`frame_from_json` gives back the same columns with the same dtypes (booleans stay
    booleans, integers stay integers). NaN is stored as null and inf as "inf" (both come back as floats)."""
    return {"columns": [str(c) for c in df.columns], "dtypes": {str(c): str(t) for c, t in df.dtypes.items()},
            "rows": [[_plain(v) for v in row] for row in df.itertuples(index=False, name=None)]}


def frame_from_json(doc: dict, columns: list[str] | None = None, what: str = "table") -> pd.DataFrame:
    """The table of :func:`frame_to_json`; with ``columns``, checks that it has exactly those."""
    try:
        cols, dtypes, rows = list(doc["columns"]), dict(doc["dtypes"]), list(doc["rows"])
    except (KeyError, TypeError) as e:
        raise MixprecError(f"the stored {what} is not a mixprec table (no columns/dtypes/rows)",
                           "delete it and compute it again") from e
    if columns is not None and cols != list(columns):
        raise MixprecError(f"the stored {what} has the columns {cols}, expected {list(columns)}",
                           "delete it and compute it again")
    df = pd.DataFrame(rows, columns=cols)
    for c in cols:
        t = dtypes.get(c, "object")
        if t.startswith("float"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(t)
        elif t.startswith(("int", "uint")) and not df[c].isna().any():
            df[c] = df[c].astype(t)
        elif t == "bool" and not df[c].isna().any():
            df[c] = df[c].astype(bool)
        elif t in ("str", "string", "object"):
            df[c] = df[c].astype(object)
    return df


def check_format(doc, kind: str, version: int, what: str | None = None) -> dict:
    """``doc`` if it is a ``kind`` document of format ``version``; a MixprecError that says
    what to do otherwise (an older format is recomputed, a newer one needs a newer mixprec)."""
    what = what or kind
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise MixprecError(f"the stored {what} is not a mixprec {kind} document", "delete it and compute it again")
    got = doc.get("format_version")
    if got != version:
        if isinstance(got, int) and got > version:
            raise MixprecError(f"the stored {what} has format {got}, newer than this mixprec reads ({version})",
                               "update mixprec, or compute it again with this version")
        raise MixprecError(f"the stored {what} has format {got}, older than this mixprec reads ({version})",
                           "compute it again: this version does not read the old format")
    return doc


def json_safe(obj):
    """``obj`` for JSON: NaN/inf become null, tuples lists, numpy scalars Python numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return json_safe(obj.item())
    return obj
