"""Input shapes: the batch axis of every input, and a concrete value for every dynamic dimension.

Every dimension gets a :class:`DimChoice` that says where its value came from:

- ``fixed``: the model fixes it;
- ``given``: the user set it (``shapes=`` / ``--shape INPUT=1x3x320x320`` for a whole input,
  ``overrides=`` / ``--dim NAME=V`` for a named dim);
- ``data``: the length in the supplied or bundled data (e.g. a sequence length);
- ``batch``: the batch axis, at ``batch`` (default 1);
- ``default``: the size the model itself implies (its metadata, or a Resize to a constant size);
- ``guessed``: 224 for the spatial dims of an image-like input, else 64.

A named dim takes one value everywhere it appears (``seq`` of ``input_ids`` and ``attention_mask``).

The batch axis comes from the dims' symbols, never from a position: the symbol named like a batch
(batch, N, batch_size, …), else the symbol every symbolic input shares. A [2, B, 128] recurrent
state has its batch on axis 1. Inputs no symbol explains: the N of an image-like input (NCHW or
NHWC, 1 or 3 channels), or axis 0 when it is unnamed-dynamic; in a model without any dynamic batch,
axis 0 of the rank ≥ 2 inputs that agree on its size (a fixed batch, e.g. 32 × 3 × 224 × 224).
Anything else (scalars, fixed-size side inputs) has no batch axis and is fed whole.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from core.errors import MixprecError
from core.model.graph import attr, with_input_dims
from core.model.kv_cache import KV_PAST, KV_SEQ, kv_cache
from core.model.load import LoadedModel, TensorSpec
from core.workspace import env_bytes, human_bytes

DEFAULT_BATCH = 1
DEFAULT_SEQ = 64
DEFAULT_IMAGE = 224
EVAL_BATCH = 16  # quality is evaluated in batches of up to this many samples where the batch axis is dynamic
SOURCES = ("fixed", "given", "data", "batch", "default", "guessed")
BATCH_NAMES = {"n", "b", "bs", "nb", "batch", "batch_size", "batchsize", "batches", "num_batch", "batch_dim",
               "nbatch", "minibatch", "mini_batch"}
# symbols that name a time or length axis: never taken for the batch because every input shares them
TIME_NAMES = {"t", "time", "times", "frames", "frame", "num_frames", "n_frames", "nframes", "time_steps", "timesteps",
              "steps", "length", "len", "audio_length", "samples_len", "num_samples", "wav_len", "bins"}
IMAGE_SIZE_KEYS = ("imgsz", "img_size", "image_size", "imagesize", "input_size", "inputsize", "img_shape",
                   "image_shape", "input_shape", "resolution", "size")
_RANK = {s: i for i, s in enumerate(SOURCES)}


@dataclass(frozen=True)
class DimChoice:
    """One dimension of one input: its value and where the value came from."""

    input: str
    axis: int
    symbol: str | None  # the dim's name; "?" for an unnamed dynamic dim; None for a fixed dim
    value: int
    source: str  # one of SOURCES
    note: str = ""  # e.g. "guessed: 224 — set it with --shape images=1x3x224x224"

    def to_dict(self) -> dict:
        return asdict(self)


def shape_text(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"images=1x3x320x320"`` → ``("images", (1, 3, 320, 320))`` (``"x="`` is a scalar)."""
    name, sep, spec = str(text).rpartition("=")
    dims = spec.strip().lower().split("x") if spec.strip() else []
    if not sep or not name or not all(d.strip().isascii() and d.strip().isdigit() and int(d) > 0 for d in dims):
        raise MixprecError(f"bad --shape {text!r}",
                           "write --shape INPUT=DIMS with every dim of the input, e.g. --shape images=1x3x320x320")
    return name, tuple(int(d) for d in dims)


def _is_dynamic(d) -> bool:
    return not isinstance(d, int) or d <= 0


def _symbol(d) -> str | None:
    if not _is_dynamic(d):
        return None
    return d if isinstance(d, str) and d else "?"


