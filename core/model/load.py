"""Model loading and validation, in Polygraphy's loader style (``load_model`` is its ``ModelFromPath``).

A model is given as a path or a bundled sample (``sample:minilm``,
``sample:tiny-cnn``, ``sample:tiny-transformer``). Loading validates the file
with onnx's checker and shape inference, refuses external data outside the
model's folder and gives every node a stable unique name (input shapes: ``core.model.shapes``).
A path is read only if it is a regular file of at most ``$MIXPREC_MAX_MODEL_BYTES`` (2 GiB,
protobuf's limit), and, when ``$MIXPREC_MODEL_ROOT`` is set (a team server), only under it or the
workspace (``core.workspace.read_user_file``): never a FIFO, a device or ``/proc``.

A model whose external data is big (over 2 GB in all, or at least ``$MIXPREC_EXTERNAL_WEIGHTS_FROM``,
1 GiB) keeps its weights in its data files (``core.model.external``): it is checked and its shapes inferred
by path (``onnx.checker.check_model(path)``, ``onnx.shape_inference.infer_shapes_path``), its
``proto`` is the graph only, and runtimes get files (:meth:`LoadedModel.save`). Smaller external data
is read into the graph. Either way the hash covers the data files, streamed.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper
from onnx.external_data_helper import _get_all_tensors, load_external_data_for_model, uses_external_data

from core.errors import MixprecError
from core.model.external import (EXTERNAL_FROM, HASH_CACHE_FROM, ExternalWeights, Spill, check_graph, data_files, externalize,
                                 folder_lock, inline_small, model_sha256, referenced_bytes, referenced_ranges,
                                 rename_location, save_with_data, sweep_tmp)
from core.model.graph import without_weights
from core.model.branches import branch_inputs, branch_sha256, default_branches, fold_branches
from core.model.ms_ops import unfuse_ms_ops
from core.model.normalize import NormStep, default_opset, normalize_model, refuse_quantized
from core.model.samples import SAMPLES, materialize_sample
from core.workspace import TempFolder, Workspace, atomic_write_bytes, check_confined, env_bytes, read_user_file

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SAMPLE_PREFIX = "sample:"
MAX_MODEL_BYTES = 2 << 30  # protobuf's limit for one file (bigger models keep their weights as external data)
GRAPH_FILE, OWN_DATA = "mixprec.model.onnx", "mixprec.model.data"  # in external/<sha>/: the normalised graph, its data


@dataclass(frozen=True)
class TensorSpec:
    """An input or output: name, numpy dtype name and shape (ints, or str for symbolic dims)."""

    name: str
    dtype: str
    shape: tuple

    @property
    def is_float(self) -> bool:
        return self.dtype in ("float32", "float16", "float64", "bfloat16")

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int) or d <= 0]


@dataclass
class LoadedModel:
    """A validated model. ``proto`` is the *normalised* model (``core.model.normalize``: IR/opset upgraded,
    constant weights folded into initializers) with stable node names and inferred shapes; it is what
    compile, calibration and every ORT/TensorRT session use (through ``proto``/``serialized()``).
    ``path`` is the user's file, shown to the user only: never hand it to a runtime. ``sha256`` is of
    the user's original bytes and data files (policies reference that hash), ``size_bytes`` their
    size on disk; ``normalization`` lists what was changed, ``original_opset`` the file's own opset.
    ``weights``: set when the weights stay external (``core.model.external``): ``proto`` is then the
    graph only, its big initializers reference data files (where: ``weights.sources``), and a
    runtime gets a file written by :meth:`save` (``serialized()`` refuses)."""

    path: Path
    name: str
    sha256: str
    proto: onnx.ModelProto
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int
    size_bytes: int
    sample: str | None = None
    generated_names: list[str] = field(default_factory=list)
    normalization: list[NormStep] = field(default_factory=list)
    original_opset: int = 0
    weights: ExternalWeights | None = None
    branches: dict = field(default_factory=dict)  # branch input -> the branch fixed on load (core.model.branches)
    branch_inputs: list[str] = field(default_factory=list)  # the model's inputs that pick an If branch
    no_batch: frozenset = frozenset()  # inputs the user marked "no batch axis" (core.model.shapes.batch_axes)
    max_batch: int | None = None  # the largest batch the graph runs at, where it runs at fewer than it declares
    ws: Workspace | None = field(default=None, repr=False, compare=False)  # loaded from: its temp work goes there

    @property
    def external(self) -> bool:
        """Whether the weights stay in external data files (``weights``)."""
        return self.weights is not None

    @property
    def nodes(self):
        return self.proto.graph.node

    def initializer_names(self) -> set[str]:
        return {i.name for i in self.proto.graph.initializer}

    def tensor_types(self) -> dict[str, int]:
        """Element type of every tensor known to shape inference."""
        g = self.proto.graph
        types = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for init in g.initializer:
            types[init.name] = init.data_type
        return types

    def serialized(self) -> bytes:
        if self.weights is not None:
            raise MixprecError(f"{self.name} keeps its weights as external data: it has no single-file form",
                               "write it with LoadedModel.save(path), which puts links of its data files beside it")
        return self.proto.SerializeToString()

    def save(self, path: str | os.PathLike, proto: onnx.ModelProto | None = None, copy: bool = False) -> Path:
        """Write the model (or ``proto``, a variant of its graph, e.g. with more outputs) at ``path`` for
        a runtime: with external weights, the graph beside links of the data files it references (with
        ``copy``, real copies: an export the user takes away)."""
        proto = self.proto if proto is None else proto
        if self.weights is None:
            return atomic_write_bytes(path, proto.SerializeToString())
        return save_with_data(proto, Path(path), self.weights, copy=copy)

    def scratch(self, prefix: str = "mixprec-") -> TempFolder:
        """A temp folder for files made from the model (a ``with`` block gives its path), in the workspace, never
        the system's temp folder: ``tmp/`` of the workspace it was loaded from; with external weights beside
        them (``external/<sha>/tmp``), so that the data files are hard-linked there, not copied. Claimed by this
        process: what a killed process left is swept by the next one (``core.workspace.TempFolder``)."""
        if self.weights is not None:
            return TempFolder(self.weights.folder / "tmp", prefix)
        return TempFolder(self.ws or Workspace.default(), prefix)

    def runtime_path(self) -> Path | None:
        """The normalised model as a file a runtime can open, in the workspace beside copies of its
        data files (external weights only; else None)."""
        if self.weights is None:
            return None
        for loc in data_files(self.proto):
            self.weights.runtime_file(loc)
        return self.weights.folder / GRAPH_FILE


def _dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.BFLOAT16:
        return "bfloat16"
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # noqa: BLE001 - exotic types
        return TensorProto.DataType.Name(elem_type).lower()


def _spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    tt = vi.type.tensor_type
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return TensorSpec(vi.name, _dtype_name(tt.elem_type), tuple(dims))


MAX_PATH_CHARS = 4096  # Linux's PATH_MAX: a longer model path or data location is no file


def shown_path(text, n: int = 120) -> str:
    """A path the user gave, for a message: at most ``n`` characters (a 5000-character one is cut in the
    middle), control characters (a NUL, a newline) shown as escapes."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= n else f"{text[:n - 30]}…{text[-25:]} ({len(text)} characters)"


