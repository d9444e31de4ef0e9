"""Compiler: precision policy → explicit-precision ONNX, with onnx-graphsurgeon.

* INT8 layers get QuantizeLinear/DequantizeLinear on their activation inputs (per-tensor,
  symmetric, scale = amax/127 from calibration; one QuantizeLinear per tensor, shared by its
  INT8 consumers, each with its own DequantizeLinear) and DequantizeLinear on int8 weights
  (per-channel, symmetric). This is TensorRT's explicit-quantization format.
* INT8 placement layers (``core.model.placement``), per TensorRT's Q/DQ placement guide: a residual
  Add gets Q/DQ on every input except the one TensorRT fuses it into (the Conv/Gemm output, so
  ``Conv + Add + Relu`` is one INT8 conv: the skip input is quantized); pooling on its input; a
  Concat on every input with one shared scale (the largest input range).
* FP16 layers get float16 inputs and weights, with Casts at the precision boundaries.
* Ops that do no arithmetic (Reshape, Transpose, Gather…) follow their inputs' precision.

Two targets:

``trt``  int8 with zero point 0; FP16 layers really typed float16. TensorRT ≥ 10.12 builds
         this file strongly typed (``trtexec --stronglyTyped``).
``ort``  the ONNX Runtime CPU encoding. Activations are uint8 with zero point 128 — the
         same grid as symmetric int8 (q_u8 = q_s8 + 128), but ORT's CPU kernels run U8S8
         much faster than S8S8. FP16 layers whose op has a real float16 CPU kernel
         (``ORT_CPU_FP16_KERNELS``) are typed float16 as for TensorRT. Every other FP16
         layer is *simulated*: ORT has no float16 kernel for it (it would insert casts and
         compute in float32), so its inputs, weights and outputs are rounded to float16
         (Cast→float16→Cast) and the math runs in float32 — the numerics of an FP16 layer
         with FP32 accumulation.

An all-FP32 policy leaves the graph's computation untouched. Nodes inside If/Loop/Scan
subgraphs are never rewritten: they run FP32 (their outer-scope inputs get float32 versions),
and the rest of the graph compiles as usual.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.external_data_helper import uses_external_data
from onnx_graphsurgeon.ir.tensor import LazyValues

from core.errors import MixprecError
from core.model.external import ExternalValues, ExternalWeights, Spill, attach, check_graph, dtype_of, save_compiled, values_of
from core.model.graph import LIGHT_FROM
from core.model.inventory import CONTROL_FLOW, NON_COMPUTE
from core.model.load import LoadedModel
from core.model.placement import PLACEMENT_OPS, PlacementGraph, fused_input
from core.quant.calibration import CalibrationResult
from core.quant.policy import Policy
from core.quant.trt_rules import assert_trt_rules
from core.workspace import TempFolder, Workspace, atomic_write_bytes

TARGETS = ("ort", "trt")
FLOAT_DTYPES = (np.float32, np.float16, np.float64)
WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1}
QUANT_INPUTS = (0, 1)
CONVERSION_OPS = ("QuantizeLinear", "DequantizeLinear", "Cast")
# Ops for which ONNX Runtime's CPU provider runs a real float16 kernel (checked by
# tests/unit/quant/test_compile.py::test_ort_fp16_kernel_table against the installed ORT). Every other op
# set to FP16 is simulated on the ORT target: ORT would only insert casts and compute in float32.
# Gather (data movement, any type): an FP16 embedding table is then stored as float16 (2 bytes a value, not a
# float16-rounded float32 copy: 0.27 GB less on a 151,936 × 896 table) and gathered rows are exact either way.
ORT_CPU_FP16_KERNELS = frozenset({"LayerNormalization", "Gather"})


@dataclass
class CompiledModel:
    proto: onnx.ModelProto
    target: str
    op_counts: dict[str, int]
    switch_inputs: dict[str, str] = field(default_factory=dict)  # layer -> boolean input (switchable models)
    # a model with external weights (core.model.external): where its data files are, and the new weights' file
    weights: ExternalWeights | None = None
    spill: Spill | None = field(default=None, repr=False)
    structure_only: bool = False  # its large weights are ShapeOnly: types and dims, no values (not runnable)

    @property
    def conversion_nodes(self) -> int:
        return sum(self.op_counts.get(op, 0) for op in CONVERSION_OPS)

    def serialized(self) -> bytes:
        self._runnable()
        if self.weights is not None:
            raise MixprecError("this compiled model keeps its weights as external data: it has no single-file form",
                               "write it with CompiledModel.save(path)")
        return self.proto.SerializeToString()

    def save(self, path, proto: onnx.ModelProto | None = None, copy: bool = False) -> Path:
        """Write the model (or ``proto``, a variant of it, e.g. with more outputs) at ``path``; with
        external weights, its new (quantized, float16) weights go to its own data file ``<name>.data``
        beside it, and the original model's data files beside it too (links of the workspace's copies;
        with ``copy``, real copies: an export). Keep this object while a saved file is used: its new
        weights' temp file goes with it (saved files keep their own link)."""
        self._runnable()
        proto = self.proto if proto is None else proto
        if self.weights is None:
            return atomic_write_bytes(path, proto.SerializeToString())
        return save_compiled(proto, Path(path), self.weights, self.spill, copy)

    def scratch(self, prefix: str = "mixprec-") -> TempFolder:
        """A temp folder for files made from the compiled model, as ``LoadedModel.scratch``: beside its data
        files (``external/<sha>/tmp``, so that they are hard-linked there) with external weights, else the
        default workspace's ``tmp/``."""
        if self.weights is not None:
            return TempFolder(self.weights.folder / "tmp", prefix)
        return TempFolder(Workspace.default(), prefix)

    def _runnable(self) -> None:
        if self.structure_only:
            raise MixprecError("this compiled model is structure-only (its weights have no values): it cannot be saved "
                               "or run", "compile the policy without structure_only for a build")


