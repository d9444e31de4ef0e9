"""Optimisation profiles: the ``(min, opt, max)`` shape of each input an engine is built for, and
Polygraphy's ``Profile`` of them (as ``polygraphy/backend/trt/profile.py``)."""
from __future__ import annotations

from core.errors import MixprecError
from core.model.profiles import input_ranges
from core.model.shapes import EVAL_BATCH, batch_axes


def profile_shapes(input_shapes: dict[str, tuple[int, ...]], overrides: dict | None = None,
                   dynamic_batch=(), max_batch: int | None = None) -> dict:
    """``{input: (min, opt, max)}``. By default opt is the project's shape and so are min and max,
    except that inputs in ``dynamic_batch`` (a dynamic batch axis in the model: ``{input: axis}``,
    or input names whose batch is axis 0) take batches from 1 up to ``max_batch`` (default:
    ``core.model.shapes.EVAL_BATCH``, the batch quality is evaluated in) along that axis.
    ``overrides`` replaces an input's range; it must contain the project's shape."""
    if max_batch is None:
        max_batch = EVAL_BATCH
    axes = dict(dynamic_batch) if isinstance(dynamic_batch, dict) else {n: 0 for n in dynamic_batch}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(input_shapes))
    if unknown:
        raise MixprecError("the optimisation profiles name inputs the model does not have",
                           f"give ranges for the model's inputs: {', '.join(input_shapes)}", details=unknown)
    out, bad = {}, []
    for name, shape in input_shapes.items():
        shape = tuple(int(d) for d in shape)
        ax = axes.get(name)
        default = (shape, shape, shape) if ax is None or ax >= len(shape) else \
            (_with_dim(shape, ax, 1), shape, _with_dim(shape, ax, max(shape[ax], max_batch)))
        try:
            lo, opt, hi = (tuple(int(d) for d in s) for s in overrides.get(name, default))
        except (TypeError, ValueError):
            bad.append(f"{name}: {overrides[name]!r} is not three shapes (min, opt, max)")
            continue
        ranks_ok = len(lo) == len(opt) == len(hi) == len(shape)
        if not ranks_ok or not all(a <= b <= c for a, b, c in zip(lo, opt, hi)) \
                or not all(a <= s <= c for a, s, c in zip(lo, shape, hi)):
            bad.append(f"{name}: min {lo} opt {opt} max {hi} (run shape {shape})")
        out[name] = (lo, opt, hi)
    if bad:
        raise MixprecError("some optimisation profiles are not min <= opt <= max around the run's input shape",
                           "give (min, opt, max) shapes of the input's rank with min <= opt <= max, "
                           "each containing the shape the project runs at", details=bad)
    return out


def _with_dim(shape: tuple[int, ...], axis: int, value: int) -> tuple[int, ...]:
    return (*shape[:axis], value, *shape[axis + 1:])


def dynamic_batch_axes(model) -> dict[str, int]:
    """Inputs whose batch axis (``core.model.shapes.batch_axes``, not necessarily axis 0) is dynamic (none where
    the graph runs at batch 1 only: ``LoadedModel.max_batch``, ``core.measure.reference.settle_eval_batch``)."""
    if model.max_batch == 1:
        return {}
    specs = {s.name: s for s in model.inputs}
    return {n: ax for n, ax in batch_axes(model).items() if ax is not None and ax in specs[n].dynamic_axes}


def project_trt_options(project, options: dict | None = None) -> dict:
    """The TensorRT backend's options (``TensorRTBackend(**options)``) for a build of ``project``: ``options``
    (e.g. ``--trt-profile`` ranges, which win for the inputs they name) with the project's dynamic-shape
    profiles (``project.profiles``, ``--profile``; ``core.model.profiles.input_ranges``: also the named dims
    an unprofiled input shares). Their opt is the project's shape. Along a dynamic batch axis the range is
    widened to cover batches 1 to ``EVAL_BATCH``, the batches quality is evaluated in (the export keeps the
    user's range as given)."""
    given = dict(options or {})
    profiles = getattr(project, "profiles", None)
    if not profiles:
        return given
    axes = dynamic_batch_axes(project.model)
    ranges = {n: r for n, r in input_ranges(project.model, project.input_shapes, profiles).items()
              if n in profiles or r[0] != r[2]}
    widened = {}
    for name, (low, opt, high) in ranges.items():
        ax = axes.get(name)
        wide = ax is not None and ax < len(opt)
        widened[name] = (_with_dim(low, ax, min(low[ax], 1)) if wide else low, opt,
                         _with_dim(high, ax, max(high[ax], EVAL_BATCH)) if wide else high)
    return {**given, "profiles": {**widened, **(given.get("profiles") or {})}}  # no self-update: the API scan converges


def trt_profile(shapes: dict):
    """Polygraphy's ``Profile`` of ``{input: (min, opt, max)}`` (:func:`profile_shapes`)."""
    from polygraphy.backend.trt import Profile

    profile = Profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.add(name, min=lo, opt=opt, max=hi)
    return profile
