"""A project: a loaded model with its inventory, calibration data and held-out evaluation
data, ready to build policies. The CLI and the dashboard both start here."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from core.errors import MixprecError
from core.model.data import Dataset, MissingData, check_dataset, generate_dataset, generated_bytes, load_npz
from core.model.inventory import Layer, build_inventory, inventory_frame
from core.model.load import LoadedModel, check_path_text, load_model
from core.model.profiles import check_profiles, shapes_with_profiles
from core.model.samples import materialize_sample
from core.model.shapes import DimChoice, check_memory, with_no_batch, model_batch, shape_choices, shape_text, shapes_of
from core.quant.policy import CalibrationSettings, Policy, default_policy
from core.workspace import Workspace

# where the user deploys: what latency numbers are compared with, and what the search optimises
DEPLOY_TARGETS = ("tensorrt", "onnxruntime")
DEFAULT_TARGET = "tensorrt"  # mixprec's users deploy on TensorRT; ONNX Runtime (CPU) is the embedded backend
TARGET_LABELS = {"tensorrt": "TensorRT (GPU)", "onnxruntime": "ONNX Runtime (CPU)"}


def check_target(target: str) -> str:
    """``target`` if it is a deployment target, else a MixprecError naming them."""
    if target not in DEPLOY_TARGETS:
        raise MixprecError(f"unknown deployment target {target!r}", f"use one of {', '.join(DEPLOY_TARGETS)}")
    return target


@dataclass
class Project:
    model: LoadedModel
    layers: list[Layer]
    calib_data: Dataset
    eval_data: Dataset
    input_shapes: dict[str, tuple[int, ...]]
    ws: Workspace = field(default_factory=Workspace.default)
    shape_choices: list[DimChoice] = field(default_factory=list)  # every input dim: value and source
    target: str = DEFAULT_TARGET  # the deployment target (DEPLOY_TARGETS): TensorRT on a GPU, or ONNX Runtime's CPU
    profiles: dict = field(default_factory=dict)  # input -> (min, opt, max) of the engine (core.model.profiles)
    user_calibration: bool = False  # the calibration data is the user's (not generated, not a bundled sample's)

    @property
    def data_notes(self) -> list[str]:
        """Advice on the user's data: fewer than :data:`ADVISED_CALIBRATION` calibration samples."""
        n = self.calib_data.num_samples
        if self.user_calibration and 0 < n < ADVISED_CALIBRATION:
            return [f"{n} calibration sample{'s' * (n != 1)} ({self.calib_data.source}): the field's advice is "
                    f"{ADVISED_CALIBRATION}–500 representative samples, so that the INT8 ranges cover what the "
                    "model sees in deployment"]
        return []

    @property
    def data_generated(self) -> bool:
        """Whether the calibration or evaluation data was generated (not the user's or the sample's)."""
        return bool(self.calib_data.generated or self.eval_data.generated)

    @property
    def data_problem(self) -> MixprecError | None:
        """Why there is no data to calibrate or evaluate with (an input needs an .npz), or None."""
        return next((d.problem for d in (self.calib_data, self.eval_data) if isinstance(d, MissingData)), None)

    @property
    def batch(self) -> int:
        """The batch the model is built and timed at (the value at its inputs' batch axis)."""
        return model_batch(self.model, self.input_shapes)

    def default_policy(self, network_default: str = "fp32", method: str = "minmax") -> Policy:
        settings = CalibrationSettings(method=method, num_samples=self.calib_data.num_samples,
                                       data_sha256=self.calib_data.sha256)
        return default_policy(self.model, self.layers, network_default, settings)

    def inventory(self):
        return inventory_frame(self.layers)

    @property
    def total_macs(self) -> int:
        """The MACs of every MAC-bearing layer (the denominator of the INT8 share of MACs): the
        INT8-eligible ones and those that cannot be INT8 (LSTM, GRU, Einsum, Attention, control flow)."""
        return sum(l.macs for l in self.layers)


