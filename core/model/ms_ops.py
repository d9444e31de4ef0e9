"""ONNX Runtime's fused transformer ops (``com.microsoft``), as its transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``) and ``optimum-cli export onnx --optimize`` write them.

TensorRT's ONNX parser imports the ``ai.onnx`` operators only (onnx-tensorrt's ``builtin_op_importers``; an
unknown op is looked up as a plugin of the same name, and TensorRT ships none named like these). So:

* the normalisation fusions are taken apart into the ``ai.onnx`` ops they fuse, exactly
  (``SkipLayerNormalization`` → Add [+ bias] + ``LayerNormalization``; ``SkipSimplifiedLayerNormalization`` and
  ``SimplifiedLayerNormalization`` → Add + the RMSNorm pattern Pow/ReduceMean/Add/Sqrt/Div/Mul; ``Gelu``,
  ``BiasGelu``, ``FastGelu``, ``QuickGelu`` → their Erf / Tanh / Sigmoid formulas), which TensorRT fuses again
  itself — these layers are then layers like any other (FP16 by default where they are normalisations);
* the attention fusions (``Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``, ``RotaryEmbedding``,
  ``PackedAttention``…), and any other ``com.microsoft`` op, have no ``ai.onnx`` form TensorRT imports: the model
  is refused, naming them and how to export without them.

Quantized ``com.microsoft`` ops (``MatMulNBits``, ``QAttention``…) are refused before this, as already quantized
(``core.model.normalize.refuse_quantized``).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from core.errors import MixprecError
from core.model.graph import attr

MS_DOMAIN = "com.microsoft"
UNFUSED = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "Gelu",
           "BiasGelu", "FastGelu", "QuickGelu")
ATTENTION_FUSIONS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "PackedAttention",
                     "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention",
                     "SparseAttention", "EmbedLayerNormalization", "LongformerAttention", "DecoderAttention")
EXPORT_FIX = ("export the model without ONNX Runtime's transformer optimizer: the ONNX that torch.onnx.export or "
              "`optimum-cli export onnx` writes without --optimize (not the output of "
              "onnxruntime.transformers.optimizer.optimize_model), at opset 17 or later; TensorRT fuses attention, "
              "normalisation and GELU itself")


class _Builder:
    """New ai.onnx nodes and constants replacing one fused node (names derived from it)."""

    def __init__(self, node: onnx.NodeProto, dtype: np.dtype, opset: int):
        self.base, self.dtype, self.opset = node.name or node.output[0], dtype, opset
        self.nodes, self.inits, self.k = [], [], 0

    def name(self, what: str) -> str:
        self.k += 1
        return f"{self.base}/{what}_{self.k}"

    def const(self, value, what: str = "c") -> str:
        name = self.name(what)
        self.inits.append(numpy_helper.from_array(np.asarray(value, self.dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out


def _reduce_mean(b: "_Builder", x: str, axis: int) -> str:
    if b.opset >= 18:  # axes became an input
        axes = b.name("axes")
        b.inits.append(numpy_helper.from_array(np.asarray([axis], np.int64), axes))
        return b.op("ReduceMean", [x, axes], keepdims=1)
    return b.op("ReduceMean", [x], axes=[axis], keepdims=1)


def _rms(b: _Builder, x: str, gamma: str, eps: float, out: str, axis: int = -1) -> str:
    """x / sqrt(mean(x²) + eps) · gamma — the decomposed RMSNorm that core.model.llm recognises."""
    mean = _reduce_mean(b, b.op("Pow", [x, b.const(2.0, "two")]), axis)
    std = b.op("Sqrt", [b.op("Add", [mean, b.const(eps, "eps")])])
    return b.op("Mul", [b.op("Div", [x, std]), gamma], out)


def _layernorm(b: _Builder, x: str, gamma: str, beta: str, eps: float, outs: list[str]) -> None:
    """LayerNormalization (opset ≥ 17), else its decomposed form ReduceMean→Sub→Pow→ReduceMean→Add→Sqrt→Div."""
    if b.opset >= 17:
        ln_outs = list(outs)
        while ln_outs and not ln_outs[-1]:
            ln_outs.pop()
        b.nodes.append(helper.make_node("LayerNormalization", [x, gamma] + ([beta] if beta else []), ln_outs,
                                        name=b.name("LayerNormalization"), axis=-1, epsilon=eps))
        return
    if any(outs[1:]):
        raise MixprecError(f"{b.base}: the mean and inverse std outputs of a fused layer norm need opset 17",
                           "export the model at opset 17 or later, or " + EXPORT_FIX)
    centred = b.op("Sub", [x, _reduce_mean(b, x, -1)])
    var = _reduce_mean(b, b.op("Pow", [centred, b.const(2.0, "two")]), -1)
    normed = b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, b.const(eps, "eps")])])])
    b.op("Add", [b.op("Mul", [normed, gamma]), beta], outs[0]) if beta else b.op("Mul", [normed, gamma], outs[0])


def _gelu_erf(b: _Builder, x: str, out: str) -> str:
    half = b.op("Mul", [x, b.const(0.5, "half")])
    erf = b.op("Erf", [b.op("Mul", [x, b.const(1.0 / math.sqrt(2.0), "inv_sqrt2")])])
    return b.op("Mul", [half, b.op("Add", [erf, b.const(1.0, "one")])], out)


def _unfuse(node: onnx.NodeProto, dtype: np.dtype, opset: int) -> _Builder:
    b = _Builder(node, dtype, opset)
    op, ins, outs = node.op_type, list(node.input), list(node.output) + [""] * 4
    eps = float(attr(node, "epsilon", 1e-12 if op.startswith("Skip") else 1e-5))
    if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        # inputs: input, skip, gamma, [beta,] bias; outputs: output, mean, inv_std_var, input_skip_bias_sum
        at = 4 if op == "SkipLayerNormalization" else 3
        bias = ins[at] if len(ins) > at else ""
        if bias:
            x = b.op("Add", [b.op("Add", ins[:2]), bias], outs[3] or None)
        else:
            x = b.op("Add", ins[:2], outs[3] or None)
        if op == "SkipLayerNormalization":
            _layernorm(b, x, ins[2], ins[3] if len(ins) > 3 else "", eps, outs[:3])
        else:
            if outs[1] or outs[2]:
                raise MixprecError(f"{b.base}: the mean / inverse std outputs of SkipSimplifiedLayerNormalization "
                                   "have no ai.onnx form", EXPORT_FIX)
            _rms(b, x, ins[2], eps, outs[0])
    elif op == "SimplifiedLayerNormalization":
        _rms(b, ins[0], ins[1], eps, outs[0], int(attr(node, "axis", -1)))
    elif op in ("Gelu", "BiasGelu"):
        x = b.op("Add", ins[:2]) if op == "BiasGelu" else ins[0]
        _gelu_erf(b, x, outs[0])
    elif op == "FastGelu":  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        x = b.op("Add", ins[:2]) if len(ins) > 1 and ins[1] else ins[0]
        cube = b.op("Mul", [b.op("Pow", [x, b.const(3.0, "three")]), b.const(0.044715, "k")])
        inner = b.op("Mul", [b.op("Add", [x, cube]), b.const(math.sqrt(2.0 / math.pi), "sqrt_2_pi")])
        half = b.op("Mul", [x, b.const(0.5, "half")])
        b.op("Mul", [half, b.op("Add", [b.op("Tanh", [inner]), b.const(1.0, "one")])], outs[0])
    elif op == "QuickGelu":  # x · sigmoid(alpha · x)
        alpha = float(attr(node, "alpha", 1.702))
        b.op("Mul", [ins[0], b.op("Sigmoid", [b.op("Mul", [ins[0], b.const(alpha, "alpha")])])], outs[0])
    return b


def _is_ms(node: onnx.NodeProto) -> bool:
    # SimplifiedLayerNormalization is registered by ONNX Runtime in the default domain
    return node.domain == MS_DOMAIN or (node.domain in ("", "ai.onnx") and node.op_type == "SimplifiedLayerNormalization")


def unfuse_ms_ops(proto: onnx.ModelProto, name: str) -> str | None:
    """Take the fused normalisation / GELU ops apart in ``proto``'s main graph (in place); refuse the
    other ``com.microsoft`` ops. What was done, or None."""
    g = proto.graph
    ms = [n for n in g.node if _is_ms(n)]
    if not ms:
        return None
    other = Counter(n.op_type for n in ms if n.op_type not in UNFUSED)
    if other:
        listed = ", ".join(f"{op} ×{k}" for op, k in other.most_common())
        attention = [op for op in other if op in ATTENTION_FUSIONS]
        what = (f"{name} holds ONNX Runtime's fused transformer ops ({listed}) that TensorRT's ONNX parser cannot "
                f"import (it runs ai.onnx operators only)") if attention else \
               (f"{name} holds com.microsoft ops ({listed}) that TensorRT's ONNX parser cannot import "
                "(it runs ai.onnx operators only)")
        raise MixprecError(what, EXPORT_FIX)
    types = {}
    for t in g.initializer:
        types.setdefault(t.name, t.data_type)
    for vi in list(g.input) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    opset = next((d.version for d in proto.opset_import if d.domain in ("", "ai.onnx")), 13)
    done = Counter()
    k = 0
    while k < len(g.node):
        n = g.node[k]
        if not _is_ms(n):
            k += 1
            continue
        elem = types.get(n.input[0], onnx.TensorProto.FLOAT)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(np.float32)
        b = _unfuse(n, dtype, opset)
        del g.node[k]
        for j, new in enumerate(b.nodes):
            g.node.insert(k + j, new)
        g.initializer.extend(b.inits)
        done[n.op_type] += 1
        k += len(b.nodes)
    if not any(n.domain == MS_DOMAIN for n in g.node):
        keep = [d for d in proto.opset_import if d.domain != MS_DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(keep)
    listed = ", ".join(f"{op} ×{c}" for op, c in done.most_common())
    return (f"took ONNX Runtime's fused ops apart into the ai.onnx ops TensorRT imports ({listed}); TensorRT fuses "
            "them again when it builds the engine")
