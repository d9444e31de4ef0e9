"""Data from what users have (issue 22 §2, core.model.data_import): image folders and zips by a recipe,
checked against a preprocessing written here with Pillow and numpy; text lines by a tokenizer, checked against
the tokenizer's own encoding; WAV files resampled, checked against the sampled signal; and the inputs that end
in one MixprecError."""
from __future__ import annotations

import io
import json
import os
import wave
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from core.errors import MixprecError
from core.model.data import load_npz
from core.model.data_import import (Recipe, import_audio, import_images, import_text, parse_recipe, preview,
                                    read_wav, save_in_workspace, saved_recipe, write_npz)
from core.model.load import load_model
from core.model.shapes import resolve_input_shapes
from core.workspace import Workspace
from tests.fixtures.models import dynamic_cnn

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --- models and files written here ---------------------------------------------------------------
def _save(path: Path, inputs, nodes, inits=(), out_shape=()) -> Path:
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, list(out_shape))
    graph = helper.make_graph(nodes, path.stem, inputs, [out], list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def nhwc_model(path: Path) -> Path:
    """``pixels`` [N, H, W, 3] (NHWC) → mean over H, W."""
    return _save(path, [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", "H", "W", 3])],
                 [helper.make_node("ReduceMean", ["pixels"], ["out"], axes=[1, 2], keepdims=0)], (), ["N", 3])


def token_model(path: Path, vocab: int, names=("input_ids", "attention_mask")) -> Path:
    """Token ids [batch, seq] (int64) through an embedding, times the mask."""
    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((vocab, 4)).astype(np.float32), "emb")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in names]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "ax"], ["m3"]),
             helper.make_node("Mul", ["e", "m3"], ["out"])]
    return _save(path, inputs, nodes, [emb, numpy_helper.from_array(np.array([2], np.int64), "ax")],
                 ["batch", "seq", 4])


def audio_model(path: Path, samples: int, channel_axis: bool = False) -> Path:
    shape = ["batch", 1, samples] if channel_axis else ["batch", samples]
    return _save(path, [helper.make_tensor_value_info("audio", TensorProto.FLOAT, shape)],
                 [helper.make_node("ReduceMean", ["audio"], ["out"], keepdims=0)])


