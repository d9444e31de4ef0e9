"""Data from what users have (issue 22 §2): a folder or ``.zip`` of images, a text file of lines, a folder
of WAV files, turned into the ``.npz`` mixprec reads (one array per model input, keyed by input name,
samples along axis 0) — the ~40 lines every user wrote per model, once, with a typed, saved recipe.

* Images (:func:`import_images`): Pillow reads PNG, JPEG, BMP, WebP, GIF, TIFF and PPM (only those: no
  format that calls an outside program). Files in sorted path order; anything else is skipped and counted in
  the notes. Each image: EXIF orientation applied, converted to RGB (L for a 1-channel input), resized to the
  input's H×W (:class:`Recipe`: ``stretch``, ``letterbox`` with ``pad``, or ``center_crop`` after resizing
  the short side), channels reordered (``BGR``), ``x * scale``, then ``(x - mean) / std`` per channel, laid
  out ``NCHW`` or ``NHWC``, cast to the input's dtype. :func:`preview` undoes the last steps for display.
* Text (:func:`import_text`): one sample per non-empty line, encoded by the model's tokenizer
  (``tokenizer.json`` beside the model, the bundled MiniLM's for that sample, or a path given), truncated
  and padded to the sequence length of the input shapes, for ``input_ids``/``attention_mask``/``token_type_ids``.
* Audio (:func:`import_audio`): WAV files (PCM 8/16/24/32-bit or 32/64-bit float; channels mixed down to
  mono), resampled to ``Recipe.rate`` by linear interpolation, cut or zero-padded to the input's length, for
  a float input ``[batch, samples]`` or ``[batch, 1, samples]``.

Every problem (no such folder, nothing readable in it, a zip member escaping its folder, a declared size
or pixel count beyond the limits, a model input the data cannot fill) is one ``MixprecError(what, fix)``.
:func:`write_npz` writes the arrays atomically and the recipe next to them; :func:`save_in_workspace`
keeps them under ``data/<sha256>/`` as an upload is kept, so the project's ``data`` can point there."""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from core.errors import MixprecError
from core.model.data import MAX_DATA_BYTES, Dataset, check_dataset
from core.model.load import LoadedModel, TensorSpec
from core.model.samples import minilm_tokenizer
from core.model.shapes import image_layout
from core.workspace import (Workspace, atomic_save_npz, atomic_write_json, check_confined, check_user_path,
                            env_bytes, read_user_file)

RESIZES = ("stretch", "letterbox", "center_crop")
CHANNEL_ORDERS = ("RGB", "BGR")
LAYOUTS = ("NCHW", "NHWC")
INTERPOLATIONS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                  "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "WEBP", "GIF", "TIFF", "PPM")  # Pillow's readers that run no other program
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ADVISED_SAMPLES = 200  # "the field's advice is 200–500 calibration samples"
MAX_PIXELS = 64_000_000  # one image's width × height ($MIXPREC_MAX_IMAGE_PIXELS); Pillow's own bomb check is 89 M
MAX_FILE_BYTES = 256 << 20  # one image, WAV or text file, or one zip member
RECIPE_SUFFIX = ".recipe.json"


def _fix_recipe() -> str:
    return ("write the recipe as JSON or key=value pairs, e.g. resize=letterbox,pad=114,channels=BGR,"
            "scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225,layout=NCHW")