def image_layout(spec: TensorSpec) -> str | None:
    """``"nchw"`` / ``"nhwc"`` for a float 4-D input with 1 or 3 channels, else None."""
    if len(spec.shape) != 4 or not spec.is_float:
        return None
    if spec.shape[1] in (1, 3):
        return "nchw"
    if spec.shape[3] in (1, 3):
        return "nhwc"
    return None


def spatial_axes(spec: TensorSpec) -> tuple[int, ...]:
    return {"nchw": (2, 3), "nhwc": (1, 2)}.get(image_layout(spec), ())


# --- the batch axis -------------------------------------------------------------------------
def _batch_symbol(model: LoadedModel) -> str | None:
    """The batch's symbol: one named like a batch, else the one every symbolic input shares and
    at least one has on axis 0 (a [1, seq] input has a fixed batch, not a batch of seq)."""
    per_input = []
    for spec in model.inputs:
        named = {}
        for axis, d in enumerate(spec.shape):
            if axis in spatial_axes(spec):
                continue  # an image's H and W are never its batch
            if isinstance(d, str) and d and d != "?" and d not in named:
                named[d] = axis
        if named:
            per_input.append(named)
    if not per_input:
        return None
    counts: dict[str, int] = {}
    for named in per_input:
        for sym in named:
            counts[sym] = counts.get(sym, 0) + 1
    batchy = [s for s in counts if s.lower() in BATCH_NAMES or "batch" in s.lower()]
    if batchy:
        return max(batchy, key=lambda s: counts[s])
    shared = [s for s, c in counts.items() if c == len(per_input) and any(p[s] == 0 for p in per_input if s in p)
              and s.lower() not in TIME_NAMES]
    if not shared:
        return None
    return min(shared, key=lambda s: sum(p[s] for p in per_input) / len(per_input))


def _unsqueezed_at_0(model: LoadedModel, name: str) -> bool:
    """Whether every use of the input is an Unsqueeze that adds axis 0: the model adds its own batch axis
    (``x[None]`` in the exported code), so the input has none (e.g. an audio model's ``[frames, bins]``)."""
    uses = [n for n in model.proto.graph.node if name in n.input]
    if not uses:
        return False
    for n in uses:
        if n.op_type != "Unsqueeze" or n.input[0] != name:
            return False
        axes = attr(n, "axes")
        if axes is None and len(n.input) > 1:
            vals = _const_values(model, n.input[1])
            axes = None if vals is None else [int(v) for v in np.ravel(vals)]
        if not axes or 0 not in axes:
            return False
    return True


def with_no_batch(model: LoadedModel, names) -> LoadedModel:
    """The model with ``names`` marked "no batch axis" (``--no-batch INPUT``): each of those inputs is fed
    whole, one sample per array along a new leading axis of the data. Unknown names are refused."""
    names = frozenset(str(n) for n in (names or ()))
    if names == model.no_batch:
        return model
    unknown = sorted(names - {s.name for s in model.inputs})
    if unknown:
        raise MixprecError(f"--no-batch names {', '.join(unknown)}, which the model has no input called",
                           f"name inputs of the model: {', '.join(s.name for s in model.inputs)}")
    return replace(model, no_batch=names)


def batch_axes(model: LoadedModel) -> dict[str, int | None]:
    """The batch axis of every input (None: the input has none and is fed whole). Inputs the user marked
    "no batch axis" (:func:`with_no_batch`) have none."""
    if model.no_batch:
        axes = batch_axes(replace(model, no_batch=frozenset(),
                                  inputs=[s for s in model.inputs if s.name not in model.no_batch]))
        return {s.name: axes.get(s.name) for s in model.inputs}
    own = {s.name for s in model.inputs if s.shape and _unsqueezed_at_0(model, s.name)}
    if own:  # inputs the model gives a batch axis of its own have none: as if marked so
        axes = batch_axes(replace(model, inputs=[s for s in model.inputs if s.name not in own]))
        return {s.name: axes.get(s.name) for s in model.inputs}
    sym = _batch_symbol(model)
    axes: dict[str, int | None] = {}
    for spec in model.inputs:
        if sym is not None and sym in spec.shape:
            axes[spec.name] = list(spec.shape).index(sym)
        elif image_layout(spec) or (spec.shape and _symbol(spec.shape[0]) == "?"):
            axes[spec.name] = 0
        else:
            axes[spec.name] = None
    if sym is None and not any(_is_dynamic(s.shape[a]) for s in model.inputs
                               if (a := axes[s.name]) is not None):
        # no dynamic batch anywhere: a fixed batch on axis 0, where the inputs agree on its size
        lead = {s.shape[0] for s in model.inputs if len(s.shape) >= 2}
        lead |= {s.shape[0] for s in model.inputs if axes[s.name] == 0}
        if len(lead) == 1 and not _is_dynamic(next(iter(lead))):  # a [frames, bins] input has no batch
            for s in model.inputs:
                if len(s.shape) >= 2:
                    axes[s.name] = 0
    return axes


