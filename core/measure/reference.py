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
from core.workspace import atomic_save_npz, atomic_write_json, cache_note, discard_corrupt, file_stamp, sha256_bytes, stamps_match

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
        most = min(EVAL_BATCH, n, project.model.max_batch or EVAL_BATCH)
        return max(d for d in range(1, most + 1) if n % d == 0)
    return project.batch


BATCH_PROBE_VERSION = 1


def _feed_key(feed: dict) -> str:
    return sha256_bytes(json.dumps({k: [str(v.dtype), list(np.shape(v))] for k, v in sorted(feed.items())}).encode())


def settle_eval_batch(backend, project: Project) -> Project:
    """The project with the batch its graph really runs at. Many exports declare a dynamic batch but only
    run at batch 1 (a Reshape to a constant ``[1, …]`` shape traced from ``x.view(1, …)``): the first
    evaluation batch is tried on the FP32 reference at its size; when ONNX Runtime refuses it and one sample
    runs, the model's ``max_batch`` becomes 1 (remembered in the reference folder, keyed by the feed's shapes)
    and quality is evaluated one sample at a time, with a note. A build or timing batch above 1 on such a
    model is refused, naming the node; a feed refused at batch 1 too is the data's problem (its error)."""
    size = max(eval_batch(project), project.batch)
    if size <= 1 or project.model.max_batch or fixed_batch(project.model) or project.eval_data.num_samples < size:
        return project
    feed = project.eval_data.batches(size)[0]
    ref = reference_engine(backend, project)
    path = Path(ref.compiled_path).parent / f"batch-probe-v{BATCH_PROBE_VERSION}-{_feed_key(feed)[:16]}.json"
    try:
        doc = json.loads(path.read_text())
        max_batch, why = doc["max_batch"], str(doc.get("why", ""))
    except FileNotFoundError:
        max_batch = why = None
    except (OSError, ValueError, KeyError, TypeError) as e:
        discard_corrupt(path, "batch probe", f"{type(e).__name__}: {e}")
        max_batch = why = None
    if why is None:
        max_batch, why = None, ""
        with backend.runner(ref) as r:
            try:
                r.infer(feed)
            except MixprecError as e:
                r.infer(project.eval_data.batches(1)[0])  # refused at 1 too: the data's own problem, raised
                max_batch, why = 1, e.what.split("; the inputs were")[0].replace("ONNX Runtime refused the inputs "
                                                                                   "while running the model in its ", "")
        atomic_write_json(path, {"max_batch": max_batch, "why": why, "batch": size})
    if not max_batch:
        return project
    if project.batch > 1:
        raise MixprecError(f"the model runs at batch 1 only, not at the batch {project.batch} asked for: {why}",
                           "use --batch 1 (on the dashboard: batch 1 in the Model page's Input shapes), or export the "
                           "model with a batch that is not fixed in its Reshape shapes")
    cache_note(f"{project.model.name} declares a dynamic batch but runs at batch 1 only (at batch {size}: {why[:240]}); quality is "
               "evaluated one sample at a time")
    return replace(project, model=replace(project.model, max_batch=int(max_batch)))


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


def engine_outputs_of(backend, engine, batches, names: list[str]) -> dict[str, list[np.ndarray]]:
    """:func:`engine_outputs` of several outputs, in one pass over the batches."""
    out: dict[str, list[np.ndarray]] = {n: [] for n in names}
    with backend.runner(engine) as r:
        for b in batches:
            res = r.infer(b)
            for n in names:
                out[n].append(np.asarray(res[n]))
    return out


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


def reference_on(backend, project: Project, ds: Dataset, batches, name: str | None = None) -> list[np.ndarray]:
    """FP32 outputs of ``project`` on ``ds`` (cached): of ``name``, default the first float output."""
    sub = replace(project, eval_data=ds)
    return reference_outputs(backend, reference_engine(backend, project), sub, batches, name or output_name(project))