def write_images(folder: Path, n: int = 4) -> list[Path]:
    """``n`` small real images of different sizes (PNG, one RGBA, one grayscale, one JPEG) and a non-image."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    paths = []
    for i in range(n):
        h, w = 17 + 6 * i, 30 - 3 * i
        if i == 1:
            im = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")
        elif i == 2:
            im = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L")
        else:
            im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        p = folder / (f"img{i:02d}.jpg" if i == 3 else f"img{i:02d}.png")
        im.save(p, quality=95) if p.suffix == ".jpg" else im.save(p)
        paths.append(p)
    (folder / "notes.txt").write_text("not an image")
    return sorted(paths)


# --- the reference preprocessing, written out here -------------------------------------------------
def reference(path: Path, h: int, w: int, resize: str, pad: float, bgr: bool, scale: float, mean, std,
              layout: str) -> np.ndarray:
    im = Image.open(path).convert("RGB")
    if resize == "stretch":
        im = im.resize((w, h), Image.BILINEAR)
    else:  # letterbox: the whole image inside h x w, centred, the rest at `pad`
        r = min(w / im.width, h / im.height)
        nw, nh = round(im.width * r), round(im.height * r)
        canvas = Image.new("RGB", (w, h), (int(pad),) * 3)
        canvas.paste(im.resize((nw, nh), Image.BILINEAR), ((w - nw) // 2, (h - nh) // 2))
        im = canvas
    x = np.asarray(im).astype(np.float32)
    if bgr:
        x = x[..., [2, 1, 0]]
    x = (x * np.float32(scale) - np.float32(mean)) / np.float32(std)
    return x.transpose(2, 0, 1) if layout == "NCHW" else x


@pytest.fixture
def cnn(tmp_path):
    ws = Workspace(tmp_path / "ws")
    return load_model(str(dynamic_cnn(tmp_path / "cnn.onnx")), ws), ws


def test_letterbox_bgr_mean_std_nchw_matches_the_reference(tmp_path, cnn):
    model, ws = cnn
    files = write_images(tmp_path / "imgs")
    shapes = resolve_input_shapes(model, shapes={"images": (1, 3, 24, 32)})
    recipe = Recipe(resize="letterbox", pad=114, channels="BGR", mean=MEAN, std=STD, layout="NCHW")
    imp = import_images(tmp_path / "imgs", model, shapes, recipe)
    want = np.stack([reference(p, 24, 32, "letterbox", 114, True, 1 / 255, MEAN, STD, "NCHW") for p in files])
    got = imp.arrays["images"]
    assert got.shape == (4, 3, 24, 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert imp.sources == [p.name for p in files]  # sorted, the text file left out
    assert any("1 file skipped" in n and "notes.txt" in n for n in imp.notes)
    # the border really is the pad value, normalised: (114/255 - mean) / std in every channel
    border = (114 / 255 - np.array(MEAN)) / np.array(STD)
    np.testing.assert_allclose(got[0, :, 0, 0], border, atol=1e-6)  # mean and std in the input's channel order

    out = write_npz(imp, tmp_path / "calib.npz", model)
    ds = load_npz(out.path, model)
    np.testing.assert_array_equal(ds.arrays["images"], want.astype(np.float32))
    assert out.num_samples == 4 and out.shapes == {"images": (4, 3, 24, 32)}
    assert saved_recipe(out.path) == recipe and json.loads(out.recipe_path.read_text())["kind"] == "images"


def test_stretch_nhwc_and_the_preview_undoes_it(tmp_path):
    ws = Workspace(tmp_path / "ws")
    model = load_model(str(nhwc_model(tmp_path / "nhwc.onnx")), ws)
    files = write_images(tmp_path / "imgs", 3)
    shapes = resolve_input_shapes(model, shapes={"pixels": (1, 20, 16, 3)})
    recipe = parse_recipe("resize=stretch,channels=RGB,scale=1/255,mean=0.5,std=0.25")
    imp = import_images(tmp_path / "imgs", model, shapes, recipe)
    assert imp.layout == "NHWC"
    want = np.stack([reference(p, 20, 16, "stretch", 0, False, 1 / 255, (0.5,) * 3, (0.25,) * 3, "NHWC") for p in files])
    np.testing.assert_allclose(imp.arrays["pixels"], want, atol=1e-6)
    shown = preview(imp, 2)
    assert len(shown) == 2 and shown[0].dtype == np.uint8 and shown[0].shape == (20, 16, 3)
    plain = np.asarray(Image.open(files[0]).convert("RGB").resize((16, 20), Image.BILINEAR))
    np.testing.assert_array_equal(shown[0], plain)  # the pixels the model sees, the normalisation undone


def test_center_crop_and_max_samples(tmp_path, cnn):
    model, _ = cnn
    files = write_images(tmp_path / "imgs")
    shapes = resolve_input_shapes(model, shapes={"images": (1, 3, 10, 10)})
    imp = import_images(tmp_path / "imgs", model, shapes, Recipe(resize="center_crop", scale=1.0, max_samples=2))
    assert imp.arrays["images"].shape == (2, 3, 10, 10)
    im = Image.open(files[0]).convert("RGB")  # 17 x 30: the short side (17) to 10, then the middle 10 columns
    r = 10 / 17
    nw = round(30 * r)
    left = (nw - 10) // 2
    crop = np.asarray(im.resize((nw, 10), Image.BILINEAR).crop((left, 0, left + 10, 10)), np.float32)
    np.testing.assert_array_equal(imp.arrays["images"][0], crop.transpose(2, 0, 1))


def test_a_zip_gives_the_same_arrays_as_the_folder(tmp_path, cnn):
    model, _ = cnn
    files = write_images(tmp_path / "imgs")
    shapes = resolve_input_shapes(model, shapes={"images": (1, 3, 24, 32)})
    recipe = Recipe(resize="letterbox", pad=114, channels="BGR", mean=MEAN, std=STD)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in reversed(files):  # stored out of order: read in sorted path order all the same
            z.write(p, f"set/{p.name}")
        z.writestr("__MACOSX/set/._img00.png", b"junk")
        z.writestr("set/readme.md", "text")
    (tmp_path / "imgs.zip").write_bytes(buf.getvalue())
    from_folder = import_images(tmp_path / "imgs", model, shapes, recipe).arrays["images"]
    from_zip = import_images(tmp_path / "imgs.zip", model, shapes, recipe)
    from_bytes = import_images(buf.getvalue(), model, shapes, recipe)
    np.testing.assert_array_equal(from_zip.arrays["images"], from_folder)
    np.testing.assert_array_equal(from_bytes.arrays["images"], from_folder)
    assert from_zip.sources == [f"set/{p.name}" for p in files]


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_bad_image_inputs_are_one_mixprec_error(tmp_path, cnn, monkeypatch):
    model, _ = cnn
    shapes = resolve_input_shapes(model)
    (tmp_path / "empty").mkdir()
    png = io.BytesIO()
    Image.new("RGB", (40, 40)).save(png, "PNG")
    cases = {
        "empty": (tmp_path / "empty", "no files"),
        "missing": (tmp_path / "nowhere", "does not exist"),
        "text only": (_zip(tmp_path / "t.zip", {"a.txt": b"x", "b.csv": b"1,2"}), "none of them an image"),
        "escape": (_zip(tmp_path / "e.zip", {"ok.png": png.getvalue(), "../../evil.png": png.getvalue()}),
                   "leads out of its folder"),
        "absolute": (_zip(tmp_path / "a.zip", {"/etc/evil.png": png.getvalue()}), "leads out of its folder"),
        "not a zip": ((tmp_path / "x.bin"), "neither a folder nor a .zip"),
    }
    (tmp_path / "x.bin").write_bytes(b"\x00" * 100)
    for name, (source, match) in cases.items():
        with pytest.raises(MixprecError, match=match) as e:
            import_images(source, model, shapes)
        assert "Fix:" in str(e.value), name
    outside = tmp_path / "outside.png"
    outside.write_bytes(png.getvalue())
    (tmp_path / "linked").mkdir()
    os.symlink(outside, tmp_path / "linked" / "a.png")
    with pytest.raises(MixprecError, match="leads out of it"):
        import_images(tmp_path / "linked", model, shapes)
    # a zip bomb: the declared size is checked before anything is unpacked
    bomb = _zip(tmp_path / "bomb.zip", {"zeros.png": b"\x00" * (3 << 20)})
    assert bomb.stat().st_size < 64 << 10
    monkeypatch.setenv("MIXPREC_MAX_DATA_BYTES", "1M")
    with pytest.raises(MixprecError, match="declares 3145728 bytes once unpacked"):
        import_images(bomb, model, shapes)
    monkeypatch.delenv("MIXPREC_MAX_DATA_BYTES")
    # a pixel bomb: the header's width x height, before decoding
    monkeypatch.setenv("MIXPREC_MAX_IMAGE_PIXELS", "1000")
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "a.png").write_bytes(png.getvalue())
    with pytest.raises(MixprecError, match="40×40 pixels, more than the 1000"):
        import_images(tmp_path / "big", model, shapes)


def test_bad_recipes_and_inputs(tmp_path, cnn):
    model, _ = cnn
    write_images(tmp_path / "imgs", 1)
    shapes = resolve_input_shapes(model)
    with pytest.raises(MixprecError, match="unknown keys: colour"):
        parse_recipe("colour=red")
    with pytest.raises(MixprecError, match="recipe is not valid") as e:
        parse_recipe("resize=squash,std=0:1:1")
    assert any("squash" in d for d in e.value.details) and any("std 0" in d for d in e.value.details)
    with pytest.raises(MixprecError, match="layout NHWC"):
        import_images(tmp_path / "imgs", model, shapes, Recipe(layout="NHWC"))
    with pytest.raises(MixprecError, match="no input 'pixels'"):
        import_images(tmp_path / "imgs", model, shapes, Recipe(input="pixels"))
    (tmp_path / "r.json").write_text(json.dumps({"resize": "letterbox", "mean": [1, 2, 3], "std": [1, 1, 1]}))
    assert parse_recipe(str(tmp_path / "r.json")) == Recipe(resize="letterbox", mean=(1, 2, 3))
    assert Recipe.from_json(Recipe(size=(8, 9), channels="bgr").to_json()) == Recipe(size=(8, 9), channels="BGR")


def test_the_advice_note_below_200_samples(tmp_path, cnn):
    model, _ = cnn
    shapes = resolve_input_shapes(model, shapes={"images": (1, 3, 4, 4)})
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(200):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(folder / f"{i:03d}.png")
    few = import_images(folder, model, shapes, Recipe(max_samples=199))
    assert any("199 calibration samples: the field's advice is 200–500 calibration samples" in n for n in few.notes)
    enough = import_images(folder, model, shapes)
    assert enough.num_samples == 200 and not any("advice" in n for n in enough.notes)
    np.testing.assert_allclose(enough.arrays["images"][:, 0, 0, 0], np.arange(200) / 255, atol=1e-6)


# --- text -----------------------------------------------------------------------------------------
def wordpiece(path: Path):
    """A small WordPiece tokenizer (lower-cased, [CLS] … [SEP], [PAD] = 0) written as tokenizer.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    words = ["the", "model", "reads", "images", "and", "text", "fast", "##er", "slow"]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(path))
    return Tokenizer.from_file(str(path)), len(vocab)


