"""Normalisation on load: the ONNX files people have, turned into the form the rest of mixprec expects.

``normalize_model`` runs on every model before onnx's checker and shape inference, and records
each change as a ``NormStep`` (shown by ``inspect`` and on the Model page):

* ``ir_initializer_inputs`` — IR < 4 lists every initializer as a graph input too. Those are weights:
  they are removed from the inputs and the IR version is raised to 4.
* ``upgrade_opset`` — opset < 13 is upgraded with ``onnx.version_converter`` (per-channel
  DequantizeLinear needs opset 13; opset < 10 has no QuantizeLinear at all). The converter may rename
  or replace nodes (Upsample → Resize); the user's node and tensor names are restored, so policies
  keep the original layer names.
* ``fold_constants`` — weight-producing constant subgraphs (``Constant``, ``ConstantOfShape``,
  Identity/Cast/Reshape/Transpose/Unsqueeze chains on constants) become initializers, so that they
  are quantized per channel like any weight. The values are computed by onnx-graphsurgeon's
  ``fold_constants`` (no ``Shape`` folding: computation on activations is never touched); only the
  constant subgraphs that end in a weight-like input (``WEIGHT_INPUTS``: MAC weights and biases,
  normalisation parameters) are replaced — other constants (shape tensors, scalars) stay as they
  are. gs never computes a tensor over ``FOLD_CAP_BYTES`` that feeds no weight.

``quantized_ops`` lists the ops that make a model already quantized; such a model is refused. That refusal, a
merged decoder's branch (``core.model.branches``) and ONNX Runtime's fused ops (``unfuse_ms_ops``,
``core.model.ms_ops``) come before this, in ``core.model.load``: before onnx's checker, which knows no
``com.microsoft`` op.
External data may stay unloaded (a model whose weights stay external, ``core.model.external``): folding
then reads only the external initializers its constant nodes take, from ``base_dir`` (after
``core.model.load``'s location check), and nothing else here reads weights.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

from core.errors import MixprecError
from core.model.graph import GraphIndex, all_nodes, default_opset, subgraphs, without_weights

MIN_OPSET = 13  # TensorRT's explicit quantization: per-channel DequantizeLinear (``axis``) needs opset 13
TARGET_OPSET = MIN_OPSET  # models below it are converted up on load (core.quant.trt_rules checks it)
MIN_IR_WITHOUT_INIT_INPUTS = 4
FOLD_CAP_BYTES = 64 << 20
ORT_DEFAULT_LOG_SEVERITY = 2  # onnxruntime's own default (warning); restored after folding
ONNX_DOMAINS = ("", "ai.onnx")
MS_DOMAIN = "com.microsoft"

QUANTIZED_ONNX_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                                "QLinearMatMul", "ConvInteger", "MatMulInteger"})
QUANTIZED_MS_OPS = frozenset({"QGemm", "QAttention", "QEmbedLayerNormalization", "DynamicQuantizeMatMul",
                              "DynamicQuantizeLSTM", "MatMulIntegerToFloat", "MatMulNBits", "MatMulBnb4",
                              "MatMulFpQ4", "GatherBlockQuantized", "QuantizeLinear", "DequantizeLinear",
                              "DynamicQuantizeLinear", "QuantizeBFP", "DequantizeBFP", "QMoE"})
QUANTIZED_MS_PREFIXES = ("QLinear", "QOrdered")

# weight-like inputs (weights, biases, normalisation parameters) — what folding turns into
# initializers — and the ops that only carry a constant towards them
WEIGHT_INPUTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "MatMul": (0, 1), "Gemm": (0, 1, 2),
                 "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2),
                 "LayerNormalization": (1, 2), "PRelu": (1,), "LSTM": (1, 2, 3), "GRU": (1, 2, 3),
                 "RNN": (1, 2, 3), "Attention": (1, 2)}
MAC_WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
CHAIN_OPS = frozenset({"Identity", "Cast", "CastLike", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten",
                       "Expand", "Tile", "Concat"})
NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})
_CONSTANT_ATTRS = {"value_float": (TensorProto.FLOAT, False), "value_floats": (TensorProto.FLOAT, True),
                   "value_int": (TensorProto.INT64, False), "value_ints": (TensorProto.INT64, True)}


@dataclass(frozen=True)
class NormStep:
    """One change normalisation made: ``step`` (a short key) and a sentence for the user."""

    step: str
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


# --- helpers over graphs -------------------------------------------------------------------------

def _counts_text(counts: Counter) -> str:
    return ", ".join(f"{op} ×{n}" for op, n in counts.most_common())


# --- already quantized ---------------------------------------------------------------------------

def _is_quantized_op(node: onnx.NodeProto) -> bool:
    if node.domain in ONNX_DOMAINS:
        return node.op_type in QUANTIZED_ONNX_OPS
    if node.domain == MS_DOMAIN:
        return node.op_type in QUANTIZED_MS_OPS or node.op_type.startswith(QUANTIZED_MS_PREFIXES)
    return False


def quantized_ops(proto: onnx.ModelProto) -> list[str]:
    """The quantized ops in the model (subgraphs included), one entry per node, in graph order."""
    return [n.op_type for n in all_nodes(proto.graph) if _is_quantized_op(n)]


def refuse_quantized(proto: onnx.ModelProto, name: str) -> None:
    ops = quantized_ops(proto)
    if ops:
        raise MixprecError(
            f"{name} is already quantized ({_counts_text(Counter(ops))})",
            "give mixprec the float original of this model (before quantize_static / quantize_dynamic, QAT "
            "export or a QDQ tool); mixprec chooses the precisions and inserts the quantization itself",
        )


# --- IR < 4: initializers listed as graph inputs -------------------------------------------------

def _fix_initializer_inputs(proto: onnx.ModelProto) -> list[NormStep]:
    if proto.ir_version >= MIN_IR_WITHOUT_INIT_INPUTS:
        return []
    inits = {i.name for i in proto.graph.initializer}
    keep = [i for i in proto.graph.input if i.name not in inits]
    removed = len(proto.graph.input) - len(keep)
    old_ir = proto.ir_version
    if removed:
        del proto.graph.input[:]
        proto.graph.input.extend(keep)
    proto.ir_version = MIN_IR_WITHOUT_INIT_INPUTS
    return [NormStep("ir_initializer_inputs",
                     f"IR version {old_ir} → {MIN_IR_WITHOUT_INIT_INPUTS}: {removed} initializers (weights) were "
                     "also listed as graph inputs; they are no longer inputs")]


# --- opset < 13: onnx.version_converter, with the user's names restored ---------------------------

def _tensor_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {i.name for i in graph.initializer}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
    names.discard("")
    return names


def _restore_tensor_names(orig: onnx.GraphProto, conv: onnx.GraphProto) -> None:
    """The converter gives a replaced node's outputs new names (``_v_21``); give them back the
    original names where the original tensor no longer exists under its own name."""
    orig_names, conv_names = _tensor_names(orig), _tensor_names(conv)
    by_name = {n.name: n for n in orig.node if n.name}
    rename: dict[str, str] = {}
    for cn in conv.node:
        on = by_name.get(cn.name) if cn.name else None
        if on is None or on.op_type != cn.op_type:
            continue
        for new, old in list(zip(cn.input, on.input)) + list(zip(cn.output, on.output)):
            if new != old and new and old and new not in orig_names and old not in conv_names:
                rename.setdefault(new, old)
    if not rename:
        return
    for n in conv.node:
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename.get(t, t) for t in n.output]
    for vi in list(conv.value_info) + list(conv.output):
        vi.name = rename.get(vi.name, vi.name)


def _restore_node_names(orig: onnx.GraphProto, conv: onnx.GraphProto) -> tuple[list[str], Counter]:
    """Name unnamed converted nodes after the original node that produced the same output.
    Returns the replaced nodes ("up1 (Upsample → Resize)") and the ops the converter added."""
    produced_by = GraphIndex(orig).producer
    used = {n.name for n in conv.node if n.name}
    replaced, added = [], Counter()
    for cn in conv.node:
        if cn.name:
            continue
        on = next((produced_by[o] for o in cn.output if o in produced_by), None)
        if on is None or on.name in used:  # a helper node (e.g. Softmax-11's Flatten/Reshape)
            added[cn.op_type] += 1
        elif on.name:
            cn.name = on.name
            used.add(on.name)
            if on.op_type != cn.op_type:
                replaced.append(f"{on.name} ({on.op_type} → {cn.op_type})")
    return replaced, added


def _restore_names(orig: onnx.GraphProto, conv: onnx.GraphProto) -> tuple[list[str], Counter]:
    """Restore tensor and node names in ``conv`` and, pairing them by node and attribute name,
    in its If/Loop/Scan subgraphs."""
    _restore_tensor_names(orig, conv)
    replaced, added = _restore_node_names(orig, conv)
    by_name = {n.name: n for n in orig.node if n.name}
    for cn in conv.node:
        on = by_name.get(cn.name) if cn.name else None
        if on is None:
            continue
        orig_subs = {a.name: a.g for a in on.attribute if a.type == onnx.AttributeProto.GRAPH}
        for a in cn.attribute:
            if a.type == onnx.AttributeProto.GRAPH and a.name in orig_subs:
                r, d = _restore_names(orig_subs[a.name], a.g)
                replaced += r
                added += d
    return replaced, added


def _conversion_failures(proto: onnx.ModelProto) -> list[str]:
    """The op types that onnx.version_converter cannot take to TARGET_OPSET, each tried alone."""
    failing = []
    for domain, op in sorted({(n.domain, n.op_type) for n in proto.graph.node}):
        node = next(n for n in proto.graph.node if (n.domain, n.op_type) == (domain, op))
        probe = onnx.NodeProto()
        probe.CopyFrom(node)
        ins = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in dict.fromkeys(probe.input) if t]
        outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in probe.output if t]
        g = helper.make_graph([probe], "probe", ins, outs)
        m = helper.make_model(g, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
        try:
            version_converter.convert_version(m, TARGET_OPSET)
        except Exception:  # noqa: BLE001 - the converter raises RuntimeError/ValueError/…
            failing.append(f"{domain}::{op}" if domain not in ONNX_DOMAINS else op)
    return failing


def _upgrade_opset(proto: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, list[NormStep]]:
    old = default_opset(proto)
    if not old or old >= TARGET_OPSET:
        return proto, []
    try:
        conv = version_converter.convert_version(proto, TARGET_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter's C++ assertions
        ops = _conversion_failures(proto)
        what = f"op {', '.join(ops)}" if ops else f"the model ({str(e).strip().splitlines()[0][:200]})"
        raise MixprecError(
            f"{name} is at opset {old}, and onnx.version_converter cannot upgrade {what} to opset {TARGET_OPSET} "
            "(mixprec's per-channel INT8 weights need opset ≥ 13)",
            "re-export the model at opset 13 or later (torch.onnx.export(..., opset_version=17), "
            "tf2onnx --opset 17, paddle2onnx --opset_version 13)",
        ) from e
    replaced, added = _restore_names(proto.graph, conv.graph)
    old_ir = conv.ir_version
    try:
        conv.ir_version = max(conv.ir_version, helper.find_min_ir_version_for(
            [o for o in conv.opset_import if o.domain in ONNX_DOMAINS]))
    except Exception:  # noqa: BLE001 - unknown opset table: keep the converter's IR version
        pass
    detail = f"opset {old} → {TARGET_OPSET} with onnx.version_converter"
    if conv.ir_version != old_ir:
        detail += f" (IR version {old_ir} → {conv.ir_version})"
    if replaced:
        detail += f"; replaced {', '.join(replaced)}"
    if added:
        detail += f"; added {_counts_text(added)}"
    return conv, [NormStep("upgrade_opset", detail)]


# --- constant subgraphs → initializers (onnx-graphsurgeon's fold_constants) -----------------------

def _feeds_weight(tensor, depth: int = 0) -> bool:
    for consumer in tensor.outputs:
        if consumer.op in WEIGHT_INPUTS and any(consumer.inputs[i] is tensor for i in WEIGHT_INPUTS[consumer.op]
                                                if i < len(consumer.inputs)):
            return True
        if consumer.op in CHAIN_OPS and depth < 16 and any(_feeds_weight(o, depth + 1) for o in consumer.outputs):
            return True
    return False


def _too_big(tensor) -> bool:
    if tensor.shape is None or tensor.dtype is None or any(not isinstance(d, int) or d < 0 for d in tensor.shape):
        return False
    try:
        itemsize = np.dtype(tensor.dtype).itemsize
    except TypeError:  # an onnx-only dtype (bfloat16, float8…)
        itemsize = 4
    return int(np.prod(tensor.shape, dtype=np.int64)) * itemsize > FOLD_CAP_BYTES


def _exclude(node) -> bool:
    """gs ``should_exclude_node``: never fold random generators, nor a big tensor that is no weight."""
    return node.op in NEVER_FOLD or any(_too_big(o) and not _feeds_weight(o) for o in node.outputs)


def _gs_folds(node: onnx.NodeProto) -> bool:
    """A node gs's ``fold_constants`` may compute when its inputs are constants: no random generator,
    no If/Loop/Scan (folding does not recurse into subgraphs)."""
    return node.op_type not in NEVER_FOLD and not list(subgraphs(node))


def _has_constant_work(g: GraphIndex) -> bool:
    """Whether some weight-like input is computed by constant nodes (a reachability check only:
    gs is not started for the usual model, whose weights are all initializers)."""
    fold = g.folding(_gs_folds)
    computed = fold.tensors - g.inits.keys()
    folded = set(fold.nodes)
    return any(k not in folded and any(n.input[i] in computed for i in WEIGHT_INPUTS.get(n.op_type, ())
                                       if i < len(n.input)) for k, n in enumerate(g.nodes))


def _canonical_constants(proto: onnx.ModelProto) -> None:
    """Constant nodes with value_float(s)/value_int(s) get a typed ``value`` (gs would make float64)."""
    for n in proto.graph.node:
        if n.op_type != "Constant" or len(n.attribute) != 1 or n.attribute[0].name not in _CONSTANT_ATTRS:
            continue
        a = n.attribute[0]
        elem, is_list = _CONSTANT_ATTRS[a.name]
        v = helper.get_attribute_value(a)
        t = helper.make_tensor("value", elem, [len(v)] if is_list else [], list(v) if is_list else [v])
        del n.attribute[:]
        n.attribute.append(helper.make_attribute("value", t))


def _constant_inputs(g: GraphIndex) -> set[str]:
    """The initializers read by nodes computable from constants alone (what folding evaluates)."""
    return {t for k in g.folding(_gs_folds).nodes for t in g.nodes[k].input if t in g.inits}


def _folded_values(proto: onnx.ModelProto, base_dir: Path | None = None,
                   index: GraphIndex | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the main graph that gs's ``fold_constants`` can compute, by name. External
    initializers that constant nodes read are loaded (into the work copy only) from ``base_dir``.
    ``index``: the main graph's, when the caller has it."""
    needed = _constant_inputs(index or GraphIndex(proto))
    # the weights no constant node reads stay out of the work copy (typed inputs there): folding cannot
    # compute from them, and copying them (and shape inference's copies) was the peak of loading a model
    work, _ = without_weights(proto, keep=needed)
    if base_dir is not None:
        for init in work.graph.initializer:
            if init.name in needed and uses_external_data(init):
                load_external_data_for_tensor(init, str(base_dir))
    _canonical_constants(work)
    try:  # shapes let the size cap act before anything big is computed
        work = onnx.shape_inference.infer_shapes(work, data_prop=True)
    except Exception:  # noqa: BLE001 - folding works without them
        pass
    severity = gs.logger.G_LOGGER.severity
    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
    ort.set_default_logger_severity(3)  # gs's folding session warns about every folded Unsqueeze
    try:
        graph = _gs_fold(work, partitioning=None)  # one ORT session: fast
        if graph is None:  # some constant node ORT cannot run: fold what can be, part by part
            graph = _gs_fold(work, partitioning="basic")
        if graph is None:
            return {}
        inits = {i.name for i in proto.graph.initializer}
        return {name: t.values for name, t in graph.tensors().items()
                if isinstance(t, gs.Constant) and name not in inits}
    finally:
        gs.logger.G_LOGGER.severity = severity
        ort.set_default_logger_severity(ORT_DEFAULT_LOG_SEVERITY)


