"""The TensorRT <= 10.11 path (``legacy`` build mode, :func:`core.backends.tensorrt.versions.build_mode`).

The original ONNX (the loaded model's proto, with its stable node names) is built with FP16 and INT8
enabled, per-layer precisions and output types obeyed (``SetLayerPrecisions``,
``precision_constraints="obey"``) and INT8 ranges from mixprec's calibration set as tensor dynamic
ranges: implicit quantization without running a calibrator. The ONNX parser names each layer after
its node and writes ``[ONNX Layer: <node>]`` into the layer's metadata, so those layers get that
node's precision. The layers it creates without metadata (weight Constants and their Shuffles,
broadcast shuffles, Gemm bias/alpha/beta) take the node of the layers next to them
(:func:`policy_nodes`). Layers of nodes the policy does not list are left to TensorRT.

The export ships the same constraints as a Polygraphy network post-process script
(:func:`legacy_postprocess_script`). The code ``LEGACY_ONLY`` names, all of it here, is the only code
that may use a TensorRT API deprecated in 10.12 or removed in 11 (tests/unit/backends/test_tensorrt_api_scan.py).
"""
from __future__ import annotations

import functools
import json

import numpy as np

from core.backends.reports import ONNX_LAYER, metadata_nodes  # one metadata parser (issue 11, bug 9)
from core.errors import MixprecError

INT8_COMPUTE = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY")  # the layers of an INT8 node that run int8
NO_PRECISION = ("CONSTANT", "SHAPE")  # layers a precision constraint must not touch

# The code that runs only on the legacy path (TensorRT 10.0-10.11, build_mode): the only place where a
# TensorRT API deprecated in 10.12 or removed in 11 may be used.
LEGACY_ONLY = ("legacy_constraints", "_source_amax", "_apply_types_and_ranges", "POSTPROCESS_SCRIPT")


def layer_node(layer_name: str, metadata: str | None = None) -> str:
    """The ONNX node a network layer was parsed from: the first ``[ONNX Layer: <node> | ...]`` in its
    metadata (TensorRT >= 10.0's parser, read by :func:`core.backends.reports.metadata_nodes`), else the
    layer's name (the parser names layers after nodes)."""
    nodes = metadata_nodes(metadata)
    return nodes[0] if nodes else layer_name


def _source_amax(tensor, amax: dict, producers: dict, trt) -> float | None:
    """|range| of an INT8 layer input: calibrated, or the weights of the Constant it comes from
    (through Shuffles, which keep values)."""
    while tensor is not None and tensor.name not in amax:
        layer = producers.get(tensor.name)
        if layer is None or layer.type not in (trt.LayerType.SHUFFLE, trt.LayerType.CONSTANT):
            return None
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer  # Polygraphy's idiom to reach subclass attributes
            return float(np.abs(np.asarray(layer.weights, dtype=np.float32)).max(initial=0.0))
        tensor = layer.get_input(0)
    return None if tensor is None else amax[tensor.name]


def policy_nodes(network, known) -> list[str | None]:
    """The policy node (one of ``known``) of each layer, by index: the ONNX node in its metadata, or
    its name (the parser names a node's layers after it). The parser creates some layers with no
    metadata (weight Constants and their Shuffles, ``ONNXTRT_Broadcast`` shuffles, Gemm's bias/alpha/
    beta): those take the one policy node of the layers that feed them, else of the layers they feed
    (issue 11, bug 7), so a Gemm's bias add follows its MatMul and a weight Shuffle its consumer."""
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    nodes = [n if n in known else None for n in (layer_node(l.name, l.metadata) for l in layers)]
    producer, consumers = {}, {}
    for i, layer in enumerate(layers):
        producer.update((layer.get_output(k).name, i) for k in range(layer.num_outputs))
        for k in range(layer.num_inputs):
            if layer.get_input(k) is not None:
                consumers.setdefault(layer.get_input(k).name, []).append(i)
    bare = [i for i, layer in enumerate(layers) if nodes[i] is None and not metadata_nodes(layer.metadata)]
    changed = True
    while changed:
        changed = False
        for i in (i for i in bare if nodes[i] is None):
            ins = [layers[i].get_input(k) for k in range(layers[i].num_inputs)]
            up = {nodes[producer[t.name]] for t in ins if t is not None and t.name in producer} - {None}
            down = {nodes[j] for k in range(layers[i].num_outputs)
                    for j in consumers.get(layers[i].get_output(k).name, ())} - {None}
            pick = up if len(up) == 1 else down if len(down) == 1 else None
            if pick:
                nodes[i], changed = next(iter(pick)), True
    return nodes