def test_text_lines_match_the_tokenizers_own_encoding(tmp_path):
    tok, vocab = wordpiece(tmp_path / "tokenizer.json")
    model = load_model(str(token_model(tmp_path / "enc.onnx", vocab)), Workspace(tmp_path / "ws"))
    lines = ["The model reads images", "", "and text faster and faster and faster", "slow zebra"]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    shapes = resolve_input_shapes(model, overrides={"seq": 8})
    imp = import_text(tmp_path / "lines.txt", model, shapes)  # tokenizer.json beside the model
    ids, mask = imp.arrays["input_ids"], imp.arrays["attention_mask"]
    assert ids.shape == mask.shape == (3, 8) and ids.dtype == np.int64
    for row, line in enumerate(l for l in lines if l):
        own = tok.encode(line)
        n = min(len(own.ids), 8)
        if len(own.ids) > 8:  # truncated: the tokenizer's own truncation keeps [SEP] last
            tok.enable_truncation(8)
            own = tok.encode(line)
            tok.no_truncation()
        assert list(ids[row, :n]) == own.ids[:n] and list(ids[row, n:]) == [0] * (8 - n)
        assert list(mask[row]) == [1] * n + [0] * (8 - n)
    assert list(ids[2]) == [2, tok.token_to_id("slow"), 1, 3, 0, 0, 0, 0]  # zebra is unknown
    assert "1 blank line skipped" in imp.notes and "1 line longer than 8 tokens, truncated" in imp.notes
    out = write_npz(imp, tmp_path / "text.npz", model)
    assert sorted(load_npz(out.path, model).arrays) == ["attention_mask", "input_ids"]


