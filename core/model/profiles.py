"""Dynamic-shape profiles: the ``(min, opt, max)`` shapes of an input that the exported TensorRT
engine is built for (``--profile input_ids=1x16:4x128:8x512``; trtexec ``--minShapes/--optShapes/
--maxShapes``, Polygraphy ``--trt-min-shapes/--trt-opt-shapes/--trt-max-shapes``).

The opt shape is the shape the project runs at: a profile's opt is its input's shape, as if
``--shape INPUT=OPT`` were given, so calibration, evaluation, timing and estimates are at opt. Inputs
without a profile keep min = opt = max (the project's shape), except where they share a named dim
with a profiled input: that dim takes the profile's range there too (one value, and one range, per
named dim)."""
from __future__ import annotations

from core.errors import MixprecError
from core.model.load import LoadedModel
from core.model.shapes import shape_text

Shape = tuple[int, ...]
Range = tuple[Shape, Shape, Shape]
PROFILE_FIX = ("write --profile INPUT=MIN:OPT:MAX with every dim of each shape, "
               "e.g. --profile input_ids=1x16:4x128:8x512")


def _dims(text: str) -> Shape:
    dims = text.strip().lower().split("x") if text.strip() else []
    if not all(d.strip().isascii() and d.strip().isdigit() and int(d) > 0 for d in dims):
        raise ValueError(text)
    return tuple(int(d) for d in dims)


def parse_profile(text: str) -> tuple[str, Range]:
    """``"input_ids=1x16:4x128:8x512"`` → ``("input_ids", ((1, 16), (4, 128), (8, 512)))``."""
    name, sep, spec = str(text).rpartition("=")
    parts = spec.split(":")
    try:
        shapes = tuple(_dims(p) for p in parts)
    except ValueError:
        shapes = ()
    if not sep or not name or len(shapes) != 3:
        raise MixprecError(f"bad --profile {text!r}", PROFILE_FIX)
    return name, shapes  # type: ignore[return-value]


def range_text(r: Range) -> str:
    """``((1, 16), (4, 128), (8, 512))`` → ``"1x16:4x128:8x512"`` (as ``--profile`` takes it)."""
    return ":".join(shape_text(s) for s in r)


def _is_fixed(d) -> bool:
    return isinstance(d, int) and d > 0


def check_profiles(model: LoadedModel, profiles: dict | None) -> dict[str, Range]:
    """``profiles`` (``{input: (min, opt, max)}``) normalised, or a MixprecError saying what to fix: an
    input the model does not have, a shape of another rank than the input's, a fixed dim that differs
    in min, opt or max, a dim that is not min <= opt <= max, or a named dim (e.g. ``seq`` of both
    ``input_ids`` and ``attention_mask``) given different ranges by two profiles."""
    if not profiles:
        return {}
    specs = {s.name: s for s in model.inputs}
    unknown = sorted(set(profiles) - set(specs))
    if unknown:
        raise MixprecError(f"--profile names {', '.join(unknown)}, which the model has no input called",
                           f"give profiles for the model's inputs: {', '.join(specs)}")
    out: dict[str, Range] = {}
    problems: list[str] = []
    seen: dict[str, tuple[tuple[int, int, int], str]] = {}  # named dim -> (its range, where)
    for name, r in profiles.items():
        lo, opt, hi = (tuple(int(d) for d in s) for s in r)
        spec = specs[name]
        rank = len(spec.shape)
        shown = "x".join(str(d) for d in spec.shape) or "a scalar"
        if not len(lo) == len(opt) == len(hi) == rank:
            problems.append(f"{name}: min, opt and max have {len(lo)}, {len(opt)} and {len(hi)} dims; "
                            f"the input has {rank} ({shown})")
            continue
        for axis, (d, a, b, c) in enumerate(zip(spec.shape, lo, opt, hi)):
            if min(a, b, c) <= 0:
                problems.append(f"{name}: axis {axis} is {a}:{b}:{c}; dims must be positive")
            elif _is_fixed(d) and not a == b == c == d:
                problems.append(f"{name}: axis {axis} is fixed at {d} by the model, {a}:{b}:{c} given "
                                f"(write {d} in min, opt and max)")
            elif not a <= b <= c:
                problems.append(f"{name}: axis {axis} is {a}:{b}:{c}, not min <= opt <= max")
            elif isinstance(d, str) and d and d != "?":
                prev = seen.setdefault(d, ((a, b, c), f"{name} axis {axis}"))
                if prev[0] != (a, b, c):
                    problems.append(f"the dim {d} is {':'.join(map(str, prev[0]))} in {prev[1]} but {a}:{b}:{c} in "
                                    f"{name} axis {axis} (a named dim has one range in every input)")
        out[name] = (lo, opt, hi)
    if problems:
        raise MixprecError("the --profile shapes do not fit the model's inputs",
                           "give min:opt:max shapes of the input's rank, with the model's fixed dims in all three, "
                           "min <= opt <= max on every axis, and one range per named dim "
                           "(python -m core inspect MODEL shows the inputs)", details=problems)
    return out