def legacy_constraints(network, policy, calib, trt):
    """For the policy on a parsed original (weakly typed) network: ``{layer: compute dtype}``,
    ``{layer: output dtype}`` and ``{tensor: amax}`` for the inputs of INT8 layers. INT8 nodes run
    int8 in their Convolution/Deconvolution/MatrixMultiply layers, fp32 in their other layers, and
    output fp32 whatever the network default, as the compiled model of the strongly typed path does
    (its DequantizeLinear outputs float32; issue 11, bug 6), and as trtexec --layerOutputTypes in
    export.trtexec_legacy_command."""
    dtype = {"fp32": trt.float32, "fp16": trt.float16, "int8": trt.int8}  # policy precision -> TensorRT type
    int8_kinds = {getattr(trt.LayerType, n) for n in INT8_COMPUTE}
    skip = {getattr(trt.LayerType, n) for n in NO_PRECISION}
    amax = {t: calib.amax(t) for t in calib.ranges} if calib is not None else {}
    precisions, outputs, producers, int8_layers = {}, {}, {}, []
    for i, node in enumerate(policy_nodes(network, policy.layers)):
        layer = network.get_layer(i)
        outs = [layer.get_output(k) for k in range(layer.num_outputs)]
        producers.update((t.name, layer) for t in outs)
        prec = policy.layers.get(node)
        if prec is None or layer.type in skip or not all(t.dtype in (trt.float32, trt.float16) for t in outs):
            continue
        if prec == "int8" and layer.type not in int8_kinds:
            prec = "fp32"
        precisions[layer.name] = dtype[prec]
        outputs[layer.name] = dtype["fp32" if prec == "int8" else prec]
        if prec == "int8":
            int8_layers.append(layer)
    ranges, missing = {}, []
    for layer in int8_layers:
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            if t is not None:
                a = _source_amax(t, amax, producers, trt)
                if a is None:
                    missing.append(f"{layer.name}: input {k} ({t.name})")
                else:
                    ranges[t.name] = a
    if missing:
        raise MixprecError("some INT8 layers have inputs with no calibrated range, which TensorRT "
                           "<= 10.11 needs for implicit INT8", "set these layers to fp16/fp32, or use "
                           "TensorRT >= 10.12 (strongly typed, Q/DQ)", details=missing)
    return precisions, outputs, ranges


