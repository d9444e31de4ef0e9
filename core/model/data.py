"""Input data: user ``.npz`` files (``allow_pickle=False``) or generated data that fits the
model's inputs. Arrays are keyed by input name; samples are concatenated along each input's batch
axis (``core.model.shapes.batch_axes``: axis 0 for most models, axis 1 for a [2, B, 128] recurrent
state); batches are slices along it. An input without a batch axis (a scalar, a fixed-size side
input) is one array passed whole in every batch. A model with a fixed batch (e.g. 32) is fed
exactly that many samples per batch."""
from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.errors import MixprecError
from core.model.kv_cache import decoding_positions, fill_cache, kv_cache
from core.model.load import LoadedModel
from core.model.shapes import batch_axes, fixed_batch, memory_budget, resolve_input_shapes, stacked_inputs
from core.workspace import env_bytes, read_user_file


LABEL_KEYS = ("labels", "label")
MAX_DATA_BYTES = 4 << 30  # the largest .npz read from a server path ($MIXPREC_MAX_DATA_BYTES)


def _cut(a: np.ndarray, axis: int, start, stop) -> np.ndarray:
    return a[(slice(None),) * axis + (slice(start, stop),)]


@dataclass
class Dataset:
    arrays: dict[str, np.ndarray]
    source: str  # file name or "generated"
    labels: np.ndarray | None = None  # optional class index per sample (key "labels" in the .npz)
    generated: bool = False  # invented by generate_dataset, not the user's data
    batch_axes: dict[str, int | None] = field(default_factory=dict)  # input -> batch axis (absent: 0)
    fixed_batch: int | None = None  # the model's fixed batch: every batch has exactly this many samples
    stacked: frozenset = frozenset()  # inputs without a batch axis whose samples are stacked on a new axis 0

    def axis(self, key: str) -> int | None:
        """The batch axis of an array (None: it is passed whole, or it is one of the stacked inputs)."""
        if key in self.stacked:
            return None
        return self.batch_axes.get(key, 0) if np.ndim(self.arrays[key]) else None

    @property
    def num_samples(self) -> int:
        for k in self.stacked:
            if k in self.arrays:
                return int(self.arrays[k].shape[0])
        for k, v in self.arrays.items():
            if (ax := self.axis(k)) is not None:
                return int(v.shape[ax])
        return 1 if self.arrays else 0

    @property
    def sha256(self) -> str:
        """Content hash of the arrays; remembered per set of array objects (pages ask for it at every
        run, and arrays are never changed in place)."""
        ident = tuple((k, id(v)) for k, v in sorted(self.arrays.items()))
        memo = self.__dict__.get("_sha256_memo")
        if memo is not None and memo[0] == ident:
            return memo[1]
        h = hashlib.sha256()
        for k in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
        self.__dict__["_sha256_memo"] = (ident, h.hexdigest())
        return self.__dict__["_sha256_memo"][1]

    def batches(self, batch: int = 1) -> list[dict[str, np.ndarray]]:
        """Feeds of ``batch`` samples (the model's fixed batch when it has one); a last partial batch
        is dropped. Inputs without a batch axis are passed whole in every feed."""
        if self.stacked:  # one whole sample of each stacked input per feed; batched inputs follow at batch 1
            return [{k: v[i] if k in self.stacked else v if (ax := self.axis(k)) is None else _cut(v, ax, i, i + 1)
                     for k, v in self.arrays.items()} for i in range(self.num_samples)]
        batch = self.fixed_batch or batch
        if not any(self.axis(k) is not None for k in self.arrays):
            return [dict(self.arrays)] if self.arrays else []
        return [{k: v if (ax := self.axis(k)) is None else _cut(v, ax, i, i + batch) for k, v in self.arrays.items()}
                for i in range(0, self.num_samples - batch + 1, batch)]

    def slice(self, start: int, stop: int | None = None) -> "Dataset":
        """Samples ``start:stop`` along each batch axis (labels included)."""
        tag = f"[{start or ''}:{'' if stop is None else stop}]"
        arrays = {k: v[start:stop] if k in self.stacked else v if (ax := self.axis(k)) is None
                  else _cut(v, ax, start, stop) for k, v in self.arrays.items()}
        return Dataset(arrays, self.source + tag, None if self.labels is None else self.labels[start:stop],
                       self.generated, dict(self.batch_axes), self.fixed_batch, self.stacked)