def check_path_text(text, what: str, fix: str | None = None) -> None:
    """A MixprecError if ``text`` cannot be a path at all: longer than ``MAX_PATH_CHARS`` or holding a NUL (which
    no file name can), said before the file system is asked (it would raise, not answer). ``what``: "model path",
    "calibration data file"…; ``fix``: what to give instead (default: the path of the file)."""
    text = str(text)
    fix = fix or f"give the path of the {what.removesuffix(' path')}"
    if "\0" in text:
        raise MixprecError(f"the {what} {shown_path(text)} has a NUL character in it, which no file name can hold",
                           fix)
    if len(text) > MAX_PATH_CHARS:
        raise MixprecError(f"the {what} {shown_path(text)} is longer than a path can be (at most {MAX_PATH_CHARS} "
                           "characters)", fix)


def _count(value) -> int | None:
    """An offset or length of an external reference: a decimal count, else None."""
    text = str(value).strip()
    return int(text) if text.isdigit() and len(text) <= 20 else None


def _stored_bytes(t: TensorProto) -> int | None:
    """The bytes tensor ``t`` takes in a data file (its dims × its element size; 4-bit types packed two to a
    byte), None for a type without a fixed size (strings) or one unknown here."""
    n = 1
    for d in t.dims:
        n *= int(d)
    if t.data_type in {getattr(TensorProto, k) for k in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, k)}:
        return (n + 1) // 2
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def _check_external_data(model: onnx.ModelProto, base_dir: Path) -> None:
    """Refuse external data outside the model's folder (never read it); report missing files; and refuse, each
    with its fix, every reference that cannot be read as it is — a location with a NUL (or none, or longer than a
    path), an offset or length that is not a count, a tensor that lies past its file's end or whose bytes there
    are fewer than its shape needs (a truncated copy), a data file with several hard links (which onnx refuses).
    Only the files' sizes and link counts are looked at here: nothing is read."""
    outside, missing, unreadable, past_end, linked = [], [], [], [], {}
    base = base_dir.resolve()
    sizes: dict[str, os.stat_result] = {}
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc or "\0" in loc or len(loc) > MAX_PATH_CHARS:
            why = "no location" if not loc else "a NUL character in its location" if "\0" in loc else \
                "a location longer than a path can be"
            unreadable.append(f"{t.name} -> {shown_path(loc, 60)}: {why}")
            continue
        try:
            target = (base / loc).resolve()
        except (OSError, RuntimeError, ValueError) as e:
            unreadable.append(f"{t.name} -> {shown_path(loc, 60)}: {getattr(e, 'strerror', None) or e}")
            continue
        if os.path.isabs(loc) or (target != base and base not in target.parents):
            outside.append(f"{t.name} -> {shown_path(loc, 60)}")
            continue
        if loc not in sizes:
            try:
                sizes[loc] = os.stat(target)
            except (FileNotFoundError, NotADirectoryError):
                missing.append(f"{t.name} -> {shown_path(loc, 60)}")
                continue
            except OSError as e:
                unreadable.append(f"{t.name} -> {shown_path(loc, 60)}: {e.strerror or e}")
                continue
        st = sizes[loc]
        if not stat.S_ISREG(st.st_mode):
            missing.append(f"{t.name} -> {shown_path(loc, 60)} (not a file)")
            continue
        if st.st_nlink > 1:
            linked[loc] = st.st_nlink
        offset = _count(info.get("offset", "0") or "0")
        length = _count(info["length"]) if info.get("length") not in (None, "") else None
        if offset is None or (info.get("length") not in (None, "") and length is None):
            unreadable.append(f"{t.name} -> {shown_path(loc, 60)}: offset {info.get('offset')!r:.30} / length "
                              f"{info.get('length')!r:.30} is not a count of bytes")
            continue
        need, size = _stored_bytes(t), st.st_size
        has = (size - offset) if length is None else length
        if offset > size or offset + (length or 0) > size:
            past_end.append(f"{t.name}: {length if length is not None else '?'} bytes at offset {offset} of "
                            f"{shown_path(loc, 60)}, which has {size}")
        elif need is not None and has != need and (length is not None or has < need):
            past_end.append(f"{t.name}: its shape {list(t.dims)} needs {need} bytes, {shown_path(loc, 60)} has "
                            f"{max(has, 0)} for it (offset {offset}" + (f", length {length})" if length is not None
                                                                        else ", to the end of the file)"))
    _refuse_external(base, outside, unreadable, missing, past_end, linked)


