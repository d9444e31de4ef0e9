"""Dynamic-shape profiles (core/model/profiles.py, issue 22 §4): ``--profile INPUT=MIN:OPT:MAX`` parsed and
checked against the model, the project opened at each profile's opt, the exported trtexec and Polygraphy
commands and the TensorRT backend's profile carrying min, opt and max. Models are built in code and tiny."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.backends.tensorrt import profile_shapes, project_trt_options
from core.backends.tensorrt.profiles import trt_profile
from core.errors import MixprecError
from core.export import bundle_readme, polygraphy_command, trtexec_profile_command, trtexec_typed_command
from core.jobs.params import BuildParams, build_params
from core.model.load import load_model
from core.model.profiles import (check_profiles, input_ranges, parse_profile, profile_from_text, range_text,
                                 shapes_with_profiles)
from core.project import ProjectSource, open_project
from core.workspace import Workspace

I64, F = TensorProto.INT64, TensorProto.FLOAT
PROFILE = {"input_ids": ((1, 16), (4, 128), (8, 512))}


def _text_model(tmp_path):
    """ids [batch, seq] int64 and mask [batch, seq] int64 → an embedding times the mask: out [batch, seq, 8]."""
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
             helper.make_node("Cast", ["attention_mask"], ["m"], name="cast_mask", to=F),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m3"], name="unsq"),
             helper.make_node("Mul", ["emb", "m3"], ["out"], name="masked")]
    inits = [numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32), "E"),
             numpy_helper.from_array(np.array([2], np.int64), "axes")]
    graph = helper.make_graph(nodes, "text", [helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"]),
                                              helper.make_tensor_value_info("attention_mask", I64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("out", F, ["batch", "seq", 8])], initializer=inits)
    path = tmp_path / "text.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _image_model(tmp_path):
    """image [N, 3, H, W] → Conv → GlobalAveragePool → Flatten."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["image", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["logits"], name="flat")]
    graph = helper.make_graph(nodes, "img", [helper.make_tensor_value_info("image", F, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("logits", F, ["N", 4])], initializer=[w])
    path = tmp_path / "img.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture
def fresh_ws(tmp_path):
    return Workspace(tmp_path / "ws")


@pytest.fixture
def text_model(tmp_path, fresh_ws):
    return load_model(_text_model(tmp_path), fresh_ws)


def test_parse_profile():
    assert parse_profile("input_ids=1x16:4x128:8x512") == ("input_ids", ((1, 16), (4, 128), (8, 512)))
    assert parse_profile("a=b=1x2:1x2:1x3") == ("a=b", ((1, 2), (1, 2), (1, 3)))  # the name ends at the last '='
    assert range_text(((1, 16), (4, 128), (8, 512))) == "1x16:4x128:8x512"
    for bad in ("input_ids=1x16:4x128", "input_ids=1x16:4x128:8x512:9x9", "=1x2:1x2:1x2", "input_ids",
                "input_ids=1x0:1x2:1x3", "input_ids=1xa:1x2:1x3", "input_ids=1x16:4x-1:8x512"):
        with pytest.raises(MixprecError, match="bad --profile") as e:
            parse_profile(bad)
        assert "INPUT=MIN:OPT:MAX" in e.value.fix


@pytest.mark.parametrize("profiles, text", [
    ({"ids": PROFILE["input_ids"]}, "names ids, which the model has no input called"),
    ({"input_ids": ((1, 16, 1), (4, 128), (8, 512))}, "min, opt and max have 3, 2 and 2 dims; the input has 2"),
    ({"input_ids": ((1, 16), (4, 8), (8, 512))}, "axis 1 is 16:8:512, not min <= opt <= max"),
    ({"input_ids": ((1, 16), (4, 128), (2, 512))}, "axis 0 is 1:4:2, not min <= opt <= max"),
    ({"input_ids": PROFILE["input_ids"], "attention_mask": ((1, 16), (4, 128), (8, 256))},
     "the dim seq is 16:128:512 in input_ids axis 1 but 16:128:256 in attention_mask axis 1"),
])
def test_check_profiles_refuses(text_model, profiles, text):
    with pytest.raises(MixprecError) as e:
        check_profiles(text_model, profiles)
    assert text in str(e.value) and e.value.fix
    if "no input called" in text:
        assert "input_ids, attention_mask" in e.value.fix  # the error lists the inputs


def test_check_profiles_refuses_a_fixed_dim_that_varies(tmp_path, fresh_ws):
    m = load_model(_image_model(tmp_path), fresh_ws)
    with pytest.raises(MixprecError) as e:
        check_profiles(m, {"image": ((1, 3, 224, 224), (4, 3, 224, 224), (8, 1, 224, 224))})
    assert "image: axis 1 is fixed at 3 by the model, 3:3:1 given" in str(e.value)
    ok = {"image": ((1, 3, 224, 224), (4, 3, 320, 320), (8, 3, 640, 640))}
    assert check_profiles(m, ok) == ok


def test_shape_and_profile_must_agree():
    assert shapes_with_profiles({"attention_mask": (4, 128)}, PROFILE) == \
        {"attention_mask": (4, 128), "input_ids": (4, 128)}
    assert shapes_with_profiles({"input_ids": (4, 128)}, PROFILE) == {"input_ids": (4, 128)}
    assert shapes_with_profiles(None, {}) is None
    with pytest.raises(MixprecError, match="two different shapes") as e:
        shapes_with_profiles({"input_ids": (1, 64)}, PROFILE)
    assert "input_ids: --shape 1x64, --profile opt 4x128" in str(e.value) and "profile's opt" in e.value.fix


def test_a_project_opened_with_a_profile_runs_at_opt(tmp_path, fresh_ws):
    path = _text_model(tmp_path)
    p = open_project(path, ws=fresh_ws, profiles=PROFILE)
    assert p.input_shapes == {"input_ids": (4, 128), "attention_mask": (4, 128)}  # the mask follows seq and batch
    assert p.batch == 4 and p.profiles == PROFILE
    assert p.calib_data.arrays["input_ids"].shape[1:] == (128,) and p.eval_data.arrays["attention_mask"].shape[1] == 128
    plain = open_project(path, ws=fresh_ws)
    assert plain.profiles == {} and plain.input_shapes == {"input_ids": (1, 64), "attention_mask": (1, 64)}
    with pytest.raises(MixprecError, match="two different shapes"):
        open_project(path, ws=fresh_ws, shapes={"input_ids": (4, 64)}, profiles=PROFILE)
    with pytest.raises(MixprecError, match="the dim seq is given two values"):  # --dim against the profile's opt
        open_project(path, ws=fresh_ws, shape_overrides={"seq": 64}, profiles=PROFILE)
    src = ProjectSource(str(path), profiles=PROFILE)
    assert src.open(fresh_ws).input_shapes["input_ids"] == (4, 128)


def test_project_source_and_job_params_round_trip_profiles():
    src = ProjectSource("m.onnx", shapes={"x": (1, 3)}, profiles={"input_ids": [[1, 16], [4, 128], [8, 512]]})
    assert src.profiles == PROFILE
    doc = json.loads(json.dumps(src.to_json()))
    assert doc["profiles"] == {"input_ids": [[1, 16], [4, 128], [8, 512]]}
    assert ProjectSource.from_json(doc) == src and hash(ProjectSource.from_json(doc)) == hash(src)
    assert ProjectSource.from_json({"model": "m.onnx"}).profiles is None
    assert BuildParams.from_params(build_params(src, "{}")).source.profiles == PROFILE
    with pytest.raises(ValueError, match=r"\[min, opt, max\]"):
        ProjectSource("m.onnx", profiles={"x": [[1], [2]]})


def test_ranges_of_unprofiled_inputs(text_model):
    shapes = {"input_ids": (4, 128), "attention_mask": (4, 128)}
    assert input_ranges(text_model, shapes) == {n: (s, s, s) for n, s in shapes.items()}  # today's min = opt = max
    got = input_ranges(text_model, shapes, PROFILE)
    assert got == {"input_ids": PROFILE["input_ids"], "attention_mask": ((1, 16), (4, 128), (8, 512))}


def test_exported_commands_carry_min_opt_max(text_model):
    shapes = {"input_ids": (4, 128), "attention_mask": (4, 128)}
    typed = trtexec_typed_command(text_model, "m.onnx", shapes, profiles=PROFILE).split()
    assert "--minShapes=input_ids:1x16,attention_mask:1x16" in typed
    assert "--optShapes=input_ids:4x128,attention_mask:4x128" in typed
    assert "--maxShapes=input_ids:8x512,attention_mask:8x512" in typed
    poly = polygraphy_command(text_model, "m.onnx", shapes, profiles=PROFILE).splitlines()[1].split()
    i = poly.index("--trt-min-shapes")
    assert poly[i:i + 9] == ["--trt-min-shapes", "'input_ids:[1,16]'", "'attention_mask:[1,16]'",
                             "--trt-opt-shapes", "'input_ids:[4,128]'", "'attention_mask:[4,128]'",
                             "--trt-max-shapes", "'input_ids:[8,512]'", "'attention_mask:[8,512]'"]
    # a built engine runs at opt
    assert "--shapes=input_ids:4x128,attention_mask:4x128" in trtexec_profile_command(text_model, "e.plan", shapes,
                                                                                      ).split()
    plain = trtexec_typed_command(text_model, "m.onnx", shapes).split()
    assert "--minShapes=input_ids:4x128,attention_mask:4x128" in plain  # no profile: min = opt = max


def test_bundle_readme_states_the_profile(tmp_path, fresh_ws):
    p = open_project(_text_model(tmp_path), ws=fresh_ws, profiles=PROFILE)
    policy = p.default_policy()
    readme = bundle_readme(p, policy, {}, [])
    assert "Optimisation profile of the engine" in readme
    assert "`input_ids=1x16:4x128:8x512`, `attention_mask=1x16:4x128:8x512`" in readme  # code spans: no escapes
    plain = open_project(_text_model(tmp_path), ws=fresh_ws)
    assert "min = opt = max" in bundle_readme(plain, plain.default_policy(), {}, [])


def test_the_tensorrt_profile_gets_min_opt_max(tmp_path, fresh_ws):
    """The backend's options carry the project's profile (its batch axis reaching EVAL_BATCH), which
    profile_shapes keeps and Polygraphy's Profile receives as min, opt and max."""
    p = open_project(_text_model(tmp_path), ws=fresh_ws, profiles=PROFILE)
    opts = project_trt_options(p, {"workspace_bytes": 1 << 30})
    assert opts["workspace_bytes"] == 1 << 30
    assert opts["profiles"]["input_ids"] == ((1, 16), (4, 128), (16, 512))  # batch max 8 → 16 (EVAL_BATCH)
    assert opts["profiles"]["attention_mask"] == ((1, 16), (4, 128), (16, 512))
    mine = project_trt_options(p, {"profiles": {"input_ids": ((1, 128), (4, 128), (4, 128))}})
    assert mine["profiles"]["input_ids"] == ((1, 128), (4, 128), (4, 128))  # --trt-profile wins for its input
    assert project_trt_options(open_project(_text_model(tmp_path), ws=fresh_ws), {"mode": "auto"}) == {"mode": "auto"}
    shapes = profile_shapes(p.input_shapes, opts["profiles"], {"input_ids": 0, "attention_mask": 0})
    profile = trt_profile(shapes)  # Polygraphy's own Profile (it imports without TensorRT)
    assert [(n, s.min, s.opt, s.max) for n, s in profile.items()] == \
        [("input_ids", (1, 16), (4, 128), (16, 512)), ("attention_mask", (1, 16), (4, 128), (16, 512))]


def test_profile_from_text():
    assert profile_from_text("ids", (4, 128), "1x16", "8x512") == PROFILE["input_ids"]
    assert profile_from_text("ids", [4, 128], "", " 8x512 ") == ((4, 128), (4, 128), (8, 512))
    assert profile_from_text("ids", (4, 128), "", None) is None
    with pytest.raises(MixprecError, match="the max shape of ids, '8 by 512', is not a shape") as e:
        profile_from_text("ids", (4, 128), "1x16", "8 by 512")
    assert "4x128" in e.value.fix
