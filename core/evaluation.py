"""Evaluation helpers shared by runs, sensitivity and search: the FP32 reference engine, the
batch size quality is evaluated with, engine outputs and the cached FP32 reference outputs.

This module imports no backend: callers pass the backend object, so ``backends`` can use
``EVAL_BATCH`` without an import cycle."""
from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from .data import Dataset
from .errors import MixprecError
from .project import Project
from .shapes import batch_axes, fixed_batch
from .workspace import atomic_save_npz, sha256_bytes

EVAL_BATCH = 16
OUTPUTS_FORMAT_VERSION = 2  # 2: keyed by the backend's identity (TensorRT version, GPU; issue 11, bug 5)


def eval_batch(project: Project) -> int:
    """The batch quality is evaluated with: the model's fixed batch when it has one; up to
    EVAL_BATCH (a divisor of the sample count) when every input has a dynamic batch axis (same
    numerics, less time); else the project's batch."""
    fb = fixed_batch(project.model)
    if fb:
        return fb
    axes = batch_axes(project.model)
    dynamic = all(axes[s.name] is not None and axes[s.name] in s.dynamic_axes for s in project.model.inputs)
    n = project.eval_data.num_samples
    if dynamic and n:
        return max(d for d in range(1, min(EVAL_BATCH, n) + 1) if n % d == 0)
    return project.batch


def eval_batches(project: Project, ds: Dataset | None = None) -> list[dict[str, np.ndarray]]:
    """``ds`` (default: the project's evaluation data) in evaluation batches."""
    ds = project.eval_data if ds is None else ds
    return ds.batches(eval_batch(replace(project, eval_data=ds)))


def output_name(project: Project) -> str:
    """The model output that quality is measured on: its first float output."""
    return next(o.name for o in project.model.outputs if o.is_float)


def timing_feed(project: Project) -> dict[str, np.ndarray]:
    """One batch at the project's batch size, for timing and profiling."""
    feeds = project.eval_data.batches(project.batch)
    if not feeds:
        raise MixprecError(f"the evaluation data has {project.eval_data.num_samples} samples, fewer than the batch "
                           f"{project.batch} the model is timed at",
                           f"give at least {project.batch} evaluation samples, or a smaller --batch")
    return feeds[0]


def reference_engine(backend, project: Project):
    """The FP32 engine, built once per model and backend."""
    ref_dir = project.ws.sub("reference", backend.name, project.model.sha256[:16])
    return backend.reference(project.model, ref_dir, project.input_shapes)


def engine_outputs(backend, engine, batches, name: str) -> list[np.ndarray]:
    with backend.runner(engine) as r:
        return [np.asarray(r.infer(b)[name]) for b in batches]


def backend_identity(backend) -> str:
    """What a backend's outputs depend on beyond the model: its ``identity()`` where it has one (the
    TensorRT backend: TensorRT version, GPU, TF32), else its name."""
    identity = getattr(backend, "identity", None)
    return f"{backend.name}: {identity()}" if callable(identity) else str(backend.name)


def reference_outputs(backend, reference, project: Project, batches, name: str) -> list[np.ndarray]:
    """FP32 outputs on the project's evaluation data, cached by model (the reference's folder) +
    backend identity + data + output + format version. A damaged cache file is recomputed."""
    ident = sha256_bytes(backend_identity(backend).encode())[:12]
    key = f"outputs-v{OUTPUTS_FORMAT_VERSION}-{ident}-{project.eval_data.sha256[:16]}-{len(batches)}-" \
          f"{name.replace('/', '_')}.npz"
    path = Path(reference.compiled_path).parent / key
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return [z[f"b{i}"] for i in range(len(z.files))]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            path.unlink(missing_ok=True)  # a corrupt cache is recomputed, never fatal
    outs = engine_outputs(backend, reference, batches, name)
    atomic_save_npz(path, {f"b{i}": o for i, o in enumerate(outs)})
    return outs


def reference_on(backend, project: Project, ds: Dataset, batches) -> list[np.ndarray]:
    """FP32 outputs of ``project`` on ``ds`` (cached)."""
    sub = replace(project, eval_data=ds)
    return reference_outputs(backend, reference_engine(backend, project), sub, batches, output_name(project))