@dataclass
class Recipe:
    """How files become model inputs. Images: ``resize`` (stretch | letterbox | center_crop), ``pad`` (the
    letterbox border, a pixel value 0–255), ``interpolation``, ``channels`` (RGB | BGR; grayscale for a
    1-channel input), ``scale`` (first), ``mean`` / ``std`` per channel in the input's channel order (BGR
    for ``channels="BGR"``), after scale: ``(x*scale - mean) / std``, ``layout`` (NCHW | NHWC; None: the input's own), ``size`` ([H, W]; None: the input shapes').
    Audio: ``rate`` (Hz). All kinds: ``input`` (which model input; None: the one that fits) and
    ``max_samples`` (the first N files or lines; None: all)."""

    resize: str = "stretch"
    pad: float = 0.0
    interpolation: str = "bilinear"
    channels: str = "RGB"
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: str | None = None
    size: tuple[int, int] | None = None
    rate: int = 16000
    input: str | None = None
    max_samples: int | None = None

    def __post_init__(self):
        problems = []
        if self.resize not in RESIZES:
            problems.append(f"resize={self.resize!r} (one of {', '.join(RESIZES)})")
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation={self.interpolation!r} (one of {', '.join(INTERPOLATIONS)})")
        self.channels = str(self.channels).upper()
        if self.channels not in CHANNEL_ORDERS:
            problems.append(f"channels={self.channels!r} (RGB or BGR)")
        if self.layout is not None:
            self.layout = str(self.layout).upper()
            if self.layout not in LAYOUTS:
                problems.append(f"layout={self.layout!r} (NCHW or NHWC)")
        try:
            self.pad, self.scale = float(self.pad), _number(self.scale)
            self.mean = tuple(float(v) for v in _seq(self.mean))
            self.std = tuple(float(v) for v in _seq(self.std))
            self.size = None if self.size is None else tuple(int(v) for v in _seq(self.size))
            self.rate = int(self.rate)
            self.max_samples = None if self.max_samples in (None, "", 0) else int(self.max_samples)
        except (TypeError, ValueError) as e:
            problems.append(str(e))
        else:
            if len(self.mean) != len(self.std) or len(self.mean) not in (1, 3):
                problems.append(f"mean {list(self.mean)} and std {list(self.std)}: one or three values each")
            if any(s == 0 for s in self.std):
                problems.append("std 0 (it divides)")
            if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
                problems.append(f"size {list(self.size)} (want [H, W])")
            if self.rate < 1 or (self.max_samples is not None and self.max_samples < 1):
                problems.append("rate and max_samples are positive")
        if problems:
            raise MixprecError("the preprocessing recipe is not valid", _fix_recipe(), details=problems)

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["mean"], doc["std"] = list(self.mean), list(self.std)
        doc["size"] = None if self.size is None else list(self.size)
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "Recipe":
        """The recipe of :meth:`to_json` (missing keys take their defaults; an unknown key is an error)."""
        if not isinstance(doc, dict):
            raise MixprecError("the preprocessing recipe is not a JSON object", _fix_recipe())
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise MixprecError(f"the preprocessing recipe has unknown keys: {', '.join(unknown)}",
                               f"use only {', '.join(sorted(known))}")
        return cls(**doc)


def _number(v) -> float:
    """``0.0039``, ``"1/255"`` → a float."""
    if isinstance(v, str):
        try:
            return float(Fraction(v.strip()))
        except (ValueError, ZeroDivisionError) as e:
            raise ValueError(f"{v!r} is not a number (write 0.5 or 1/255)") from e
    return float(v)


def _seq(v) -> list:
    """A list, or ``"0.5:0.5:0.5"`` / ``"0.5, 0.5"`` / a lone number as one."""
    if isinstance(v, str):
        return [_number(p) for p in v.replace(",", ":").split(":") if p.strip()]
    if isinstance(v, (int, float)):
        return [v]
    return list(v)


def parse_recipe(text: str | None) -> Recipe:
    """The recipe of a ``--recipe`` argument: a JSON file's path, inline JSON, or ``key=value,key=value``
    (lists with ``:``, e.g. ``mean=0.485:0.456:0.406``; ``scale=1/255``). None or empty: the defaults."""
    text = (text or "").strip()
    if not text:
        return Recipe()
    if text.startswith("{"):
        return _recipe_json(text, "the inline recipe")
    if "=" not in text:
        raw = read_user_file(text, "recipe file", MAX_FILE_BYTES)
        return _recipe_json(raw.decode("utf-8", errors="replace"), f"the recipe file {text}")
    doc = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise MixprecError(f"bad recipe entry {part!r}", _fix_recipe())
        doc[key.strip()] = None if value.strip().lower() in ("", "none", "null") else value.strip()
    return Recipe.from_json(doc)


def _recipe_json(text: str, what: str) -> Recipe:
    try:
        return Recipe.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise MixprecError(f"{what} is not valid JSON ({e})", _fix_recipe()) from e


@dataclass
class Imported:
    """What an import made: one array per model input (samples along axis 0), the files or lines each
    sample came from, notes for the user (skipped files, too few samples) and the recipe used."""

    kind: str  # images | text | audio
    arrays: dict[str, np.ndarray]
    sources: list[str]
    recipe: Recipe
    notes: list[str] = field(default_factory=list)
    input: str | None = None  # the input the files went into (images, audio)
    layout: str | None = None  # NCHW | NHWC (images)

    @property
    def num_samples(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0]) if self.arrays else 0


