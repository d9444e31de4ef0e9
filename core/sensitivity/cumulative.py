"""Layer-wise comparison with Polygraphy: FP32 against a candidate policy, with the output
of every layer marked as a graph output (``OnnxrtRunner`` + ``Comparator``).

The comparison is *cumulative*: a layer's output error includes the error of every
quantized layer before it. ``added_cos_drop`` (this layer's cosine drop minus the worst
drop among its inputs) separates the error a layer adds from the error it inherits."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from polygraphy.backend.onnx import BytesFromOnnx, ModifyOutputs
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.comparator import Comparator
from polygraphy.logger import G_LOGGER

from ..calibration import calibrate_policy
from ..compile import compile_policy
from ..errors import MixprecError
from ..inventory import main_graph_layers, require_eligible
from ..metrics import StreamingError
from ..policy import Policy, uniform_policy
from ..project import Project
from ..records import check_format, frame_from_json, frame_to_json

RANK_COLUMNS = ["rank", "name", "op_type", "precision", "eligible", "macs", "cosine", "cos_drop",
                "added_cos_drop", "snr_db", "max_abs"]
RANK_METRICS = ("cos_drop", "added_cos_drop", "snr_db", "max_abs")


@dataclass
class Ranking:
    """A cumulative ranking (:func:`rank_layers`), stored as a ``"ranking"`` document."""

    FORMAT_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "ranking"

    table: pd.DataFrame  # RANK_COLUMNS, most sensitive first
    metric: str
    samples: int
    seconds: float
    calibration_cache_hit: bool | None
    method: str = "minmax"

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "metric": self.metric,
                "method": self.method, "samples": self.samples, "seconds": self.seconds,
                "calibration_cache_hit": self.calibration_cache_hit, "table": frame_to_json(self.table)}

    @classmethod
    def from_json(cls, doc: dict) -> "Ranking":
        doc = check_format(doc, cls.KIND, cls.FORMAT_VERSION, "ranking")
        return cls(frame_from_json(doc["table"], RANK_COLUMNS, "ranking"), doc["metric"], int(doc["samples"]),
                   float(doc["seconds"]), doc["calibration_cache_hit"], doc["method"])


def rank_layers(project: Project, policy: Policy | None = None, method: str = "minmax",
                metric: str = "cos_drop", max_samples: int = 16, progress=None) -> Ranking:
    """Rank layers by how far their outputs drift from FP32 under ``policy`` (default: every
    INT8-eligible layer INT8, everything else FP32)."""
    if metric not in RANK_METRICS:
        raise MixprecError(f"unknown ranking metric {metric!r}", f"use one of {', '.join(RANK_METRICS)}")
    step = progress or (lambda f, t: None)
    t0 = time.perf_counter()
    model, layers = project.model, main_graph_layers(project.layers)  # subgraph tensors cannot be marked
    require_eligible(model.name, project.layers, "rank")
    if policy is None:
        policy = uniform_policy(model, project.layers, "int8").with_calibration(project.default_policy(method=method).calibration)
    step(0.05, f"calibrating ({policy.calibration.method})")
    calib = calibrate_policy(model, project.calib_data, policy, project.layers, project.ws)
    step(0.2, "compiling candidate")
    compiled = compile_policy(model, policy, calib, target="ort")
    float_out = {o for l in layers for o in l.outputs}
    types = model.tensor_types()  # the main graph's tensors only
    marked = sorted(t for t in float_out if types.get(t) in (1, 10, 11))
    runners = [
        OnnxrtRunner(SessionFromOnnx(BytesFromOnnx(ModifyOutputs(model.proto, outputs=marked, copy=True)),
                                     providers=["cpu"]), name="fp32"),
        OnnxrtRunner(SessionFromOnnx(BytesFromOnnx(ModifyOutputs(compiled.proto, outputs=marked, copy=True)),
                                     providers=["cpu"]), name="candidate"),
    ]
    feeds = project.eval_data.batches(1)[:max_samples]
    acc = {t: StreamingError() for t in marked}
    G_LOGGER.module_severity = G_LOGGER.WARNING  # Polygraphy logs every iteration on stdout otherwise
    for i, results in enumerate(Comparator.run(runners, data_loader=feeds, streaming=True)):
        step(0.3 + 0.65 * i / len(feeds), f"comparing sample {i + 1}/{len(feeds)}")
        ref, cand = results["fp32"][0], results["candidate"][0]
        for t in marked:
            acc[t].add(np.asarray(ref[t]), np.asarray(cand[t]))
    drop = {t: 1.0 - a.cosine for t, a in acc.items()}
    rows = []
    for l in layers:
        outs = [o for o in l.outputs if o in acc]
        if not outs:
            continue
        a = acc[outs[0]]
        inherited = max((drop[i] for i in l.inputs if i in drop), default=0.0)
        rows.append((l.name, l.op_type, policy.layers.get(l.name, ""), l.eligible, l.macs, a.cosine,
                     drop[outs[0]], drop[outs[0]] - inherited, a.snr_db, a.max_abs))
    df = pd.DataFrame(rows, columns=RANK_COLUMNS[1:])
    ascending = metric == "snr_db"
    df = df.sort_values(metric, ascending=ascending, kind="stable", ignore_index=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    step(1.0, "done")
    return Ranking(df, metric, len(feeds), time.perf_counter() - t0, calib.cache_hit if calib else None,
                   policy.calibration.method)
