"""Precision policy: a versioned JSON document mapping every inventory layer to
``fp32``/``fp16``/``int8``, validated against the model it was made for (its exports for
TensorRT are in ``core.export``)."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.errors import MixprecError
from core.model.inventory import CONTROL_FLOW, NON_COMPUTE, PRECISIONS, Layer, can_be_int8
from core.model.load import FLOAT_TYPES, LoadedModel
from core.workspace import sha256_bytes

POLICY_FORMAT = "mixprec.policy"
# 2: Add / pooling / float Concat can be INT8 (placement, ``core.model.placement``), Concat is a layer, and
# their defaults follow the pattern (a ResNet residual Add defaults to INT8). Version 1 documents
# still load (:func:`migrate_v1`) and compile to the same model as before.
POLICY_VERSION = 2
READABLE_VERSIONS = (1, 2)
CALIB_METHODS = ("minmax", "entropy", "percentile")
NETWORK_DEFAULTS = ("fp32", "fp16")  # the precision of layers the policy does not set otherwise


@dataclass(frozen=True)
class CalibrationSettings:
    method: str = "minmax"
    percentile: float = 99.999
    num_samples: int = 0
    data_sha256: str = ""
    per_tensor: tuple[tuple[str, str], ...] = ()  # (tensor, method) overrides of ``method``


@dataclass(frozen=True)
class Policy:
    model_name: str
    model_sha256: str
    network_default: str
    layers: dict[str, str]
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    smoothing: tuple[tuple[str, float], ...] = ()  # (INT8 MatMul layer, alpha): SmoothQuant-style scaling

    # --- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": POLICY_FORMAT,
            "version": POLICY_VERSION,
            "model": {"name": self.model_name, "sha256": self.model_sha256},
            "network_default": self.network_default,
            "layers": dict(self.layers),
            **({"smoothing": dict(self.smoothing)} if self.smoothing else {}),
            "calibration": {
                "method": self.calibration.method,
                "percentile": self.calibration.percentile,
                "num_samples": self.calibration.num_samples,
                "data_sha256": self.calibration.data_sha256,
                **({"per_tensor": dict(self.calibration.per_tensor)} if self.calibration.per_tensor else {}),
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @property
    def sha256(self) -> str:
        return sha256_bytes(json.dumps(self.to_dict(), sort_keys=True).encode())

    # --- queries ------------------------------------------------------------------------
    def precision_counts(self) -> dict[str, int]:
        c = Counter(self.layers.values())
        return {p: c.get(p, 0) for p in PRECISIONS}

    def with_layers(self, changes: dict[str, str]) -> "Policy":
        return replace(self, layers={**self.layers, **changes})

    def with_calibration(self, settings: CalibrationSettings) -> "Policy":
        return replace(self, calibration=settings)

    def with_smoothing(self, alphas: dict[str, float]) -> "Policy":
        return replace(self, smoothing=tuple(sorted(alphas.items())))


def default_policy(model: LoadedModel, layers: list[Layer], network_default: str = "fp32",
                   calibration: CalibrationSettings | None = None) -> Policy:
    """LayerNorm, Softmax and embeddings FP16; INT8-eligible layers INT8; the rest at the network default."""
    if network_default not in NETWORK_DEFAULTS:
        raise MixprecError(f"network default {network_default!r} is not fp32 or fp16",
                           "pass --network-default fp32 or fp16")
    mapping = {
        l.name: (network_default if l.default_precision == "default" else l.default_precision) for l in layers
    }
    return Policy(model.name, model.sha256, network_default, mapping, calibration or CalibrationSettings())


def with_network_default(policy: Policy, model: LoadedModel, layers: list[Layer], network_default: str) -> Policy:
    """``policy`` under another network default, as ``--network-default`` makes it (:func:`default_policy`):
    every layer at the network default — a layer whose default is the network default and whose precision
    is still the old network default — moves to the new one; what was set otherwise (INT8, FP16 under an FP32
    default, the LayerNorm / Softmax / embedding defaults) stays. The default policy under one network
    default becomes the default policy under the other; the calibration and smoothing are kept."""
    if network_default not in NETWORK_DEFAULTS:
        raise MixprecError(f"network default {network_default!r} is not fp32 or fp16",
                           "pick fp32 or fp16 (--network-default)")
    old = default_policy(model, layers, policy.network_default if policy.network_default in NETWORK_DEFAULTS
                         else "fp32").layers
    new = default_policy(model, layers, network_default).layers
    moved = {n: new[n] for n, p in policy.layers.items() if n in old and p == old[n] != new[n]}
    return replace(policy.with_layers(moved), network_default=network_default)


def change_summary(before: Policy, after: Policy) -> str:
    """What an edit changed, in words: "102 layers FP32 → FP16, 3 INT8 → FP16" (the largest move first),
    "no layer changed" when none did; a changed network default is said first."""
    moves = Counter((before.layers.get(n, "fp32"), p) for n, p in after.layers.items()
                    if before.layers.get(n, "fp32") != p)
    parts = [f"{k} layer{'s' * (k != 1)} {a.upper()} → {b.upper()}" if i == 0 else f"{k} {a.upper()} → {b.upper()}"
             for i, ((a, b), k) in enumerate(sorted(moves.items(), key=lambda m: (-m[1], m[0])))]
    text = ", ".join(parts) or "no layer changed"
    if before.network_default != after.network_default:
        text = f"network default {before.network_default.upper()} → {after.network_default.upper()}; {text}"
    return text


def next_precision(layer: Layer, precision: str) -> str:
    """The precision a click on a layer's precision moves it to: FP32 → FP16 → INT8 (where the layer can be
    INT8, else back to FP32) → FP32; a layer inside control flow stays FP32."""
    if layer.subgraph is not None:
        return "fp32"
    return {"fp32": "fp16", "fp16": "int8" if can_be_int8(layer) else "fp32"}.get(precision, "fp32")


def uniform_policy(model: LoadedModel, layers: list[Layer], precision: str) -> Policy:
    """Every layer at one precision (INT8 only where eligible; the rest FP32)."""
    mapping = {l.name: (precision if (precision != "int8" or l.eligible) and l.subgraph is None else "fp32")
               for l in layers}
    return Policy(model.name, model.sha256, "fp16" if precision == "fp16" else "fp32", mapping)


def policy_from_dict(doc: dict, model: LoadedModel, layers: list[Layer]) -> Policy:
    """Validate a policy document against the model; every problem is listed at once."""
    if not isinstance(doc, dict) or doc.get("format") != POLICY_FORMAT:
        raise MixprecError(
            "this is not a mixprec policy (its 'format' is not 'mixprec.policy')",
            "export a policy with `python -m core export MODEL --format json` or the dashboard's Export page",
        )
    if doc.get("version") not in READABLE_VERSIONS:
        raise MixprecError(f"policy format version {doc.get('version')!r} is not supported (this mixprec reads "
                           f"{', '.join(map(str, READABLE_VERSIONS))})", "re-export the policy with this version of mixprec")
    if doc.get("version") == 1:
        doc = migrate_v1(doc, model, layers)
    problems = []
    model_doc = doc.get("model") or {}
    if model_doc.get("sha256") != model.sha256:
        problems.append(f"model sha256 {str(model_doc.get('sha256'))[:12]}… (policy for {model_doc.get('name')!r}) "
                        f"!= loaded model {model.sha256[:12]}… ({model.name})")
    nd = doc.get("network_default", "fp32")
    if nd not in NETWORK_DEFAULTS:
        problems.append(f"network_default: {nd!r} (want fp32 or fp16)")
    by_name = {l.name: l for l in layers}
    entries = doc.get("layers")
    if not isinstance(entries, dict):
        problems.append("layers: missing or not an object of name → precision")
        entries = {}
    for name, prec in entries.items():
        if name not in by_name:
            problems.append(f"unknown layer {name!r}")
        elif prec not in PRECISIONS:
            problems.append(f"{name}: bad precision {prec!r} (want fp32, fp16 or int8)")
        elif prec != "fp32" and by_name[name].subgraph is not None:
            problems.append(f"{name}: {prec} is not possible, the layer is {by_name[name].reason} (set it to fp32)")
        elif prec == "int8" and not can_be_int8(by_name[name]):
            problems.append(f"{name}: int8 on a {by_name[name].op_type} (only MatMul, Gemm, Conv, ConvTranspose and the "
                            "placement ops — residual Add, pooling, float Concat — can be INT8)")
    cal = doc.get("calibration") or {}
    method = cal.get("method", "minmax")
    if method not in CALIB_METHODS:
        problems.append(f"calibration.method: {method!r} (want one of {', '.join(CALIB_METHODS)})")
    per_tensor = cal.get("per_tensor") or {}
    eligible_inputs = {i for l in layers if can_be_int8(l) for i in l.inputs}
    for tensor, m in per_tensor.items():
        if m not in CALIB_METHODS:
            problems.append(f"calibration.per_tensor[{tensor!r}]: {m!r} (want one of {', '.join(CALIB_METHODS)})")
        elif tensor not in eligible_inputs:
            problems.append(f"calibration.per_tensor: {tensor!r} is not an input of an INT8-eligible layer")
    smoothing = doc.get("smoothing") or {}
    for name, alpha in smoothing.items():
        layer = by_name.get(name)
        if layer is None or layer.op_type != "MatMul":
            problems.append(f"smoothing: {name!r} is not a MatMul layer of this model")
        elif not isinstance(alpha, (int, float)) or not 0.0 < float(alpha) < 1.0:
            problems.append(f"smoothing[{name!r}]: alpha {alpha!r} (want a number between 0 and 1)")
    if problems:
        raise MixprecError(
            f"the policy does not fit the model {model.name} ({len(problems)} problem(s))",
            "export a fresh policy for this model, or correct the listed entries",
            details=problems,
        )
    base = default_policy(model, layers, nd)
    return Policy(
        model.name, model.sha256, nd, {**base.layers, **entries},
        CalibrationSettings(method, float(cal.get("percentile", 99.999)), int(cal.get("num_samples", 0)),
                            str(cal.get("data_sha256", "")), tuple(sorted(per_tensor.items()))),
        tuple(sorted((k, float(v)) for k, v in smoothing.items())),
    )


def _v1_default(layer: Layer, network_default: str) -> str:
    """A layer's default under format 1: placement layers (Add, pooling) were at the network default."""
    if layer.placement or layer.default_precision == "default":
        return network_default
    return layer.default_precision