# --- structure-only compiles (the estimator's): weights as their type and dims only ---------------
SHAPE_ONLY = "<mixprec structure-only: no values>"  # the external-data location a ShapeOnly tensor names


class ShapeOnly(ExternalValues):
    """A weight's type and dims without its values, in a structure-only compile (``compile_policy(...,
    structure_only=True)``): the estimator reads shapes and types only. Its tensor is an external
    reference to :data:`SHAPE_ONLY` (so the checks treat it as a weight kept elsewhere); reading it
    is an error."""

    def __init__(self, name: str, shape, dtype):
        """``dtype``: a numpy dtype or an ONNX data type (``TensorProto.FLOAT16``)."""
        data_type = dtype if isinstance(dtype, int) else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        t = onnx.TensorProto(name=name, data_type=data_type, dims=[int(d) for d in shape])
        t.data_location = onnx.TensorProto.EXTERNAL
        t.external_data.add(key="location", value=SHAPE_ONLY)
        super().__init__(t, Path(SHAPE_ONLY))

    def load(self):
        raise MixprecError(f"the weight {self.tensor.name!r} of a structure-only compile has no values",
                           "compile the policy without structure_only to read or convert weights")


def is_shape_only(t) -> bool:
    return isinstance(t, gs.Constant) and isinstance(t._values, ShapeOnly)


def _shape_only(name: str, shape, dtype) -> gs.Constant:
    return gs.Constant(name, ShapeOnly(name, shape, dtype))


def _strip_weights(graph: gs.Graph) -> int:
    """Make every main-graph constant of LIGHT_FROM bytes or more (or kept as external data) ShapeOnly.
    Returns how many."""
    n = 0
    for t in graph.tensors().values():
        v = t._values if isinstance(t, gs.Constant) else None
        if type(v) is LazyValues and (v.nbytes >= LIGHT_FROM or uses_external_data(v.tensor)):  # not sparse ones
            t._values = ShapeOnly(t.name, v.shape, v.tensor.data_type)
            n += 1
    return n


def _is_float(t) -> bool:
    dt = dtype_of(t) if isinstance(t, gs.Constant) else t.dtype  # an external weight is not read for it
    try:
        return dt is not None and np.dtype(dt) in [np.dtype(d) for d in FLOAT_DTYPES]
    except TypeError:
        return False


