"""Input shapes (core/model/shapes.py): batch axes from the dims' symbols, every dynamic dim settable,
defaults reported as such, and the shapes used for data, calibration, evaluation and the build.
Models are built in code and kept tiny."""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.cli.commands import main as cli_main
from core.errors import MixprecError
from core.export import trtexec_typed_command
from core.jobs.params import BuildParams, build_params
from core.measure.reference import eval_batch, timing_feed
from core.measure.runs import build_and_measure
from core.model.data import generate_dataset, load_npz
from core.model.load import load_model
from core.model.shapes import batch_axes, fixed_batch, parse_shape, resolve_input_shapes, shape_choices
from core.project import ProjectSource, open_project
from core.workspace import Workspace

F = TensorProto.FLOAT


def _save(tmp_path, name, nodes, inputs, outputs, inits=(), metadata=None):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _w(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _state_model(tmp_path, b="B", t="T"):
    """y = x @ W + sum(state, axis 0)[:, None, :]: x [B, T, 16], state [2, B, 16] (GRU-like)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="proj"),
             helper.make_node("ReduceSum", ["state", "axes0"], ["s"], name="sum_state", keepdims=0),
             helper.make_node("Unsqueeze", ["s", "axes1"], ["s1"], name="unsq"),
             helper.make_node("Add", ["xw", "s1"], ["y"], name="add_state")]
    inits = [_w("W", 16, 16), numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([1], np.int64), "axes1")]
    return _save(tmp_path, "state", nodes,
                 [helper.make_tensor_value_info("x", F, [b, t, 16]), helper.make_tensor_value_info("state", F, [2, b, 16])],
                 [helper.make_tensor_value_info("y", F, [b, t, 16])], inits)


def _cnn(tmp_path, name, shape, nhwc=False, metadata=None, resize=None):
    """A Conv classifier on an image input of ``shape`` (NCHW, or NHWC through a Transpose)."""
    nodes, src = [], "image"
    if nhwc:
        nodes.append(helper.make_node("Transpose", ["image"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2]))
        src = "nchw"
    inits = [_w("Wc", 4, 3, 3, 3), _w("Bc", 4, seed=1)]
    if resize:
        nodes.append(helper.make_node("Resize", [src, "", "", "sizes"], ["resized"], name="pre_resize"))
        inits.append(numpy_helper.from_array(np.array(resize, np.int64), "sizes"))
        src = "resized"
    nodes += [helper.make_node("Conv", [src, "Wc", "Bc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
              helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
              helper.make_node("Flatten", ["g"], ["logits"], name="flat")]
    return _save(tmp_path, name, nodes, [helper.make_tensor_value_info("image", F, shape)],
                 [helper.make_tensor_value_info("logits", F, [shape[0] if isinstance(shape[0], int) else None, 4])],
                 inits, metadata)


def _sample_rate_model(tmp_path):
    """audio [N, 32] float and sample_rate int64 scalar (feeds no embedding)."""
    nodes = [helper.make_node("Cast", ["sample_rate"], ["sr"], name="cast_sr", to=F),
             helper.make_node("Mul", ["audio", "sr"], ["scaled"], name="scale"),
             helper.make_node("MatMul", ["scaled", "Wa"], ["out"], name="proj")]
    return _save(tmp_path, "audio", nodes,
                 [helper.make_tensor_value_info("audio", F, ["N", 32]),
                  helper.make_tensor_value_info("sample_rate", TensorProto.INT64, [])],
                 [helper.make_tensor_value_info("out", F, ["N", 8])], [_w("Wa", 32, 8)])


@pytest.fixture
def fresh_ws(tmp_path):
    return Workspace(tmp_path / "ws")


def test_parse_shape():
    assert parse_shape("images=1x3x320x320") == ("images", (1, 3, 320, 320))
    assert parse_shape("a=b=2x3") == ("a=b", (2, 3))
    for bad in ("images", "images=1x3xHx4", "=1x2", "x=0x3"):
        with pytest.raises(MixprecError, match="bad --shape.*Fix: write --shape INPUT="):
            parse_shape(bad)


@pytest.mark.parametrize("b,t", [("B", "T"), ("s0", "s1")])
def test_state_batch_axis_is_the_shared_symbol(tmp_path, b, t):
    m = load_model(_state_model(tmp_path, b, t))
    assert batch_axes(m) == {"x": 0, "state": 1}
    shapes = resolve_input_shapes(m, overrides={t: 4}, batch=3)
    assert shapes == {"x": (3, 4, 16), "state": (2, 3, 16)}
    ds = generate_dataset(m, 8, shapes=shapes)
    assert ds.arrays["x"].shape == (8, 4, 16) and ds.arrays["state"].shape == (2, 8, 16) and ds.generated
    feeds = ds.batches(4)
    assert len(feeds) == 2 and feeds[1]["state"].shape == (2, 4, 16)
    assert np.array_equal(feeds[1]["state"], ds.arrays["state"][:, 4:8])
    assert ds.slice(2, 5).arrays["state"].shape == (2, 3, 16) and ds.slice(2, 5).num_samples == 3


def test_fixed_batch_1_with_a_named_sequence(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")]
    m = load_model(_save(tmp_path, "seq", nodes, [helper.make_tensor_value_info("x", F, [1, "seq", 16])],
                         [helper.make_tensor_value_info("y", F, [1, "seq", 16])], [_w("W", 16, 16)]))
    assert batch_axes(m) == {"x": 0} and fixed_batch(m) == 1
    assert resolve_input_shapes(m, overrides={"seq": 5}) == {"x": (1, 5, 16)}


def test_state_model_builds_with_its_npz(tmp_path, fresh_ws):
    path = _state_model(tmp_path)
    rng = np.random.default_rng(0)
    npz = tmp_path / "state.npz"
    np.savez(npz, x=rng.standard_normal((12, 4, 16)).astype(np.float32),
             state=rng.standard_normal((2, 12, 16)).astype(np.float32))  # samples along the state's axis 1
    p = open_project(path, data=npz, ws=fresh_ws)
    assert p.calib_data.num_samples == 9 and p.eval_data.num_samples == 3 and not p.data_generated
    assert p.input_shapes == {"x": (1, 4, 16), "state": (2, 1, 16)}
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, profile_iterations=1)
    assert run.precision_counts.get("int8") == 1 and run.quality.cosine_mean > 0.9
    np.savez(npz, x=np.zeros((12, 4, 16), np.float32), state=np.zeros((2, 10, 16), np.float32))
    with pytest.raises(MixprecError, match=r"different sample counts.*state=10 \(axis 1\).*samples along axis 1"):
        load_npz(npz, p.model)


def test_state_model_generated_data_calibrates(tmp_path, fresh_ws):
    p = open_project(_state_model(tmp_path), ws=fresh_ws, shape_overrides={"T": 4})
    assert p.data_generated and p.eval_data.arrays["state"].shape == (2, 16, 16)
    assert eval_batch(p) == 16 and timing_feed(p)["state"].shape == (2, 1, 16)
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, profile_iterations=1)
    assert run.quality.cosine_mean > 0.9 and run.input_shapes == {"x": [1, 4, 16], "state": [2, 1, 16]}


@pytest.mark.parametrize("batch_dim", [None, -1])
def test_unnamed_dims_are_settable(tmp_path, batch_dim):
    m = load_model(_cnn(tmp_path, "unnamed", [batch_dim, 3, None, None]))
    assert batch_axes(m) == {"image": 0}
    by_source = {c.axis: c for c in shape_choices(m)}
    assert (by_source[0].source, by_source[0].value, by_source[2].source, by_source[2].value) == ("batch", 1, "guessed", 224)
    assert by_source[2].symbol == "?"
    assert resolve_input_shapes(m, shapes={"image": (2, 3, 40, 48)}) == {"image": (2, 3, 40, 48)}
    with pytest.raises(MixprecError, match="axis 1 is fixed at 3, 4 given"):
        resolve_input_shapes(m, shapes={"image": (1, 4, 40, 40)})
    with pytest.raises(MixprecError, match="3 dims given, the input has 4"):
        resolve_input_shapes(m, shapes={"image": (1, 3, 40)})
    with pytest.raises(MixprecError, match="no input called.*Fix: give shapes for the model's inputs: image"):
        resolve_input_shapes(m, shapes={"images": (1, 3, 40, 40)})


def test_cli_shape_flag(tmp_path, fresh_ws, capsys, monkeypatch):
    monkeypatch.setenv("MIXPREC_WORKSPACE", str(fresh_ws.root))
    path = _cnn(tmp_path, "cli", [None, 3, None, None])
    assert cli_main(["inspect", str(path), "--shape", "image=1x3x40x48", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["input_shapes"] == {"image": [1, 3, 40, 48]} and doc["model"]["data_generated"]
    assert [c["source"] for c in doc["model"]["shape_choices"]] == ["given", "fixed", "given", "given"]
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "guessed: 224 — set it with --shape image=1x3x224x224" in out and "data: generated" in out
    assert cli_main(["inspect", str(path), "--shape", "image=1x3x40"]) == 2
    assert "3 dims given" in capsys.readouterr().err


def test_nhwc_image_defaults_to_224_reported_as_guessed(tmp_path):
    m = load_model(_cnn(tmp_path, "nhwc", ["N", "H", "W", 3], nhwc=True))
    assert batch_axes(m) == {"image": 0}
    choices = {c.axis: c for c in shape_choices(m)}
    assert [choices[a].value for a in range(4)] == [1, 224, 224, 3]
    assert choices[1].source == choices[2].source == "guessed"
    assert choices[1].note == "guessed: 224 — set it with --shape image=1x224x224x3"
    assert choices[0].source == "batch" and choices[3].source == "fixed"


def test_model_implied_image_size(tmp_path):
    meta = load_model(_cnn(tmp_path, "meta", [None, 3, None, None], metadata={"imgsz": "[96, 128]"}))
    c = {c.axis: c for c in shape_choices(meta)}
    assert (c[2].value, c[3].value, c[2].source) == (96, 128, "default")
    assert "metadata imgsz" in c[2].note and "set it with --shape image=1x3x96x128" in c[2].note
    rs = load_model(_cnn(tmp_path, "resize", [None, 3, None, None], resize=[1, 3, 64, 64]))
    assert resolve_input_shapes(rs)["image"] == (1, 3, 64, 64)


def test_fixed_batch_32_builds(tmp_path, fresh_ws):
    p = open_project(_cnn(tmp_path, "fixed32", [32, 3, 8, 8]), ws=fresh_ws)
    assert batch_axes(p.model) == {"image": 0} and fixed_batch(p.model) == 32
    assert p.calib_data.num_samples == 32 and p.eval_data.num_samples == 64 and p.batch == 32
    assert eval_batch(p) == 32 and [f["image"].shape for f in p.calib_data.batches(1)] == [(32, 3, 8, 8)]
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, profile_iterations=1)
    assert run.precision_counts.get("int8") == 1 and run.input_shapes == {"image": [32, 3, 8, 8]}
    npz = tmp_path / "few.npz"
    np.savez(npz, image=np.zeros((16, 3, 8, 8), np.float32))
    with pytest.raises(MixprecError, match="batch is fixed at 32"):
        load_npz(npz, p.model)
    with pytest.raises(MixprecError, match="--batch 4: the model fixes its batch at 32"):
        open_project(p.model.path, ws=fresh_ws, batch=4)


def test_integer_input_without_meaning_is_refused(tmp_path, fresh_ws):
    path = _sample_rate_model(tmp_path)
    m = load_model(path)
    assert batch_axes(m) == {"audio": 0, "sample_rate": None}
    msg = r"sample_rate \(int64, shape \[\]\) has no value mixprec can invent.*Fix: give an .npz with sample_rate"
    with pytest.raises(MixprecError, match=msg):
        generate_dataset(m, 4)
    p = open_project(path, ws=fresh_ws)  # opens for inspection; anything that needs samples says why
    assert p.layers is not None and p.data_problem is not None and re.search(msg, str(p.data_problem))
    with pytest.raises(MixprecError, match=msg):
        build_and_measure(p, p.default_policy(), backend="onnxruntime")
    npz = tmp_path / "audio.npz"
    np.savez(npz, audio=np.ones((8, 32), np.float32), sample_rate=np.array(16000, np.int64))
    p = open_project(path, data=npz, ws=fresh_ws)
    feeds = p.calib_data.batches(2)
    assert p.calib_data.num_samples == 6 and len(feeds) == 3 and feeds[0]["sample_rate"].shape == ()
    assert p.eval_data.arrays["sample_rate"] == 16000


def test_320_shape_used_everywhere(tmp_path, fresh_ws):
    path = _cnn(tmp_path, "det", [None, 3, None, None])
    p = open_project(path, ws=fresh_ws, shapes={"image": (1, 3, 320, 320)})
    assert p.input_shapes == {"image": (1, 3, 320, 320)}
    assert p.calib_data.arrays["image"].shape[1:] == p.eval_data.arrays["image"].shape[1:] == (3, 320, 320)
    assert {c.source for c in p.shape_choices if c.axis != 1} == {"given"}
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", iterations=2, profile_iterations=1)
    assert run.input_shapes == {"image": [1, 3, 320, 320]} and run.data_generated
    assert "--optShapes=image:1x3x320x320" in trtexec_typed_command(p.model, "m.onnx", p.input_shapes)
    npz = tmp_path / "small.npz"
    np.savez(npz, image=np.zeros((8, 3, 64, 64), np.float32))
    with pytest.raises(MixprecError, match="does not have the input shapes given.*axis 2 is 64"):
        open_project(path, data=npz, ws=fresh_ws, shapes={"image": (1, 3, 320, 320)})


def test_job_params_carry_shapes():
    params = build_params(ProjectSource("m.onnx", shapes={"image": (1, 3, 320, 320)}, dims={"seq": 128}, batch=2), "{}")
    json.dumps(params)
    p = BuildParams.from_params(params)
    assert params["shapes"] == {"image": [1, 3, 320, 320]}
    assert p.source.shapes == {"image": (1, 3, 320, 320)} and p.source.dims == {"seq": 128} and p.source.batch == 2
    assert p.policy == "{}" and BuildParams.from_params({"model": "m"}).source.shapes is None


def test_dev_and_held_out_halves_are_whole_fixed_batches():
    """96 samples of a model whose batch is fixed at 32 split into 32 + 64, never 48 + 48."""
    import numpy as np

    from core.model.data import Dataset
    from core.errors import MixprecError
    from core.sensitivity import split_eval

    ds = Dataset({"x": np.zeros((96, 3), np.float32)}, "t", fixed_batch=32)
    dev, held = split_eval(ds)
    assert (dev.num_samples, held.num_samples) == (32, 64)
    assert all(b["x"].shape[0] == 32 for b in dev.batches() + held.batches())
    with pytest.raises(MixprecError, match="fixed at 32"):
        split_eval(Dataset({"x": np.zeros((48, 3), np.float32)}, "t", fixed_batch=32))


def test_non_ascii_digits_are_a_clear_error():
    """'²'.isdigit() is True but int('²') raises: both shape flags refuse it cleanly."""
    from core.cli.source import parse_dims

    with pytest.raises(MixprecError, match="bad --shape"):
        parse_shape("x=1x²")
    with pytest.raises(MixprecError, match="bad --dim"):
        parse_dims(["seq=²"])
