"""TensorRT engine reports written by trtexec, as typed tables.

Two inputs, both from the same trtexec run:

* layer info, ``--exportLayerInfo=F`` built with ``--profilingVerbosity=detailed``:
  ``{"Layers": [{Name, LayerType, Inputs, Outputs, TacticName, Origin, Metadata, ...}], "Bindings": [...]}``
* profile, ``--exportProfile=F``: ``[{"count": N}, {name, timeMs, averageMs, medianMs, percentage}, ...]``

Definitions (each is tested in ``tests/unit/backends/test_reports.py``):

``precision``
    The datatype in ``Format/Datatype`` (``FP32``, ``FP16``, ``BF16``, ``INT8``, ``FP8``, ...) of the
    layer's first input, as TREx does. For ``Reformat`` layers (and layers without inputs) it is
    that of the first output: a reformat or Q/DQ layer is labelled with what it converts *to*.
``time_ms`` / ``median_ms``
    The profile's ``averageMs`` (mean time per run) and ``medianMs``.
``pct``
    ``time_ms`` as a percentage of the per-layer sum (the sum of ``time_ms`` over all layers).
    That sum exceeds the end-to-end latency because of profiling overhead, so ``pct`` is a share
    of the per-layer sum, never of latency. See :data:`PCT_LABEL`.
``is_reformat``
    ``LayerType == "Reformat"``: TensorRT's reformat copies (``Reformatting CopyNode for ...``) and
    the Q/DQ nodes it runs as reformats (``Origin == "QDQ"``, e.g. ``QuantizeLinear_2``), plus any
    ``Reformatting CopyNode`` that runs under another kernel type, and the Q/DQ nodes TensorRT 8.2
    ran as ``Scale`` layers (named after Q/DQ nodes only, INT8 on one side: :func:`is_qdq_scale`);
    their ``precision`` is, as a reformat's, what they convert to. CopyNodes that TensorRT made
    ``NoOp`` run no kernel (0 ms); they are counted apart, as ``ReformatSummary.elided``.
``onnx_nodes`` / ``qdq_nodes``
    ONNX node names the layer came from: the ``Metadata`` field split on ``\\x1E``/``\\x1F`` (with
    ``[ONNX Layer: <node> | ...]`` unwrapped to ``<node>``, :func:`metadata_nodes`) where present,
    else the fused layer name split on ``" + "``.
    Q/DQ node names go to ``qdq_nodes``. Names TensorRT made up (``(Unnamed Layer* N) [...]``,
    ``reshape_after_...``) are dropped, and a ``Reformatting CopyNode for ...`` layer has no ONNX
    node. Without the ONNX model these are candidates (fused initializers such as
    ``conv1.weight`` stay in); :func:`join_onnx` with the model's node names is exact.

Whether a report is of a model (:func:`match_model`: "N of M engine layers are layers of this model", by
node name) and what it says of its GPU (:func:`engine_device`: trtexec's log or TREx's device JSON name
it; the layer info and profile never do, but their kernel names bound its compute capability) are read
here too; :mod:`core.estimate.fit` refuses a calibration on either.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from core.errors import MixprecError

LAYER_COLUMNS = [
    "name", "layer_type", "precision", "in_formats", "out_formats", "in_tensors", "out_tensors",
    "tactic", "origin", "onnx_nodes", "qdq_nodes", "time_ms", "median_ms", "pct", "is_reformat",
]
PRECISION_COLUMNS = ["precision", "layers", "time_ms", "pct"]
TYPE_COLUMNS = ["layer_type", "layers", "time_ms", "pct"]
REFORMAT_COLUMNS = ["run", "count", "elided", "ms", "pct", "total_ms"]
COVERAGE_COLUMNS = ["name", "layer_type", "precision", "is_reformat", "covers"]
NEIGHBOUR_COLUMNS = ["reformat", "side", "layer", "onnx_node"]
# Columns of ``EngineReport.to_json()["per_layer"]``.
PER_LAYER_JSON_COLUMNS = [
    "name", "layer_type", "precision", "time_ms", "median_ms", "pct", "is_reformat", "onnx_nodes",
    "qdq_nodes",
]
PCT_LABEL = "% of per-layer time sum"

GRAPH_FLAG = "--exportLayerInfo"
PROFILE_FLAG = "--exportProfile"
_REBUILD = ("rebuild the engine with trtexec --profilingVerbosity=detailed and export both reports "
            "from that run: --exportLayerInfo=graph.json --exportProfile=profile.json")

# Datatype words of "Format/Datatype" strings ("Row major linear FP32", "Half", "Channel major
# INT8 format where ...") mapped to precision names.
_DATATYPES = {
    "fp32": "FP32", "float": "FP32", "fp16": "FP16", "half": "FP16", "bfloat16": "BF16",
    "bf16": "BF16", "fp8": "FP8", "fp4": "FP4", "int8": "INT8", "int4": "INT4", "uint8": "UINT8",
    "int32": "INT32", "int64": "INT64", "bool": "BOOL", "double": "FP64",
}
UNKNOWN = "UNKNOWN"
COPY_NODE = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to ")
_QDQ = re.compile(r"(Quantize|Dequantize)Linear")
_TRT_MADE = re.compile(r"\(Unnamed Layer\* \d+\)|^(reshape|unsqueeze_node|copied_squeeze)_after_")
# One "[ONNX Layer: <node> | <property> | ...]" entry of a layer's Metadata (TensorRT >= 10's ONNX
# parser writes one per node; an engine layer joins its nodes' entries with \x1e/\x1f). The node name
# ends at the first "|" (local function, doc string); an entry ends at a "]" before the next one.
ONNX_LAYER = re.compile(r"\[ONNX Layer: (.*?)(?:\s*\|[^\x1e\x1f]*?)?\](?=\[|[\x1e\x1f]|$)")


@dataclass(frozen=True)
class ReformatSummary:
    """Reformat overhead of one engine. ``ms`` and ``total_ms`` are per-run sums over layers,
    ``pct`` is ``ms`` as a share of the per-layer sum (NaN without a profile)."""

    count: int
    ms: float
    pct: float
    total_ms: float
    elided: int = 0  # "Reformatting CopyNode" layers TensorRT turned into NoOp: no kernel, 0 ms


@dataclass(frozen=True, eq=False)
class OnnxJoin:
    """Engine layers joined with a list of ONNX node names (see :func:`join_onnx`)."""

    coverage: pd.DataFrame    # COVERAGE_COLUMNS, one row per engine layer
    neighbours: pd.DataFrame  # NEIGHBOUR_COLUMNS, ONNX nodes right before/after a reformat
    unmatched: list[str]      # given names no engine layer covers (fused away or removed)


# ---------------------------------------------------------------------------- parsing helpers

def datatype(fmt: str) -> str:
    """Precision named by a ``Format/Datatype`` string, e.g. ``"Row major linear FP32"`` -> ``FP32``."""
    for word in re.findall(r"[A-Za-z0-9]+", fmt or ""):
        if word.lower() in _DATATYPES:
            return _DATATYPES[word.lower()]
    return UNKNOWN


def metadata_nodes(metadata: str | None) -> list[str]:
    """The ONNX node names of the ``[ONNX Layer: <node> | ...]`` entries in a TensorRT layer's
    ``Metadata`` (network or engine layer), in order; ``[]`` when it has none."""
    return [n for n in (m.strip() for m in ONNX_LAYER.findall(metadata or "")) if n]


def onnx_names(layer_name: str, metadata: str | None = None) -> tuple[list[str], list[str]]:
    """``(onnx_nodes, qdq_nodes)`` of one engine layer (see the module docstring)."""
    if metadata:
        parts = metadata_nodes(metadata) or re.split(r"[\x1e\x1f]", metadata)
    elif COPY_NODE.match(layer_name):
        parts = []
    else:
        parts = layer_name.split(" + ")
    parts = [p.strip() for p in parts if p.strip() and not _TRT_MADE.search(p)]
    return [p for p in parts if not _QDQ.search(p)], [p for p in parts if _QDQ.search(p)]


_INT_TYPES = ("INT8", "UINT8", "INT4", "FP8", "FP4")


def is_qdq_scale(raw: dict) -> bool:
    """A TensorRT 8.2 Q/DQ layer: 8.2 ran an explicit-precision network's QuantizeLinear /
    DequantizeLinear nodes as ``Scale`` layers (8.4 and later show them as ``Reformat``): named after
    Q/DQ nodes only, one side quantized (INT8) and the other not."""
    if str(raw.get("LayerType", "")) != "Scale":
        return False
    nodes, qdq = onnx_names(str(raw.get("Name", "")), raw.get("Metadata"))
    types = [datatype(str(t.get("Format/Datatype", ""))) for key in ("Inputs", "Outputs")
             for t in (raw.get(key) or [])[:1] if isinstance(t, dict)]
    return bool(qdq) and not nodes and len(types) == 2 and (types[0] in _INT_TYPES) != (types[1] in _INT_TYPES)


def is_reformat_layer(raw: dict) -> bool:
    """``is_reformat`` of one layer-info record (the module docstring): a ``Reformat``, a
    ``Reformatting CopyNode`` that runs a kernel, or a TensorRT 8.2 Q/DQ ``Scale`` layer."""
    layer_type = str(raw.get("LayerType", ""))
    return (layer_type == "Reformat" or (layer_type != "NoOp" and bool(COPY_NODE.match(str(raw.get("Name", "")))))
            or is_qdq_scale(raw))


def _source_bytes(source, what: str, fix: str) -> tuple[bytes, str]:
    """The bytes of an upload (bytes) or a path, and how a message names them; a MixprecError with ``fix``
    when the path cannot be read."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), f"the uploaded {what}"
    path = Path(os.fspath(source))
    label = f"the {what} {path}"
    try:
        return path.read_bytes(), label
    except OSError as e:
        raise MixprecError(f"Cannot read {label}: {e.strerror}", fix) from e