def stacked_inputs(model: LoadedModel, axes: dict | None = None) -> frozenset[str]:
    """Inputs whose samples are whole arrays stacked along a new leading axis of the data (and fed one at a
    time): those the user marked "no batch axis", and every input of a model where no input has one
    (e.g. an audio model's ``[frames, bins]``). Other inputs without a batch axis (a fixed-size side input
    of a batched model) are one array passed whole in every batch. ``axes``: :func:`batch_axes`, if known."""
    axes = batch_axes(model) if axes is None else axes
    if all(a is None for a in axes.values()):
        return frozenset(axes)
    return frozenset(model.no_batch)


def fixed_batch(model: LoadedModel) -> int | None:
    """The batch size the model fixes (e.g. 32 for a 32 × 3 × 224 × 224 input), None when dynamic."""
    axes = batch_axes(model)
    sizes = {s.shape[a] for s in model.inputs if (a := axes[s.name]) is not None}
    if sizes and not any(_is_dynamic(d) for d in sizes):
        return int(max(sizes))
    return None


def model_batch(model: LoadedModel, input_shapes: dict[str, tuple[int, ...]]) -> int:
    """The batch of these shapes: the value at the first input's batch axis (1 without one)."""
    axes = batch_axes(model)
    for s in model.inputs:
        if axes.get(s.name) is not None and s.name in input_shapes:
            return int(input_shapes[s.name][axes[s.name]])
    return 1


# --- sizes the model implies ------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", str(text))]


def _const_values(model: LoadedModel, name: str) -> np.ndarray | None:
    for init in model.proto.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.proto.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


def implied_image_size(model: LoadedModel, spec: TensorSpec) -> tuple[int, int, str] | None:
    """(height, width, why) that the model's metadata or a Resize of this input to constant sizes implies."""
    for prop in model.proto.metadata_props:
        if prop.key.lower() in IMAGE_SIZE_KEYS:
            vals = [v for v in _ints(prop.value) if 8 <= v <= 8192]
            if len(vals) in (1, 2, 3, 4):
                h, w = (vals[0], vals[0]) if len(vals) == 1 else vals[-2:]
                return h, w, f"metadata {prop.key}={prop.value}"
    axes = spatial_axes(spec)
    for node in model.proto.graph.node:
        if node.op_type == "Resize" and node.input and node.input[0] == spec.name and len(node.input) > 3:
            sizes = _const_values(model, node.input[3])
            if sizes is not None and sizes.size == 4 and axes:
                return int(sizes[axes[0]]), int(sizes[axes[1]]), f"Resize {node.name} to constant sizes"
    return None


_PASS_THROUGH = ("Cast", "Identity", "Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Dropout", "Softmax", "LayerNormalization",
                 "BatchNormalization", "InstanceNormalization")


