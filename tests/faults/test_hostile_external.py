"""Issue 23 fault 4: external data that cannot be read as the model says — too short, pointing past its file's end,
hard-linked, a NUL in its location, an offset that is no count — and a model path no file can have end in one
MixprecError with its fix, whether the weights are read into the graph or stay external; from the CLI one
``error: … Fix: …`` line and exit 2, never a traceback. Tiny models built here, with an external-data initializer."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.load import load_model
from core.workspace import Workspace
from tests.faults.test_hostile import cli, refused  # noqa: F401 - the fixture

W = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)  # 16384 bytes: read by onnx (the inline path), not inlined small


def _model(folder: Path, case: str) -> Path:
    """x[1,64] · w[64,64] with ``w`` in ``w.bin`` beside the model, then made hostile as ``case`` says."""
    folder.mkdir(parents=True, exist_ok=True)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                          [numpy_helper.from_array(W, "w")])
    path = folder / "model.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path,
                    save_as_external_data=True, location="w.bin", size_threshold=0)
    m = onnx.load(path, load_external_data=False)
    t = m.graph.initializer[0]
    info = {e.key: e for e in t.external_data}

    def setting(key, value):
        (info[key] if key in info else t.external_data.add(key=key)).value = value

    if case == "too_short":  # a copy cut short: the file ends before the tensor's bytes do
        os.truncate(folder / "w.bin", 1000)
    elif case == "too_short_no_length":  # likewise, without a length: onnx would read to the end of the file
        os.truncate(folder / "w.bin", 1000)
        del t.external_data[[e.key for e in t.external_data].index("length")]
    elif case == "past_end":  # offset + length beyond the file
        setting("offset", "8192")
    elif case == "hard_link":  # onnx refuses a data file with several links
        os.link(folder / "w.bin", folder / "w-other-name.bin")
    elif case == "nul":
        setting("location", "w.bin\x00../../etc/passwd")
    elif case == "bad_offset":
        setting("offset", "-12")
    onnx.save_model(m, path)
    return path


CASES = {"too_short": "does not hold what the model says.*16384 bytes at offset 0 of w.bin, which has 1000",
         "too_short_no_length": "does not hold what the model says.*needs 16384 bytes, w.bin has 1000",
         "past_end": "does not hold what the model says.*16384 bytes at offset 8192 of w.bin, which has 16384",
         "hard_link": "several hard links.*w.bin: 2 links.*Fix: give each data file a copy of its own",
         "nul": r"cannot be read as they are.*w -> w.bin\\x00\.\./\.\./etc/passwd: a NUL character",
         "bad_offset": "cannot be read as they are.*is not a count of bytes"}


@pytest.mark.parametrize("kept_external", [False, True], ids=["read_into_graph", "kept_external"])
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_external_data_is_one_clear_error(tmp_path, monkeypatch, case, kept_external):
    if kept_external:  # the path of big models: weights stay in their files, checked by path
        monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = _model(tmp_path / "m", case)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(MixprecError, match=CASES[case]) as e:
        load_model(path, ws=ws)
    assert "Fix:" in str(e.value)
    assert not (ws.root / "external").exists() or not any((ws.root / "external").rglob("*.onnx"))  # nothing prepared


def test_the_same_model_with_sound_external_data_loads_both_ways(tmp_path, monkeypatch):
    ok = _model(tmp_path / "ok", "none")
    assert numpy_helper.to_array(load_model(ok, ws=Workspace(tmp_path / "ws")).proto.graph.initializer[0])[63, 63] == W[63, 63]
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    assert load_model(ok, ws=Workspace(tmp_path / "ws2")).external


@pytest.mark.parametrize("case", ["too_short", "past_end", "hard_link", "nul"])
def test_cli_hostile_external_data_exit_2_without_a_traceback(cli, tmp_path, case):  # noqa: F811
    path = _model(tmp_path / "m", case)
    refused(cli, "inspect", str(path), needles=(CASES[case].split(".*")[0].replace("\\", ""),))


@pytest.mark.parametrize("spec,needle", [("a" * 5000, "longer than a path can be"),
                                         ("/tmp/" + "a/" * 2500 + "x.onnx", "longer than a path can be"),
                                         ("/tmp/" + "b" * 300 + ".onnx", "cannot be looked up: File name too long")])
def test_cli_a_model_path_no_file_can_have(cli, spec, needle):  # noqa: F811
    last, _ = refused(cli, "inspect", spec, needles=(needle,))
    assert len(last) < 600  # the path is cut short in the message


def test_a_model_or_data_path_with_a_nul_is_a_clear_error(tmp_path):
    from core.project import open_project

    with pytest.raises(MixprecError, match="NUL character"):
        load_model("m\x00.onnx", ws=Workspace(tmp_path))
    with pytest.raises(MixprecError, match="calibration data file .* NUL character.*Fix: give the path of the "
                                           "calibration data file"):
        open_project("sample:tiny-cnn", data="/tmp/c\x00.npz", ws=Workspace(tmp_path))