def _refuse_external(base: Path, outside: list, unreadable: list, missing: list, past_end: list,
                     linked: dict) -> None:
    """The first of ``_check_external_data``'s findings as one MixprecError with its fix (none: return)."""
    if outside:
        raise MixprecError(
            "the model references external data outside its folder; mixprec refuses to read it",
            f"move the data files into {base} and re-save the model with relative locations "
            "(onnx.save_model(..., save_as_external_data=True, location='weights.bin'))",
            details=outside,
        )
    if unreadable:
        raise MixprecError(
            "the model's external data references cannot be read as they are",
            "re-save the model with its data in a file beside it (onnx.save_model(..., save_as_external_data=True, "
            "location='weights.bin')), or re-export it with its weights embedded",
            details=unreadable,
        )
    if missing:
        raise MixprecError(
            "the model's external data files are missing",
            f"put the data files next to the model in {base}, or re-export the model with its weights embedded",
            details=missing,
        )
    if past_end:
        raise MixprecError(
            "the model's external data does not hold what the model says its tensors are (a data file cut short, "
            "or one of another export)",
            "copy the model's data files again in full, or re-export the model",
            details=past_end,
        )
    if linked:
        first = next(iter(linked))
        raise MixprecError(
            "the model's external data " + ("file has" if len(linked) == 1 else "files have") + " several hard "
            "links, and onnx refuses to read such a file (a guard against hard-link attacks)",
            f"give each data file a copy of its own, e.g. cp {first} {first}.copy && mv {first}.copy {first}",
            details=[f"{shown_path(loc, 60)}: {n} links" for loc, n in linked.items()],
        )