def _v1_followed(model: LoadedModel, mapping: dict[str, str], names: set[str]) -> dict[str, str]:
    """The precision the format-1 compiler gave the Concats ``names`` (not layers then): they followed
    their inputs, FP16 when every float activation input was float16 (or float16-exact), else FP32."""
    types, consts = model.tensor_types(), model.initializer_names()
    fp16: set[str] = set()
    out = {}
    for node in model.proto.graph.node:
        prec = None if node.name in names else mapping.get(node.name)
        float_out = [o for o in node.output if o and types.get(o) in FLOAT_TYPES]
        if node.op_type in CONTROL_FLOW:
            continue
        if prec is None:
            acts = [i for i in node.input if i and i not in consts and types.get(i) in FLOAT_TYPES]
            follows = bool(acts) and all(i in fp16 for i in acts) and node.op_type in NON_COMPUTE
            if node.name in names:
                out[node.name] = "fp16" if follows else "fp32"
            if follows:
                fp16.update(float_out)
        elif prec == "fp16":
            fp16.update(float_out)
    return out


def migrate_v1(doc: dict, model: LoadedModel, layers: list[Layer]) -> dict:
    """A format-1 policy document as format 2, meaning the same compiled model: layers it does not
    list get their format-1 default (placement layers at the network default, not the new pattern
    defaults), and each float Concat (a layer only since format 2) the precision it followed."""
    entries = doc.get("layers")
    if not isinstance(entries, dict):
        return {**doc, "version": POLICY_VERSION}  # the validation reports it
    nd = doc.get("network_default", "fp32")
    nd = nd if nd in NETWORK_DEFAULTS else "fp32"
    concats = {l.name for l in layers if l.placement == "concat" and l.name not in entries}
    mapping = {**{l.name: _v1_default(l, nd) for l in layers if l.name not in concats}, **entries}
    mapping.update(_v1_followed(model, mapping, concats))
    return {**doc, "version": POLICY_VERSION, "layers": mapping}