@dataclass
class MissingData(Dataset):
    """Data that mixprec could not generate (an integer input it cannot invent values for). The
    model still opens, so its inventory, shapes and default policy can be shown; anything that
    needs samples (calibration, evaluation, timing) raises ``problem``, which names the input."""

    problem: MixprecError | None = None

    @property
    def num_samples(self) -> int:
        return 0

    @property
    def sha256(self) -> str:
        return "missing-" + hashlib.sha256(str(self.problem).encode()).hexdigest()

    def batches(self, batch: int = 1) -> list[dict[str, np.ndarray]]:
        raise self.problem

    def slice(self, start: int, stop: int | None = None) -> "Dataset":
        raise self.problem


NPY_MAX_HEADER = 10_000  # bytes: numpy's own limit for an .npy header (a larger one is refused, not parsed)
NPZ_MAX_MEMBERS = 10_000


def _npz_refusal(label: str, what: str) -> MixprecError:
    return MixprecError(f"{label} is not a plain .npz: {what}",
                        "save the data with numpy.savez(path, <input name>=array, ...): one numeric array per input")


def read_npz_arrays(raw: bytes, label: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` held in ``raw``, read safely: every member must be an ``.npy`` array (not a
    nested archive or another file), its header at most ``NPY_MAX_HEADER`` bytes and of no object dtype; the
    declared shapes and sizes of all members together are checked against the memory budget
    (``core.model.shapes.memory_budget``) *before* anything is decompressed, so a small archive that would
    inflate to gigabytes (a decompression bomb) is refused, not read."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
        infos = [i for i in zf.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise MixprecError(f"{label} is not a .npz archive ({e})",
                           "save the data with numpy.savez(path, <input name>=array, ...)") from e
    if len(infos) > NPZ_MAX_MEMBERS:
        raise _npz_refusal(label, f"{len(infos)} members (at most {NPZ_MAX_MEMBERS})")
    budget, where = memory_budget()
    plan, total = [], 0
    for info in infos:
        name = info.filename
        if not name.endswith(".npy"):
            raise _npz_refusal(label, f"member {name!r} is not an array (.npy)")
        try:
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ValueError(f"npy format version {version}")
                shape, _, dtype = read_header(f, max_header_size=NPY_MAX_HEADER)
                held = info.file_size - f.tell()  # the data's bytes, after the header
        except (ValueError, SyntaxError, TypeError, zipfile.BadZipFile, OSError, EOFError, RuntimeError,
                NotImplementedError, RecursionError, MemoryError) as e:
            why = "a header larger than numpy's safe limit" if "max_header_size" in str(e) else \
                "a nested archive" if _starts_with_zip(zf, info) else f"not an .npy array ({e})"
            raise _npz_refusal(label, f"member {name!r} is {why}") from e
        if dtype.hasobject:
            raise MixprecError(f"{label} holds object (pickled) arrays, which mixprec refuses to load",
                               "save plain numeric arrays: np.savez(path, input_ids=np.asarray(ids, dtype=np.int64), "
                               "...)")
        if any(int(d) < 0 for d in shape):
            raise _npz_refusal(label, f"member {name!r} declares the shape {shape}")
        nbytes = int(np.prod([int(d) for d in shape], dtype=object)) * dtype.itemsize
        if held < nbytes:
            raise _npz_refusal(label, f"member {name!r} declares {shape} {dtype} ({nbytes:,} bytes) but holds "
                                      f"{max(held, 0):,} bytes (a truncated or forged file)")
        total += nbytes
        if total > budget:
            raise MixprecError(
                f"{label} would take {total / 2**30:.2f} GiB once unpacked (member {name!r}: {shape} {dtype}), over "
                f"the memory budget of {budget / 2**30:.2f} GiB ({where}); it was not unpacked",
                "use fewer samples (200-500 calibration samples are the usual advice), or raise "
                "MIXPREC_MEMORY_BUDGET on a machine with the memory")
        plan.append((info, name[:-4]))
    arrays = {}
    for info, key in plan:
        try:
            with zf.open(info) as f:
                arrays[key] = np.lib.format.read_array(f, allow_pickle=False, max_header_size=NPY_MAX_HEADER)
        except (ValueError, zipfile.BadZipFile, OSError, EOFError, RuntimeError) as e:
            raise _npz_refusal(label, f"member {key!r} cannot be read ({e})") from e
    return arrays


def _starts_with_zip(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    try:
        with zf.open(info) as f:
            return f.read(4) == b"PK\x03\x04"
    except Exception:  # noqa: BLE001 - only a hint for the message
        return False


def load_npz(source, model: LoadedModel | None = None, name: str | None = None, ws_root=None) -> Dataset:
    """Load a user ``.npz`` from a path or bytes. Pickled (object) arrays are refused. A path must be a
    regular file of at most ``$MIXPREC_MAX_DATA_BYTES`` (4 GiB), under ``$MIXPREC_MODEL_ROOT`` or the
    workspace ``ws_root`` when that is set (``core.workspace.read_user_file``)."""
    label = name or (Path(source).name if isinstance(source, (str, Path)) else "upload.npz")
    if isinstance(source, (str, Path)):
        raw = read_user_file(source, "data file", env_bytes("MIXPREC_MAX_DATA_BYTES", MAX_DATA_BYTES), ws_root)
    else:
        raw = bytes(source)
    if not raw.startswith(b"PK"):
        raise MixprecError(f"{label} is not a .npz archive (no zip header)",
                           "save the data with numpy.savez(path, <input name>=array, ...)")
    arrays = read_npz_arrays(raw, label)
    if not arrays:
        raise MixprecError(f"{label} holds no arrays", "save one array per model input, keyed by input name")
    ds = Dataset(arrays, label)
    if model is not None:
        check_dataset(ds, model)
    return ds


def _take_labels(ds: Dataset, names: list[str], problems: list[str]) -> None:
    for key in LABEL_KEYS:
        if key in ds.arrays and key not in names:
            labels = ds.arrays.pop(key)
            if labels.ndim not in (1, 2) or labels.dtype.kind not in "iu":  # 2: next-token ids per position (LLM)
                problems.append(f"{key}: want one integer class index per sample, or next-token ids "
                                f"[samples, seq] for a language model, got {labels.dtype} {labels.shape}")
            else:
                ds.labels = labels.astype(np.int64)


def _input_problems(ds: Dataset, model: LoadedModel) -> list[str]:
    problems = []
    for spec in model.inputs:
        a = ds.arrays.get(spec.name)
        if a is None:
            continue
        if spec.name in ds.stacked:
            if a.ndim != len(spec.shape) + 1:
                problems.append(f"{spec.name}: rank {a.ndim}, want rank {len(spec.shape) + 1}: samples along a new "
                                f"axis 0, each of the input's shape {spec.shape} (it has no batch axis)")
                continue
            a = a[0]
        if a.ndim != len(spec.shape):
            problems.append(f"{spec.name}: rank {a.ndim}, model wants rank {len(spec.shape)} {spec.shape}")
            continue
        if spec.dtype != "bfloat16" and np.dtype(a.dtype).kind != np.dtype(spec.dtype).kind:
            problems.append(f"{spec.name}: dtype {a.dtype}, model wants {spec.dtype}")
        for axis, d in enumerate(spec.shape):
            if axis != ds.axis(spec.name) and isinstance(d, int) and d > 0 and a.shape[axis] != d:
                problems.append(f"{spec.name}: axis {axis} is {a.shape[axis]}, model wants {d}")
    return problems


def check_dataset(ds: Dataset, model: LoadedModel) -> None:
    """Check ``ds`` against the model's inputs (samples along each input's batch axis), take its
    labels apart, and cast every array to the input's dtype."""
    problems = []
    names = [s.name for s in model.inputs]
    _take_labels(ds, names, problems)
    ds.batch_axes, ds.fixed_batch = batch_axes(model), fixed_batch(model)
    ds.stacked = frozenset()
    for name in stacked_inputs(model):  # one sample per array along a new axis 0 (one array alone: one sample)
        spec = next(s for s in model.inputs if s.name == name)
        a = ds.arrays.get(name)
        if a is not None and a.ndim == len(spec.shape):
            ds.arrays[name] = a[None]
        ds.stacked |= {name}
    missing = [n for n in names if n not in ds.arrays]
    if missing:
        problems.append(f"missing inputs: {', '.join(missing)} (the file has {', '.join(sorted(ds.arrays))})")
    problems += _input_problems(ds, model)
    counts = {k: v.shape[ax] for k, v in ds.arrays.items()
              if k in names and v.ndim == len(next(s.shape for s in model.inputs if s.name == k))
              and (ax := ds.axis(k)) is not None}
    counts.update({k: ds.arrays[k].shape[0] for k in ds.stacked if k in ds.arrays and ds.arrays[k].ndim})
    if len(set(counts.values())) > 1:
        problems.append("inputs have different sample counts along their batch axes: "
                        + ", ".join(f"{k}={v} (axis {ds.axis(k)})" for k, v in counts.items()))
    n = next(iter(counts.values()), None)
    if ds.labels is not None and n is not None and len(ds.labels) != n:
        problems.append(f"labels: {len(ds.labels)} labels for {n} samples")
    if ds.fixed_batch and n is not None and n < ds.fixed_batch:
        problems.append(f"{n} samples: the model's batch is fixed at {ds.fixed_batch}, give at least that many "
                        f"(a multiple of {ds.fixed_batch})")
    if problems:
        odd = {k: ax for k, ax in ds.batch_axes.items() if ax != 0}
        where = "samples along axis 0" + (
            "; " + ", ".join(f"{k}: {'samples along axis ' + str(ax) if ax is not None else 'no batch axis: whole samples stacked along a new axis 0' if k in ds.stacked else 'one array, no sample axis'}"
                             for k, ax in odd.items()) if odd else "")
        raise MixprecError(f"the data in {ds.source} does not fit the model's inputs",
                           f"save one array per input, keyed by input name, {where}", details=problems)
    # Cast to the exact dtype the model wants (e.g. int32 ids for an int64 input).
    for spec in model.inputs:
        if spec.dtype != "bfloat16" and ds.arrays[spec.name].dtype != np.dtype(spec.dtype):
            ds.arrays[spec.name] = ds.arrays[spec.name].astype(spec.dtype)
    ds.arrays = {k: ds.arrays[k] for k in names}


def _vocab_size(model: LoadedModel, input_name: str) -> int | None:
    """Rows of the embedding table that a Gather indexes with this input (directly or through a
    Cast). The table may be an initializer or computed from one (e.g. int8 weights dequantized
    by Cast and Mul): its row count comes from the initializer or from shape inference."""
    rows = {i.name: (int(i.dims[0]) if i.dims else None) for i in model.proto.graph.initializer}
    for vi in model.proto.graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            rows.setdefault(vi.name, int(dims[0].dim_value))
    frontier = {input_name}
    for node in model.proto.graph.node:
        if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Flatten") and node.input and node.input[0] in frontier:
            frontier.update(node.output)
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in frontier \
                and rows.get(node.input[0]):
            return rows[node.input[0]]
    return None


def _mask(shape: tuple, dtype) -> np.ndarray:
    """Masks of ones; a [.., seq, seq] mask (a decoder's explicit causal mask) is lower triangular."""
    if len(shape) >= 3 and shape[-1] == shape[-2]:
        return np.broadcast_to(np.tril(np.ones(shape[-2:], dtype)), shape).copy()
    return np.ones(shape, dtype)


def _invented(model: LoadedModel, spec, shape: tuple, rng) -> np.ndarray | None:
    """Values for one input, or None when mixprec cannot invent any (an integer/bool input that is
    neither token ids, a mask nor token types)."""
    lname = spec.name.lower()
    dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
    if dtype.kind in "iub":
        if "mask" in lname:
            return _mask(shape, dtype)
        if "position" in lname and dtype.kind in "iu" and shape:  # position_ids, cache_position: 0..seq-1
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        if dtype.kind == "b":
            return None
        if "token_type" in lname or "segment" in lname or lname in ("type_ids", "token_types"):
            return np.zeros(shape, dtype)
        vocab = _vocab_size(model, spec.name)
        return None if vocab is None else rng.integers(0, vocab, size=shape).astype(dtype)
    if dtype.kind == "f":
        return np.clip(rng.standard_normal(shape), -3, 3).astype(dtype)
    return None


def generated_bytes(model: LoadedModel, num_samples: int, shapes: dict[str, tuple[int, ...]]) -> int:
    """Bytes :func:`generate_dataset` would allocate for ``num_samples`` at ``shapes`` (before it does)."""
    axes, fb, stacked = batch_axes(model), fixed_batch(model), stacked_inputs(model)
    if fb:
        num_samples = -(-num_samples // fb) * fb
    total = 0
    for spec in model.inputs:
        shape = [int(d) for d in shapes[spec.name]]
        if spec.name in stacked:
            shape = [int(num_samples), *shape]
        elif axes[spec.name] is not None:
            shape[axes[spec.name]] = int(num_samples)
        item = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype).itemsize
        total += int(np.prod(shape, dtype=np.float64)) * item
    return total


def generate_dataset(model: LoadedModel, num_samples: int = 32, seed: int = 0,
                     shapes: dict | None = None) -> Dataset:
    """Synthetic data fitting the input specs at ``shapes``, ``num_samples`` along each input's batch
    axis (rounded up to a multiple of a fixed batch); inputs without one keep their shape. Token ids
    within the embedding's vocabulary, masks of ones (a square [.., seq, seq] mask: causal, lower
    triangular), position ids 0..seq-1 (``position_ids``, ``cache_position``), token types zero,
    floats ~ N(0, 1) clipped to [-3, 3]. A KV-cache decoder (:mod:`core.model.kv_cache`): positions past …
    past + seq − 1 and a cache holding the model's own keys and values of a prompt. Any other integer or bool
    input is refused (MixprecError): give an .npz."""
    rng = np.random.default_rng(seed)
    shapes = shapes or resolve_input_shapes(model)
    axes, fb, stacked = batch_axes(model), fixed_batch(model), stacked_inputs(model)
    if fb:
        num_samples = -(-num_samples // fb) * fb
    arrays, refused = {}, []
    for spec in model.inputs:
        shape = list(shapes[spec.name])
        if spec.name in stacked:  # whole samples along a new axis 0
            shape = [num_samples, *shape]
        elif axes[spec.name] is not None:
            shape[axes[spec.name]] = num_samples
        arr = _invented(model, spec, tuple(shape), rng)
        if arr is None:
            refused.append(spec)
        arrays[spec.name] = arr
    if refused:
        what = ", ".join(f"{s.name} ({s.dtype}, shape {list(s.shape)})" for s in refused)
        names = ", ".join(s.name for s in refused)
        raise MixprecError(
            f"{what} {'has no value' if len(refused) == 1 else 'have no values'} mixprec can invent "
            "(not token ids, a mask or token types)",
            f"give an .npz with {names} and the other inputs, keyed by input name "
            "(python -m core build MODEL --data data.npz, or upload it on the Model page)")
    source = "generated"
    kv = kv_cache(model)
    if kv is not None:  # a decoder with its KV cache: the new tokens follow a prompt whose keys and values it holds
        past = arrays[kv.cache_inputs[0]].shape[kv.past_axis]
        decoding_positions(kv, arrays, past)
        source = f"generated; {fill_cache(model, kv, arrays, _vocab_size(model, kv.ids) if kv.ids else None, rng)}"
    return Dataset(arrays, source, generated=True, batch_axes=axes, fixed_batch=fb, stacked=stacked)
