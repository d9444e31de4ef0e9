"""Input data: user ``.npz`` files (``allow_pickle=False``) or generated data that fits the
model's inputs. Arrays are keyed by input name and concatenated along axis 0 (the sample
axis); batches are slices of it."""
from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import MixprecError
from .model import LoadedModel, resolve_input_shapes


LABEL_KEYS = ("labels", "label")


@dataclass
class Dataset:
    arrays: dict[str, np.ndarray]
    source: str  # file name or "generated"
    labels: np.ndarray | None = None  # optional class index per sample (key "labels" in the .npz)

    @property
    def num_samples(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0]) if self.arrays else 0

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for k in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
        return h.hexdigest()

    def batches(self, batch: int = 1) -> list[dict[str, np.ndarray]]:
        n = self.num_samples
        return [{k: v[i:i + batch] for k, v in self.arrays.items()} for i in range(0, n - batch + 1, batch)]

    def slice(self, start: int, stop: int | None = None) -> "Dataset":
        """Samples ``start:stop`` (labels included)."""
        cut = slice(start, stop)
        tag = f"[{start or ''}:{'' if stop is None else stop}]"
        return Dataset({k: v[cut] for k, v in self.arrays.items()}, self.source + tag,
                       None if self.labels is None else self.labels[cut])


def load_npz(source, model: LoadedModel | None = None, name: str | None = None) -> Dataset:
    """Load a user ``.npz`` from a path or bytes. Pickled (object) arrays are refused."""
    label = name or (Path(source).name if isinstance(source, (str, Path)) else "upload.npz")
    if isinstance(source, (str, Path)):
        if not Path(source).is_file():
            raise MixprecError(f"the data file {source} does not exist", "check the path of the .npz file")
        raw = Path(source).read_bytes()
    else:
        raw = bytes(source)
    if not raw.startswith(b"PK"):
        raise MixprecError(f"{label} is not a .npz archive (no zip header)",
                           "save the data with numpy.savez(path, <input name>=array, ...)")
    arrays = {}
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            for k in z.files:
                arrays[k] = z[k]
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise MixprecError(
                f"{label} holds object (pickled) arrays, which mixprec refuses to load",
                "save plain numeric arrays: np.savez(path, input_ids=np.asarray(ids, dtype=np.int64), ...)",
            ) from e
        raise MixprecError(f"{label} is not a readable .npz ({e})", "save the data with numpy.savez") from e
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise MixprecError(f"{label} is not a .npz archive ({e})",
                           "save the data with numpy.savez(path, <input name>=array, ...)") from e
    if not arrays:
        raise MixprecError(f"{label} holds no arrays", "save one array per model input, keyed by input name")
    ds = Dataset(arrays, label)
    if model is not None:
        check_dataset(ds, model)
    return ds


def check_dataset(ds: Dataset, model: LoadedModel) -> None:
    problems = []
    names = [s.name for s in model.inputs]
    for key in LABEL_KEYS:
        if key in ds.arrays and key not in names:
            labels = ds.arrays.pop(key)
            if labels.ndim != 1 or labels.dtype.kind not in "iu":
                problems.append(f"{key}: want one integer class index per sample, got {labels.dtype} {labels.shape}")
            else:
                ds.labels = labels.astype(np.int64)
    missing = [n for n in names if n not in ds.arrays]
    if missing:
        problems.append(f"missing inputs: {', '.join(missing)} (the file has {', '.join(sorted(ds.arrays))})")
    counts = {k: v.shape[0] if v.ndim else 0 for k, v in ds.arrays.items() if k in names}
    if len(set(counts.values())) > 1:
        problems.append("inputs have different sample counts on axis 0: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for spec in model.inputs:
        a = ds.arrays.get(spec.name)
        if a is None:
            continue
        if a.ndim != len(spec.shape):
            problems.append(f"{spec.name}: rank {a.ndim}, model wants rank {len(spec.shape)} {spec.shape}")
            continue
        if spec.dtype != "bfloat16" and np.dtype(a.dtype).kind != np.dtype(spec.dtype).kind:
            problems.append(f"{spec.name}: dtype {a.dtype}, model wants {spec.dtype}")
        for axis, d in enumerate(spec.shape):
            if axis > 0 and isinstance(d, int) and d > 0 and a.shape[axis] != d:
                problems.append(f"{spec.name}: axis {axis} is {a.shape[axis]}, model wants {d}")
    n = next((v.shape[0] for k, v in ds.arrays.items() if k in names and v.ndim), None)
    if ds.labels is not None and n is not None and len(ds.labels) != n:
        problems.append(f"labels: {len(ds.labels)} labels for {n} samples")
    if problems:
        raise MixprecError(f"the data in {ds.source} does not fit the model's inputs",
                           "save one array per input, keyed by input name, samples along axis 0", details=problems)
    # Cast to the exact dtype the model wants (e.g. int32 ids for an int64 input).
    for spec in model.inputs:
        if spec.dtype != "bfloat16" and ds.arrays[spec.name].dtype != np.dtype(spec.dtype):
            ds.arrays[spec.name] = ds.arrays[spec.name].astype(spec.dtype)
    ds.arrays = {k: ds.arrays[k] for k in names}


def _vocab_size(model: LoadedModel, input_name: str) -> int | None:
    """Rows of the embedding table that a Gather indexes with this input (directly or through a Cast)."""
    inits = {i.name: i for i in model.proto.graph.initializer}
    frontier = {input_name}
    for node in model.proto.graph.node:
        if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Flatten") and node.input and node.input[0] in frontier:
            frontier.update(node.output)
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in frontier and node.input[0] in inits:
            return int(inits[node.input[0]].dims[0])
    return None


def generate_dataset(model: LoadedModel, num_samples: int = 32, seed: int = 0,
                     shapes: dict | None = None) -> Dataset:
    """Synthetic data fitting the input specs: token ids within the embedding's vocabulary,
    masks of ones, token types zero, floats ~ N(0, 1) clipped to [-3, 3]."""
    rng = np.random.default_rng(seed)
    shapes = shapes or resolve_input_shapes(model)
    arrays = {}
    for spec in model.inputs:
        shape = (num_samples, *shapes[spec.name][1:])
        lname = spec.name.lower()
        dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
        if dtype.kind in "iu":
            if "mask" in lname:
                arr = np.ones(shape, dtype)
            elif "type" in lname or "segment" in lname:
                arr = np.zeros(shape, dtype)
            else:
                vocab = _vocab_size(model, spec.name) or 2
                arr = rng.integers(0, vocab, size=shape).astype(dtype)
        elif dtype.kind == "b":
            arr = np.ones(shape, dtype)
        else:
            arr = np.clip(rng.standard_normal(shape), -3, 3).astype(dtype)
        arrays[spec.name] = arr
    return Dataset(arrays, "generated")
