"""A project: a loaded model with its inventory, calibration data and held-out evaluation
data, ready to build policies. The CLI and the dashboard both start here."""
from __future__ import annotations

from dataclasses import dataclass, field

from .data import Dataset, check_dataset, generate_dataset, load_npz
from .errors import MixprecError
from .inventory import Layer, build_inventory, inventory_frame
from .model import LoadedModel, load_model, resolve_input_shapes
from .policy import CalibrationSettings, Policy, default_policy
from .samples import materialize_sample
from .workspace import Workspace


@dataclass
class Project:
    model: LoadedModel
    layers: list[Layer]
    calib_data: Dataset
    eval_data: Dataset
    input_shapes: dict[str, tuple[int, ...]]
    ws: Workspace = field(default_factory=Workspace.default)

    def default_policy(self, network_default: str = "fp32", method: str = "minmax") -> Policy:
        settings = CalibrationSettings(method=method, num_samples=self.calib_data.num_samples,
                                       data_sha256=self.calib_data.sha256)
        return default_policy(self.model, self.layers, network_default, settings)

    def inventory(self):
        return inventory_frame(self.layers)

    @property
    def eligible_macs(self) -> int:
        return sum(l.macs for l in self.layers if l.eligible)


def _as_dataset(source, model: LoadedModel) -> Dataset:
    if isinstance(source, Dataset):
        check_dataset(source, model)
        return source
    return load_npz(source, model)


def open_project(model_spec, data=None, eval_data=None, ws: Workspace | None = None, batch: int = 1,
                 shape_overrides: dict[str, int] | None = None, progress=None) -> Project:
    """Load a model (path or ``sample:NAME``) with its data.

    Calibration data: ``data`` (a .npz path/bytes or Dataset), else the sample's calib.npz,
    else generated data. Evaluation data: ``eval_data``, else the sample's eval.npz, else the
    last quarter of ``data`` (which is then not used for calibration), else generated data
    with another seed. Evaluation never sees calibration samples."""
    ws = ws or Workspace.default()
    model = load_model(model_spec, ws, progress=progress)
    if model.sample:
        paths = materialize_sample(model.sample, ws)
        data = data if data is not None else paths.calib
        eval_data = eval_data if eval_data is not None else paths.eval
    calib = _as_dataset(data, model) if data is not None else None
    evald = _as_dataset(eval_data, model) if eval_data is not None else None
    if calib is not None and evald is None:
        n = calib.num_samples
        if n < 4:
            raise MixprecError(f"{calib.source} has {n} samples: too few to hold some out for evaluation",
                               "give at least 4 samples, or a separate evaluation .npz (--eval)")
        cut = n - max(1, n // 4)
        evald, calib = calib.slice(cut), calib.slice(0, cut)
    shapes = resolve_input_shapes(model, calib.arrays if calib else None, batch, shape_overrides)
    if calib is None:
        calib = generate_dataset(model, 32, seed=0, shapes=shapes)
    if evald is None:
        evald = generate_dataset(model, 16, seed=1, shapes=shapes)
    layers = build_inventory(model, calib.arrays)
    return Project(model, layers, calib, evald, shapes, ws)

