"""Policy editing for the dashboard's Precision and Export pages: bulk selections, the
precision table, diffs against built policies and the compiled exports. Pure functions over
core objects, so pages stay thin and the logic is testable without Streamlit."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .errors import MixprecError
from .inventory import PRECISIONS, Layer
from .policy import Policy, policy_from_text
from .project import Project
from .runs import int8_mac_fraction, list_runs

EDITOR_COLUMNS = ["name", "op_type", "macs", "sensitivity", "eligible", "precision"]
DIFF_COLUMNS = ["name", "op_type", "built", "now"]
COMPARE_COLUMNS = ["name", "op_type", "macs", "isolated_rank", "isolated_delta", "cumulative_rank", "cos_drop",
                   "added_cos_drop"]
FRONT_COLUMNS = ["candidate", "method", "n_int8", "quality", "est_ms", "int8_mac_share", "est_reformat_pct",
                 "boundaries", "meets_budget"]


def select_layers(layers: list[Layer], op_types=None, regex: str | None = None) -> list[str]:
    """Names of the layers whose op type is in ``op_types`` (if given) and whose name matches
    ``regex`` (``re.search``, if given)."""
    try:
        pattern = re.compile(regex) if regex else None
    except re.error as e:
        raise MixprecError(f"the name pattern {regex!r} is not a valid regular expression ({e})",
                           "escape special characters, e.g. layer\\.5/output") from e
    return [l.name for l in layers
            if (not op_types or l.op_type in op_types) and (pattern is None or pattern.search(l.name))]


def set_precision(policy: Policy, layers: list[Layer], names, precision: str) -> tuple[Policy, list[str]]:
    """Set ``names`` to ``precision``; INT8 is applied only to eligible layers and the
    others are returned as skipped."""
    if precision not in PRECISIONS:
        raise MixprecError(f"unknown precision {precision!r}", "use fp32, fp16 or int8")
    eligible = {l.name for l in layers if l.eligible}
    names = list(names)
    skipped = [n for n in names if precision == "int8" and n not in eligible]
    return policy.with_layers({n: precision for n in names if n not in skipped}), skipped


def top_sensitive(ranking: pd.DataFrame | None, k: int, metric: str = "cos_drop") -> list[str]:
    """The ``k`` most sensitive INT8-eligible layers of a ranking table."""
    if ranking is None or ranking.empty:
        raise MixprecError("there is no sensitivity ranking for this model and data yet",
                           "run the ranking on the Sensitivity page first")
    df = ranking[ranking["eligible"].astype(str).isin(["True", "true", "1"])]
    df = df.sort_values(metric, ascending=metric == "snr_db", kind="stable")
    return df["name"].head(int(k)).tolist()


def editor_table(project: Project, policy: Policy, ranking: pd.DataFrame | None) -> pd.DataFrame:
    """One row per layer (EDITOR_COLUMNS), ``sensitivity`` = cosine drop under all-INT8."""
    sens = dict(zip(ranking["name"], ranking["cos_drop"])) if ranking is not None else {}
    rows = [(l.name, l.op_type, l.macs, sens.get(l.name), l.eligible, policy.layers.get(l.name, "fp32"))
            for l in project.layers]
    return pd.DataFrame(rows, columns=EDITOR_COLUMNS)


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


def search_tables(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From a stored search document: every evaluated candidate (with the ``pareto`` flag) and the
    front (FRONT_COLUMNS, fastest first)."""
    cands = pd.DataFrame(doc.get("candidate_table") or doc["front"])
    if "boundaries" not in cands:  # stored by mixprec before the latency model counted them
        cands["boundaries"] = pd.NA
    front = cands[cands["pareto"].astype(bool)].sort_values("est_ms", ignore_index=True)
    return cands, front[FRONT_COLUMNS]


def policy_summary(project: Project, policy: Policy) -> dict:
    return {**policy.precision_counts(), "int8_mac_share": int8_mac_fraction(project, policy)}


def policy_diff(before: Policy | None, after: Policy, layers: list[Layer]) -> pd.DataFrame:
    """Layers whose precision differs between two policies (DIFF_COLUMNS)."""
    old = before.layers if before else {}
    rows = [(l.name, l.op_type, old.get(l.name, "—"), after.layers.get(l.name))
            for l in layers if old.get(l.name) != after.layers.get(l.name)]
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)


def run_policy(project: Project, run_dir: str | Path) -> Policy:
    path = Path(run_dir) / "policy.json"
    return policy_from_text(path.read_text(), project.model, project.layers, source=path.name)


def last_built_policy(project: Project) -> Policy | None:
    """The policy of the newest stored run of this model, or None."""
    runs = list_runs(project.ws, project.model.sha256)
    for run_id in runs["run_id"]:
        try:
            return run_policy(project, project.ws.runs / run_id)
        except (OSError, MixprecError):
            continue
    return None


def run_comparison(runs: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Two runs side by side: one row per metric, one column per run."""
    pick = runs.set_index("run_id").loc[[a, b]].T
    pick.columns = [f"{runs.set_index('run_id').at[r, 'label']} ({r[-6:]})" for r in (a, b)]
    return pick.drop(index=["created", "model_sha256", "policy_sha256"], errors="ignore").astype(str)


def compiled_onnx(project: Project, policy: Policy) -> bytes:
    """The explicit-precision ONNX for TensorRT ≥ 10.12 (calibrating first when there is INT8)."""
    from .calibration import calibrate
    from .compile import compile_policy

    calib = None
    if "int8" in policy.layers.values():
        calib = calibrate(project.model, project.calib_data, policy.calibration, project.ws)
    return compile_policy(project.model, policy, calib, target="trt").serialized()


def policy_filename(policy: Policy, suffix: str = ".policy.json") -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", policy.model_name).strip("_") or "model"
    return stem + suffix


def store_upload(ws, data: bytes, filename: str, kind: str, model=None) -> Path:
    """Validate an uploaded ``model`` (ONNX) or ``data`` (.npz, checked against ``model``) and
    store it in the workspace by content hash: ``models/<sha256>.onnx`` or ``data/<sha256>.npz``."""
    from .data import load_npz
    from .model import model_from_bytes
    from .workspace import atomic_write_bytes, sha256_bytes

    sha = sha256_bytes(data)
    if kind == "model":
        path = ws.models / f"{sha}.onnx"
        model_from_bytes(data, path, name=Path(filename).stem)
    elif kind == "data":
        load_npz(data, model, name=filename)
        path = ws.sub("data") / f"{sha}.npz"
    else:
        raise ValueError(kind)
    if not path.exists():
        atomic_write_bytes(path, data)
    return path