def _parse(data: bytes, path: Path) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as e:
        if data[:1] == b"\x08" and len(data) > 16:
            raise MixprecError(
                f"{path.name} looks like an ONNX file but is truncated or corrupt ({e})",
                "copy or export the model again; check the file size against the original",
            ) from e
        raise MixprecError(
            f"{path.name} is not an ONNX model (its bytes do not parse as an ONNX protobuf)",
            "give the path of a .onnx file exported with torch.onnx.export, tf2onnx or similar",
        ) from e
    if model.ir_version == 0 or not model.HasField("graph") or not model.graph.node:
        if data[:1] == b"\x08" and model.ir_version:
            raise MixprecError(
                f"{path.name} looks like an ONNX file but is truncated (its graph is missing)",
                "copy or export the model again; check the file size against the original",
            )
        raise MixprecError(
            f"{path.name} is not an ONNX model (no IR version or graph found)",
            "give the path of a .onnx file exported with torch.onnx.export, tf2onnx or similar",
        )
    return model


def assign_stable_names(model: onnx.ModelProto) -> list[str]:
    """Name every unnamed node ``node_of_<first output>`` (TensorRT's parser convention) and
    make duplicates unique. Names depend only on the graph, so policies stay valid on reload."""
    generated = []
    seen: set[str] = set()
    for node in model.graph.node:
        if not node.name:
            node.name = f"node_of_{node.output[0]}" if node.output else f"{node.op_type}_unnamed"
            generated.append(node.name)
        base, k = node.name, 1
        while node.name in seen:
            node.name = f"{base}__{k}"
            k += 1
        seen.add(node.name)
    return generated


def resolve_sample(spec: str, ws: Workspace | None = None, progress=None):
    return materialize_sample(spec[len(SAMPLE_PREFIX):], ws or Workspace.default(), progress=progress)


def _check(model: onnx.ModelProto | Path, path: Path, when: str) -> None:
    """onnx's checker on a model, on a file by path (its external data stays on disk), or on a graph
    whose weights stay external without them (``core.model.external.check_graph``)."""
    try:
        if isinstance(model, Path):
            onnx.checker.check_model(str(model))
        elif any(uses_external_data(t) for t in model.graph.initializer):
            check_graph(model)
        else:
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise MixprecError(
            f"{path.name} fails onnx's checker{when}: {first}",
            "re-export the model with a current exporter (opset 13 or later), or repair it "
            "(onnx.checker.check_model shows details)",
        ) from e


def _inference_error(e: Exception, path: Path) -> MixprecError:
    first = str(e).strip().splitlines()[0][:300]
    return MixprecError(
        f"shape inference fails on {path.name}: {first}",
        "fix the offending node's shapes/types (onnx.shape_inference.infer_shapes(model, strict_mode=True) "
        "reproduces it), or re-export the model",
    )


