"""Models whose weights stay in their external data files: every model over 2 GB (protobuf cannot
serialise more), and any model whose external data is at least ``$MIXPREC_EXTERNAL_WEIGHTS_FROM``
(1 GiB). Smaller external data is read into the graph, as before.

Such a model's ``LoadedModel.proto`` is its graph only: each big initializer is a reference
(location, offset, length) into a data file, and ``LoadedModel.weights`` (:class:`ExternalWeights`)
says where each file's bytes are read (the user's files, in place) and which workspace folder
(``external/<sha256>/``) holds the normalised graph. Nothing holds a second copy of the weights
in memory:

* values are read when needed, one tensor at a time, through a read-only memory map
  (:func:`read_tensor`; onnx-graphsurgeon constants get :class:`ExternalValues`, read uncached
  by :func:`values_of`);
* new weights the compiler makes (INT8, float16, smoothed) go to the compiled model's own data
  file as they are made (:class:`Spill`), never into the proto;
* checks run on the graph without its weights (:func:`check_graph`), shape inference by path;
* a runtime is given a file (:func:`save_with_data`): the graph beside hard links of the data files it
  references. ONNX Runtime then maps the files; it refuses data files that resolve outside the
  model's folder (so no symlinks). The user's own files are never linked — onnx refuses to load a data
  file with several links, so a link would break the user's model for onnx — so the first runtime
  use copies each data file once into the workspace folder (a reflink where the file system has
  them, else a copy that keeps the file's holes), and runtime files link that copy.
  Exported models get real copies (:func:`copy_file`), which onnx loads.

The model's hash covers its data files, streamed (:func:`model_sha256`): the bytes its tensors read
(:func:`referenced_ranges`; a data file that holds much more than those is read for them only, and only
they count as the model's weights); the digest of a big file is cached in the workspace by its path,
inode, size and mtime.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import (_get_attribute_tensors, _get_initializer_tensors, load_external_data_for_tensor,
                                       uses_external_data)
from onnx_graphsurgeon.ir.tensor import LazyValues

from core.errors import MixprecError
from core.workspace import (Workspace, atomic_write_bytes, atomic_write_text, cache_note, human_bytes, sha256_bytes,
                            sha256_file, write_error)

EXTERNAL_FROM = 1 << 30  # external data of at least this stays external (env MIXPREC_EXTERNAL_WEIGHTS_FROM)
INLINE_BELOW = 64 << 10  # external tensors smaller than this (scalars, shapes, biases) are read into the graph
ALIGN = 4096  # offsets of tensors in mixprec's data files: page-aligned, so ONNX Runtime can map them
SPILL_PREFIX = ".spill-"  # a compiled model's data file until it is saved (workspace external/<sha>/tmp/)
HASH_CACHE_FROM = 64 << 20  # files from this size have their sha256 cached by stamp
FICLONE = 0x40049409  # Linux ioctl: a copy-on-write clone (btrfs, xfs)
_LINK_FALLBACK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES, getattr(errno, "ENOTSUP", 95),
                  getattr(errno, "EOPNOTSUPP", 95)}


@dataclass(frozen=True)
class ExternalWeights:
    """Where a model's external data lives: ``folder`` (workspace ``external/<sha>/``: the normalised
    graph, the data it made itself, runtime copies of the user's files) and ``sources`` (location ->
    the file its bytes are read from)."""

    folder: Path
    sources: dict[str, Path] = field(default_factory=dict)

    def read_path(self, loc: str) -> Path:
        """The file to read ``loc`` from: the workspace copy once there is one, else its source."""
        copy = self.folder / loc
        return copy if loc in self.sources and copy.is_file() else self.sources[loc]

    def runtime_file(self, loc: str) -> Path:
        """``loc`` as a file in ``folder`` that may be linked beside a runtime file (copied there once)."""
        src, dst = self.sources[loc], self.folder / loc
        if dst.is_file() and (src == dst or dst.stat().st_size == src.stat().st_size):
            return dst
        with folder_lock(self.folder):
            if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
                copy_file(src, dst)
                cache_note(f"{loc} ({human_bytes(src.stat().st_size)}) was copied once into the workspace "
                           f"({self.folder}) for the runtimes: a link would make onnx refuse your model's data file")
        return dst


# --- references ----------------------------------------------------------------------------------
def _info(t: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def location(t: TensorProto) -> str:
    return _info(t).get("location", "")


def external_tensors(proto: onnx.ModelProto) -> list[TensorProto]:
    """The tensors (initializers and attribute values, subgraphs included) stored as external data."""
    return [t for t in [*_get_initializer_tensors(proto), *_get_attribute_tensors(proto)] if uses_external_data(t)]


def data_files(proto: onnx.ModelProto) -> list[str]:
    """The external data files the model references (their locations), sorted."""
    return sorted({location(t) for t in external_tensors(proto)})


def files_bytes(base_dir: Path, files: list[str]) -> int:
    return sum((Path(base_dir) / f).stat().st_size for f in files)


def _int(value, default: int | None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _extent(t: TensorProto, size: int) -> tuple[int, int]:
    """The bytes ``[start, end)`` of its data file that tensor ``t`` is read from, within ``size``: its
    offset and length; without a length, its dims × dtype size (onnx reads to the end of the file, so the
    file's size is in the hash too); a value that is not a number or a dtype without a byte size: the
    file from the offset on (what onnx reads, kept in the hash)."""
    info = _info(t)
    start = _int(info.get("offset") or 0, None)
    if start is None or start < 0:
        return 0, size
    length = _int(info.get("length"), None) if info.get("length") not in (None, "") else None
    if length is None:
        dt = _np_dtype(t.data_type)
        length = int(np.prod([int(d) for d in t.dims], dtype=np.int64)) * dt.itemsize if dt is not None else size - start
    return min(start, size), min(start + max(length, 0), size)


def referenced_ranges(proto: onnx.ModelProto, base_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Per data file (location), the byte ranges the model's external tensors are read from, sorted and
    merged (``[start, end)``, within the file). Bytes of a data file outside them are never read by the
    model: they are neither its weights (:func:`referenced_bytes`) nor in its hash (:func:`file_sha256`)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for t in external_tensors(proto):
        loc = location(t)
        spans.setdefault(loc, []).append(t)
    out: dict[str, list[tuple[int, int]]] = {}
    for loc, tensors in spans.items():
        size = (Path(base_dir) / loc).stat().st_size
        merged: list[list[int]] = []
        for a, b in sorted(_extent(t, size) for t in tensors):
            if b <= a:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out[loc] = [(a, b) for a, b in merged]
    return out


def referenced_bytes(ranges: dict[str, list[tuple[int, int]]]) -> int:
    """The bytes of the model's data files its tensors reference (:func:`referenced_ranges`): its external
    weights, however big the files around them are."""
    return sum(b - a for spans in ranges.values() for a, b in spans)


def rename_location(proto: onnx.ModelProto, old: str, new: str) -> None:
    """Make the tensors stored in data file ``old`` reference it as ``new``."""
    for t in external_tensors(proto):
        for e in t.external_data:
            if e.key == "location" and e.value == old:
                e.value = new


def _np_dtype(data_type: int):
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, TypeError, ValueError):
        return None
    return dt if data_type != TensorProto.BFLOAT16 and dt.kind in "fiub" else None


def read_tensor(t: TensorProto, path: Path) -> np.ndarray:
    """The values of an external tensor stored in the file ``path``: a read-only memory map of its bytes
    (no copy), or, for a dtype numpy cannot map (bfloat16, float8, 4-bit), onnx's conversion of them."""
    info, dims, path = _info(t), tuple(int(d) for d in t.dims), Path(path)
    dt = _np_dtype(t.data_type)
    if dt is None:
        copy = TensorProto()
        copy.CopyFrom(t)
        for e in copy.external_data:
            if e.key == "location":
                e.value = path.name
        load_external_data_for_tensor(copy, str(path.parent))
        return numpy_helper.to_array(copy)
    count = int(np.prod(dims, dtype=np.int64))
    offset, need = int(info.get("offset", 0) or 0), count * dt.itemsize
    size = path.stat().st_size
    if int(info.get("length", need) or need) < need or offset + need > size:
        raise MixprecError(f"the external data of {t.name} ({need} bytes at offset {offset} of {path.name}) "
                           f"lies beyond the end of the file ({size} bytes)",
                           "copy the model's data files again, or re-export the model")
    if count == 0:
        return np.zeros(dims, dt)
    return np.asarray(np.memmap(path, dtype=dt.newbyteorder("<"), mode="r", offset=offset, shape=dims))


def inline_small(proto: onnx.ModelProto, base_dir: Path, below: int = INLINE_BELOW) -> int:
    """Read into the graph the external tensors under ``below`` bytes and every attribute tensor
    (Constant values): what analysis reads as numbers. Returns the bytes read."""
    read = 0
    for t in _get_initializer_tensors(proto):
        if uses_external_data(t) and int(_info(t).get("length", 0) or 0) < below:
            load_external_data_for_tensor(t, str(base_dir))
            read += len(t.raw_data)
    for t in _get_attribute_tensors(proto):
        if uses_external_data(t):
            load_external_data_for_tensor(t, str(base_dir))
            read += len(t.raw_data)
    return read


def check_graph(proto: onnx.ModelProto) -> None:
    """onnx's checker on the graph without its external weights: each external initializer of the main
    graph is checked as a graph input of its type and shape (in memory the checker would look for the
    data files in the current folder, and by path it refuses the workspace's linked copies)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(proto)
    g = twin.graph
    ext = [i for i, t in enumerate(g.initializer) if uses_external_data(t)]
    inputs = {i.name for i in g.input}
    for i in reversed(ext):
        t = g.initializer[i]
        if t.name not in inputs:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        del g.initializer[i]
    onnx.checker.check_model(twin)


# --- onnx-graphsurgeon constants over external data ---------------------------------------------
class ExternalValues(LazyValues):
    """gs ``LazyValues`` whose ``load()`` maps the tensor's bytes; gs exports the original reference
    as long as the constant was never loaded through ``Constant.values`` (use :func:`values_of`)."""

    def __init__(self, tensor: TensorProto, path: Path):
        super().__init__(tensor)
        self.path = Path(path)

    def load(self):
        return read_tensor(self.tensor, self.path)


def _graph_constants(graph: gs.Graph):
    yield from (t for t in graph.tensors().values() if isinstance(t, gs.Constant))
    for node in graph.nodes:
        for value in node.attrs.values():
            for g in (value if isinstance(value, list) else [value]):
                if isinstance(g, gs.Graph):
                    yield from _graph_constants(g)


def attach(graph: gs.Graph, weights: ExternalWeights) -> int:
    """Give every constant of ``graph`` stored as external data an :class:`ExternalValues`. Returns how many."""
    n = 0
    for c in _graph_constants(graph):
        v = c._values
        if isinstance(v, LazyValues) and not isinstance(v, ExternalValues) and isinstance(v.tensor, TensorProto) \
                and uses_external_data(v.tensor):
            c._values = ExternalValues(v.tensor, weights.read_path(location(v.tensor)))
            n += 1
    return n


def is_external(t) -> bool:
    return isinstance(t, gs.Constant) and isinstance(t._values, ExternalValues)


def values_of(t: gs.Constant) -> np.ndarray:
    """A constant's values; an external one's are mapped afresh and not kept (``Constant.values``
    would keep them, and gs would then write them into the proto)."""
    return t._values.load() if is_external(t) else t.values


def dtype_of(t: gs.Constant):
    """A constant's numpy dtype without reading an external one's values."""
    return t._values.dtype if is_external(t) else t.values.dtype


# --- new weights, written as they are made ------------------------------------------------------
def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


CHUNK_BYTES = 64 << 20  # external weights larger than this are converted in chunks of this size


def _drop_pages(values: np.ndarray) -> None:
    """Tell the kernel a memory map's pages are not needed now (they stay readable: read again from
    the file), so a streamed pass over a large weight does not keep it resident."""
    base = values
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    mm = getattr(base, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


class Spill:
    """A new data file in ``folder`` that tensors are appended to (page-aligned), each returned as an
    external reference; removed when the Spill is collected (saving links or moves it first)."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, p = tempfile.mkstemp(prefix=SPILL_PREFIX, suffix=".data", dir=folder)
        except OSError as e:
            raise write_error(folder / "compiled weights", e) from e
        os.fchmod(fd, 0o644)  # as a file written the usual way (mkstemp makes it private)
        self.path, self.file = Path(p), os.fdopen(fd, "wb")
        weakref.finalize(self, _unlink, self.path)
        weakref.finalize(self, self.file.close)
        self.location = self.path.name  # what its tensors' references name (save_compiled renames them in a proto)
        self.bytes = 0

    def add(self, name: str, values: np.ndarray) -> TensorProto:
        arr = np.ascontiguousarray(values)
        try:
            pos = self.file.tell()
            pad = (-pos) % ALIGN
            self.file.write(b"\0" * pad)
            self.file.write(arr.reshape(-1).view(np.uint8).data)
            self.file.flush()
        except OSError as e:
            raise write_error(self.path, e, arr.nbytes) from e
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype), dims=list(arr.shape))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.location), ("offset", str(pos + pad)), ("length", str(arr.nbytes))):
            t.external_data.add(key=k, value=v)
        self.bytes = pos + pad + arr.nbytes
        return t

    def add_converted(self, name: str, source: np.ndarray, steps: tuple, chunk_bytes: int | None = None) -> TensorProto:
        """Append ``source`` (e.g. a memory map of an external weight) converted through the dtypes
        ``steps`` (``(np.float16,)``; ``(np.float16, np.float32)`` rounds to float16 and back), one
        chunk of rows at a time: the converted tensor is never whole in memory, and the source's pages
        are dropped after each chunk (a memory map's pages would otherwise stay resident)."""
        out_dt = np.dtype(steps[-1])
        flat = source.reshape(-1)
        rows = max(1, (chunk_bytes or CHUNK_BYTES) // max(flat.itemsize, 1))
        try:
            pos = self.file.tell()
            pad = (-pos) % ALIGN
            self.file.write(b"\0" * pad)
            for start in range(0, flat.size, rows):
                part = np.asarray(flat[start:start + rows])
                for dt in steps:
                    part = part.astype(dt)
                self.file.write(part.view(np.uint8).data)
                _drop_pages(source)
            self.file.flush()
        except OSError as e:
            raise write_error(self.path, e, flat.size * out_dt.itemsize) from e
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(out_dt), dims=list(source.shape))
        t.data_location = TensorProto.EXTERNAL
        nbytes = flat.size * out_dt.itemsize
        for k, v in (("location", self.location), ("offset", str(pos + pad)), ("length", str(nbytes))):
            t.external_data.add(key=k, value=v)
        self.bytes = pos + pad + nbytes
        return t

    def converted(self, name: str, source: gs.Constant, steps: tuple) -> gs.Constant | None:
        """An external constant's values converted through ``steps`` straight into this file
        (:meth:`add_converted`); None when ``source`` is not external or is small (convert it in memory)."""
        if not is_external(source):
            return None
        values = values_of(source)
        if values.nbytes < CHUNK_BYTES:
            return None
        return gs.Constant(name, ExternalValues(self.add_converted(name, values, steps), self.path))

    def constant(self, name: str, values: np.ndarray) -> gs.Constant:
        """A gs constant of ``values``: in this file when it is at least INLINE_BELOW bytes."""
        if values.nbytes < INLINE_BELOW or values.dtype == np.bool_:
            return gs.Constant(name, values)
        return gs.Constant(name, ExternalValues(self.add(name, values), self.path))

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