def _gs_fold(work: onnx.ModelProto, partitioning: str | None):
    try:
        graph = gs.import_onnx(work)
        graph.toposort()
        graph.fold_constants(fold_shapes=False, recurse_subgraphs=False, flatten_subgraphs=False,
                             partitioning=partitioning, error_ok=partitioning is not None, size_threshold=None,
                             should_exclude_node=_exclude)
        return graph
    except Exception:  # noqa: BLE001 - a graph gs cannot take (or evaluate) as a whole
        return None


def _as_initializers(values: dict[str, np.ndarray]) -> dict[str, onnx.TensorProto]:
    out = {}
    for name, v in values.items():
        try:
            out[name] = numpy_helper.from_array(np.asarray(v), name)
        except Exception:  # noqa: BLE001 - a dtype onnx cannot store: leave that node in place
            continue
    return out


def _referenced(graph: onnx.GraphProto, nodes) -> set[str]:
    names = {o.name for o in graph.output}
    for n in nodes:
        names.update(n.input)
        for sub in subgraphs(n):
            for inner in all_nodes(sub):
                names.update(inner.input)
    return names


def _weight_cone(g: GraphIndex, values: dict) -> tuple[set[int], set[str]]:
    """The foldable nodes that compute weights, and those weights: tensors gs could compute that a
    node which stays feeds into a weight input, with every foldable node upstream of them."""
    nodes = g.nodes
    cand = {i for i, n in enumerate(nodes) if n.output and not list(subgraphs(n))
            and not g.outputs.keys() & set(n.output) and all(o in values for o in n.output if o)}

    def made(t: str) -> int | None:  # the candidate that writes ``t``
        return k if (k := g.producer_id.get(t)) in cand else None

    roots = {n.input[k] for i, n in enumerate(nodes) if i not in cand for k in WEIGHT_INPUTS.get(n.op_type, ())
             if k < len(n.input) and made(n.input[k]) is not None}
    cone, stack = set(), [made(t) for t in roots]
    while stack:
        i = stack.pop()
        if i not in cone:
            cone.add(i)
            stack.extend(k for t in nodes[i].input if (k := made(t)) is not None)
    return cone, roots