def implied_width(model: LoadedModel, spec: TensorSpec, axis: int) -> tuple[int, str] | None:
    """(size, why) of a dynamic dim that a weight fixes: the input width of an RNN/LSTM/GRU reading the input
    (``W`` is [directions, gates × hidden, width]), the K of a MatMul or Gemm with a constant weight, the
    channels of a Conv. Followed through element-wise ops that keep the shape; None when no weight says."""
    rank = len(spec.shape)
    inits = {i.name: tuple(int(d) for d in i.dims) for i in model.proto.graph.initializer}
    frontier = {spec.name}
    for node in model.proto.graph.node:
        ins = list(node.input)
        if not ins or not frontier.intersection(ins):
            continue
        if node.op_type in _PASS_THROUGH and ins[0] in frontier:
            frontier.update(node.output)
            continue
        w = inits.get(ins[1]) if len(ins) > 1 else None
        if w is None:
            continue
        op, name = node.op_type, node.name or node.op_type
        if op in ("LSTM", "GRU", "RNN") and ins[0] in frontier and axis == rank - 1 == 2 and len(w) == 3:
            return w[2], f"the {op} {name}'s weight W {list(w)}"
        if op == "MatMul" and ins[0] in frontier and axis == rank - 1 and len(w) >= 2:
            return w[-2], f"the MatMul {name}'s weight {list(w)}"
        if op == "Gemm" and ins[0] in frontier and rank == 2 and axis == 1 and len(w) == 2 and not attr(node, "transA", 0):
            return (w[1] if attr(node, "transB", 0) else w[0]), f"the Gemm {name}'s weight {list(w)}"
        if op in ("Conv", "ConvTranspose") and ins[0] in frontier and axis == 1 and len(w) == rank:
            chans = w[1] * attr(node, "group", 1) if op == "Conv" else w[0]
            return chans, f"the {op} {name}'s weight {list(w)}"
    return None


# --- choices ----------------------------------------------------------------------------------
def _check_given(model: LoadedModel, shapes: dict, overrides: dict, batch: int) -> None:
    specs = {s.name: s for s in model.inputs}
    unknown = sorted(set(shapes) - set(specs))
    if unknown:
        raise MixprecError(f"--shape names {', '.join(unknown)}, which the model has no input called",
                           f"give shapes for the model's inputs: {', '.join(specs)}")
    problems = []
    for name, shape in shapes.items():
        spec = specs[name]
        if len(shape) != len(spec.shape):
            problems.append(f"{name}: {len(shape)} dims given, the input has {len(spec.shape)} "
                            f"({'x'.join(str(d) for d in spec.shape) or 'a scalar'})")
            continue
        problems += [f"{name}: axis {a} is fixed at {d}, {v} given" for a, (d, v) in enumerate(zip(spec.shape, shape))
                     if not _is_dynamic(d) and d != v]
        problems += [f"{name}: axis {a} is {v}; dims must be positive" for a, v in enumerate(shape) if v <= 0]
    symbols = {d for s in model.inputs for d in s.shape if isinstance(d, str)} | {"batch"}
    problems += [f"--dim {k}: the model has no dim named {k} (named dims: {', '.join(sorted(symbols - {'?'}))})"
                 for k in overrides if k not in symbols]
    problems += [f"--dim {k}={v}: dims must be positive" for k, v in overrides.items() if v <= 0]
    if batch < 1:
        problems.append(f"--batch {batch}: the batch must be at least 1")
    fb = fixed_batch(model)
    if fb is not None and batch not in (DEFAULT_BATCH, fb):
        problems.append(f"--batch {batch}: the model fixes its batch at {fb}")
    if problems:
        raise MixprecError("the given shapes do not fit the model's inputs",
                           "give every dim of an input, keeping the fixed ones (python -m core inspect MODEL shows them)",
                           details=problems)


def _choose(model, spec, axis, d, ctx) -> tuple[int, str, str]:
    """(value, source, why) of one dimension before named dims are made consistent."""
    data, batch, overrides, shapes, axes = ctx
    sym = _symbol(d)
    if sym is None:
        return int(d), "fixed", ""
    if spec.name in shapes:
        return int(shapes[spec.name][axis]), "given", "given"
    if sym != "?" and sym in overrides:
        return int(overrides[sym]), "given", f"given (--dim {sym}={int(overrides[sym])})"
    if axis == axes.get(spec.name):
        return int(overrides.get("batch", batch)), "batch", "batch (--batch)"
    arr = None if data is None else data.get(spec.name)
    if arr is not None and np.ndim(arr) == len(spec.shape):
        return int(np.shape(arr)[axis]), "data", "from the data"
    if arr is not None and np.ndim(arr) == len(spec.shape) + 1 and axes.get(spec.name) is None:
        return int(np.shape(arr)[axis + 1]), "data", "from the data (one sample per array)"
    width = implied_width(model, spec, axis)
    if width:
        return width[0], "default", f"default from {width[1]}"
    if axis in spatial_axes(spec):
        implied = implied_image_size(model, spec)
        if implied:
            h, w, why = implied
            return (h if axis == spatial_axes(spec)[0] else w), "default", f"default from the model's {why}"
        return DEFAULT_IMAGE, "guessed", "guessed"
    return DEFAULT_SEQ, "guessed", "guessed"


