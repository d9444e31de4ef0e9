"""Precision policy: a versioned JSON document mapping every inventory layer to
``fp32``/``fp16``/``int8``, validated against the model it was made for (its exports for
TensorRT are in ``core.export``)."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import MixprecError
from .inventory import PRECISIONS, Layer
from .model import LoadedModel
from .workspace import sha256_bytes

POLICY_FORMAT = "mixprec.policy"
POLICY_VERSION = 1
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
    if doc.get("version") != POLICY_VERSION:
        raise MixprecError(f"policy format version {doc.get('version')!r} is not supported (this mixprec reads {POLICY_VERSION})",
                           "re-export the policy with this version of mixprec")
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
        elif prec == "int8" and not by_name[name].eligible:
            problems.append(f"{name}: int8 on a {by_name[name].op_type} (only MatMul, Gemm, Conv, ConvTranspose can be INT8)")
    cal = doc.get("calibration") or {}
    method = cal.get("method", "minmax")
    if method not in CALIB_METHODS:
        problems.append(f"calibration.method: {method!r} (want one of {', '.join(CALIB_METHODS)})")
    per_tensor = cal.get("per_tensor") or {}
    eligible_inputs = {i for l in layers if l.eligible for i in l.inputs}
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


def load_policy(path: str | Path, model: LoadedModel, layers: list[Layer]) -> Policy:
    path = Path(path)
    if not path.is_file():
        raise MixprecError(f"the policy file {path} does not exist", "check the path of the policy JSON")
    return policy_from_text(path.read_text(errors="replace"), model, layers, source=path.name)


def policy_from_text(text: str, model: LoadedModel, layers: list[Layer], source: str = "policy") -> Policy:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MixprecError(f"{source} is not valid JSON ({e.msg} at line {e.lineno})",
                           "give a policy JSON exported by mixprec") from e
    return policy_from_dict(doc, model, layers)