def read_json(source, what: str, flag: str):
    """Parsed JSON of a path, raw bytes, or an already-parsed object."""
    if isinstance(source, (dict, list)):
        return source
    data, label = _source_bytes(source, what, f"pass the file written by trtexec {flag}=FILE")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MixprecError(f"{label[0].upper()}{label[1:]} is not JSON ({e})",
                           f"pass the file written by trtexec {flag}=FILE") from e


def layer_records(graph) -> tuple[list[dict], list[str]]:
    """The ``Layers`` records and ``Bindings`` of parsed layer info (:func:`read_json`), or a MixprecError
    when it is not the detailed layer info of trtexec ``--exportLayerInfo``."""
    if isinstance(graph, list):
        raise MixprecError(
            "The layer info is a JSON list, which is what a trtexec profile looks like",
            f"pass the {GRAPH_FLAG} file as the layer info and the {PROFILE_FLAG} file as the profile")
    if not isinstance(graph, dict) or not isinstance(graph.get("Layers"), list):
        raise MixprecError("The layer info has no \"Layers\" list",
                           f"pass the file written by trtexec {GRAPH_FLAG}=FILE")
    layers = graph["Layers"]
    if not layers:
        raise MixprecError("The layer info lists no layers", _REBUILD)
    plain = [str(layer) for layer in layers if not isinstance(layer, dict)]
    if plain:
        raise MixprecError(
            f"The layer info has no layer details: {len(plain)} of {len(layers)} \"Layers\" entries "
            "are plain names, which trtexec writes unless the engine was built with detailed "
            "profiling verbosity", _REBUILD, details=plain[:5])
    unnamed = [f"layer #{i}" for i, layer in enumerate(layers) if not isinstance(layer.get("Name"), str)]
    if unnamed:
        raise MixprecError("Some layers of the layer info have no \"Name\"",
                           f"pass the file written by trtexec {GRAPH_FLAG}=FILE", details=unnamed)
    return layers, [str(b) for b in graph.get("Bindings", [])]