def _unify(raw: list[list]) -> None:
    """A named dim takes the value of its best-sourced occurrence everywhere (in place)."""
    best: dict[str, list] = {}
    for c in raw:
        sym = c[2]
        if sym and sym != "?" and c[4] != "fixed":
            prev = best.get(sym)
            if prev is not None and prev[4] == "given" and c[4] == "given" and prev[3] != c[3]:
                raise MixprecError(f"the dim {sym} is given two values: {prev[3]} ({prev[0]}) and {c[3]} ({c[0]})",
                                   f"give {sym} one value in every --shape")
            if prev is None or _RANK[c[4]] < _RANK[prev[4]]:
                best[sym] = c
    for c in raw:
        b = best.get(c[2]) if c[2] and c[2] != "?" else None
        if b is not None and c[4] != "fixed" and _RANK[b[4]] < _RANK[c[4]]:
            c[3], c[4], c[5] = b[3], b[4], f"{b[5]} ({b[0]} axis {b[1]})"


def _kv_relation(model: LoadedModel, raw: list[list]) -> None:
    """A KV-cache decoder (:func:`core.model.kv_cache.kv_cache`): the mask's length is past + seq (in place).
    Guessed sizes become the decoder's defaults (:data:`KV_PAST` cached, :data:`KV_SEQ` new tokens); a mask
    length that is given or in the data sets the past when only the past is guessed; a mask that contradicts
    the given past and seq is refused, naming the relation and the ``--dim`` that fixes it."""
    kv = kv_cache(model)
    if kv is None:
        return
    cache = set(kv.cache_inputs)
    pasts = [c for c in raw if c[0] in cache and c[1] == kv.past_axis]
    seqs = [c for c in raw if c[0] in (kv.ids, kv.positions) and c[1] == 1 and c[4] != "fixed"]
    totals = [c for c in raw if c[0] == kv.mask and c[1] == 1 and c[4] != "fixed"]
    for group, default, what in ((pasts, KV_PAST, "cached tokens"), (seqs, KV_SEQ, "new tokens")):
        for c in group:
            if c[4] == "guessed":
                c[3], c[4], c[5] = default, "default", f"the KV-cache decoder's default ({what})"
                if c[2] not in (None, "?"):
                    c.append(f" — set it with --dim {c[2]}=N")
    if not (pasts and seqs and totals):
        return
    past, seq, total = pasts[0], seqs[0], totals[0]
    psym, ssym, tsym = (c[2] if c[2] not in (None, "?") else f"{c[0]} axis {c[1]}" for c in (past, seq, total))
    if total[4] in ("given", "data") and past[4] == "default" and total[3] - seq[3] >= 0:
        for c in pasts:  # the mask's length and the new tokens say how many are cached
            c[3], c[4], c[5] = total[3] - seq[3], "default", f"{tsym} − {ssym} ({kv.relation()})"
            c[6:] = [""]
    elif total[4] in ("given", "data") and total[3] != past[3] + seq[3]:
        fix = (f"give data whose {kv.mask} has {past[3]} + {seq[3]} = {past[3] + seq[3]} positions ({kv.relation()}), "
               f"or whose cache inputs hold {total[3] - seq[3]} positions" if total[4] == "data" else
               f"give consistent sizes, e.g. --dim {psym}={past[3]} --dim {ssym}={seq[3]} and leave {tsym} out "
               f"(it follows {kv.relation()}), or --dim {tsym}={past[3] + seq[3]}")
        raise MixprecError(
            f"{kv.mask} has {total[3]} positions ({tsym}, {total[5]}), but the KV cache holds {past[3]} ({psym}) "
            f"and there are {seq[3]} new tokens ({ssym}): {kv.relation()} = {past[3] + seq[3]}", fix)
    for c in totals:
        if c[4] not in ("given", "data"):
            c[3], c[4], c[5] = pasts[0][3] + seqs[0][3], "default", kv.relation()
            c[6:] = [f" — it follows {psym} and {ssym}"]


