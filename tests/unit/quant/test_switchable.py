"""The switchable model (``compile_policy(..., switchable=True)``, the sensitivity trials' model): a
weight's switch is an ``If`` whose off branch casts a float16 copy of the weight to float32. Its
numbers are those of the former graph (``Where(flag, DQ(int8 w), float32 copy of fp16(w))``, format 2)
bit for bit, and it stores no float32 copy of a switched weight."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from core.quant.calibration import calibrate_policy
from core.quant.compile import QUANT_INPUTS, compile_policy
from core.sensitivity.distributed import TRIAL_DISABLED_OPTIMIZERS, trial_options, trial_session


def _compiled(p, smooth: bool = False):
    pol = p.default_policy().with_layers({l.name: "int8" for l in p.layers if l.eligible})
    if smooth:  # SmoothQuant scaling on every INT8 MatMul with a constant weight (the search's smoothed variant)
        inits = p.model.initializer_names()
        pol = pol.with_smoothing({l.name: 0.5 for l in p.layers if l.eligible and l.op_type == "MatMul"
                                  and len(l.inputs) > 1 and l.inputs[1] in inits})
        assert pol.smoothing
    calib = calibrate_policy(p.model, p.calib_data, pol, p.layers, p.ws)
    return (compile_policy(p.model, pol, calib, target="ort", switchable=True),
            compile_policy(p.model, pol, calib, target="ort"))


def _switched_weights(p) -> dict[str, np.ndarray]:
    """The float weights of the INT8-eligible layers (what their switches hold), by name."""
    inits = {t.name: t for t in p.model.proto.graph.initializer}
    nodes = {n.name: n for n in p.model.proto.graph.node}
    out = {}
    for layer in (l for l in p.layers if l.eligible):
        for i in QUANT_INPUTS:
            name = nodes[layer.name].input[i] if i < len(nodes[layer.name].input) else ""
            if name in inits and inits[name].data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
                out[name] = numpy_helper.to_array(inits[name])
    return out


def _bytes_by_dtype(proto: onnx.ModelProto) -> Counter:
    """Initializer bytes per element type, over the main graph and every subgraph."""
    by = Counter()

    def walk(g):
        for t in g.initializer:
            by[onnx.TensorProto.DataType.Name(t.data_type)] += numpy_helper.to_array(t).nbytes
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(proto.graph)
    return by


def _switch_uses(proto: onnx.ModelProto) -> dict[str, tuple[str, int]]:
    """Each weight switch's output -> (the layer that reads it, which input)."""
    ifs = {n.output[0] for n in proto.graph.node if n.op_type == "If"}
    uses = {o: (c.name, list(c.input).index(o)) for c in proto.graph.node for o in ifs & set(c.input)}
    assert set(uses) == ifs and ifs
    return uses


