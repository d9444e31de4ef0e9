"""Layer inventory: every node that does floating-point work, with its parameters, MACs,
INT8 eligibility and default precision."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx
import pandas as pd

from .model import FLOAT_TYPES, LoadedModel, resolve_input_shapes, with_static_shapes

INT8_ELIGIBLE = ("MatMul", "Gemm", "Conv", "ConvTranspose")
PRECISIONS = ("fp32", "fp16", "int8")
# Ops that move or reinterpret data but do no arithmetic: they are not layers of their own.
NON_COMPUTE = {
    "Cast", "CastLike", "Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Reshape",
    "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "Pad", "QuantizeLinear", "DequantizeLinear",
    "NonZero", "Range", "Equal", "Less", "Greater", "Not", "And", "Or", "Where", "If", "Loop",
}
LAYERNORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization")

INVENTORY_COLUMNS = [
    "name", "op_type", "params", "macs", "eligible", "default_precision", "default_reason",
    "inputs", "outputs",
]


@dataclass(frozen=True)
class Layer:
    name: str
    op_type: str
    params: int
    macs: int
    eligible: bool
    default_precision: str  # "fp16" / "int8" / "default" (the policy's network default)
    default_reason: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _shape_map(proto: onnx.ModelProto, batch: int) -> dict[str, tuple[int, ...]]:
    """Concrete shapes after inference; a leading dim that inference could not resolve
    (e.g. behind a Reshape) is the batch."""
    g = proto.graph
    shapes = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        vals = [int(d.dim_value) if d.HasField("dim_value") else (batch if i == 0 else None)
                for i, d in enumerate(dims)]
        if vals and None not in vals:
            shapes[vi.name] = tuple(vals)
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def tensor_shapes(model: LoadedModel, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every tensor whose shape inference resolves, for these input shapes."""
    batch = next(iter(input_shapes.values()))[0] if input_shapes else 1
    return _shape_map(with_static_shapes(model, input_shapes), batch)


def _macs(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    out = shapes.get(node.output[0]) if node.output else None
    ins = [shapes.get(i) for i in node.input]
    try:
        if node.op_type == "MatMul" and ins[0] and out:
            return int(np.prod(out, dtype=np.int64)) * int(ins[0][-1])
        if node.op_type == "Gemm" and ins[0] and out:
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            k = ins[0][0] if trans_a else ins[0][1]
            return int(np.prod(out, dtype=np.int64)) * int(k)
        if node.op_type in ("Conv", "ConvTranspose") and ins[1] and out:
            w = ins[1]
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if node.op_type == "Conv":  # W: [M, C/g, k...]
                return int(np.prod(out, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
            x = ins[0]  # ConvTranspose W: [C, M/g, k...]: every input pixel scatters into M/g*k outputs
            return int(np.prod(x, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64)) // max(group, 1) * group
    except (IndexError, TypeError):
        return 0
    return 0


def _decomposed_layernorm_nodes(proto: onnx.ModelProto) -> set[str]:
    """Nodes of the decomposed pattern ReduceMean→Sub→Pow→ReduceMean→Add→Sqrt→Div."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def prod(name, op):
        n = producer.get(name)
        return n if n is not None and n.op_type == op else None

    found: set[str] = set()
    for sqrt in (n for n in proto.graph.node if n.op_type == "Sqrt"):
        add = prod(sqrt.input[0], "Add")
        rm2 = add and (prod(add.input[0], "ReduceMean") or prod(add.input[1], "ReduceMean"))
        pow_ = rm2 and prod(rm2.input[0], "Pow")
        sub = pow_ and prod(pow_.input[0], "Sub")
        rm1 = sub and prod(sub.input[1], "ReduceMean")
        divs = [c for c in consumers.get(sqrt.output[0], []) if c.op_type == "Div"]
        if rm1 and divs:
            found.update(n.name for n in (rm1, sub, pow_, rm2, add, sqrt, *divs))
    return found


def build_inventory(model: LoadedModel, data: dict | None = None) -> list[Layer]:
    input_shapes = resolve_input_shapes(model, data)
    batch = next(iter(input_shapes.values()))[0] if input_shapes else 1
    shapes = _shape_map(with_static_shapes(model, input_shapes), batch)
    types = model.tensor_types()
    inits = {i.name: i for i in model.proto.graph.initializer}
    ln_nodes = _decomposed_layernorm_nodes(model.proto)
    layers = []
    for node in model.proto.graph.node:
        float_io = [t for t in (*node.input, *node.output) if t and types.get(t) in FLOAT_TYPES]
        embedding = (
            node.op_type == "Gather" and node.input and node.input[0] in inits
            and inits[node.input[0]].data_type in FLOAT_TYPES
        )
        if not float_io or (node.op_type in NON_COMPUTE and not embedding):
            continue
        params = sum(int(np.prod(inits[i].dims, dtype=np.int64)) for i in node.input if i in inits
                     and inits[i].data_type in FLOAT_TYPES)
        eligible = node.op_type in INT8_ELIGIBLE
        if node.op_type in LAYERNORM_OPS or node.name in ln_nodes:
            default, reason = "fp16", "layernorm"
        elif node.op_type == "Softmax":
            default, reason = "fp16", "softmax"
        elif embedding:
            default, reason = "fp16", "embedding"
        elif eligible:
            default, reason = "int8", "int8-eligible"
        else:
            default, reason = "default", "network default"
        layers.append(Layer(
            name=node.name, op_type=node.op_type, params=params, macs=_macs(node, shapes),
            eligible=eligible, default_precision=default, default_reason=reason,
            inputs=tuple(node.input), outputs=tuple(node.output),
        ))
    return layers


def inventory_frame(layers: list[Layer]) -> pd.DataFrame:
    return pd.DataFrame([asdict(layer) for layer in layers], columns=INVENTORY_COLUMNS)

