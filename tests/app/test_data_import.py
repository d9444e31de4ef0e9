"""Streamlit AppTest of the Model page's images form (ui/data_import.py, issue 22 §2): a server folder with a
recipe, previewed as the model sees it, then used as the project's calibration data (the .npz and its recipe
in the workspace); a folder without images is an error and the page stays usable."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from core.model.data_import import Recipe, import_images
from core.project import open_project
from tests.fixtures.apptest import ok, page, shown


def write_images(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (20 + i, 28, 3), dtype=np.uint8)).save(folder / f"p{i:02d}.png")
    (folder / "labels.csv").write_text("a,b\n")
    return folder


def _fill(at, folder: Path):
    at.text_input(key="img_path").input(str(folder))
    at.selectbox(key="img_resize").select("letterbox")
    at.slider(key="img_pad").set_value(114)
    at.selectbox(key="img_channels").select("BGR")
    at.text_input(key="img_mean").input("0.485, 0.456, 0.406")
    at.text_input(key="img_std").input("0.229, 0.224, 0.225")


def test_images_previewed_then_used_as_calibration_data(ws, tmp_path):
    folder = write_images(tmp_path / "user" / "photos", 8)
    at = ok(page("model"))
    _fill(at, folder)
    at.button(key="img_preview").click().run()
    ok(at)
    images = at.get("image")
    assert len(images) == 8  # one st.image per preview cell
    assert "1 file skipped, not images: labels.csv" in " ".join(shown(c) for c in at.caption)
    recipe = Recipe(resize="letterbox", pad=114, channels="BGR", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                    input="image")
    p = open_project("sample:tiny-cnn", ws=ws)
    want = import_images(folder, p.model, p.input_shapes, recipe)
    assert want.arrays["image"].shape == (8, 3, 32, 32)

    _fill(at, folder)
    at.button(key="img_use").click().run()
    ok(at)
    data = at.session_state["source"]["data"]
    assert data and Path(data).parent.parent == ws.root / "data" and Path(data).name == "photos.npz"
    with np.load(data) as z:
        np.testing.assert_array_equal(z["image"], want.arrays["image"])
    doc = json.loads(Path(data).with_name("photos.recipe.json").read_text())
    assert doc["recipe"]["resize"] == "letterbox" and doc["recipe"]["channels"] == "BGR" and doc["samples"] == 8
    assert any("8 images from photos" in shown(s) for s in at.success)
    samples = next(m for m in at.metric if m.label.startswith("Samples"))
    assert samples.value == "8 / 16"  # all 8 calibrate; the sample keeps its own evaluation data
    # the page shows the recipe kept beside the project's data, and fills the form from it
    assert at.selectbox(key="img_resize").value == "letterbox" and at.selectbox(key="img_channels").value == "BGR"


def test_a_folder_without_images_is_an_error_and_the_page_stays_usable(ws, tmp_path):
    empty = tmp_path / "user" / "empty"
    empty.mkdir(parents=True)
    (empty / "readme.txt").write_text("no images here")
    at = ok(page("model"))
    at.text_input(key="img_path").input(str(empty))
    at.button(key="img_use").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "none of them an image" in shown(at.error[0]) and "Fix:" in shown(at.error[0])
    assert at.session_state["source"]["data"] is None
    at.multiselect(key="inv_ops").select("Conv").run()
    ok(at)
    assert any(c.value.startswith("3 of 8 layers") for c in at.caption)


def test_text_lines_and_wav_files_made_into_calibration_data_on_the_model_page(ws, tmp_path):
    """A token-id model gets a text-lines form (its bundled tokenizer), an audio model a WAV-folder form; each
    writes the .npz into the workspace and makes it the calibration data."""
    import wave

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    lines = tmp_path / "user" / "lines.txt"
    lines.parent.mkdir(parents=True)
    lines.write_text("\n".join(f"sentence number {i} about quantization" for i in range(30)) + "\n\n")
    at = ok(page("model", model="sample:minilm"))
    at.text_input(key="text_path").input(str(lines))
    at.button(key="text_use").click().run()
    ok(at)
    data = at.session_state["source"]["data"]
    assert data and Path(data).is_file() and Path(data).is_relative_to(ws.root)
    with np.load(data) as z:
        assert z["input_ids"].shape[0] == 30 and z["input_ids"][0, 0] == 101  # [CLS] of the MiniLM vocabulary
    assert next(m for m in at.metric if m.label == "Samples (calib / eval)").value.startswith("30 / ")

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1600, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["audio", "w"], ["y"])], "kws",
                          [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1600])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    model = tmp_path / "kws.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    wavs = tmp_path / "user" / "wavs"
    wavs.mkdir()
    for i in range(5):
        with wave.open(str(wavs / f"c{i}.wav"), "wb") as f:
            f.setnchannels(1), f.setsampwidth(2), f.setframerate(8000)
            f.writeframes((np.sin(np.arange(800) * (i + 1) / 10) * 20000).astype("<i2").tobytes())
    at = ok(page("model", model=str(model)))
    at.text_input(key="audio_path").input(str(wavs))
    at.number_input(key="audio_rate").set_value(16000)
    at.button(key="audio_use").click().run()
    ok(at)
    with np.load(at.session_state["source"]["data"]) as z:
        assert z["audio"].shape == (5, 1600)  # 800 samples at 8 kHz: 1600 at 16 kHz, the input's length
        assert abs(float(z["audio"][0, 2]) - 20000 / 32768 * np.sin(0.1)) < 0.02
