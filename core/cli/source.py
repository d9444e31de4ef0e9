"""The project a command runs on, from its arguments: one ``core.project.ProjectSource`` for every
command (``inspect``, ``build``, ``rank``, ``search``, ``export``, ``estimate``…)."""
from __future__ import annotations

from core.errors import MixprecError
from core.model.profiles import parse_profile
from core.model.shapes import parse_shape
from core.project import DEFAULT_TARGET, ProjectSource


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """``--dim NAME=VALUE`` (repeatable) → ``{NAME: VALUE}``; anything else is a MixprecError."""
    out = {}
    for item in items or []:
        name, _, value = item.partition("=")
        if not name or not (value.isascii() and value.isdigit()):
            raise MixprecError(f"bad --dim {item!r}", "write --dim NAME=VALUE, e.g. --dim seq=128")
        out[name] = int(value)
    return out


def parse_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``--shape INPUT=1x3x320x320`` (repeatable) → ``{INPUT: (1, 3, 320, 320)}``."""
    return dict(parse_shape(item) for item in items or [])


def parse_profiles(items: list[str] | None) -> dict | None:
    """``--profile INPUT=1x16:4x128:8x512`` (repeatable) → ``{INPUT: ((1, 16), (4, 128), (8, 512))}`` (None when
    not given; ``core.model.profiles``). An input given twice is a MixprecError."""
    out = {}
    for item in items or []:
        name, shapes = parse_profile(item)
        if name in out and out[name] != shapes:
            raise MixprecError(f"--profile gives {name} twice", f"give one --profile {name}=MIN:OPT:MAX")
        out[name] = shapes
    return out or None


def parse_branches(items: list[str] | None) -> dict[str, bool] | None:
    """``--branch INPUT=true|false`` (repeatable) → ``{INPUT: bool}`` (None when not given)."""
    out = {}
    for item in items or []:
        name, _, value = item.partition("=")
        if not name or value.lower() not in _BOOL:
            raise MixprecError(f"bad --branch {item!r}",
                               "write --branch INPUT=true|false, e.g. --branch use_cache_branch=false")
        out[name] = _BOOL[value.lower()]
    return out or None


_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def source_from_args(args) -> ProjectSource:
    """The project a command runs on: its model, ``--data``, ``--eval``, ``--shape``, ``--dim``,
    ``--batch``, ``--target``, ``--branch``, ``--no-batch`` and ``--profile`` (a bad ``--shape``, ``--dim`` or
    ``--profile`` is a MixprecError); a flag the command does not have is left at its default."""
    return ProjectSource(args.model, getattr(args, "data", None), getattr(args, "eval", None),
                         parse_shapes(getattr(args, "shape", None)), parse_dims(getattr(args, "dim", None)),
                         getattr(args, "batch", 1), getattr(args, "deploy_target", DEFAULT_TARGET),
                         parse_branches(getattr(args, "branch", None)), no_batch=getattr(args, "no_batch", None),
                         profiles=parse_profiles(getattr(args, "profile", None)))