def _profile_records(profile) -> tuple[list[dict], int | None]:
    """Per-layer records and the ``count`` (profiled runs) of a trtexec profile."""
    if isinstance(profile, dict) and "Layers" in profile:
        raise MixprecError(
            "The profile is a layer-info file (it has \"Layers\")",
            f"pass the {PROFILE_FLAG} file as the profile and the {GRAPH_FLAG} file as the layer info")
    if not isinstance(profile, list):
        raise MixprecError("The profile is not a JSON list of per-layer records",
                           f"pass the file written by trtexec {PROFILE_FLAG}=FILE")
    runs = next((r["count"] for r in profile if isinstance(r, dict) and "count" in r), None)
    records = [r for r in profile if isinstance(r, dict) and "name" in r]
    if not records:
        raise MixprecError("The profile has no per-layer records (only a header or nothing)",
                           f"re-run trtexec with {PROFILE_FLAG}=FILE on an engine that runs")
    untimed = [str(r["name"]) for r in records if not isinstance(r.get("averageMs"), (int, float))]
    if untimed:
        raise MixprecError("Some profile records have no numeric \"averageMs\"",
                           f"pass the file written by trtexec {PROFILE_FLAG}=FILE", details=untimed)
    return records, runs


def _match_profile(names: list[str], records: list[dict]) -> list[tuple[float, float]]:
    """``(averageMs, medianMs)`` per graph layer; every record must name a layer and vice versa.
    Repeated names are matched in order."""
    queues: dict[str, deque] = defaultdict(deque)
    for r in records:
        queues[str(r["name"])].append(r)
    times, missing = [], []
    for name in names:
        if queues.get(name):
            r = queues[name].popleft()
            median = r.get("medianMs")
            times.append((float(r["averageMs"]),
                          float(median) if isinstance(median, (int, float)) else math.nan))
        else:
            missing.append(name)
    extra = [name for name, q in queues.items() for _ in q]
    if extra or missing:
        raise MixprecError(
            f"The profile does not belong to this layer info: {len(extra)} of {len(records)} profile "
            f"records name no layer, and {len(missing)} of {len(names)} layers have no record",
            "export the layer info and the profile from the same engine, in one trtexec run",
            details=[f"profile only: {n}" for n in extra[:5]]
            + [f"layer info only: {n}" for n in missing[:5]])
    return times