def _opt_text(v, what: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise TypeError(f"the {what} of a project source is a string or null")


@dataclass(frozen=True)
class ProjectSource:
    """Where a project comes from: the model (a path or ``sample:NAME``), its calibration and
    evaluation data (.npz paths; None: the sample's, else held out or generated, see
    :func:`open_project`), the input shapes (``shapes``: whole inputs, ``dims``: named dims, ``batch``;
    see ``core.model.shapes``) and the deployment ``target`` (None: not chosen, :data:`DEFAULT_TARGET`).

    The one record of it: a job's params carry it (``core.jobs.params``), a saved dashboard project
    stores it (``core.store.drafts``), the CLI builds it from its arguments and the dashboard keeps it
    in the session. Shapes are kept as tuples (JSON: lists); empty shapes or dims are None."""

    model: str
    data: str | None = None
    eval_data: str | None = None
    shapes: dict[str, tuple[int, ...]] | None = None
    dims: dict[str, int] | None = None
    batch: int = 1
    target: str | None = None
    branches: dict[str, bool] | None = None  # a merged decoder's If branches fixed on load (core.model.branches)
    no_batch: tuple[str, ...] | None = None  # inputs the user marked "no batch axis" (fed whole, one sample per array)
    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] | None = None  # input -> min, opt, max

    def __post_init__(self):
        shapes = {str(k): tuple(int(d) for d in v) for k, v in self.shapes.items()} if self.shapes else None
        dims = {str(k): int(v) for k, v in self.dims.items()} if self.dims else None
        if self.branches is not None and not isinstance(self.branches, dict):
            raise TypeError("the branches of a project source are an object or null")
        branches = {str(k): bool(v) for k, v in self.branches.items()} if self.branches else None
        if self.no_batch is not None and isinstance(self.no_batch, (str, bytes, dict)):
            raise TypeError("the no_batch of a project source is a list of input names or null")
        no_batch = tuple(sorted({str(n) for n in self.no_batch})) if self.no_batch else None
        if self.profiles is not None and not isinstance(self.profiles, dict):
            raise TypeError("the profiles of a project source are an object or null")
        profiles = {str(k): tuple(tuple(int(d) for d in shape) for shape in v) for k, v in self.profiles.items()} \
            if self.profiles else None
        if profiles and any(len(v) != 3 for v in profiles.values()):
            raise ValueError("a profile of a project source is [min, opt, max]")
        normal = {"model": str(self.model), "data": None if self.data is None else str(self.data),
                  "eval_data": None if self.eval_data is None else str(self.eval_data), "shapes": shapes,
                  "dims": dims, "batch": int(self.batch), "branches": branches,
                  "no_batch": no_batch, "profiles": profiles}
        for name, value in normal.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def __hash__(self) -> int:  # the dicts are compared by value (dataclass eq): hash their canonical JSON
        return hash(json.dumps(self.to_json(), sort_keys=True))

    @property
    def deploy_target(self) -> str:
        """The deployment target: ``target``, or the default when none was chosen."""
        return self.target or DEFAULT_TARGET

    def to_json(self) -> dict:
        """JSON-serialisable, every field written out (shapes as lists of ints)."""
        return {"model": self.model, "data": self.data, "eval_data": self.eval_data,
                "shapes": {k: list(v) for k, v in self.shapes.items()} if self.shapes else None,
                "dims": dict(self.dims) if self.dims else None, "batch": self.batch, "target": self.target,
                "branches": dict(self.branches) if self.branches else None,
                "no_batch": list(self.no_batch) if self.no_batch else None,
                "profiles": {k: [list(s) for s in v] for k, v in self.profiles.items()} if self.profiles else None}

    @classmethod
    def from_json(cls, doc: dict) -> "ProjectSource":
        """The source of :meth:`to_json` (or of any document holding its keys, e.g. a job's params:
        other keys are ignored, missing ones take their defaults). A value of the wrong type is a
        TypeError or ValueError (the reader says which document is damaged)."""
        if not isinstance(doc.get("model"), str):
            raise TypeError("the model of a project source is a string")
        shapes, dims = doc.get("shapes"), doc.get("dims")
        if not isinstance(shapes, (dict, type(None))) or not isinstance(dims, (dict, type(None))):
            raise TypeError("the shapes and dims of a project source are objects or null")
        return cls(doc["model"], _opt_text(doc.get("data"), "data"), _opt_text(doc.get("eval_data"), "eval_data"),
                   shapes, dims, int(doc.get("batch") or 1), _opt_text(doc.get("target"), "target"),
                   doc.get("branches"), doc.get("no_batch"), doc.get("profiles"))

    def open(self, ws: Workspace | None = None, progress=None, sample_data: bool = True) -> "Project":
        """The project of this source (:func:`open_project`)."""
        return open_project(self.model, self.data, self.eval_data, ws=ws, batch=self.batch, shape_overrides=self.dims,
                            shapes=self.shapes, progress=progress, target=self.deploy_target, sample_data=sample_data,
                            branches=self.branches, no_batch=self.no_batch,
                            profiles=self.profiles)


def _as_dataset(source, model: LoadedModel, ws: Workspace | None = None) -> Dataset:
    if isinstance(source, Dataset):
        check_dataset(source, model)
        return source
    return load_npz(source, model, ws_root=ws.root if ws else None)


ADVISED_CALIBRATION = 200  # calibration samples: the field's advice is 200–500 (TensorRT's and ModelOpt's guides)
CALIB_GENERATED, EVAL_GENERATED = 32, 16  # samples generated when no data is given (at least; see open_project)


def _check_memory(model: LoadedModel, shapes: dict, calib: Dataset | None, evald: Dataset | None) -> None:
    """The shapes and batch against the memory budget (``core.model.shapes.check_memory``), counting the
    data that would be generated, before any of it is."""
    b = model_batch(model, shapes)
    counts = ([max(CALIB_GENERATED, b)] if calib is None else []) + ([max(EVAL_GENERATED, 2 * b)] if evald is None else [])
    data = sum(generated_bytes(model, n, shapes) for n in counts)
    check_memory(model, shapes, data, f"generated data ({' + '.join(map(str, counts))} samples)" if counts else "")