# The network post-process script the TensorRT <= 10.11 export ships (core/export.py): trtexec cannot
# put ranges on the tensors the ONNX parser creates (weight Constants, ONNXTRT_Broadcast shuffles of
# INT8 Gemm/MatMul), so the export builds with ``polygraphy convert --trt-network-postprocess-script``.
# It applies the same constraints as :func:`legacy_constraints`; tests/unit/backends check that they agree.
POSTPROCESS_SCRIPT = """\
\"\"\"mixprec policy {policy_sha} for {model_name}: TensorRT 10.0-10.11 network post-process script.

polygraphy convert MODEL.onnx --fp16 --precision-constraints obey \\\\
    --trt-network-postprocess-script THIS_FILE.py --trt-config-postprocess-script THIS_FILE.py -o model.plan
postprocess() sets each policy layer's precision and output type (INT8 nodes compute int8 in
their convolutions/matrix multiplies and output fp32, as the strongly typed build does), and the
dynamic range of every input of an INT8 layer: calibrated activations from AMAX, weights (the
parser's Constant layers, through Shuffles) from max |w|. postprocess_config()
enables INT8 without a calibrator (Polygraphy's --int8 would add one, calibrating on random data).\"\"\"
import re

import numpy as np
import tensorrt as trt

POLICY = {layers}
AMAX = {amax}
INT8_COMPUTE = {int8_compute!r}
NO_PRECISION = {no_precision!r}
ONNX_LAYER = re.compile({onnx_layer!r})


def _meta(layer):
    return [n.strip() for n in ONNX_LAYER.findall(layer.metadata or "") if n.strip()]


def _nodes(network):
    # the policy node of each layer; layers the parser made without metadata take the one node of
    # the layers that feed them, else of the layers they feed
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    nodes = [n if n in POLICY else None for n in ((_meta(l) or [l.name])[0] for l in layers)]
    producer, consumers = {{}}, {{}}
    for i, layer in enumerate(layers):
        producer.update((layer.get_output(k).name, i) for k in range(layer.num_outputs))
        for k in range(layer.num_inputs):
            if layer.get_input(k) is not None:
                consumers.setdefault(layer.get_input(k).name, []).append(i)
    bare = [i for i, layer in enumerate(layers) if nodes[i] is None and not _meta(layer)]
    changed = True
    while changed:
        changed = False
        for i in [i for i in bare if nodes[i] is None]:
            ins = [layers[i].get_input(k) for k in range(layers[i].num_inputs)]
            up = {{nodes[producer[t.name]] for t in ins if t is not None and t.name in producer}} - {{None}}
            down = {{nodes[j] for k in range(layers[i].num_outputs)
                    for j in consumers.get(layers[i].get_output(k).name, ())}} - {{None}}
            pick = up if len(up) == 1 else down if len(down) == 1 else None
            if pick:
                nodes[i], changed = next(iter(pick)), True
    return nodes


def _amax(tensor, producers):
    while tensor is not None and tensor.name not in AMAX:
        layer = producers.get(tensor.name)
        if layer is None or layer.type not in (trt.LayerType.SHUFFLE, trt.LayerType.CONSTANT):
            return None
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer
            return float(np.abs(np.asarray(layer.weights, dtype=np.float32)).max(initial=0.0))
        tensor = layer.get_input(0)
    return None if tensor is None else AMAX[tensor.name]


def postprocess(network):
    types = {{"fp32": trt.float32, "fp16": trt.float16, "int8": trt.int8}}
    int8_kinds = {{getattr(trt.LayerType, n) for n in INT8_COMPUTE}}
    skip = {{getattr(trt.LayerType, n) for n in NO_PRECISION}}
    producers, int8_layers, ranges, missing = {{}}, [], {{}}, []
    for i, node in enumerate(_nodes(network)):
        layer = network.get_layer(i)
        outs = [layer.get_output(k) for k in range(layer.num_outputs)]
        producers.update((t.name, layer) for t in outs)
        prec = POLICY.get(node)
        if prec is None or layer.type in skip or not all(t.dtype in (trt.float32, trt.float16) for t in outs):
            continue
        if prec == "int8" and layer.type not in int8_kinds:
            prec = "fp32"
        layer.precision = types[prec]
        for k in range(layer.num_outputs):
            layer.set_output_type(k, types["fp32" if prec == "int8" else prec])
        if prec == "int8":
            int8_layers.append(layer)
    for layer in int8_layers:
        for k in range(layer.num_inputs):
            t = layer.get_input(k)
            if t is not None:
                a = _amax(t, producers)
                if a is None:
                    missing.append(f"{{layer.name}}: input {{k}} ({{t.name}})")
                else:
                    ranges[t.name] = a
                    t.dynamic_range = (-a, a)
    if missing:
        raise RuntimeError("INT8 layers with inputs that have no range: " + ", ".join(missing))
    return network


def postprocess_config(builder, network, config):
    if "int8" in POLICY.values():
        config.set_flag(trt.BuilderFlag.INT8)
"""


def legacy_postprocess_script(policy, calib) -> str:
    """The Polygraphy network post-process script (``POSTPROCESS_SCRIPT``) for ``policy`` with the
    ranges of ``calib`` (None: a policy without INT8)."""
    amax = {t: calib.amax(t) for t in sorted(calib.ranges)} if calib is not None else {}
    def literal(d: dict) -> str:
        return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in d.items()) + "}"

    return POSTPROCESS_SCRIPT.format(
        # the name as a JSON string (quotes and line breaks escaped): a file name with '"""' and a newline would
        # otherwise end the docstring and write code into a script that polygraphy runs
        policy_sha=policy.sha256[:12], model_name=json.dumps(policy.model_name), layers=literal(dict(policy.layers)),
        amax=literal(amax), int8_compute=INT8_COMPUTE,
        no_precision=NO_PRECISION, onnx_layer=ONNX_LAYER.pattern)


def _apply_types_and_ranges(network, outputs: dict, ranges: dict):
    """A ``PostprocessNetwork`` step: output types of constrained layers, dynamic ranges of INT8 inputs."""
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for k in range(layer.num_outputs):
            if layer.name in outputs:
                layer.set_output_type(k, outputs[layer.name])
            t = layer.get_output(k)
            if t.name in ranges:
                t.dynamic_range = (-ranges[t.name], ranges[t.name])
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t.name in ranges:
            t.dynamic_range = (-ranges[t.name], ranges[t.name])
    return network


def constrained_network(trt, network, constraints):
    """The parsed network with the legacy ``constraints`` (:func:`legacy_constraints`) applied (None: as
    parsed), and the FP16/INT8 flags it needs."""
    from polygraphy.backend.trt import PostprocessNetwork, SetLayerPrecisions

    if constraints is None:
        return network, False, False
    precisions, outputs, ranges = constraints
    apply = functools.partial(_apply_types_and_ranges, outputs=outputs, ranges=ranges)
    network = PostprocessNetwork(SetLayerPrecisions(network, precisions), apply,
                                 name="mixprec output types and INT8 ranges")()
    used = set(precisions.values()) | set(outputs.values())
    return network, trt.float16 in used, trt.int8 in used