def _fold_constants(proto: onnx.ModelProto, base_dir: Path | None = None) -> list[NormStep]:
    g, index = proto.graph, GraphIndex(proto)
    if not _has_constant_work(index):
        return []
    values = _folded_values(proto, base_dir, index)
    nodes = index.nodes
    gone, _ = _weight_cone(index, values)
    if not gone:
        return []
    folded = [nodes[i] for i in sorted(gone)]
    kept = [n for i, n in enumerate(nodes) if i not in gone]
    needed = _referenced(g, kept)
    inits = _as_initializers({o: values[o] for n in folded for o in n.output if o in needed})
    if len(inits) < len({o for n in folded for o in n.output if o in needed}):
        return []  # a value onnx cannot store as an initializer: leave the graph as it is
    # named as core.model.load.assign_stable_names will name them
    weights = [n.name or f"node_of_{n.output[0]}" for n in kept
               if n.op_type in MAC_WEIGHT_OPS and any(t in inits for t in n.input[1:2])]
    for i in sorted(gone, reverse=True):
        del g.node[i]
    spent = {t for n in folded for t in n.input} - needed  # inputs only the folded nodes used
    for i in reversed([i for i, t in enumerate(g.initializer) if t.name in spent]):
        del g.initializer[i]
    g.initializer.extend(inits.values())
    detail = (f"folded {len(folded)} constant nodes ({_counts_text(Counter(n.op_type for n in folded))}) "
              f"into {len(inits)} weight initializers with onnx-graphsurgeon")
    if weights:
        shown = ", ".join(weights[:8]) + (f", … ({len(weights)} in all)" if len(weights) > 8 else "")
        detail += f"; {shown} now have initializer weights (quantized per channel in INT8)"
    return [NormStep("fold_constants", detail)]


# --- driver --------------------------------------------------------------------------------------

def normalize_model(proto: onnx.ModelProto, base_dir: Path, name: str = "the model"
                    ) -> tuple[onnx.ModelProto, list[NormStep]]:
    """The normalised model and the steps taken (empty when nothing changed). ``proto`` is changed
    in place where possible. External data may be unloaded: folding reads what it needs from
    ``base_dir`` (the model's folder, whose locations ``core.model.load`` has checked)."""
    steps = _fix_initializer_inputs(proto)
    proto, upgraded = _upgrade_opset(proto, name)
    steps += upgraded
    steps += _fold_constants(proto, base_dir)
    return proto, steps