def _layer_row(raw: dict) -> dict:
    ins, outs = raw.get("Inputs") or [], raw.get("Outputs") or []
    in_formats = [str(t.get("Format/Datatype", "")) for t in ins]
    out_formats = [str(t.get("Format/Datatype", "")) for t in outs]
    layer_type = str(raw.get("LayerType", ""))
    source = out_formats if layer_type == "Reformat" or is_qdq_scale(raw) or not in_formats else in_formats
    nodes, qdq = onnx_names(raw["Name"], raw.get("Metadata"))
    return {
        "name": raw["Name"],
        "layer_type": layer_type,
        "precision": datatype(source[0]) if source else UNKNOWN,
        "in_formats": in_formats,
        "out_formats": out_formats,
        "in_tensors": [str(t.get("Name", "")) for t in ins],
        "out_tensors": [str(t.get("Name", "")) for t in outs],
        "tactic": str(raw.get("TacticName") or raw.get("TacticValue") or ""),
        "origin": str(raw.get("Origin", "")),
        "onnx_nodes": nodes,
        "qdq_nodes": qdq,
        "is_reformat": is_reformat_layer(raw),
    }


def _share(part, total: float):
    """``part`` (a number or a Series) as a percentage of ``total``; NaN when total is 0 or NaN."""
    return part / total * 100 if total > 0 else math.nan


def parse_layers(graph, profile=None) -> tuple[pd.DataFrame, list[str], int | None]:
    """The layers table (LAYER_COLUMNS), the bindings and the profiled run count of parsed JSON."""
    raw_layers, bindings = layer_records(graph)
    layers = pd.DataFrame([_layer_row(raw) for raw in raw_layers])
    runs = None
    if profile is None:
        layers["time_ms"] = layers["median_ms"] = math.nan
    else:
        records, runs = _profile_records(profile)
        times = _match_profile(layers["name"].tolist(), records)
        layers["time_ms"] = [t for t, _ in times]
        layers["median_ms"] = [m for _, m in times]
    layers["pct"] = _share(layers["time_ms"], layers["time_ms"].sum(min_count=1))
    return layers[LAYER_COLUMNS], bindings, runs


# ---------------------------------------------------------------------------- derived tables

def _grouped(layers: pd.DataFrame, key: str, columns: list[str]) -> pd.DataFrame:
    groups = layers.groupby(key, sort=False)["time_ms"]
    table = pd.DataFrame({"layers": groups.size(), "time_ms": groups.sum(min_count=1)})
    table["pct"] = _share(table["time_ms"], layers["time_ms"].sum(min_count=1))
    table = table.reset_index().sort_values(["time_ms", "layers"], ascending=False, kind="stable")
    return table[columns].reset_index(drop=True)


def precision_distribution(layers: pd.DataFrame) -> pd.DataFrame:
    """Layer count, time and share of the per-layer sum by precision (PRECISION_COLUMNS)."""
    return _grouped(layers, "precision", PRECISION_COLUMNS)


def latency_by_type(layers: pd.DataFrame) -> pd.DataFrame:
    """Layer count, time and share of the per-layer sum by LayerType (TYPE_COLUMNS)."""
    return _grouped(layers, "layer_type", TYPE_COLUMNS)