@dataclass
class ImportResult:
    """The written ``.npz``: its path, the recipe beside it, the sample count, each array's shape, the notes."""

    path: Path
    recipe_path: Path
    num_samples: int
    shapes: dict[str, tuple[int, ...]]
    notes: list[str]

    def to_json(self) -> dict:
        return {"path": str(self.path), "recipe_path": str(self.recipe_path), "num_samples": self.num_samples,
                "shapes": {k: list(v) for k, v in self.shapes.items()}, "notes": list(self.notes)}


# --- reading files: a folder or a zip ----------------------------------------------------------------
def _limits() -> tuple[int, int]:
    return env_bytes("MIXPREC_MAX_DATA_BYTES", MAX_DATA_BYTES), int(env_bytes("MIXPREC_MAX_IMAGE_PIXELS", MAX_PIXELS))


def _hidden(rel: str) -> bool:
    return any(p.startswith(".") or p == "__MACOSX" for p in PurePosixPath(rel).parts)


def _folder_files(folder: Path, what: str, ws_root=None) -> list[tuple[str, object]]:
    """(relative path, a reader of its bytes) of every regular file under ``folder``, sorted by path; a link
    that leads out of it is an error. Sizes are checked before anything is read."""
    check_confined(folder, what, ws_root)
    real = folder.expanduser().resolve()
    total, out = 0, []
    limit = _limits()[0]
    for path in sorted(real.rglob("*")):
        rel = path.relative_to(real).as_posix()
        if _hidden(rel):
            continue
        target = path.resolve()
        if target != real and real not in target.parents:
            raise MixprecError(f"{rel} in the {what} {folder} leads out of it (to {target})",
                               "copy the files into the folder instead of linking to them")
        if not target.is_file():
            continue
        size = target.stat().st_size
        total += size
        if size > MAX_FILE_BYTES or total > limit:
            raise MixprecError(f"the {what} {folder} holds more than this server reads ({rel}: {size} bytes, "
                               f"{total} bytes so far, at most {MAX_FILE_BYTES} per file and {limit} in all)",
                               "give fewer or smaller files (or raise MIXPREC_MAX_DATA_BYTES on a server you run)")
        out.append((rel, target.read_bytes))
    return out