def _infer_light(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes(model, strict_mode=True)`` without sending the weights through
    onnx's C++ side (which serializes the model, parses it, and serializes and parses the result: four more
    copies of every weight): inference runs on ``core.model.graph.without_weights``, then the weights are put back into
    the inferred graph in their order. The same proto as inferring ``model`` itself."""
    twin, added = without_weights(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(twin, strict_mode=True)
    except Exception as e:  # noqa: BLE001 - InferenceError and friends
        raise _inference_error(e, path) from e
    del twin
    g = inferred.graph
    kept = [i for i in g.input if i.name not in added]
    del g.input[:]
    g.input.extend(kept)
    del g.initializer[:]
    g.initializer.extend(model.graph.initializer)
    return inferred


def _infer_path(graph: Path, path: Path) -> onnx.ModelProto:
    """Shape inference by path (``infer_shapes_path``): the graph with its inferred shapes, its
    external data unread."""
    out = graph.with_name(f".inferred-{os.getpid()}-{graph.name}")
    try:
        onnx.shape_inference.infer_shapes_path(str(graph), str(out), strict_mode=True)
        return onnx.load(str(out), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - InferenceError and friends
        raise _inference_error(e, path) from e
    finally:
        out.unlink(missing_ok=True)


def _finish(inferred: onnx.ModelProto, path: Path, name: str | None, sample: str | None, sha: str, size: int,
            steps: list[NormStep], original_opset: int, weights: ExternalWeights | None = None,
            branches: tuple[dict, list] = ({}, []), ws: Workspace | None = None) -> LoadedModel:
    generated = assign_stable_names(inferred)
    outputs = [_spec(o) for o in inferred.graph.output]
    if not any(o.is_float for o in outputs):
        raise MixprecError(
            f"{path.name} has no floating-point outputs ({', '.join(f'{o.name}: {o.dtype}' for o in outputs)}); "
            "precision effects cannot be measured on it",
            "export the model so it returns its float logits/embeddings (before argmax or other integer post-processing)",
        )
    init_names = {i.name for i in inferred.graph.initializer}
    inputs = [_spec(i) for i in inferred.graph.input if i.name not in init_names]
    if weights is not None:  # the file runtimes open is exactly ``proto`` (names included)
        atomic_write_bytes(weights.folder / GRAPH_FILE, inferred.SerializeToString())
    return LoadedModel(path=path, name=name or (sample if sample else path.stem), sha256=sha, proto=inferred,
                       inputs=inputs, outputs=outputs, opset=default_opset(inferred), size_bytes=size, sample=sample,
                       generated_names=generated, normalization=steps, original_opset=original_opset,
                       weights=weights, branches=dict(branches[0]), branch_inputs=list(branches[1]), ws=ws)


def _load_external(model: onnx.ModelProto, path: Path, sha: str, ws: Workspace, checked: bool = True):
    """Normalise a model whose weights stay external: checked by path where it is (its data files are
    never read, nor linked), normalised (weights it folds go to its own data file), its graph written
    to ``external/<sha>/`` of the workspace and shape-inferred by path there. Returns (inferred graph,
    steps, original opset, ExternalWeights)."""
    if checked:  # else the graph was changed before (the folded branch): it is checked after normalisation
        _check(path, path, "")
    folder = ws.external_dir(sha)
    with folder_lock(folder):
        sweep_tmp(folder)  # temp files of killed processes
        inline_small(model, path.parent)
        original_opset = default_opset(model)
        model, steps = normalize_model(model, path.parent, name=path.name)
        files = data_files(model)
        if {GRAPH_FILE, OWN_DATA} & set(files):
            raise MixprecError(f"{path.name} names an external data file {GRAPH_FILE} or {OWN_DATA}, names mixprec "
                               "keeps for itself", "re-save the model with another location for its data")
        sources = {f: path.parent / f for f in files}
        spill = Spill(folder / "tmp")  # a new file: one that runs have linked is never rewritten
        if externalize(model, spill):
            rename_location(model, spill.location, OWN_DATA)
            os.replace(spill.path, folder / OWN_DATA)
            sources[OWN_DATA] = folder / OWN_DATA
        if steps or not checked:
            _check(model, path, " after normalisation (" + ", ".join(["fold_branch"] * (not checked) + [s.step for s in steps]) + ")")
        graph = atomic_write_bytes(folder / GRAPH_FILE, model.SerializeToString())
        return _infer_path(graph, path), steps, original_opset, ExternalWeights(folder, sources)


def _fold_branches(model: onnx.ModelProto, branches: dict[str, bool] | None, path_name: str
                   ) -> tuple[list[NormStep], tuple]:
    """The changes made before the model is checked, as normalisation steps: a merged decoder's If branches
    fixed (``core.model.branches``) and ONNX Runtime's fused ops taken apart (``core.model.ms_ops``); and
    (branches fixed, branch inputs) for the LoadedModel."""
    found = branch_inputs(model)
    chosen = default_branches(model, branches)
    done = fold_branches(model, chosen)
    steps = [NormStep("fold_branch", done)] if done else []
    refuse_quantized(model, path_name)
    unfused = unfuse_ms_ops(model, path_name)  # before onnx's checker, which knows no com.microsoft op
    if unfused:
        steps.append(NormStep("unfuse_ms_ops", unfused))
    return steps, (chosen, found)


def model_from_bytes(data: bytes, path: Path, name: str | None = None, sample: str | None = None,
                     ws: Workspace | None = None, branches: dict[str, bool] | None = None) -> LoadedModel:
    """The model of the bytes of ``path`` (external data files are found beside ``path``). ``branches``:
    the If branch to fix for a merged decoder's branch inputs (``core.model.branches``; default: the
    cache branch taken)."""
    model = _parse(data, path)
    _check_external_data(model, path.parent)  # before anything reads external data
    files = data_files(model)
    ranges = referenced_ranges(model, path.parent)  # the weights are what the tensors read, not the files around them
    extra = referenced_bytes(ranges)
    if ws is None and extra >= HASH_CACHE_FROM:
        ws = Workspace.default()
    sha, size = model_sha256(data, path.parent, files, ws, ranges), len(data) + extra
    del data  # parsed and hashed: a caller that passed it without keeping it frees its bytes here
    folded, chosen = _fold_branches(model, branches, path.name)
    sha = branch_sha256(sha, chosen[0])
    if files and (extra >= env_bytes("MIXPREC_EXTERNAL_WEIGHTS_FROM", EXTERNAL_FROM) or size >= MAX_MODEL_BYTES):
        inferred, steps, original_opset, weights = _load_external(model, path, sha, ws or Workspace.default(),
                                                                  checked=not folded)
        return _finish(inferred, path, name, sample, sha, size, folded + steps, original_opset, weights, chosen, ws)
    if files:
        try:
            load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as e:  # checked before: a file changed meanwhile
            raise MixprecError(f"the external data of {path.name} cannot be read: {str(e).splitlines()[0][:300]}",
                               "copy the model's data files again, or re-export the model") from e
    _check(model, path, "" if not folded else " after " + ", ".join(s.step for s in folded))
    original_opset = default_opset(model)
    model, steps = normalize_model(model, path.parent, name=path.name)
    steps = folded + steps
    if steps:
        _check(model, path, " after normalisation (" + ", ".join(s.step for s in steps) + ")")
    inferred = _infer_light(model, path)
    del model  # the inferred graph holds the only copy of the weights from here
    return _finish(inferred, path, name, sample, sha, size, steps, original_opset, branches=chosen, ws=ws)


def load_model(spec: str | os.PathLike, ws: Workspace | None = None, progress=None,
               branches: dict[str, bool] | None = None) -> LoadedModel:
    """Load a model from a path or ``sample:NAME`` and validate it (``branches``: see :func:`model_from_bytes`)."""
    spec_s = str(spec)
    sample = None
    ws = ws or Workspace.default()
    if spec_s.startswith(SAMPLE_PREFIX):
        sample = spec_s[len(SAMPLE_PREFIX):]
        path = resolve_sample(spec_s, ws, progress).model
    else:
        check_path_text(spec_s, "model path", "give the path of an .onnx file, or a bundled sample: "
                        + ", ".join(f"sample:{n}" for n in SAMPLES))
        path = Path(spec_s).expanduser()
        check_confined(path, "model", ws.root)
        try:
            exists, is_dir = path.exists(), path.is_dir()
        except OSError as e:  # a name too long for the file system, a loop of links…
            raise MixprecError(f"the model path {shown_path(path)} cannot be looked up: {e.strerror or e}",
                               "check the path") from e
        if not exists:
            raise MixprecError(
                f"the model path {shown_path(path)} does not exist",
                "check the path, or use a bundled sample: " + ", ".join(f"sample:{n}" for n in SAMPLES),
            )
        if is_dir:
            onnx_files = sorted(p.name for p in path.glob("*.onnx"))
            raise MixprecError(
                f"{path} is a folder, not a model file",
                "give the .onnx file itself" + (f", e.g. {path / onnx_files[0]}" if onnx_files else ""),
            )
    return model_from_bytes(read_user_file(path, "model", env_bytes("MIXPREC_MAX_MODEL_BYTES", MAX_MODEL_BYTES), ws.root),
                            path, name=f"sample:{sample}" if sample else None, sample=sample, ws=ws, branches=branches)