def _type_vars(node: gs.Node, opset: int):
    """Formal type strings of each input and output (None where the schema is unknown)."""
    try:
        schema = onnx.defs.get_schema(node.op, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None, None

    def formal(params, i):
        return params[min(i, len(params) - 1)].type_str if params else None

    return ([formal(schema.inputs, i) for i in range(len(node.inputs))],
            [formal(schema.outputs, i) for i in range(len(node.outputs))])


def _weight_quant(w: np.ndarray, axis: int | None):
    """Symmetric int8: per-channel along ``axis`` (None: per-tensor)."""
    w = w.astype(np.float32)
    if axis is None:
        amax = np.array(np.abs(w).max(), dtype=np.float32)
    else:
        amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis)).astype(np.float32)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def _weight_axis(node: gs.Node, ndim: int) -> int | None:
    if ndim < 2:
        return None
    if node.op == "MatMul":
        return ndim - 1
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    if node.op == "Conv":
        return 0
    if node.op == "ConvTranspose":
        return 1
    return None


def _subgraphs(node: gs.Node):
    """Every graph nested in ``node`` (If branches, Loop/Scan bodies, and theirs)."""
    for value in node.attrs.values():
        for g in (value if isinstance(value, list) else [value]):
            if isinstance(g, gs.Graph):
                yield g
                for inner in g.nodes:
                    yield from _subgraphs(inner)


def _hoist_switch_constants(proto: onnx.ModelProto, names: set[str]) -> None:
    """Move the initializers of the weight switches' If branches (onnx-graphsurgeon exports a
    constant where it is used) into the main graph, which the branches read from the outer scope:
    the checks, the data-file handling and the runtimes then see every weight in one place, and a
    constant shared by several switches is stored once."""
    main = proto.graph
    have = {t.name for t in main.initializer}
    for n in main.node:
        if n.op_type != "If" or n.name not in names:
            continue
        for a in n.attribute:
            for t in a.g.initializer:
                if t.name not in have:
                    main.initializer.append(t)
                    have.add(t.name)
            del a.g.initializer[:]