def reformat_summary(layers: pd.DataFrame) -> ReformatSummary:
    """Reformat overhead of a per-layer table: a TensorRT engine report's (``time_ms``, with
    ``layer_type``) or a backend profile's (``PER_LAYER_COLUMNS``: ``ms``), rows flagged
    ``is_reformat``."""
    col = "time_ms" if "time_ms" in layers else "ms"
    total = float(layers[col].sum(min_count=1))
    reformats = layers[layers["is_reformat"].astype(bool)]
    ms = math.nan if math.isnan(total) else float(reformats[col].sum())
    elided = 0
    if "layer_type" in layers:
        elided = int((layers["name"].str.match(COPY_NODE.pattern) & (layers["layer_type"] == "NoOp")).sum())
    return ReformatSummary(count=len(reformats), ms=ms, pct=_share(ms, total), total_ms=total, elided=elided)


def _walk(start: int, tensors: list[list[str]], edges: dict[str, list[int]],
          transparent: list[bool]) -> list[int]:
    """Layers reached from ``start`` over ``edges``, passing through transparent layers."""
    found, seen, stack = [], {start}, list(tensors[start])
    while stack:
        for j in edges.get(stack.pop(), []):
            if j not in seen:
                seen.add(j)
                if transparent[j]:
                    stack.extend(tensors[j])
                else:
                    found.append(j)
    return sorted(found)


def join_onnx(layers: pd.DataFrame, onnx_node_names: Iterable[str]) -> OnnxJoin:
    """Join engine layers with ONNX node names (e.g. the layer names of a policy).

    ``coverage.covers`` lists, per engine layer, the given names among its ``onnx_nodes`` and
    ``qdq_nodes``. ``neighbours`` has one row per given ONNX node whose engine layer reads a
    Reformat layer's output (``side="after"``) or writes its input (``side="before"``), matched by
    tensor names; NoOp and other Reformat layers in between are looked through.
    """
    wanted = list(dict.fromkeys(onnx_node_names))
    wanted_set = set(wanted)
    covers = [[n for n in (*nodes, *qdq) if n in wanted_set]
              for nodes, qdq in zip(layers["onnx_nodes"], layers["qdq_nodes"])]
    coverage = layers.assign(covers=covers)[COVERAGE_COLUMNS].reset_index(drop=True)
    covered = {n for c in covers for n in c}

    names = layers["name"].tolist()
    ins, outs = layers["in_tensors"].tolist(), layers["out_tensors"].tolist()
    transparent = (layers["is_reformat"] | (layers["layer_type"] == "NoOp")).tolist()
    producers: dict[str, list[int]] = defaultdict(list)
    consumers: dict[str, list[int]] = defaultdict(list)
    for i in range(len(names)):
        for t in outs[i]:
            producers[t].append(i)
        for t in ins[i]:
            consumers[t].append(i)
    rows = []
    for i in (i for i, r in enumerate(layers["is_reformat"]) if r):
        for side, tensors, edges in (("before", ins, producers), ("after", outs, consumers)):
            for j in _walk(i, tensors, edges, transparent):
                rows += [(names[i], side, names[j], node) for node in covers[j]]
    return OnnxJoin(coverage=coverage,
                    neighbours=pd.DataFrame(rows, columns=NEIGHBOUR_COLUMNS),
                    unmatched=[n for n in wanted if n not in covered])