def externalize(proto: onnx.ModelProto, spill: Spill, below: int = INLINE_BELOW) -> int:
    """Move the main graph's inline initializers of at least ``below`` bytes (e.g. weights folded
    by normalisation) into ``spill``. Returns how many bytes moved."""
    moved = 0
    for i, init in enumerate(proto.graph.initializer):
        if uses_external_data(init) or _np_dtype(init.data_type) is None:
            continue
        arr = numpy_helper.to_array(init)
        if arr.nbytes >= below:
            proto.graph.initializer[i].CopyFrom(spill.add(init.name, arr))
            moved += arr.nbytes
    spill.close()
    return moved


# --- files ----------------------------------------------------------------------------------------
STALE_SECONDS = 86400  # a temp file in external/<sha>/tmp/ older than this is a leftover of a killed process


def sweep_tmp(folder: Path, max_age: float = STALE_SECONDS) -> int:
    """Remove the leftovers in ``folder/tmp`` (Spill files, temp folders) older than ``max_age``."""
    removed, now = 0, time.time()
    tmp = Path(folder) / "tmp"
    for p in tmp.iterdir() if tmp.is_dir() else []:
        try:
            if now - p.stat().st_mtime > max_age:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
                removed += 1
        except OSError:
            pass
    return removed



@contextmanager
def folder_lock(folder: Path):
    """An exclusive lock on ``folder`` (one process prepares a model's external folder at a time)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _copy_sparse(fi: int, fo: int, size: int) -> None:
    """Copy the data regions of ``fi`` (SEEK_DATA/SEEK_HOLE) to ``fo``; its holes stay holes."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fi, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = os.lseek(fi, start, os.SEEK_HOLE)
        os.lseek(fi, start, os.SEEK_SET)
        os.lseek(fo, start, os.SEEK_SET)
        left = end - start
        while left > 0:
            n = os.sendfile(fo, fi, None, min(left, 1 << 30))
            if n <= 0:
                raise OSError(errno.EIO, "short copy")
            left -= n
        pos = end
    os.ftruncate(fo, size)