class _Compiler:
    def __init__(self, model: LoadedModel, policy: Policy, calib: CalibrationResult | None, target: str,
                 switchable: bool = False, int8_outputs: bool = False, structure_only: bool = False):
        if target not in TARGETS:
            raise MixprecError(f"unknown compile target {target!r}", f"use one of {', '.join(TARGETS)}")
        self.model, self.policy, self.calib, self.target = model, policy, calib, target
        self.graph = gs.import_onnx(model.proto)
        self.structure_only = structure_only
        if structure_only:  # large weights as their type and dims only: none is read, converted or written
            _strip_weights(self.graph)
        # external weights are read one at a time (core.model.external); new weights go to a data file as made
        self.spill = None if model.weights is None or structure_only else Spill(model.weights.folder / "tmp")
        if self.spill is not None:
            attach(self.graph, model.weights)
        self.opset = model.opset
        self.versions: dict[tuple[str, str], gs.Variable] = {}  # (tensor, "fp16"/"fp32"/"r16") -> variable
        self.is16: set[str] = set()  # typed: tensors that are float16 now
        self.rep: set[str] = set()   # ort: float32 tensors whose values are exactly float16 values
        self.new_nodes: list[gs.Node] = []
        self.const_copies: dict[tuple[str, str], gs.Constant] = {}
        self.origin: dict[str, str] = {}  # name of a Cast-made version -> the original tensor's name
        self.switches: dict[str, gs.Variable] | None = {} if switchable else None
        self.if_switches: set[str] = set()  # names of the weight switches' If nodes
        self.smoothing = dict(policy.smoothing)
        self.amax_override: dict[str, float] = {}
        self.quantized: dict[tuple[str, float], tuple[gs.Variable, gs.Constant, gs.Constant]] = {}
        self.int8_weights: dict[tuple[str, int | None], gs.Constant] = {}  # (weight, axis) -> int8 copy
        self.int8_outputs = int8_outputs
        g = PlacementGraph(model.proto)  # residual Adds: the input TensorRT fuses the Add into
        self.fused = {n.name: fused_input(n, g) for n in g.nodes if n.op_type == "Add"}

    # --- helpers ------------------------------------------------------------------------
    def _constant(self, name: str, values: np.ndarray) -> gs.Constant:
        """A new weight (in the compiled model's own data file when the weights are external)."""
        return gs.Constant(name, values) if self.spill is None else self.spill.constant(name, values)

    def _node(self, op, inputs, name, attrs=None, dtype=np.float32, shape=None):
        out = gs.Variable(f"{name}_output", dtype=dtype, shape=shape)
        self.new_nodes.append(gs.Node(op=op, name=name, inputs=inputs, outputs=[out], attrs=attrs or {}))
        return out

    def _cast(self, var, to, tag):
        key = (var.name, tag)
        if key not in self.versions:
            to_onnx = onnx.TensorProto.FLOAT16 if to == np.float16 else onnx.TensorProto.FLOAT
            self.versions[key] = self._node("Cast", [var], f"{var.name}/Cast_{tag}", {"to": to_onnx}, to, var.shape)
            self.origin[self.versions[key].name] = self.origin.get(var.name, var.name)
        return self.versions[key]

    def _fp32(self, var):
        """The float32 version of a tensor (a Cast where it is float16 now; values stay fp16-exact)."""
        if var.name in self.is16:
            v = self._cast(var, np.float32, "fp32")
            self.rep.add(v.name)
            return v
        return var

    def _typed(self, node) -> bool:
        """Whether this FP16 node really runs in float16: always for TensorRT; on ORT only
        where the CPU provider has a float16 kernel (``ORT_CPU_FP16_KERNELS``)."""
        return self.target == "trt" or node.op in ORT_CPU_FP16_KERNELS

    def _fp16(self, var, typed: bool):
        if isinstance(var, gs.Constant):
            key = (var.name, "fp16" if typed else "r16")
            if key not in self.const_copies:
                name, steps = f"{var.name}__{key[1]}", (np.float16,) if typed else (np.float16, np.float32)
                streamed = self.spill.converted(name, var, steps) if self.spill is not None else None
                if is_shape_only(var):
                    self.const_copies[key] = _shape_only(name, var.shape, steps[-1])
                elif streamed is not None:  # a large external weight: converted chunk by chunk into the data file
                    self.const_copies[key] = streamed
                else:
                    vals = values_of(var).astype(np.float16)
                    self.const_copies[key] = self._constant(name, vals if typed else vals.astype(np.float32))
            return self.const_copies[key]
        if typed:
            return var if var.name in self.is16 else self._cast(var, np.float16, "fp16")
        var = self._fp32(var)
        if var.name in self.rep:
            return var
        key = (var.name, "r16")
        if key not in self.versions:  # round to fp16 and back: Cast -> float16 -> Cast -> float32
            h = self._cast(var, np.float16, "fp16")
            back = self._node("Cast", [h], f"{var.name}/Cast_r16", {"to": onnx.TensorProto.FLOAT}, np.float32, var.shape)
            self.versions[key] = back
            self.origin[back.name] = self.origin.get(var.name, var.name)
            self.rep.add(back.name)
        return self.versions[key]

    # --- per-node rewrites --------------------------------------------------------------
    def _as_fp32(self, node):
        for i, t in enumerate(node.inputs):
            if isinstance(t, gs.Variable) and _is_float(t):
                node.inputs[i] = self._fp32(t)

    def _as_fp16(self, node, follow: bool):
        in_types, out_types = _type_vars(node, self.opset)
        if in_types is None:
            self._as_fp32(node)
            return
        typed = self._typed(node) or (follow and any(t.name in self.is16 for t in node.inputs))
        castable = {i for i, t in enumerate(node.inputs) if _is_float(t) and in_types[i] and not in_types[i].startswith("tensor(")}
        tvars = {in_types[i] for i in castable}
        for i in castable:
            node.inputs[i] = self._fp16(node.inputs[i], typed)
        for i, t in enumerate(node.inputs):  # float inputs of a fixed type (e.g. Resize scales) stay fp32
            if i not in castable and isinstance(t, gs.Variable) and _is_float(t):
                node.inputs[i] = self._fp32(t)
        outs = [o for i, o in enumerate(node.outputs) if out_types[i] in tvars and _is_float(o)]
        if typed:
            for o in outs:
                o.dtype = np.float16
                self.is16.add(o.name)
        elif follow or node.op in NON_COMPUTE:
            self.rep.update(o.name for o in outs)  # data movement keeps fp16 values exact
        else:
            for o in outs:  # round the fp32 result to fp16: op -> raw -> Cast fp16 -> Cast fp32 -> o
                raw = gs.Variable(f"{o.name}__acc", dtype=np.float32, shape=o.shape)
                node.outputs[node.outputs.index(o)] = raw
                h = self._cast(raw, np.float16, "fp16")
                self.new_nodes.append(gs.Node("Cast", f"{o.name}/Cast_r16", {"to": onnx.TensorProto.FLOAT}, [h], [o]))
                self.rep.add(o.name)

    def _as_control_flow(self, node):
        """If/Loop/Scan: the node and its subgraphs stay FP32, untouched. Its inputs, and every
        outer-scope tensor its subgraphs read, get their float32 version."""
        self._as_fp32(node)
        for graph in _subgraphs(node):
            for inner in graph.nodes:
                for i, t in enumerate(inner.inputs):
                    if isinstance(t, gs.Variable) and t.name in self.is16:
                        inner.inputs[i] = self._fp32(t)

    def _switch(self, node, i, quantized, original):
        """Switchable model: one boolean input per layer; on, the layer's input is ``quantized``, off,
        its FP16 fallback (inputs and weights rounded to float16). An activation: ``Where(flag,
        quantized, fp16)``. A weight: ``If(flag)`` (:meth:`_switch_weight`)."""
        if self.switches is None:
            return quantized
        if node.name not in self.switches:
            flag = gs.Variable(f"mixprec_switch/{node.name}", dtype=np.bool_, shape=[])
            self.graph.inputs.append(flag)
            self.switches[node.name] = flag
        if isinstance(original, gs.Constant):
            return self._switch_weight(node, i, quantized, original)
        original = self._fp16(original, typed=False)
        return self._node("Where", [self.switches[node.name], quantized, original], f"{node.name}/switch{i}",
                          dtype=np.float32, shape=original.shape)

    def _switch_weight(self, node, i, quantized, original):
        """A weight's switch: ``If(flag)`` whose then-branch is the weight's DequantizeLinear (of its
        int8 copy) and whose else-branch casts its float16 copy to float32 (the same values as the
        float32 rounding ``_fp16(w, typed=False)``, stored at 2 bytes a value). Only the branch taken
        runs, and no float32 copy of the weight is stored; the branches' constants are main-graph
        initializers (:func:`_hoist_switch_constants`)."""
        dq = quantized.inputs[0]
        self.new_nodes.remove(dq)
        name = f"{node.name}/switch{i}"
        w16 = self._fp16(original, typed=True)
        r16 = gs.Variable(f"{name}/w16_output", dtype=np.float32, shape=original.shape)
        cast = gs.Node("Cast", f"{name}/Cast_w16", {"to": onnx.TensorProto.FLOAT}, [w16], [r16])
        then_g = gs.Graph(nodes=[dq], outputs=[quantized], name=f"{name}/int8", opset=self.opset)
        else_g = gs.Graph(nodes=[cast], outputs=[r16], name=f"{name}/fp16", opset=self.opset)
        self.if_switches.add(name)
        return self._node("If", [self.switches[node.name]], name, {"then_branch": then_g, "else_branch": else_g},
                          dtype=np.float32, shape=original.shape)

    def _smooth(self, node):
        """SmoothQuant-style scaling of an INT8 MatMul: x' = x / s, W' = diag(s)·W with
        s_j = amax(x_j)^α / amax(W_j)^(1-α), moving activation outliers into the weights.
        x'·W' == x·W in exact arithmetic; the Mul runs before the activation's Q/DQ."""
        alpha = self.smoothing.get(node.name)
        w = node.inputs[1] if len(node.inputs) > 1 else None
        if alpha is None or node.op != "MatMul" or not isinstance(w, gs.Constant) or len(w.shape) != 2:
            return
        x = node.inputs[0]
        src = self._original_name(x)
        c = (self.calib.channels if self.calib else {}).get(src)
        if c is None:
            raise MixprecError(f"no per-channel statistics for {src!r} (input of smoothed layer {node.name})",
                               "calibrate with core.quant.calibration.calibrate_policy, which collects them for smoothed layers")
        if is_shape_only(w):  # a structure-only compile: unit scales, the smoothed weight's type and dims
            wv, s = None, np.ones(int(w.shape[0]), dtype=np.float32)
        else:
            wv = values_of(w).astype(np.float32)
            s = np.clip(np.maximum(c, 1e-5) ** alpha / np.maximum(np.abs(wv).max(axis=1), 1e-5) ** (1 - alpha),
                        1e-4, 1e4).astype(np.float32)
        xs = self._node("Mul", [x, gs.Constant(f"{node.name}/smooth_inv_scale", (1.0 / s).astype(np.float32))],
                        f"{node.name}/smooth/Mul", dtype=np.float32, shape=x.shape)
        self.amax_override[xs.name] = float(np.max(c / s))
        node.inputs[0] = xs
        # per layer: layers sharing one weight (tied weights) smooth it by their own s
        name = f"{node.name}/{w.name}__smoothed"
        node.inputs[1] = _shape_only(name, w.shape, np.float32) if wv is None else self._constant(name, wv * s[:, None])

    def _as_int8_placement(self, node):
        """An INT8 Add / pooling / Concat, placed as TensorRT fuses it (module docstring): the
        quantized inputs get Q/DQ; a Concat's share one scale; a residual Add's fused input stays
        float (in a switchable model it is rounded to float16 when the switch is off)."""
        self._as_fp32(node)
        originals = list(node.inputs)
        u8 = self.target == "ort"
        kind = PLACEMENT_OPS[node.op]
        acts = [i for i, t in enumerate(node.inputs) if isinstance(t, gs.Variable) and _is_float(t)]
        fused = self.fused.get(node.name) if kind == "add" else None
        quantized = acts[:1] if kind == "pooling" else [i for i in acts if i != fused]
        shared = max(self._activation_amax(node, i, node.inputs[i]) for i in quantized) \
            if kind == "concat" and quantized else None
        for i in quantized:
            q = self._quantize_activation(node, i, node.inputs[i], u8, shared)
            node.inputs[i] = self._switch(node, i, q, originals[i])
        if fused is not None and fused in acts and self.switches is not None:
            node.inputs[fused] = self._switch(node, fused, originals[fused], originals[fused])
        if self.int8_outputs:
            self._quantize_output(node, u8)

    def _as_int8(self, node):
        if node.op in PLACEMENT_OPS:
            self._as_int8_placement(node)
            return
        self._as_fp32(node)
        originals = list(node.inputs)
        self._smooth(node)
        u8 = self.target == "ort"
        w_idx = WEIGHT_INPUT.get(node.op)
        for i in QUANT_INPUTS:
            if i >= len(node.inputs):
                continue
            q = self._quantize_input(node, i, node.inputs[i], u8, w_idx)
            if q is not None:
                node.inputs[i] = self._switch(node, i, q, originals[i])
        if self.int8_outputs:
            self._quantize_output(node, u8)

    def _quantize_output(self, node, u8):
        """INT8 *output* too (``int8_outputs``): Q/DQ on the layer's float output, per-tensor from
        calibration — what implicit INT8 or ``--layerOutputTypes=int8`` gives in TensorRT. Not
        mixprec's placement: on MiniLM it costs 0.14 cosine (see ``compile_policy``)."""
        out = node.outputs[0]
        if not _is_float(out):
            return
        if self.calib is None or out.name not in self.calib.ranges:
            raise MixprecError(f"no calibration range for the output {out.name!r} of INT8 layer {node.name}",
                               "calibrate this model again (mixprec calibrates the outputs of every eligible layer)")
        scale = np.array(max(self.calib.amax(out.name), 1e-8) / 127.0, dtype=np.float32)
        zp = np.array(128, dtype=np.uint8) if u8 else np.array(0, dtype=np.int8)
        sc, zc = gs.Constant(f"{node.name}/y_scale", scale), gs.Constant(f"{node.name}/y_zero_point", zp)
        raw = gs.Variable(f"{out.name}__int8_acc", dtype=np.float32, shape=out.shape)
        node.outputs[0] = raw
        qv = self._node("QuantizeLinear", [raw, sc, zc], f"{node.name}/y/QuantizeLinear",
                        dtype=np.uint8 if u8 else np.int8, shape=out.shape)
        self.new_nodes.append(gs.Node("DequantizeLinear", f"{node.name}/y/DequantizeLinear", inputs=[qv, sc, zc],
                                      outputs=[out]))

    def _quantize_input(self, node, i, t, u8, w_idx):
        """The dequantized replacement of input ``i`` (None if it is not a float tensor)."""
        if isinstance(t, gs.Constant):
            axis = _weight_axis(node, len(t.shape)) if i == w_idx else None
            if is_shape_only(t):  # a structure-only compile: the int8 copy's type and dims, unit scales
                q, scale = None, np.ones(() if axis is None else (int(t.shape[axis]),), dtype=np.float32)
            else:
                w = values_of(t)
                q, scale = _weight_quant(w, axis)
                del w
            zp = np.zeros_like(scale, dtype=np.int8)
            attrs = {"axis": axis} if axis is not None else {}
            # one int8 copy per (weight, axis): a weight shared by layers that quantize it along
            # different axes (tied weights, Gemm transB=1 and MatMul) needs one copy per axis
            key = (t.name, axis)
            if key not in self.int8_weights:
                suffix = "" if not any(k[0] == t.name for k in self.int8_weights) else \
                    ("_per_tensor" if axis is None else f"_axis{axis}")
                name = f"{t.name}__int8{suffix}"
                self.int8_weights[key] = _shape_only(name, t.shape, np.int8) if q is None else self._constant(name, q)
            return self._node(
                "DequantizeLinear",
                [self.int8_weights[key], gs.Constant(f"{node.name}/w{i}_scale", scale),
                 gs.Constant(f"{node.name}/w{i}_zero_point", zp)],
                f"{node.name}/w{i}/DequantizeLinear", attrs, np.float32, t.shape)
        elif _is_float(t):
            return self._quantize_activation(node, i, t, u8)
        return None

    def _activation_amax(self, node, i, t) -> float:
        """The calibrated |max| of activation ``t`` (input ``i`` of INT8 layer ``node``)."""
        src = self._original_name(t)
        if t.name in self.amax_override:
            return self.amax_override[t.name]
        if self.calib is None or src not in self.calib.ranges:
            raise MixprecError(
                f"no calibration range for tensor {src!r} (input {i} of INT8 layer {node.name})",
                "calibrate with this model and data again (mixprec calibrates the inputs of every "
                "MatMul/Gemm/Conv/ConvTranspose and placement Add/pooling/Concat), or set this layer to fp16/fp32")
        return self.calib.amax(src)

    def _quantize_activation(self, node, i, t, u8, amax: float | None = None):
        """Q/DQ on activation ``t`` at its calibrated range (``amax``: a given one, e.g. a Concat's shared
        range). One QuantizeLinear per (tensor, scale), shared by every INT8 consumer (e.g. Q, K and V
        of one LayerNorm output, or a residual block's input and its skip); each consumer gets its own
        DequantizeLinear, the QDQ form that TensorRT and ORT's QDQ fusions expect."""
        amax = self._activation_amax(node, i, t) if amax is None else amax
        key = (t.name, float(amax))
        if key not in self.quantized:
            scale = np.array(max(amax, 1e-8) / 127.0, dtype=np.float32)
            zp = np.array(128, dtype=np.uint8) if u8 else np.array(0, dtype=np.int8)
            sc = gs.Constant(f"{node.name}/x{i}_scale", scale)
            zc = gs.Constant(f"{node.name}/x{i}_zero_point", zp)
            qv = self._node("QuantizeLinear", [t, sc, zc], f"{node.name}/x{i}/QuantizeLinear",
                            dtype=np.uint8 if u8 else np.int8, shape=t.shape)
            self.quantized[key] = (qv, sc, zc)
        qv, sc, zc = self.quantized[key]
        return self._node("DequantizeLinear", [qv, sc, zc], f"{node.name}/x{i}/DequantizeLinear",
                          dtype=np.float32, shape=t.shape)

    def _original_name(self, var) -> str:
        return self.origin.get(var.name, var.name)

    # --- driver -------------------------------------------------------------------------
    def run(self) -> CompiledModel:
        policy = self.policy.layers
        for node in list(self.graph.nodes):
            prec = policy.get(node.name)
            if node.op in CONTROL_FLOW:  # its subgraphs stay FP32 (see core.model.inventory)
                self._as_control_flow(node)
            elif prec is None:  # not a layer: follow the inputs' precision
                float_vars = [t for t in node.inputs if isinstance(t, gs.Variable) and _is_float(t)]
                fp16_now = self.is16 | self.rep
                if float_vars and all(t.name in fp16_now for t in float_vars) and node.op in NON_COMPUTE:
                    self._as_fp16(node, follow=True)
                else:
                    self._as_fp32(node)
            elif prec == "fp32":
                self._as_fp32(node)
            elif prec == "fp16":  # a Concat layer (data movement) keeps float16 inputs as they are
                self._as_fp16(node, follow=node.op == "Concat")
            elif prec == "int8":
                self._as_int8(node)
        # graph outputs keep their original float32 type and name
        for k, out in enumerate(self.graph.outputs):
            if out.name in self.is16:
                producer = out.inputs[0]
                h = gs.Variable(f"{out.name}__fp16", dtype=np.float16, shape=out.shape)
                producer.outputs[producer.outputs.index(out)] = h
                for consumer in list(out.outputs):  # nodes inside the graph keep reading the float16 tensor
                    for j, t in enumerate(consumer.inputs):
                        if t is out:
                            consumer.inputs[j] = h
                out.dtype = np.float32
                self.new_nodes.append(gs.Node("Cast", f"{out.name}/Cast_out", {"to": onnx.TensorProto.FLOAT}, [h], [out]))
        self.graph.nodes.extend(self.new_nodes)
        self.graph.cleanup(remove_unused_graph_inputs=False).toposort()
        proto = gs.export_onnx(self.graph, do_type_check=True)
        _hoist_switch_constants(proto, self.if_switches)
        proto.ir_version = self.model.proto.ir_version
        del proto.graph.value_info[:]
        proto.doc_string = f"mixprec explicit-precision model (target={self.target}, policy sha256={self.policy.sha256})"
        try:
            if self.spill is None and not self.structure_only:
                onnx.checker.check_model(proto)
            else:  # external weights: the graph, its weights unread (core.model.external.check_graph)
                check_graph(proto)
        except onnx.checker.ValidationError as e:
            first = str(e).splitlines()[0]
            node = re.search(r"Name: ?(\S+)", str(e))
            what = f"the layer of node {node.group(1)!r}" if node else "the layer the message names"
            raise MixprecError(f"the compiled model fails onnx's checker: {first}",
                               f"set {what} to fp32 in the policy and build again (an all-FP32 policy leaves the "
                               "model's computation unchanged, so it always compiles)") from e
        if self.target == "trt":  # what TensorRT gets must follow its explicit-quantization rules
            assert_trt_rules(proto, source_nodes={n.name for n in self.model.proto.graph.node})
        switch_inputs = {layer: v.name for layer, v in (self.switches or {}).items()}
        return CompiledModel(proto, self.target, dict(Counter(n.op_type for n in proto.graph.node)), switch_inputs,
                             self.model.weights, self.spill, self.structure_only)


