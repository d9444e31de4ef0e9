"""Evaluation helpers shared by runs, sensitivity and search: the FP32 reference engine, the
batch size quality is evaluated with, engine outputs and the cached FP32 reference outputs.

This module imports no backend: callers pass the backend object."""
from __future__ import annotations

import fcntl
import json
import zipfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from core.errors import MixprecError
from core.model.data import Dataset
from core.model.shapes import EVAL_BATCH, batch_axes, fixed_batch
from core.project import Project
from core.workspace import atomic_save_npz, atomic_write_json, discard_corrupt, file_stamp, sha256_bytes, stamps_match

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


REFERENCE_STAMPS = "reference-engine.json"  # the stamps of the reference engine's files, written when complete


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder`` (one process builds or checks its reference engine at a time)."""
    with open(folder / ".lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _engine_files(engine) -> list[Path]:
    return [Path(p) for p in (getattr(engine, "compiled_path", None), getattr(engine, "artifact_path", None)) if p]


def reference_engine(backend, project: Project):
    """The FP32 engine, built once per model and backend. Its files are stamped when complete
    (``reference-engine.json``: size and mtime of each); files without a matching stamp — half
    written by a build that died, truncated, rewritten — are removed and the engine is built again."""
    ref_dir = project.ws.reference_dir(backend.name, project.model.sha256)
    stamps_path = ref_dir / REFERENCE_STAMPS
    with _locked(ref_dir):
        try:
            stamps = json.loads(stamps_path.read_text()).get("files")
        except (OSError, ValueError, AttributeError):
            stamps = None
        engine_like = [p for p in ref_dir.iterdir() if p.name.startswith("reference-fp32") and p.is_file()]
        if engine_like and not stamps_match(stamps, ref_dir):
            for p in engine_like:
                discard_corrupt(p, f"{backend.name} reference engine file", "incomplete or changed since it was built")
            stamps_path.unlink(missing_ok=True)
        try:
            engine = backend.reference(project.model, ref_dir, project.input_shapes)
        except BaseException:  # e.g. a full disk: leave no half-written engine behind
            if not stamps_path.is_file():
                for p in ref_dir.glob("reference-fp32*"):
                    p.unlink(missing_ok=True)
            raise
        files = {p.name: file_stamp(p) for p in _engine_files(engine) if p.parent == ref_dir and p.is_file()}
        if files and files != stamps:
            atomic_write_json(stamps_path, {"files": files})
    return engine


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
                outs = [z[f"b{i}"] for i in range(len(z.files))]
            if len(outs) == len(batches):
                return outs
            discard_corrupt(path, "FP32 reference outputs", f"{len(outs)} batches, {len(batches)} expected")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            discard_corrupt(path, "FP32 reference outputs", f"{type(e).__name__}: {e}")  # recomputed, never fatal
    outs = engine_outputs(backend, reference, batches, name)
    atomic_save_npz(path, {f"b{i}": o for i, o in enumerate(outs)})
    return outs


def reference_on(backend, project: Project, ds: Dataset, batches) -> list[np.ndarray]:
    """FP32 outputs of ``project`` on ``ds`` (cached)."""
    sub = replace(project, eval_data=ds)
    return reference_outputs(backend, reference_engine(backend, project), sub, batches, output_name(project))