def load_policy(path: str | Path, model: LoadedModel, layers: list[Layer]) -> Policy:
    path = Path(path)
    if not path.is_file():
        raise MixprecError(f"the policy file {path} does not exist", "check the path of the policy JSON")
    return policy_from_text(path.read_text(errors="replace"), model, layers, source=path.name)


MAX_POLICY_BYTES = 8 << 20  # a policy of 100,000 layers is about 7 MB
MAX_POLICY_DEPTH = 8  # a policy nests 3 levels (calibration.per_tensor.<tensor>); allow some slack


def _depth(doc, limit: int) -> int:
    """How deep ``doc`` nests (1 for a flat object), counting no further than ``limit + 1``; iterative."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def policy_from_text(text: str | bytes, model: LoadedModel, layers: list[Layer], source: str = "policy") -> Policy:
    """A policy from its JSON text, refusing hostile input quickly and cleanly: more than
    MAX_POLICY_BYTES, nesting deeper than MAX_POLICY_DEPTH (checked after a parse that cannot
    recurse out of the stack), or a field of the wrong type."""
    size = len(text)
    if size > MAX_POLICY_BYTES:
        raise MixprecError(f"{source} is {size / (1 << 20):.1f} MB, more than a policy can be "
                           f"({MAX_POLICY_BYTES >> 20} MB)", "give a policy JSON exported by mixprec")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MixprecError(f"{source} is not valid JSON ({e.msg} at line {e.lineno})",
                           "give a policy JSON exported by mixprec") from e
    except RecursionError as e:
        raise MixprecError(f"{source} nests too deeply to be a policy (a policy nests {MAX_POLICY_DEPTH} levels "
                           "at most)", "give a policy JSON exported by mixprec") from e
    except (ValueError, UnicodeDecodeError) as e:  # e.g. an integer of more than 4300 digits
        raise MixprecError(f"{source} is not valid JSON ({str(e)[:120]})", "give a policy JSON exported by mixprec") from e
    depth = _depth(doc, MAX_POLICY_DEPTH)
    if depth > MAX_POLICY_DEPTH:
        raise MixprecError(f"{source} nests deeper than {MAX_POLICY_DEPTH} levels, which no policy does",
                           "give a policy JSON exported by mixprec")
    try:
        return policy_from_dict(doc, model, layers)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        raise MixprecError(f"{source} has a field of the wrong type ({type(e).__name__}: {str(e)[:200]})",
                           "give a policy JSON exported by mixprec, or correct the field") from e