def _where_graph(proto: onnx.ModelProto, p) -> onnx.ModelProto:
    """The former switchable graph (format 2), from this one and the original model: each weight's
    ``If`` as ``Where(flag, DQ(int8 w), float32 copy of the original weight rounded to float16)``."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    g = m.graph
    uses, weights = _switch_uses(proto), _switched_weights(p)
    original = {n.name: n for n in p.model.proto.graph.node}
    nodes = []
    for n in g.node:
        if n.op_type != "If":
            nodes.append(n)
            continue
        layer, i = uses[n.output[0]]
        w = weights[original[layer].input[i]]
        r16 = numpy_helper.from_array(w.astype(np.float16).astype(np.float32), f"{n.name}/r16")
        g.initializer.append(r16)
        (dq,) = next(a.g for a in n.attribute if a.name == "then_branch").node
        nodes += [dq, helper.make_node("Where", [n.input[0], dq.output[0], r16.name], list(n.output), name=n.name)]
    del g.node[:]
    g.node.extend(nodes)
    return m


def _run(sess, feed, flags, names=None):
    return sess.run(names, {**feed, **flags})


def _flag_sets(switches: list[str]) -> list[set[str]]:
    """All off, all on, and each switch on alone (the isolated trials)."""
    return [set(), set(switches)] + [{s} for s in switches]


@pytest.mark.parametrize("name,smooth", [("tiny_transformer", False), ("tiny_transformer", True), ("tiny_cnn", False)])
def test_switchable_outputs_are_the_former_graphs_bit_for_bit(name, smooth, request):
    """Every isolated trial (and all off / all on) gives the former Where graph's outputs exactly, in
    the trial session (no ConstantFolding) as in a default ONNX Runtime session."""
    import onnxruntime as ort

    p = request.getfixturevalue(name)
    sw, _ = _compiled(p, smooth)
    assert sw.op_counts.get("If", 0) == len(_switched_weights(p)) > 0
    new, old = sw.proto.SerializeToString(), _where_graph(sw.proto, p).SerializeToString()
    pairs = [(trial_session(new, 1), trial_session(old, 1)),
             (ort.InferenceSession(new, providers=["CPUExecutionProvider"]),
              ort.InferenceSession(old, providers=["CPUExecutionProvider"]))]
    feed = p.eval_data.batches(2)[0]
    switches = list(sw.switch_inputs.values())
    for on in _flag_sets(switches):
        flags = {s: np.array(s in on) for s in switches}
        for a, b in pairs:
            x, y = _run(a, feed, flags), _run(b, feed, flags)
            assert [v.tobytes() for v in x] == [v.tobytes() for v in y], f"switches on: {sorted(on)}"


@pytest.mark.parametrize("name", ["tiny_transformer", "tiny_cnn"])
def test_weight_switch_is_fp16_rounding_off_and_int8_build_on(name, request):
    """Off, a switched weight is exactly the float16 rounding of the original weight (the FP16
    fallback's weight); on, exactly what the non-switchable INT8 compile dequantizes."""
    p = request.getfixturevalue(name)
    sw, plain = _compiled(p)
    weights = _switched_weights(p)
    original = {n.name: n for n in p.model.proto.graph.node}
    uses = _switch_uses(sw.proto)
    ifs = set(uses)
    int8_nodes = {n.name: n for n in plain.proto.graph.node}
    dq = {o: int8_nodes[layer].input[i] for o, (layer, i) in uses.items()}  # the INT8 compile's DQ output there
    names = sorted(ifs)
    sess = trial_session(_with_outputs(sw.proto, names).SerializeToString(), 1)
    ref = trial_session(_with_outputs(plain.proto, [dq[o] for o in names]).SerializeToString(), 1)
    feed = p.eval_data.batches(1)[0]
    switches = list(sw.switch_inputs.values())
    off = dict(zip(names, _run(sess, feed, {s: np.array(False) for s in switches}, names)))
    on = dict(zip(names, _run(sess, feed, {s: np.array(True) for s in switches}, names)))
    int8 = dict(zip(names, ref.run([dq[o] for o in names], feed)))
    for o, (layer, i) in uses.items():
        w = weights[original[layer].input[i]]
        assert off[o].dtype == np.float32 and off[o].shape == w.shape
        assert off[o].tobytes() == w.astype(np.float16).astype(np.float32).tobytes(), f"{layer}: off is not fp16(w)"
        assert on[o].tobytes() == int8[o].tobytes(), f"{layer}: on differs from the INT8 compile's weight"
        assert not np.array_equal(on[o], off[o])


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    m.graph.output.extend(helper.make_empty_tensor_value_info(v) for v in names)
    return m


@pytest.mark.parametrize("name", ["tiny_transformer", "tiny_cnn"])
def test_switchable_model_stores_no_float32_copy_of_a_switched_weight(name, request):
    """By element type, the switchable model's initializers are the INT8 compile's plus one float16
    copy of each switched weight (2 bytes a value): no float32 bytes added (the former graph added a
    float32 copy of every switched weight, 4 bytes a value)."""
    p = request.getfixturevalue(name)
    sw, plain = _compiled(p)
    weights = _switched_weights(p)
    n_values = sum(w.size for w in weights.values())
    have, base = _bytes_by_dtype(sw.proto), _bytes_by_dtype(plain.proto)
    assert have["FLOAT"] == base["FLOAT"]
    assert have["INT8"] == base["INT8"]
    assert have["FLOAT16"] == base["FLOAT16"] + 2 * n_values
    assert _bytes_by_dtype(_where_graph(sw.proto, p))["FLOAT"] == base["FLOAT"] + 4 * n_values  # the former graph


def _optimized(tmp_path, proto, disabled) -> onnx.ModelProto:
    """The graph ONNX Runtime runs: the trial session's options, optimized model saved."""
    import onnxruntime as ort

    so = trial_options(1)
    so.optimized_model_filepath = str(tmp_path / f"optimized-{len(disabled)}.onnx")
    ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled)
    return onnx.load(so.optimized_model_filepath)


def test_trial_session_keeps_the_float16_copies(tiny_transformer, tmp_path):
    """In the trial session (TRIAL_DISABLED_OPTIMIZERS) ONNX Runtime keeps each weight's float16
    copy and its Cast: no float32 initializer is added. With ConstantFolding on, it would fold
    each Cast into a float32 weight (what the trial session avoids)."""
    sw, _ = _compiled(tiny_transformer)
    n_values = sum(w.size for w in _switched_weights(tiny_transformer).values())
    given = _bytes_by_dtype(sw.proto)
    kept = _bytes_by_dtype(_optimized(tmp_path, sw.proto, TRIAL_DISABLED_OPTIMIZERS))
    assert kept["FLOAT"] <= given["FLOAT"] and kept["FLOAT16"] == given["FLOAT16"] >= 2 * n_values
    folded = _bytes_by_dtype(_optimized(tmp_path, sw.proto, []))
    assert folded["FLOAT"] == kept["FLOAT"] + 4 * n_values and folded["FLOAT16"] == kept["FLOAT16"] - 2 * n_values


def test_trial_workers_map_the_reference_outputs_from_one_file(tmp_path):
    """Issue 21 §2: every trial worker held its own copy of the FP32 reference outputs (hundreds of MB for a
    151,936-wide vocabulary); they are now .npy files the workers map, one copy in the page cache for all."""
    from core.sensitivity.isolated import TrialData, _load_trial_data, _save_trial_data

    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(size=(2, 3)).astype(np.float32)} for _ in range(3)]
    ref = [rng.normal(size=(2, 4, 50)).astype(np.float32) for _ in range(3)]
    labels = rng.integers(0, 50, (6, 4))
    path = tmp_path / "trial-data.npz"
    _save_trial_data(path, TrialData(batches, ref, "logits", labels))
    back = _load_trial_data(str(path), "logits")
    assert all(isinstance(r, np.memmap) for r in back.ref) and len(back.ref) == 3
    assert all(np.array_equal(a, b) for a, b in zip(back.ref, ref))
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(back.batches, batches))
    assert np.array_equal(back.labels, labels) and back.out_name == "logits"