def _zip_files(raw: bytes, label: str) -> list[tuple[str, object]]:
    """(member path, a reader of its bytes) of every file in a zip, sorted; the member paths and their
    declared sizes are checked before anything is unpacked (zipfile then stops at the declared size)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as e:
        raise MixprecError(f"{label} is not a zip archive ({e})", "give a folder or a .zip of images") from e
    limit = _limits()[0]
    members = [i for i in zf.infolist() if not i.is_dir()]
    for i in members:
        parts = PurePosixPath(i.filename.replace("\\", "/")).parts
        if i.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise MixprecError(f"{label} holds {i.filename!r}, a path that leads out of its folder",
                               "make the archive again with relative paths inside it")
    declared = sum(i.file_size for i in members)
    big = [i.filename for i in members if i.file_size > MAX_FILE_BYTES]
    if declared > limit or big:
        raise MixprecError(f"{label} declares {declared} bytes once unpacked"
                           + (f" ({big[0]} alone is more than {MAX_FILE_BYTES})" if big else f", more than {limit}"),
                           "give a smaller archive (or raise MIXPREC_MAX_DATA_BYTES on a server you run)")

    def reader(info: zipfile.ZipInfo):
        def read() -> bytes:
            try:
                return zf.read(info)  # at most the declared size, CRC checked
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
                raise MixprecError(f"{label}: {info.filename} cannot be unpacked ({e})",
                                   "make the archive again (plain deflate, no password)") from e
        return read

    return [(i.filename, reader(i)) for i in sorted(members, key=lambda i: i.filename) if not _hidden(i.filename)]


def gather_files(source, what: str, ws_root=None) -> tuple[list[tuple[str, object]], str]:
    """The files of ``source`` (a folder, a .zip path, or a zip's bytes) as (path, reader of its bytes), sorted
    by path, and its label."""
    if isinstance(source, (bytes, bytearray)):
        return _zip_files(bytes(source), "the uploaded archive"), "upload.zip"
    path = Path(source).expanduser()
    if path.is_dir():
        return _folder_files(path, what, ws_root), path.name
    check_user_path(path, what, _limits()[0], ws_root)
    if not zipfile.is_zipfile(path):
        raise MixprecError(f"the {what} {path} is neither a folder nor a .zip archive", "give a folder or a .zip")
    return _zip_files(read_user_file(path, what, _limits()[0], ws_root), f"the archive {path.name}"), path.stem


# --- images ---------------------------------------------------------------------------------------
def _specs(model: LoadedModel) -> dict[str, TensorSpec]:
    return {s.name: s for s in model.inputs}


def _only_input(model: LoadedModel, name: str | None, fits, kind: str, want: str) -> TensorSpec:
    """The model input the files go into: ``name``, else the one input that ``fits``; and no other inputs."""
    specs = _specs(model)
    if name is not None and name not in specs:
        raise MixprecError(f"the model has no input {name!r}", f"name one of {', '.join(specs)} (recipe input=NAME)")
    if name is None:
        found = [s for s in model.inputs if fits(s)]
        if len(found) != 1:
            which = ", ".join(f"{s.name} {s.dtype} {list(s.shape)}" for s in model.inputs)
            raise MixprecError(f"the model has {len(found) or 'no'} {want} input{'s' if len(found) != 1 else ''} "
                               f"({which})", "name the input the " + kind + " go into (recipe input=NAME)"
                               if found else f"this model does not take {kind}")
        name = found[0].name
    others = [n for n in specs if n != name]
    if others:
        raise MixprecError(f"the model has other inputs besides {name} ({', '.join(others)}), which {kind} cannot fill",
                           "write the .npz of all inputs yourself (numpy.savez(path, <input name>=array, ...))")
    return specs[name]


def _image_target(spec: TensorSpec, shape: tuple[int, ...], recipe: Recipe) -> tuple[str, int, int, int]:
    """(layout, channels, H, W) of the input at ``shape``; a recipe size must agree with the model's fixed dims."""
    model_layout = image_layout(spec)
    layout = recipe.layout or (model_layout or "").upper()
    if len(shape) != 4 or not layout:
        raise MixprecError(f"the input {spec.name} ({spec.dtype} {list(spec.shape)}) is not an image batch",
                           "give a 4-D input, and its layout when the model does not say it (recipe layout=NCHW)")
    if model_layout and model_layout.upper() != layout:
        raise MixprecError(f"the recipe says layout {layout}, the input {spec.name} {list(spec.shape)} is "
                           f"{model_layout.upper()}", f"write layout={model_layout.upper()} (or leave it out)")
    caxis, (hax, wax) = (1, (2, 3)) if layout == "NCHW" else (3, (1, 2))
    c, h, w = int(shape[caxis]), int(shape[hax]), int(shape[wax])
    if recipe.size is not None:
        for axis, want in zip((hax, wax), recipe.size):
            fixed = spec.shape[axis]
            if isinstance(fixed, int) and fixed > 0 and fixed != want:
                raise MixprecError(f"the recipe's size {list(recipe.size)} does not fit the input {spec.name}, "
                                   f"whose axis {axis} is fixed at {fixed}", "leave size out, or match the model")
        h, w = recipe.size
    if c not in (1, 3):
        raise MixprecError(f"the input {spec.name} has {c} channels", "images fill 1-channel (grayscale) or 3-channel inputs")
    return layout, c, h, w


def _open_image(data: bytes, max_pixels: int, rel: str, label: str) -> Image.Image | None:
    """The decoded image, None if it is not one; too many pixels is an error (checked before decoding)."""
    try:
        im = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    if im.width * im.height > max_pixels:
        raise MixprecError(f"{rel} in {label} is {im.width}×{im.height} pixels, more than the {max_pixels} this "
                           "server decodes", "give smaller images (or raise MIXPREC_MAX_IMAGE_PIXELS on a server you run)")
    try:
        im.load()
        return ImageOps.exif_transpose(im)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def resize_image(im: Image.Image, h: int, w: int, recipe: Recipe, mode: str) -> Image.Image:
    """``im`` in ``mode`` (RGB or L) at ``h``×``w``, by the recipe's resize."""
    im = im.convert(mode)
    how = INTERPOLATIONS[recipe.interpolation]
    if recipe.resize == "stretch":
        return im.resize((w, h), how)
    if recipe.resize == "letterbox":
        r = min(w / im.width, h / im.height)
        nw, nh = max(1, min(w, round(im.width * r))), max(1, min(h, round(im.height * r)))
        fill = int(round(recipe.pad)) if mode == "L" else (int(round(recipe.pad)),) * 3
        canvas = Image.new(mode, (w, h), fill)
        canvas.paste(im.resize((nw, nh), how), ((w - nw) // 2, (h - nh) // 2))
        return canvas
    r = max(w / im.width, h / im.height)  # center_crop: the short side to fit, then the middle
    nw, nh = max(w, round(im.width * r)), max(h, round(im.height * r))
    left, top = (nw - w) // 2, (nh - h) // 2
    return im.resize((nw, nh), how).crop((left, top, left + w, top + h))


def _to_array(im: Image.Image, recipe: Recipe, channels: int, layout: str) -> np.ndarray:
    x = np.asarray(im, dtype=np.float32)
    x = x[:, :, None] if x.ndim == 2 else x
    if channels == 3 and recipe.channels == "BGR":
        x = x[:, :, ::-1]
    mean = np.asarray(recipe.mean[:channels] if channels == 1 else np.broadcast_to(recipe.mean, 3), np.float32)
    std = np.asarray(recipe.std[:channels] if channels == 1 else np.broadcast_to(recipe.std, 3), np.float32)
    x = (x * np.float32(recipe.scale) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1) if layout == "NCHW" else x)


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    dt = np.dtype("float32" if dtype == "bfloat16" else dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(x), info.min, info.max).astype(dt)
    return x.astype(dt)


def _check_bytes(n: int, shape: tuple, dtype: str, what: str) -> None:
    need = n * int(np.prod(shape, dtype=np.float64)) * np.dtype("float32" if dtype == "bfloat16" else dtype).itemsize
    if need > _limits()[0]:
        raise MixprecError(f"{n} {what} at {list(shape)} would be {need} bytes, more than the {_limits()[0]} "
                           "this server writes", "give fewer samples (recipe max_samples=N) or smaller shapes")


def import_images(source, model: LoadedModel, shapes: dict[str, tuple[int, ...]], recipe: Recipe | None = None,
                  ws_root=None, limit: int | None = None) -> Imported:
    """The images of ``source`` (a folder, a .zip path or a zip's bytes) as the model's image input at
    ``shapes`` (the project's resolved input shapes), by ``recipe``. ``limit``: only the first images
    (a preview); else ``recipe.max_samples`` or all."""
    recipe = recipe or Recipe()
    spec = _only_input(model, recipe.input, lambda s: image_layout(s) is not None, "images", "image-like")
    layout, c, h, w = _image_target(spec, tuple(shapes[spec.name]), recipe)
    files, label = gather_files(source, "image folder", ws_root)
    max_pixels = _limits()[1]
    cap = min((n for n in (limit, recipe.max_samples) if n), default=None)
    arrays, names, skipped = [], [], []
    for rel, read in files:
        if cap is not None and len(arrays) >= cap:
            break
        im = _open_image(read(), max_pixels, rel, label)
        if im is None:
            skipped.append(rel)
            continue
        if not arrays:
            _check_bytes(min(len(files), cap or len(files)), (c, h, w), spec.dtype, "images")
        arrays.append(_to_array(resize_image(im, h, w, recipe, "L" if c == 1 else "RGB"), recipe, c, layout))
        names.append(rel)
    if not arrays:
        what = f"{len(files)} files, none of them an image" if files else "no files"
        raise MixprecError(f"{label} holds {what} Pillow reads ({', '.join(IMAGE_FORMATS)})",
                           "give a folder or a .zip of images")
    notes = [f"{len(skipped)} file{'s' if len(skipped) != 1 else ''} skipped, not images: "
             + ", ".join(skipped[:5]) + (" …" if len(skipped) > 5 else "")] if skipped else []
    batch = _cast(np.stack(arrays), spec.dtype)
    return Imported("images", {spec.name: batch}, names, recipe, notes + _count_note(len(names), limit), spec.name,
                    layout)


def _count_note(n: int, limit: int | None) -> list[str]:
    if limit is not None or n >= ADVISED_SAMPLES:
        return []
    return [f"{n} calibration sample{'s' if n != 1 else ''}: the field's advice is 200–500 calibration samples "
            "(without an evaluation .npz, the last quarter is held out for evaluation)"]


def preview(imported: Imported, count: int = 8) -> list[np.ndarray]:
    """The first ``count`` images as the model sees them, for display only: H×W×3 (or H×W) uint8, with the
    layout, the normalisation and the channel order undone (values outside 0–255 clipped)."""
    if imported.kind != "images":
        return []
    r = imported.recipe
    out = []
    for x in imported.arrays[imported.input][:count].astype(np.float32):
        x = x.transpose(1, 2, 0) if imported.layout == "NCHW" else x
        c = x.shape[-1]
        mean = np.asarray(r.mean[:1] if c == 1 else np.broadcast_to(r.mean, 3), np.float32)
        std = np.asarray(r.std[:1] if c == 1 else np.broadcast_to(r.std, 3), np.float32)
        x = (x * std + mean) / np.float32(r.scale or 1)
        x = x[:, :, ::-1] if c == 3 and r.channels == "BGR" else x
        img = np.clip(np.rint(x), 0, 255).astype(np.uint8)
        out.append(img[:, :, 0] if c == 1 else img)
    return out


# --- text -----------------------------------------------------------------------------------------
def find_tokenizer(model: LoadedModel, given=None) -> Path:
    """The tokenizer file: ``given``, else ``tokenizer.json`` beside the model, else the bundled MiniLM's
    for that sample."""
    if given:
        return Path(given).expanduser()
    beside = Path(model.path).parent / "tokenizer.json"
    if beside.is_file():
        return beside
    if model.sample == "minilm":
        return minilm_tokenizer()
    raise MixprecError(f"no tokenizer.json beside the model {Path(model.path).name}",
                       "give the model's tokenizer file (--tokenizer tokenizer.json, HuggingFace tokenizers format)")


def _load_tokenizer(path: Path, ws_root=None):
    from tokenizers import Tokenizer  # Rust extension: loaded only for text

    raw = read_user_file(path, "tokenizer file", MAX_FILE_BYTES, ws_root)
    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception subclass for a bad file
        raise MixprecError(f"{path.name} is not a tokenizers file ({str(e)[:200]})",
                           "give the model's tokenizer.json (HuggingFace tokenizers format)") from e


def _pad(tok) -> tuple[int, str]:
    """The pad id and token: the tokenizer's padding, else [PAD] / <pad> in its vocabulary, else 0."""
    if tok.padding:
        return int(tok.padding["pad_id"]), tok.padding["pad_token"]
    for t in ("[PAD]", "<pad>", "<|pad|>"):
        if tok.token_to_id(t) is not None:
            return tok.token_to_id(t), t
    return 0, "[PAD]"


def import_text(path, model: LoadedModel, shapes: dict[str, tuple[int, ...]], tokenizer=None,
                recipe: Recipe | None = None, ws_root=None) -> Imported:
    """The non-empty lines of the text file ``path`` as token-id inputs (``TOKEN_INPUTS``, by name), each
    encoded by the tokenizer (:func:`find_tokenizer`) with truncation and padding to the sequence length
    of ``shapes``."""
    recipe = recipe or Recipe()
    specs = _specs(model)
    others = [n for n in specs if n not in TOKEN_INPUTS]
    if "input_ids" not in specs or others:
        raise MixprecError(f"the model's inputs ({', '.join(specs)}) are not token ids "
                           f"({', '.join(TOKEN_INPUTS)})", "text fills input_ids, attention_mask and token_type_ids "
                           "only: write the .npz of the other inputs yourself")
    bad = [n for n in specs if len(shapes[n]) != 2]
    if bad:
        raise MixprecError(f"{', '.join(bad)}: not [batch, sequence]", "text fills 2-D token inputs")
    length = int(shapes["input_ids"][1])
    raw = read_user_file(path, "text file", MAX_FILE_BYTES, ws_root)
    try:
        lines = [ln.strip() for ln in raw.decode("utf-8-sig").splitlines()]
    except UnicodeDecodeError as e:
        raise MixprecError(f"{Path(path).name} is not UTF-8 text ({e})", "save the file as UTF-8, one sample a line") from e
    blank = sum(1 for ln in lines if not ln)
    lines = [ln for ln in lines if ln][:recipe.max_samples]
    if not lines:
        raise MixprecError(f"{Path(path).name} has no text lines", "give a text file with one sample a line")
    tok = _load_tokenizer(find_tokenizer(model, tokenizer), ws_root)
    pad_id, pad_token = _pad(tok)
    tok.enable_truncation(length)
    tok.enable_padding(length=length, pad_id=pad_id, pad_token=pad_token)
    encs = tok.encode_batch(lines)
    values = {"input_ids": [e.ids for e in encs], "attention_mask": [e.attention_mask for e in encs],
              "token_type_ids": [e.type_ids for e in encs]}
    arrays = {n: np.asarray(values[n], dtype=specs[n].dtype) for n in specs}
    cut = sum(1 for e in encs if e.overflowing)
    notes = ([f"{blank} blank line{'s' if blank != 1 else ''} skipped"] if blank else []) + (
        [f"{cut} line{'s' if cut != 1 else ''} longer than {length} tokens, truncated"] if cut else [])
    return Imported("text", arrays, lines, recipe, notes + _count_note(len(lines), None), "input_ids")


# --- audio ----------------------------------------------------------------------------------------
def read_wav(data: bytes, name: str = "the file") -> tuple[np.ndarray, int]:
    """(mono float32 samples in [-1, 1], rate) of a WAV file: PCM 8/16/24/32-bit or IEEE float 32/64-bit,
    channels averaged. The RIFF chunks are read here (the stdlib ``wave`` reads no float WAV)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise MixprecError(f"{name} is not a WAV file (no RIFF/WAVE header)", "give WAV files")
    fmt = body = None
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        chunk = data[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = chunk
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None or len(fmt) < 16:
        raise MixprecError(f"{name} has no fmt or data chunk", "give complete WAV files")
    tag, channels, rate = (int.from_bytes(fmt[a:b], "little") for a, b in ((0, 2), (2, 4), (4, 8)))
    bits = int.from_bytes(fmt[14:16], "little")
    if tag == 0xFFFE and len(fmt) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the sub-format's first two bytes
        tag = int.from_bytes(fmt[24:26], "little")
    width = bits // 8
    if channels < 1 or rate < 1 or (tag, bits) not in {(1, 8), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64)}:
        raise MixprecError(f"{name}: WAV format {tag} with {bits}-bit samples is not read",
                           "give PCM 8/16/24/32-bit or 32/64-bit float WAV files")
    frames = len(body) // (width * channels)
    raw = np.frombuffer(body[:frames * width * channels], np.uint8).reshape(frames * channels, width)
    if tag == 3:
        x = raw.copy().view("<f4" if bits == 32 else "<f8")[:, 0].astype(np.float32)
    elif bits == 8:
        x = (raw[:, 0].astype(np.float32) - 128) / 128
    else:
        full = np.zeros((raw.shape[0], 4), np.uint8)
        full[:, 4 - width:] = raw  # left-aligned into 32 bits keeps the sign
        x = full.view("<i4")[:, 0].astype(np.float64) / 2 ** 31
    return x.reshape(frames, channels).mean(axis=1).astype(np.float32), rate


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """``x`` at ``rate_out``: linear interpolation at the new sample times (the first sample kept)."""
    if rate_in == rate_out or len(x) == 0:
        return x.astype(np.float32)
    n = max(1, int(round(len(x) * rate_out / rate_in)))
    t = np.arange(n, dtype=np.float64) * (rate_in / rate_out)
    return np.interp(t, np.arange(len(x), dtype=np.float64), x).astype(np.float32)


def is_audio_input(s: TensorSpec) -> bool:
    return s.is_float and (len(s.shape) == 2 or (len(s.shape) == 3 and s.shape[1] == 1))


def import_audio(folder, model: LoadedModel, shapes: dict[str, tuple[int, ...]], recipe: Recipe | None = None,
                 ws_root=None) -> Imported:
    """The WAV files of ``folder`` (or a .zip), mono, at ``recipe.rate``, cut or zero-padded to the input's
    length (its last axis at ``shapes``), as a float input ``[batch, samples]`` or ``[batch, 1, samples]``."""
    recipe = recipe or Recipe()
    spec = _only_input(model, recipe.input, is_audio_input, "audio", "audio-like ([batch, samples] float)")
    shape = tuple(shapes[spec.name])
    if not is_audio_input(spec):
        raise MixprecError(f"the input {spec.name} {list(spec.shape)} is not [batch, samples] or [batch, 1, samples]",
                           "audio fills a float input of one of those shapes")
    length = int(shape[-1])
    files, label = gather_files(folder, "audio folder", ws_root)
    out, names, cut, padded, skipped = [], [], 0, 0, 0
    for rel, read in files:
        if recipe.max_samples is not None and len(out) >= recipe.max_samples:
            break
        data = read()
        if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
            skipped += 1
            continue
        if not out:
            _check_bytes(min(len(files), recipe.max_samples or len(files)), shape[1:], spec.dtype, "clips")
        x, rate = read_wav(data, rel)
        x = resample(x, rate, recipe.rate)
        cut, padded = cut + (len(x) > length), padded + (len(x) < length)
        clip = np.zeros(length, np.float32)
        clip[:min(length, len(x))] = x[:length]
        out.append(clip)
        names.append(rel)
    if not out:
        raise MixprecError(f"{label} holds no WAV files", "give a folder or a .zip of .wav files")
    batch = np.stack(out).reshape((len(out),) + tuple(int(d) for d in shape[1:]))
    notes = ([f"{skipped} file{'s' if skipped != 1 else ''} skipped, not WAV"] if skipped else []) + (
        [f"{cut} clip(s) longer than {length} samples at {recipe.rate} Hz, cut"] if cut else []) + (
        [f"{padded} clip(s) shorter, padded with silence"] if padded else [])
    return Imported("audio", {spec.name: _cast(batch, spec.dtype)}, names, recipe,
                    notes + _count_note(len(out), None), spec.name)


# --- writing ----------------------------------------------------------------------------------------
def recipe_path(npz_path) -> Path:
    """The recipe saved beside an imported ``.npz``: ``<name>.recipe.json``."""
    p = Path(npz_path)
    return p.with_name(p.stem + RECIPE_SUFFIX)


def saved_recipe(npz_path) -> Recipe | None:
    """The recipe beside a data file, if the data was imported (None: none, or unreadable)."""
    try:
        doc = json.loads(recipe_path(npz_path).read_text())
        return Recipe.from_json(doc.get("recipe", doc))
    except (OSError, ValueError, AttributeError, MixprecError):
        return None


def write_npz(imported: Imported, path, model: LoadedModel | None = None) -> ImportResult:
    """Write the arrays to ``path`` (atomically) and the recipe beside it (:func:`recipe_path`), after checking
    them against ``model``'s inputs (``core.model.data.check_dataset``) when given."""
    path = Path(path)
    if model is not None:
        check_dataset(Dataset(dict(imported.arrays), path.name), model)
    atomic_save_npz(path, imported.arrays)
    rp = atomic_write_json(recipe_path(path), {"kind": imported.kind, "input": imported.input,
                                               "recipe": imported.recipe.to_json(), "samples": imported.num_samples,
                                               "sources": imported.sources[:1000], "notes": imported.notes})
    return ImportResult(path, rp, imported.num_samples, {k: tuple(v.shape) for k, v in imported.arrays.items()},
                        list(imported.notes))


def save_in_workspace(ws: Workspace, imported: Imported, name: str, model: LoadedModel | None = None) -> ImportResult:
    """Keep the import as an uploaded .npz is kept: ``data/<sha256 of the arrays>/<name>.npz`` (and its recipe)."""
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(name).stem)[:80] or imported.kind
    folder = ws.upload_dir("data", Dataset(imported.arrays, stem).sha256)
    return write_npz(imported, folder / f"{stem}.npz", model)


def import_data(model: LoadedModel, shapes: dict[str, tuple[int, ...]], images=None, text=None, audio=None,
                recipe: Recipe | None = None, tokenizer=None, ws_root=None) -> Imported:
    """One of ``images`` / ``text`` / ``audio`` imported (the CLI's ``data`` command)."""
    given = [k for k, v in (("images", images), ("text", text), ("audio", audio)) if v is not None]
    if len(given) != 1:
        raise MixprecError("give one of images, text or audio" + (f" (got {', '.join(given)})" if given else ""),
                           "python -m core data MODEL --images DIR|ZIP, --text FILE or --audio DIR --out data.npz")
    if images is not None:
        return import_images(images, model, shapes, recipe, ws_root)
    if text is not None:
        return import_text(text, model, shapes, tokenizer, recipe, ws_root)
    return import_audio(audio, model, shapes, recipe, ws_root)