def shapes_with_profiles(shapes: dict | None, profiles: dict[str, Range]) -> dict | None:
    """The whole-input shapes to open a project with: ``shapes`` (``--shape``) and every profile's opt.
    A ``--shape`` of a profiled input that is not its opt is a MixprecError."""
    shapes = {str(k): tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    bad = [f"{n}: --shape {shape_text(shapes[n])}, --profile opt {shape_text(r[1])}"
           for n, r in profiles.items() if n in shapes and shapes[n] != tuple(r[1])]
    if bad:
        raise MixprecError("--shape and --profile give an input two different shapes (the profile's opt is the "
                           "shape the project runs at)",
                           "leave out the --shape of a profiled input, or make it the profile's opt", details=bad)
    return {**shapes, **{n: tuple(r[1]) for n, r in profiles.items()}} or None


def input_ranges(model: LoadedModel, input_shapes: dict[str, Shape], profiles: dict | None = None) -> dict[str, Range]:
    """``{input: (min, opt, max)}`` of every input the exported engine gets a profile for: those with a
    dynamic dim. A profiled input takes its profile; another takes its shape (``input_shapes``) as min,
    opt and max, except along the named dims it shares with a profiled input, which take their range."""
    profiles = profiles or {}
    named: dict[str, tuple[int, int, int]] = {}
    for spec in model.inputs:
        if spec.name in profiles:
            for axis, d in enumerate(spec.shape):
                if isinstance(d, str) and d and d != "?":
                    named.setdefault(d, tuple(int(s[axis]) for s in profiles[spec.name]))
    out: dict[str, Range] = {}
    for spec in model.inputs:
        if not spec.dynamic_axes:
            continue
        if spec.name in profiles:
            out[spec.name] = tuple(tuple(int(d) for d in s) for s in profiles[spec.name])  # type: ignore[assignment]
            continue
        shape = tuple(int(d) for d in input_shapes[spec.name])
        lo, hi = list(shape), list(shape)
        for axis, d in enumerate(spec.shape if named else ()):
            if isinstance(d, str) and d in named and named[d][1] == shape[axis]:
                lo[axis], hi[axis] = named[d][0], named[d][2]
        out[spec.name] = (tuple(lo), shape, tuple(hi))
    return out


def profile_from_text(name: str, opt, min_text: str | None, max_text: str | None) -> Range | None:
    """The profile of ``name`` from a min and a max shape typed as text (``1x16``; either may be empty and
    then is ``opt``), around ``opt`` (the shape the input runs at); None when both are empty. A shape
    that is not ``AxB…`` of positive dims is a MixprecError (``check_profiles`` checks the rest)."""
    opt = tuple(int(d) for d in opt)
    typed = [(t or "").strip() for t in (min_text, max_text)]
    if not any(typed):
        return None
    out = []
    for what, text in zip(("min", "max"), typed):
        try:
            out.append(_dims(text) if text else opt)
        except ValueError:
            raise MixprecError(f"the {what} shape of {name}, {text!r}, is not a shape",
                               f"write every dim of {name} separated by x, e.g. {shape_text(opt)}, "
                               "or leave it empty") from None
    return out[0], opt, out[1]
