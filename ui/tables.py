"""Tables as shown: ``st.dataframe`` column formats with units and sensible rounding, chosen by
column name (``*_ms`` in ms, ``pct`` in %, cosines to 4 decimals, SNR in dB, MACs compact). The
data stays as it is (sorting works on the numbers); cells are never read as Markdown."""
from __future__ import annotations

import pandas as pd
import streamlit as st

_FORMATS = [  # (test on the column name, format)
    (lambda c: c in ("ms", "time_ms", "median_ms", "est_ms", "delta_ms") or c.endswith("_ms"), "%.4f ms"),
    (lambda c: c in ("pct", "est_reformat_pct") or c.endswith("_pct"), "%.1f %%"),
    (lambda c: c in ("snr_db",) or c.endswith("_db"), "%.1f dB"),
    (lambda c: c in ("cosine", "cos_drop", "added_cos_drop", "delta", "isolated_delta", "quality", "cosine_mean",
                     "cosine_min", "sensitivity"), "%.4f"),
    (lambda c: c in ("max_abs",), "%.3g"),
    # the headings of core.display.tables's display tables, which carry their unit
    (lambda c: c.startswith("cosine "), "%.4f"),
    (lambda c: c.endswith(("(dB)", "(%)", "(s)")), "%.1f"),
    (lambda c: c in ("macs",), "compact"),
    (lambda c: c in ("int8_mac_share", "int8_mac_fraction"), "percent"),
]


def column_formats(df: pd.DataFrame) -> dict:
    """``column_config`` for the numeric columns of ``df`` that have a known unit."""
    config = {}
    for col in df.columns:
        if not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            continue
        for test, fmt in _FORMATS:
            if test(str(col)):
                config[col] = st.column_config.NumberColumn(str(col), format=fmt)
                break
    return config


def show(df: pd.DataFrame, **kwargs):
    """``st.dataframe`` with :func:`column_formats` (``kwargs`` go to it; a given ``column_config`` wins)."""
    config = {**column_formats(df), **(kwargs.pop("column_config", None) or {})}
    return st.dataframe(df, column_config=config, **kwargs)