def _plain(value):
    """A JSON-ready value: NaN becomes None, numpy scalars become Python ones."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def _records(table: pd.DataFrame) -> list[dict]:
    return [{k: _plain(v) for k, v in row.items()} for row in table.to_dict("records")]


# ---------------------------------------------------------------------------- the report

@dataclass(frozen=True, eq=False)
class EngineReport:
    """One engine's layer info (and profile): ``layers`` has LAYER_COLUMNS, in engine order."""

    name: str
    layers: pd.DataFrame
    bindings: list[str]
    profiled_runs: int | None = None  # the profile's "count" record

    @classmethod
    def from_json(cls, graph, profile=None, name: str = "engine") -> EngineReport:
        """From parsed JSON (the dict of the layer info, the list of the profile)."""
        layers, bindings, runs = parse_layers(graph, profile)
        return cls(name=name, layers=layers, bindings=bindings, profiled_runs=runs)

    @property
    def has_profile(self) -> bool:
        return bool(self.layers["time_ms"].notna().all())

    @property
    def total_ms(self) -> float:
        """Per-layer sum of mean times per run; exceeds end-to-end latency (profiling overhead)."""
        return float(self.layers["time_ms"].sum(min_count=1))

    @property
    def reformat(self) -> ReformatSummary:
        return reformat_summary(self.layers)

    def precision_distribution(self) -> pd.DataFrame:
        return precision_distribution(self.layers)

    def latency_by_type(self) -> pd.DataFrame:
        return latency_by_type(self.layers)

    def join_onnx(self, onnx_node_names: Iterable[str]) -> OnnxJoin:
        return join_onnx(self.layers, onnx_node_names)

    def to_json(self) -> dict:
        """A plain JSON-serialisable summary (NaN as null), e.g. for ``--json``."""
        return {
            "name": self.name,
            "layers": len(self.layers),
            "profiled_runs": self.profiled_runs,
            "total_ms": _plain(self.total_ms),
            "pct_basis": PCT_LABEL,
            "reformat": {k: _plain(v) for k, v in asdict(self.reformat).items()},
            "precision": _records(self.precision_distribution()),
            "layer_types": _records(self.latency_by_type()),
            "per_layer": _records(self.layers[PER_LAYER_JSON_COLUMNS]),
        }


def _report_name(graph) -> str:
    if isinstance(graph, (str, os.PathLike)):
        base = Path(os.fspath(graph)).name
        return re.sub(r"(\.graph)?\.json$", "", base) or base
    return "engine"


def load_engine_report(graph, profile=None, name: str | None = None) -> EngineReport:
    """Load a trtexec layer info (and profile). Each may be a path, bytes, or parsed JSON."""
    return EngineReport.from_json(
        read_json(graph, "layer info", GRAPH_FLAG),
        None if profile is None else read_json(profile, "profile", PROFILE_FLAG),
        name=name or _report_name(graph))


def reformat_table(reports: Sequence[EngineReport]) -> pd.DataFrame:
    """Reformat overhead of one or more reports, one row each (REFORMAT_COLUMNS)."""
    rows = [{"run": r.name, **asdict(r.reformat)} for r in reports]
    return pd.DataFrame(rows, columns=REFORMAT_COLUMNS)


# ---------------------------------------------------------------------------- the report and the model

# Below this share of its named engine layers matched to the model's nodes, a report is of another model:
# its charts are still drawn (with the count), but it calibrates nothing (core.estimate.fit.calibrate).
MIN_MATCH_SHARE = 0.25
_FOREIGN_NODE = re.compile(r"^\{ForeignNode\[(.*)\]\}$")


def node_names(graph) -> list[str]:
    """The names TensorRT's ONNX parser gives the layers of an ONNX graph's nodes (a ``GraphProto``):
    the node's name, or ``node_of_<first output>`` for a node without one."""
    out = []
    for n in graph.node:
        if n.name:
            out.append(n.name)
        elif len(n.output) and n.output[0]:
            out.append(f"node_of_{n.output[0]}")
    return out


def _candidates(nodes: Sequence[str]) -> list[str]:
    """The ONNX node names an engine layer's ``onnx_nodes`` may stand for: a Myelin region
    ``{ForeignNode[first...last]}`` names its first and last node."""
    out = []
    for n in nodes:
        m = _FOREIGN_NODE.match(n)
        out += [p.strip() for p in m.group(1).split("...") if p.strip()] if m else [n]
    return out