def _holdout(calib: Dataset) -> tuple[Dataset, Dataset]:
    """(calibration, evaluation): the last quarter of ``calib`` held out (whole fixed batches)."""
    n, step = calib.num_samples, calib.fixed_batch or 1
    held = max(step, (n // 4) // step * step)
    if n - held < step or n < 4:
        need = max(4, 2 * step)
        raise MixprecError(f"{calib.source} has {n} samples: too few to hold some out for evaluation",
                           f"give at least {need} samples, or a separate evaluation .npz (--eval)")
    return calib.slice(0, n - held), calib.slice(n - held)


def _check_fits(ds: Dataset, choices: list[DimChoice], shapes: dict[str, tuple[int, ...]]) -> None:
    """The data must have the user's given dims (other dims may vary between data sets, e.g. the
    sequence length of the calibration and the evaluation data)."""
    def sample_shape(name):  # a stacked input's arrays hold whole samples along a new axis 0
        a = ds.arrays[name]
        return a.shape[1:] if name in ds.stacked else a.shape

    bad = [f"{c.input}: axis {c.axis} is {sample_shape(c.input)[c.axis]}, the shape is {shape_text(shapes[c.input])}"
           for c in choices if c.source == "given" and c.input in ds.arrays and c.axis != ds.axis(c.input)
           and len(sample_shape(c.input)) == len(shapes[c.input]) and sample_shape(c.input)[c.axis] != c.value]
    if bad:
        raise MixprecError(f"the data in {ds.source} does not have the input shapes given",
                           "give --shape/--dim values that match the data, or data of that shape", details=bad)


def _generated(model: LoadedModel, n: int, seed: int, shapes: dict[str, tuple[int, ...]]) -> Dataset:
    """Generated data, or a MissingData that raises the reason when samples are needed (so a model
    whose inputs mixprec cannot invent still opens for inspection)."""
    try:
        return generate_dataset(model, n, seed=seed, shapes=shapes)
    except MixprecError as e:
        return MissingData({}, "missing", generated=True, problem=e)


def open_project(model_spec, data=None, eval_data=None, ws: Workspace | None = None, batch: int = 1,
                 shape_overrides: dict[str, int] | None = None, shapes: dict | None = None,
                 progress=None, target: str = DEFAULT_TARGET, sample_data: bool = True,
                 branches: dict[str, bool] | None = None, no_batch=None, profiles: dict | None = None) -> Project:
    """Load a model (path or ``sample:NAME``) with its data, at the input shapes given
    (``shapes``: whole inputs, ``shape_overrides``: named dims, ``batch``; see ``core.model.shapes``).

    Calibration data: ``data`` (a .npz path/bytes or Dataset), else the sample's calib.npz,
    else generated data. Evaluation data: ``eval_data``, else the sample's eval.npz, else the
    last quarter of ``data`` (which is then not used for calibration), else generated data
    with another seed. Evaluation never sees calibration samples. ``target``: where the model is
    deployed (``DEPLOY_TARGETS``; default TensorRT, where mixprec's users deploy). ``sample_data=False``:
    a sample's own data is not used (generated data at the shapes given instead). ``branches``: a merged
    decoder's If branches to fix (``core.model.branches``; default: the cache branch). ``profiles``: the
    dynamic-shape profiles ``{input: (min, opt, max)}`` (``core.model.profiles``): the project runs at their opt."""
    check_target(target)
    for given, what in ((data, "calibration data file"), (eval_data, "evaluation data file")):
        if isinstance(given, (str, os.PathLike)):
            check_path_text(given, what)  # (a link's ?data= is any text) before the model loads
    ws = ws or Workspace.default()
    model = with_no_batch(load_model(model_spec, ws, progress=progress, branches=branches), no_batch)
    profiles = check_profiles(model, profiles)
    shapes = shapes_with_profiles(shapes, profiles)  # the project runs at each profile's opt
    user_calibration = data is not None
    if model.sample and sample_data:  # sample_data=False: generated data at the shapes given (estimates need none)
        paths = materialize_sample(model.sample, ws)
        data = data if data is not None else paths.calib
        eval_data = eval_data if eval_data is not None else paths.eval
    calib = _as_dataset(data, model, ws) if data is not None else None
    evald = _as_dataset(eval_data, model, ws) if eval_data is not None else None
    if calib is not None and evald is None:
        calib, evald = _holdout(calib)
    given = calib or evald
    choices = shape_choices(model, given.arrays if given else None, batch, shape_overrides, shapes)
    input_shapes = shapes_of(model, choices)
    for ds in (calib, evald):
        if ds is not None:
            _check_fits(ds, choices, input_shapes)
    _check_memory(model, input_shapes, calib, evald)
    b = model_batch(model, input_shapes)
    if calib is None:
        calib = _generated(model, max(CALIB_GENERATED, b), 0, input_shapes)
    if evald is None:
        evald = _generated(model, max(EVAL_GENERATED, 2 * b), 1, input_shapes)  # two batches: dev + held-out
    layers = build_inventory(model, calib.arrays, input_shapes)
    return Project(model, layers, calib, evald, input_shapes, ws, choices, target, profiles=profiles,
                   user_calibration=user_calibration)