def copy_file(src: Path, dst: Path) -> Path:
    """``src`` copied to ``dst`` (atomically: a temp file renamed): a copy-on-write clone where the file
    system has them, else a streamed copy that keeps the file's holes."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    size = src.stat().st_size
    try:
        with open(src, "rb") as fsrc, open(tmp, "wb") as fdst:
            try:
                fcntl.ioctl(fdst.fileno(), FICLONE, fsrc.fileno())
            except OSError:
                if hasattr(os, "SEEK_DATA"):
                    _copy_sparse(fsrc.fileno(), fdst.fileno(), size)
                else:  # pragma: no cover - not Linux
                    shutil.copyfileobj(fsrc, fdst, 8 << 20)
        os.replace(tmp, dst)
    except OSError as e:
        _unlink(tmp)
        raise write_error(dst, e, size) from e
    return dst


def link_file(src: Path, dst: Path) -> str:
    """``dst`` as a hard link of ``src`` (a file of the workspace): "linked", "present" if it already
    is one, or "copied" where the file system refuses links."""
    src, dst = Path(src), Path(dst)
    try:
        if dst.exists() and os.path.samefile(src, dst):
            return "present"
    except OSError:
        pass
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, tmp)
        except OSError as e:
            if e.errno not in _LINK_FALLBACK:
                raise
            _unlink(tmp)
            copy_file(src, dst)
            return "copied"
        os.replace(tmp, dst)
    except OSError as e:
        _unlink(tmp)
        raise write_error(dst, e, src.stat().st_size if src.exists() else None) from e
    return "linked"


def save_with_data(proto: onnx.ModelProto, path: Path, weights: ExternalWeights,
                   extra: dict[str, Path] | None = None, copy: bool = False) -> Path:
    """Write ``proto`` (a graph whose data files are ``weights``' or ``extra``'s: location -> file) at
    ``path``, with those files beside it: hard links of workspace files, or with ``copy`` real copies
    (an export the user takes away, which onnx loads)."""
    path = Path(path)
    extra = extra or {}
    for loc in data_files(proto):
        if loc in extra:
            src = extra[loc]
        elif loc in weights.sources:
            src = weights.read_path(loc) if copy else weights.runtime_file(loc)
        else:
            raise MixprecError(f"{path.name} references a data file {loc} that its model does not have",
                               "load the model again")
        dst = path.parent / loc
        if src.resolve() != dst.resolve():
            copy_file(src, dst) if copy else link_file(src, dst)
    return atomic_write_bytes(path, proto.SerializeToString())


def save_compiled(proto: onnx.ModelProto, path: Path, weights: ExternalWeights, spill: Spill | None,
                  copy: bool = False) -> Path:
    """A compiled model with external weights at ``path``: its new weights as ``<name>.data`` beside it
    (the Spill's file), the original ones beside it too (:func:`save_with_data`)."""
    path = Path(path)
    extra = {}
    if spill is not None and spill.bytes:
        spill.close()
        files = data_files(proto)
        new = [f for f in files if f not in weights.sources]  # the Spill's file, by whatever name it had
        own = next(n for n in (f"{path.name}.data", f"{path.name}.mixprec.data", f"{path.stem}.{uuid.uuid4().hex}.data")
                   if n not in weights.sources)
        for f in new:
            rename_location(proto, f, own)
        extra[own] = spill.path
    return save_with_data(proto, path, weights, extra, copy)


# --- hashes, streamed ----------------------------------------------------------------------------
# A data file with more bytes than this outside the ranges its model references is hashed by those ranges
# only (:func:`file_sha256`): a 20 GiB file holding 1 MB of the model's weights is read for that 1 MB.
# Below it (tensors back to back, onnx's alignment gaps of at most 64 KiB) the whole file is hashed, so the
# hash of an ordinary model is what it always was (its runs, caches and policies keep their key).
RANGED_HASH_FROM = 64 << 20
RANGED_HASH_TAG = b"mixprec-ranges-v1"
_READ = 1 << 20


def _ranges_sha256(path: Path, size: int, ranges: list[tuple[int, int]]) -> str:
    """The sha256 of the file's size, each range's bounds and bytes (nothing else of the file is read)."""
    h = hashlib.sha256(RANGED_HASH_TAG + b"\0" + str(size).encode())
    with open(path, "rb") as f:
        for a, b in ranges:
            h.update(f"\0{a}-{b}\0".encode())
            f.seek(a)
            left = b - a
            while left > 0:
                chunk = f.read(min(_READ, left))
                if not chunk:  # the file shrank while it was read: its bounds are in the hash, the rest is not there
                    break
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def file_sha256(path: Path, ws: Workspace | None, ranges: list[tuple[int, int]] | None = None) -> str:
    """The sha256 of a file, streamed; with ``ranges`` (the byte ranges a model reads, :func:`referenced_ranges`)
    that leave more than :data:`RANGED_HASH_FROM` bytes of it unread, the digest of its size and those ranges
    only (a change of any byte the model reads, or of the file's size, changes it; bytes no tensor reads
    do not matter to the model). For a big file it is cached in ``ws`` by its path, inode, size, mtime (and
    ranges): a rewritten file has a new mtime or inode, so it is hashed again."""
    path = Path(path).resolve()
    st = path.stat()
    if ranges is not None and st.st_size - sum(b - a for a, b in ranges) <= RANGED_HASH_FROM:
        ranges = None  # (nearly) all of it is read: the whole file's digest, as always
    read = st.st_size if ranges is None else sum(b - a for a, b in ranges)
    cached = None
    if ws is not None and read >= HASH_CACHE_FROM:
        stamp = f"{path}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
        if ranges is not None:
            stamp += "|" + ",".join(f"{a}-{b}" for a, b in ranges)
        key = sha256_bytes(stamp.encode())[:32]
        cached = ws.file_hashes / f"{key}.json"
        try:
            return str(json.loads(cached.read_text())["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    digest = sha256_file(path) if ranges is None else _ranges_sha256(path, st.st_size, ranges)
    if cached is not None:
        atomic_write_text(cached, json.dumps({"sha256": digest}))
    return digest


def saved_sha256(path: Path, weights: ExternalWeights | None = None) -> str:
    """The hash of a model file written for a runtime: its bytes, and (weights kept external) each data
    file beside it that is not one of the model's own (the compiled model's new weights); the model's
    data files are covered by its sha256."""
    path = Path(path)
    data = path.read_bytes()
    if weights is None:
        return sha256_bytes(data)
    proto = onnx.load_model_from_string(data)
    return model_sha256(data, path.parent, [f for f in data_files(proto) if f not in weights.sources])


def model_sha256(data: bytes, base_dir: Path, files: list[str], ws: Workspace | None = None,
                 ranges: dict[str, list[tuple[int, int]]] | None = None) -> str:
    """The model's hash: of its bytes alone without external data (as always), else of its bytes and
    each data file's name and streamed digest (:func:`file_sha256`; ``ranges``: the byte ranges the model
    reads of each file, :func:`referenced_ranges`)."""
    if not files:
        return sha256_bytes(data)
    h = hashlib.sha256(data)
    for f in sorted(files):
        digest = file_sha256(Path(base_dir) / f, ws, None if ranges is None else ranges.get(f, []))
        h.update(b"\0" + f.encode() + b"\0" + bytes.fromhex(digest))
    return h.hexdigest()