def test_text_refuses_other_inputs_and_a_missing_tokenizer(tmp_path):
    (tmp_path / "m").mkdir()  # no tokenizer.json beside this model
    model = load_model(str(token_model(tmp_path / "m" / "enc.onnx", 20)), Workspace(tmp_path / "ws"))
    (tmp_path / "lines.txt").write_text("the model\n")
    shapes = resolve_input_shapes(model)
    with pytest.raises(MixprecError, match="no tokenizer.json beside the model"):
        import_text(tmp_path / "lines.txt", model, shapes)
    cnn = load_model(str(dynamic_cnn(tmp_path / "cnn.onnx")), Workspace(tmp_path / "ws"))
    with pytest.raises(MixprecError, match="are not token ids"):
        import_text(tmp_path / "lines.txt", cnn, resolve_input_shapes(cnn))


# --- audio ----------------------------------------------------------------------------------------
def write_wav_pcm16(path: Path, x: np.ndarray, rate: int) -> None:
    """``x`` [frames, channels] in [-1, 1] as 16-bit PCM (the stdlib's writer)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(x.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(x * 32767).astype("<i2").tobytes())


def write_wav_float32(path: Path, x: np.ndarray, rate: int) -> None:
    """Mono IEEE float (format 3), the RIFF chunks written out by hand."""
    body = x.astype("<f4").tobytes()
    fmt = (3).to_bytes(2, "little") + (1).to_bytes(2, "little") + rate.to_bytes(4, "little") + \
        (rate * 4).to_bytes(4, "little") + (4).to_bytes(2, "little") + (32).to_bytes(2, "little")
    chunks = b"fmt " + len(fmt).to_bytes(4, "little") + fmt + b"data" + len(body).to_bytes(4, "little") + body
    path.write_bytes(b"RIFF" + (4 + len(chunks)).to_bytes(4, "little") + b"WAVE" + chunks)


def test_wav_files_are_mixed_down_resampled_and_cut(tmp_path):
    folder = tmp_path / "wavs"
    folder.mkdir()
    t = np.arange(44100 // 2) / 44100  # 0.5 s at 44.1 kHz
    sine = 0.5 * np.sin(2 * np.pi * 440 * t)
    write_wav_pcm16(folder / "a.wav", np.stack([sine + 0.2, sine - 0.2], 1), 44100)  # stereo: the mean is the sine
    write_wav_float32(folder / "b.wav", (0.25 * np.sin(2 * np.pi * 100 * np.arange(4000) / 8000)), 8000)
    (folder / "c.txt").write_text("not audio")
    model = load_model(str(audio_model(tmp_path / "audio.onnx", 16000, channel_axis=True)), Workspace(tmp_path / "ws"))
    imp = import_audio(folder, model, resolve_input_shapes(model), Recipe(rate=16000))
    x = imp.arrays["audio"]
    assert x.shape == (2, 1, 16000) and x.dtype == np.float32
    t16 = np.arange(8000) / 16000  # a: 0.5 s → 8000 samples at 16 kHz, then silence
    # linear interpolation's error bound h²/8·max|f''| (2.5e-4 here), plus 16-bit rounding
    np.testing.assert_allclose(x[0, 0, :8000], 0.5 * np.sin(2 * np.pi * 440 * t16), atol=3e-4)
    assert not x[0, 0, 8000:].any()
    # b: 8 → 16 kHz (the last sample, past the last input sample, holds it)
    np.testing.assert_allclose(x[1, 0, :7999], 0.25 * np.sin(2 * np.pi * 100 * t16[:7999]), atol=2e-4)  # bound 1.9e-4
    assert "1 file skipped, not WAV" in imp.notes and "2 clip(s) shorter, padded with silence" in imp.notes
    short = load_model(str(audio_model(tmp_path / "short.onnx", 1000)), Workspace(tmp_path / "ws"))
    cut = import_audio(folder, short, resolve_input_shapes(short), Recipe(rate=16000))
    assert cut.arrays["audio"].shape == (2, 1000) and "2 clip(s) longer than 1000 samples at 16000 Hz, cut" in cut.notes
    np.testing.assert_array_equal(cut.arrays["audio"], x[:, 0, :1000])
    mono, rate = read_wav((folder / "b.wav").read_bytes())
    assert rate == 8000 and mono.shape == (4000,)
    with pytest.raises(MixprecError, match="no fmt or data chunk"):
        read_wav(b"RIFF\x04\x00\x00\x00WAVE")


def test_save_in_workspace_keeps_it_like_an_upload(tmp_path, cnn):
    model, ws = cnn
    write_images(tmp_path / "imgs", 2)
    imp = import_images(tmp_path / "imgs", model, resolve_input_shapes(model, shapes={"images": (1, 3, 8, 8)}))
    r = save_in_workspace(ws, imp, "my photos!", model)
    assert r.path.parent.parent == ws.root / "data" and r.path.name == "my_photos_.npz"
    assert r.recipe_path == r.path.with_name("my_photos_.recipe.json")
    again = save_in_workspace(ws, imp, "my photos!", model)
    assert again.path == r.path  # the same arrays: the same place