@dataclass(frozen=True)
class ModelMatch:
    """How much of an engine report is of a model: its engine layers matched to the model's ONNX node
    names (``onnx_nodes``: the layer's Metadata, or its fused name split on ``" + "``)."""

    model: str                        # what the model is called in the text ("this model", a file name)
    layers: int                       # engine layers in the report
    named: int                        # of them, those that name an ONNX node (not a reformat copy, a
    #                                   Q/DQ-only layer or a layer TensorRT made up)
    matched: int                      # of those, the ones that name a node of the model
    unmatched: tuple[str, ...] = ()   # a few named engine layers that name no node of the model

    @property
    def share(self) -> float:
        return self.matched / self.named if self.named else 0.0

    @property
    def enough(self) -> bool:
        """True when the report is of this model (enough of its layers are): it may calibrate."""
        return self.matched > 0 and self.share >= MIN_MATCH_SHARE

    def text(self) -> str:
        """"21 of 24 engine layers are layers of this model (…)"."""
        rest = self.layers - self.named
        tail = (f" (matched by ONNX node name; {rest} more engine layer{'s' if rest != 1 else ''} — reformat copies, "
                "Q/DQ, TensorRT's own — name no node)") if rest else " (matched by ONNX node name)"
        return f"{self.matched} of {self.named} engine layers are layers of {self.model}{tail}"

    def refusal(self, what: str = "engine report") -> MixprecError:
        """The error of a calibration on a report that is not of this model."""
        return MixprecError(
            f"The {what} is not of {self.model}: {self.matched} of its {self.named} engine layers that name an ONNX "
            f"node name one of the model's, fewer than {MIN_MATCH_SHARE:.0%}",
            "import the reports of an engine built from this model's ONNX (the Export page's trtexec "
            "script writes both), or open the project of the model the engine was built from",
            details=[f"not in the model: {n}" for n in self.unmatched])

    def to_json(self) -> dict:
        return {"model": self.model, "layers": self.layers, "named": self.named, "matched": self.matched,
                "share": self.share, "enough": self.enough, "unmatched": list(self.unmatched)}


def match_nodes(layers: Iterable[tuple[str, Sequence[str]]], model_nodes: Iterable[str],
                model: str = "this model") -> ModelMatch:
    """:class:`ModelMatch` of engine layers given as ``(name, onnx_nodes)`` against a model's node names."""
    known = set(model_nodes)
    total = named = matched = 0
    unmatched: list[str] = []
    for name, nodes in layers:
        total += 1
        names = _candidates(nodes)
        if not names:
            continue
        named += 1
        if any(n in known for n in names):
            matched += 1
        elif len(unmatched) < 5:
            unmatched.append(name)
    return ModelMatch(model=model, layers=total, named=named, matched=matched, unmatched=tuple(unmatched))


def match_model(layers: pd.DataFrame, model_nodes: Iterable[str], model: str = "this model") -> ModelMatch:
    """:class:`ModelMatch` of an engine report's layers table (LAYER_COLUMNS) against a model's node
    names (:func:`node_names`)."""
    return match_nodes(zip(layers["name"], layers["onnx_nodes"]), model_nodes, model)


# ---------------------------------------------------------------------------- the GPU of a report

# "Selected Device: NVIDIA A100-SXM4-40GB" / "Compute Capability: 8.0" / "SMs: 108": what trtexec prints
# under "=== Device Information ===" (samples/common/sampleDevice.cpp), with or without its "[date] [I] " prefix
_LOG_DEVICE = re.compile(r"^(?:\[[^\]]*\]\s*)*Selected Device:\s*(\S.*?)\s*$", re.M)
_LOG_CAPABILITY = re.compile(r"^(?:\[[^\]]*\]\s*)*Compute Capability:\s*(\d+)\.(\d+)", re.M)
# a kernel built for an SM: "sm80_xmma_fprop_…", "sm75_…", "sm_90…", "sm100_…"
_KERNEL_SM = re.compile(r"(?<![a-z0-9])sm_?(\d{2,3})(?![0-9])", re.I)
LOG_HINT = ("trtexec's layer info and profile never name the GPU; its log does (\"Selected Device\": save "
            "trtexec's output, e.g. trtexec … > trtexec.log)")


@dataclass(frozen=True)
class ReportDevice:
    """What an engine report says of the GPU it was built and profiled on."""

    name: str = ""                                    # the GPU as the report names it, "" when it does not
    source: str = ""                                  # where that was read
    capability: tuple[int, int] | None = None         # compute capability as stated
    min_capability: tuple[int, int] | None = None     # the least its kernels need (a kernel built for sm80)
    kernel: str = ""                                  # a kernel that needs min_capability

    @property
    def named(self) -> bool:
        return bool(self.name)

    def text(self) -> str:
        if self.name:
            cc = f", compute capability {self.capability[0]}.{self.capability[1]}" if self.capability else ""
            return f"the report names its GPU: {self.name} ({self.source}{cc})"
        out = "the report does not name its GPU"
        if self.capability:
            out += f"; it states compute capability {self.capability[0]}.{self.capability[1]} ({self.source})"
        if self.min_capability:
            out += (f"; its kernels ({self.kernel[:40]}…) need compute capability "
                    f"{self.min_capability[0]}.{self.min_capability[1]} or later")
        return out

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source,
                "capability": list(self.capability) if self.capability else None,
                "min_capability": list(self.min_capability) if self.min_capability else None, "kernel": self.kernel}