def shape_choices(model: LoadedModel, data: dict[str, np.ndarray] | None = None, batch: int = DEFAULT_BATCH,
                  overrides: dict[str, int] | None = None, shapes: dict | None = None) -> list[DimChoice]:
    """Every dimension of every input, with its value and source (see the module docstring)."""
    overrides = {str(k): int(v) for k, v in (overrides or {}).items()}
    shapes = {str(k): tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    _check_given(model, shapes, overrides, int(batch))
    ctx = (data, int(batch), overrides, shapes, batch_axes(model))
    raw = [[spec.name, axis, _symbol(d), *_choose(model, spec, axis, d, ctx)]
           for spec in model.inputs for axis, d in enumerate(spec.shape)]
    _unify(raw)
    _kv_relation(model, raw)
    final = {}
    for name, axis, _sym, value, *_ in raw:
        final.setdefault(name, []).append(value)
    out = []
    for name, axis, sym, value, src, why, *how in raw:  # how: a KV-cache dim's own way to set it
        note = "" if src == "fixed" else f"{why}: {value}"
        if how:
            note += how[0]
        elif src in ("default", "guessed"):
            note += f" — set it with --shape {name}={shape_text(final[name])}"
        out.append(DimChoice(name, axis, sym, int(value), src, note))
    return out


def resolve_input_shapes(model: LoadedModel, data: dict[str, np.ndarray] | None = None, batch: int = DEFAULT_BATCH,
                         overrides: dict[str, int] | None = None, shapes: dict | None = None
                         ) -> dict[str, tuple[int, ...]]:
    """A concrete shape for every input (see :func:`shape_choices`)."""
    return shapes_of(model, shape_choices(model, data, batch, overrides, shapes))


def shapes_of(model: LoadedModel, choices: list[DimChoice]) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {s.name: [] for s in model.inputs}
    for c in choices:
        out[c.input].append(c.value)
    return {k: tuple(v) for k, v in out.items()}


def with_static_shapes(model: LoadedModel, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of the model with concrete input dims and re-inferred shapes (for MAC counts)."""
    m = with_input_dims(model.proto, shapes)
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - fall back to the symbolic shapes
        return model.proto


# --- memory: what the shapes cost before anything is allocated --------------------------------------
MEMORY_BUDGET_SHARE = 0.8  # of the memory available to this process, unless MIXPREC_MEMORY_BUDGET says otherwise
SMALL_INITIALIZER = 4096  # elements: initializers up to this size keep their values for shape inference
ORT_SESSIONS = 2  # a build times the candidate and the FP32 reference side by side


CGROUP_MEMORY_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _available_memory() -> int:
    """Bytes this process can still allocate: MemAvailable, capped by a cgroup (container) limit."""
    avail = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 8 << 30
    for limit_file, used_file in CGROUP_MEMORY_FILES:  # cgroup v2, then v1 (its "no limit" is a huge number)
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(used_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit != "max" and limit.isdigit() and int(limit) < (1 << 60):
            avail = min(avail, max(0, int(limit) - used))
        break
    return int(avail)


def memory_budget() -> tuple[int, str]:
    """(bytes, where the number comes from): ``$MIXPREC_MEMORY_BUDGET`` (e.g. ``8G``), else 80 % of the
    memory available now."""
    if os.environ.get("MIXPREC_MEMORY_BUDGET"):
        return env_bytes("MIXPREC_MEMORY_BUDGET", 0), "MIXPREC_MEMORY_BUDGET"
    return int(MEMORY_BUDGET_SHARE * _available_memory()), f"{int(100 * MEMORY_BUDGET_SHARE)} % of the available memory"


def _itemsize(elem_type: int) -> int:
    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except Exception:  # noqa: BLE001 - exotic / undefined types
        return 4


def _skeleton(model: LoadedModel, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """The main graph without its weights (large initializers become typed graph inputs) and with
    concrete input dims: shape inference on it is fast and copies no weights."""
    src = model.proto.graph
    m = onnx.ModelProto()
    m.ir_version, m.producer_name = model.proto.ir_version, model.proto.producer_name
    m.opset_import.extend(model.proto.opset_import)
    g = m.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None) for o in src.output)
    init_names = set()
    for init in src.initializer:
        init_names.add(init.name)
        if int(np.prod(init.dims)) <= SMALL_INITIALIZER and not init.external_data:
            g.initializer.append(init)
        else:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for inp in src.input:
        if inp.name in init_names:
            continue
        vi = g.input.add()
        vi.CopyFrom(inp)
        if inp.name in shapes:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[inp.name]):
                d.Clear()
                d.dim_value = int(v)
    return m


@dataclass(frozen=True)
class MemoryEstimate:
    """What one ONNX Runtime session of the model needs at some input shapes, about: the input
    tensors, the peak of the activations alive at once (in graph order, each freed after its last
    use) and the largest single tensor."""

    input_bytes: int
    peak_bytes: int
    largest: str
    largest_bytes: int


def _sizes(proto: onnx.ModelProto, skip: set[str]) -> dict[str, int]:
    sizes = {}
    g = proto.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.name in skip or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            sizes[vi.name] = int(np.prod([d.dim_value for d in dims], dtype=np.float64)) * _itemsize(
                vi.type.tensor_type.elem_type)
    return sizes


def estimate_memory(model: LoadedModel, shapes: dict[str, tuple[int, ...]]) -> MemoryEstimate:
    """A :class:`MemoryEstimate` at ``shapes`` (tensors whose shape inference cannot tell count 0)."""
    m = _skeleton(model, shapes)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - the inputs' sizes are still known
        pass
    weights = model.initializer_names()
    sizes = _sizes(m, weights)
    nodes = list(m.graph.node)
    last = {name: len(nodes) for name in (o.name for o in m.graph.output)}
    for i, node in enumerate(nodes):
        for t in node.input:
            if t and last.get(t, -1) < i:
                last[t] = i
    inputs = [s.name for s in model.inputs]
    live = sum(sizes.get(t, 0) for t in inputs)
    peak = live
    for i, node in enumerate(nodes):
        live += sum(sizes.get(t, 0) for t in node.output if t)
        peak = max(peak, live)
        for t in set(node.input) | set(node.output):
            if t and t not in weights and last.get(t, i) <= i:
                live -= sizes.get(t, 0)
    largest = max(sizes, key=sizes.get, default="")
    return MemoryEstimate(sum(sizes.get(t, 0) for t in inputs), int(peak), largest, int(sizes.get(largest, 0)))


def check_memory(model: LoadedModel, shapes: dict[str, tuple[int, ...]], data_bytes: int = 0,
                 data_note: str = "") -> MemoryEstimate:
    """Refuse shapes whose estimated memory — ``data_bytes`` of data to generate, plus two sessions
    (candidate and FP32 reference) each holding the weights and the peak activations — exceeds the
    budget (:func:`memory_budget`), before anything is allocated."""
    est = estimate_memory(model, shapes)
    need = data_bytes + ORT_SESSIONS * (model.size_bytes + est.peak_bytes)
    budget, source = memory_budget()
    if need > budget:
        batch = model_batch(model, shapes)
        parts = [f"activations about {human_bytes(est.peak_bytes)} per session at batch {batch}"
                 + (f" (the largest tensor, {est.largest}, alone {human_bytes(est.largest_bytes)})" if est.largest else ""),
                 f"weights {human_bytes(model.size_bytes)} per session"]
        if data_bytes:
            parts.insert(0, f"{data_note or 'generated data'} {human_bytes(data_bytes)}")
        shown = ", ".join(f"{k}={shape_text(v)}" for k, v in shapes.items())
        raise MixprecError(f"the input shapes {shown} need about {human_bytes(need)} of memory ({'; '.join(parts)}), "
                           f"more than the budget of {human_bytes(budget)} ({source})",
                           "use a smaller --batch, --dim or --shape (python -m core inspect MODEL lists the dims), or "
                           "set MIXPREC_MEMORY_BUDGET on a machine with more memory")
    return est
