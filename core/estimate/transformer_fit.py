"""The transformer classes' fitted parameters (``transformer_fit.json``, written by
``bench/bench_bert_estimate.py --fit`` from NVIDIA's published BERT-base latencies on the A100-40GB and T4;
see :mod:`core.estimate.transformer`), merged into the shipped cost-model parameters. Data only: no import
of the cost model, so :mod:`core.estimate.cost` can merge it at import time."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

FIT_FILE = Path(__file__).with_name("transformer_fit.json")
_SCALARS = ("gemm_tile", "clock_alpha", "transformer_knee")


def load() -> dict:
    """The fitted values (``"compute_eff[transformer]": 0.9, …``), {} when the file is absent."""
    if not FIT_FILE.is_file():
        return {}
    doc = json.loads(FIT_FILE.read_text())
    return dict(doc.get("values") or {})


def merged(params):
    """``params`` with the transformer classes' fitted values in place (others unchanged)."""
    values = load()
    if not values:
        return params
    changes = {f: dict(getattr(params, f)) for f in ("compute_eff", "memory_eff", "overhead_us", "math_eff")}
    for key, v in values.items():
        if key in _SCALARS:
            changes[key] = float(v)
            continue
        field, name = key.rstrip("]").split("[", 1)
        changes[field][name] = float(v)
    fitted = tuple(params.fitted) + tuple(k for k in values if k not in params.fitted)
    return replace(params, **changes, fitted=fitted,
                   fitted_on=tuple(params.fitted_on) + ("published TensorRT BERT-base (A100-40GB, T4)",))