def compile_policy(model: LoadedModel, policy: Policy, calib: CalibrationResult | None = None,
                   target: str = "ort", switchable: bool = False, int8_outputs: bool = False,
                   structure_only: bool = False) -> CompiledModel:
    """Compile ``policy`` for ``model`` into an explicit-precision ONNX. ``switchable`` puts
    every INT8 layer's quantization behind a boolean graph input (``switch_inputs``), so one
    session can evaluate any subset of INT8 layers (used by the sensitivity search). An activation's
    switch is a ``Where``; a weight's an ``If`` that runs only the branch taken and stores the weight
    as int8 and float16 (3 bytes a value): open it without ONNX Runtime's ConstantFolding
    (``core.sensitivity.distributed.trial_session``), which would store the float16 copy's float32 cast.

    ``int8_outputs`` also quantizes the *outputs* of INT8 layers — an analysis option that
    reproduces the placement of implicit INT8 / ``--layerOutputTypes=int8``. mixprec's own
    placement (inputs only, outputs in the network's float type, TensorRT's recommended Q/DQ
    placement) is the default everywhere: on MiniLM int8 outputs drop held-out cosine from 0.981
    to 0.841, almost all of it at the six FFN down-projections, whose outputs carry the residual
    stream's outliers (``tests/unit/measure/test_runs.py``).

    ``structure_only`` compiles the graph only: every node, tensor type and dims as a real compile
    makes them, but no weight of LIGHT_FROM bytes or more (nor one kept as external data) is read,
    converted or written: those, and the new weights made from them (int8, float16, smoothed), are
    :class:`ShapeOnly`; their per-channel scales are ones. For the estimator (``core.estimate``),
    which reads shapes and types only; such a model cannot be saved or run."""
    if policy.model_sha256 != model.sha256:
        raise MixprecError(f"the policy was made for another model ({policy.model_name}, sha256 {policy.model_sha256[:12]}…)",
                           f"load the policy with the model it was made for, or make a new policy for {model.name}")
    if "int8" in policy.layers.values() and calib is None:
        raise MixprecError("the policy has INT8 layers but no calibration was given",
                           "calibrate first (mixprec calibrates automatically in `build`), or set those layers to fp16/fp32")
    return _Compiler(model, policy, calib, target, switchable, int8_outputs, structure_only).run()

