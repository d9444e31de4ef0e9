"""Precision policy: a versioned JSON document mapping every inventory layer to
``fp32``/``fp16``/``int8``, validated against the model it was made for, and
exported as JSON, trtexec command lines and a Polygraphy command."""
from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import MixprecError
from .inventory import PRECISIONS, Layer
from .model import LoadedModel, resolve_input_shapes
from .workspace import sha256_bytes

POLICY_FORMAT = "mixprec.policy"
POLICY_VERSION = 1
CALIB_METHODS = ("minmax", "entropy", "percentile")


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
    if network_default not in ("fp32", "fp16"):
        raise MixprecError(f"network default {network_default!r} is not fp32 or fp16",
                           "pass --network-default fp32 or fp16")
    mapping = {
        l.name: (network_default if l.default_precision == "default" else l.default_precision) for l in layers
    }
    return Policy(model.name, model.sha256, network_default, mapping, calibration or CalibrationSettings())


def uniform_policy(model: LoadedModel, layers: list[Layer], precision: str) -> Policy:
    """Every layer at one precision (INT8 only where eligible; the rest FP32)."""
    mapping = {l.name: (precision if precision != "int8" or l.eligible else "fp32") for l in layers}
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
    if nd not in ("fp32", "fp16"):
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


# --- exports for TensorRT ------------------------------------------------------------------
TRT_DTYPE = {"fp32": "fp32", "fp16": "fp16", "int8": "int8"}
_UNSAFE_TRT_NAME = re.compile(r"[,:]")


def _shape_flags(model: LoadedModel, shapes: dict[str, tuple[int, ...]] | None) -> list[str]:
    shapes = shapes or resolve_input_shapes(model)
    dynamic = [s for s in model.inputs if s.dynamic_axes]
    if not dynamic:
        return []
    spec = ",".join(f"{s.name}:{'x'.join(str(d) for d in shapes[s.name])}" for s in dynamic)
    return [f"--minShapes={spec}", f"--optShapes={spec}", f"--maxShapes={spec}"]


def trtexec_legacy_command(model: LoadedModel, policy: Policy, onnx_path: str = "model.onnx",
                           calib_cache: str = "calibration.cache", shapes=None) -> str:
    """TensorRT ≤ 10.11: the original ONNX with per-layer precision constraints."""
    bad = [n for n in policy.layers if _UNSAFE_TRT_NAME.search(n)]
    if bad:
        raise MixprecError("some layer names contain ',' or ':' which trtexec's --layerPrecisions cannot express",
                           "rename those nodes in the ONNX, or use the typed export (--format trtexec-typed)",
                           details=bad)
    precisions = ",".join(f"{n}:{TRT_DTYPE[p]}" for n, p in policy.layers.items())
    # INT8 layers compute in int8 but hand a float tensor (the network default) to their consumers.
    outputs = ",".join(f"{n}:{TRT_DTYPE[policy.network_default if p == 'int8' else p]}"
                       for n, p in policy.layers.items())
    args = ["trtexec", f"--onnx={onnx_path}", "--fp16", "--int8", f"--calib={calib_cache}",
            "--precisionConstraints=obey", f"--layerPrecisions={precisions}",
            f"--layerOutputTypes={outputs}", *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--saveEngine=model.plan"]
    return shlex.join(args)


def trtexec_typed_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None) -> str:
    """TensorRT ≥ 10.12 / 11: the compiled explicit-precision ONNX, strongly typed."""
    args = ["trtexec", f"--onnx={compiled_path}", "--stronglyTyped", *_shape_flags(model, shapes),
            "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--exportProfile=profile.json",
            "--separateProfileRun", "--saveEngine=model.plan"]
    return shlex.join(args)


def polygraphy_command(model: LoadedModel, compiled_path: str = "model.mixprec.onnx", shapes=None) -> str:
    """Polygraphy: build the compiled ONNX strongly typed and compare it against ONNX Runtime FP32."""
    shapes = shapes or resolve_input_shapes(model)
    args = ["polygraphy", "run", compiled_path, "--trt", "--strongly-typed", "--onnxrt"]
    dynamic = [s for s in model.inputs if s.dynamic_axes]
    if dynamic:
        for flag in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"):
            args += [flag, *(f"{s.name}:[{','.join(str(d) for d in shapes[s.name])}]" for s in dynamic)]
        args += ["--input-shapes", *(f"{s.name}:[{','.join(str(d) for d in shapes[s.name])}]" for s in dynamic)]
    return shlex.join(args)
