"""The isolated (or leave-one-out) ranking next to the cumulative one, layer by layer."""
from __future__ import annotations

import pandas as pd

COMPARE_COLUMNS = ["name", "op_type", "macs", "isolated_rank", "isolated_delta", "cumulative_rank", "cos_drop",
                   "added_cos_drop"]


def ranking_comparison(cumulative: pd.DataFrame | None, isolated: pd.DataFrame) -> pd.DataFrame:
    """One row per INT8-eligible layer (COMPARE_COLUMNS), most harmful on its own first: its rank
    and cosine drop in the isolated (or leave-one-out) ranking next to its rank among the same
    layers in the cumulative ranking (all eligible layers INT8)."""
    df = isolated.rename(columns={"rank": "isolated_rank", "delta": "isolated_delta"})
    cum = pd.DataFrame(columns=["name", "cos_drop", "added_cos_drop"]) if cumulative is None else \
        cumulative[cumulative["name"].isin(df["name"])]
    cum = cum.sort_values("cos_drop", ascending=False, kind="stable")[["name", "cos_drop", "added_cos_drop"]]
    cum.insert(1, "cumulative_rank", range(1, len(cum) + 1))
    out = df.merge(cum, on="name", how="left").sort_values("isolated_rank", kind="stable", ignore_index=True)
    return out[COMPARE_COLUMNS]