def _capability(value) -> tuple[int, int] | None:
    """A compute capability as ``(8, 0)`` from ``8.0``, ``"8.0"``, ``[8, 0]`` or ``"(8, 0)"``."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    m = re.search(r"(\d+)\s*[.,]\s*(\d+)", str(value)) if isinstance(value, (str, int, float)) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


_NAME_KEYS = ("Selected Device", "Name", "Device", "GPU", "device_name", "gpu_name")
_CAPABILITY_KEYS = ("Compute Capability", "ComputeCapability", "compute_capability")


def _json_device(doc, source: str) -> ReportDevice | None:
    """The GPU a JSON document names: TREx's metadata (``{"device_information": {"Selected Device": …,
    "Compute Capability": 8.0}}``), TREx's device_info.py output (``[{"Name": …, "ComputeCapability":
    [8, 0]}]``) or a device record at its top."""
    records = []
    if isinstance(doc, dict):
        records = [doc.get("device_information"), doc.get("DeviceInformation"), doc]
    elif isinstance(doc, list):
        records = [r for r in doc[:4] if isinstance(r, dict)]
    for r in records:
        if not isinstance(r, dict):
            continue
        name = next((str(r[k]).strip() for k in _NAME_KEYS if isinstance(r.get(k), str) and r[k].strip()), "")
        cc = next((_capability(r[k]) for k in _CAPABILITY_KEYS if k in r and _capability(r[k])), None)
        if name or cc:
            return ReportDevice(name=name, source=source, capability=cc)
    return None


def kernel_capability(tactics: Iterable[str]) -> tuple[tuple[int, int] | None, str]:
    """The least compute capability the kernels named by ``tactics`` need (a kernel built for sm80 runs on
    8.0 and later only), and one such kernel; ``(None, "")`` when no name says it."""
    best, kernel = None, ""
    for t in tactics:
        for m in _KERNEL_SM.finditer(str(t or "")):
            digits = m.group(1)
            cc = (int(digits[:-1]), int(digits[-1]))
            if best is None or cc > best:
                best, kernel = cc, str(t)
    return best, kernel


def read_log(source) -> tuple[str, object]:
    """The text and, when it is JSON, the parsed document of a trtexec log or a device-info file (a
    path, bytes or text); a MixprecError when it cannot be read."""
    if isinstance(source, str) and ("\n" in source or "Selected Device" in source):
        data, label = source.encode(), "the log"
    else:
        data, label = _source_bytes(source, "log", "pass the output of the trtexec run (trtexec … > trtexec.log)")
    text = data.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    return text, doc


def engine_device(graph, profile=None, log=None) -> ReportDevice:
    """What an engine's reports say of its GPU: the name and compute capability from ``log`` (trtexec's
    output, with its "Selected Device" line, or TREx's device/metadata JSON) or from device information
    in the layer info or profile JSON, when any says it (trtexec's own never do); and, from the layer
    info's kernel names, the least compute capability they need. Each input: a path, bytes or parsed JSON
    (``log``: also text); a MixprecError when one cannot be read."""
    found = None
    if log is not None:
        text, doc = read_log(log)
        found = _json_device(doc, "device information JSON") if doc is not None else None
        if found is None:
            name = _LOG_DEVICE.search(text)
            cc = _LOG_CAPABILITY.search(text)
            if name or cc:
                found = ReportDevice(name=name.group(1) if name else "", source="trtexec log, \"Selected Device\"",
                                     capability=(int(cc.group(1)), int(cc.group(2))) if cc else None)
    graph_doc = read_json(graph, "layer info", GRAPH_FLAG) if graph is not None else None
    for doc, what in ((graph_doc, "layer info"), (None if profile is None else read_json(profile, "profile", PROFILE_FLAG),
                                                  "profile")):
        if found is None and doc is not None:
            found = _json_device(doc if isinstance(doc, list) else {k: v for k, v in doc.items() if k != "Layers"},
                                 f"the {what} JSON")
    tactics = [raw.get("TacticName") for raw in graph_doc.get("Layers", []) if isinstance(raw, dict)] \
        if isinstance(graph_doc, dict) else []
    least, kernel = kernel_capability(tactics)
    base = found or ReportDevice()
    return ReportDevice(name=base.name, source=base.source, capability=base.capability, min_capability=least,
                        kernel=kernel)
