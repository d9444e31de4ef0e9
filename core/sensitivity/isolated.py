"""Isolated and leave-one-out sensitivity on a switchable model.

The layer-wise comparison (``core.sensitivity.cumulative``) is cumulative: late layers look
sensitive because early layers are quantized. Here every INT8-eligible layer is measured *on
its own*:

* **isolated**: only that layer INT8 (everything else as in the base policy), quality drop
  against FP32 on held-out data;
* **leave-one-out**: every eligible layer INT8 except that one, quality gain.

All trials run on one *switchable* model (``compile_policy(..., switchable=True)``): each
layer's Q/DQ sits behind a boolean graph input, so a trial is one inference pass with other
flags — calibration happens once and is reused, no re-quantization per layer. Trials run in
parallel worker processes (:class:`TrialPool`); the search (``core.search``) uses the same pool.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import pandas as pd

from core.backends import select_backend
from core.errors import MixprecError
from core.measure.evaluation import MetricSpec, project_outputs
from core.measure.metrics import Quality
from core.measure.reference import eval_batches, output_name, reference_on, settle_eval_batch
from core.model.data import Dataset
from core.model.external import data_files
from core.model.inventory import require_eligible
from core.project import Project
from core.quant.calibration import calibrate_policy
from core.quant.compile import compile_policy
from core.quant.policy import Policy
from core.records import check_format, frame_from_json, frame_to_json
from core.sensitivity.distributed import RayTrialPool, ray_address, run_trial, trial_arrays, trial_session
from core.sensitivity.memory import release_memory
from core.workspace import (TempFolder, Workspace, analysis_key, atomic_write_json, die_with_parent, detach_output,
                            discard_corrupt, exit_when_gone, file_stamp, process_start, sha256_bytes)

# in the cache keys of switchable models; 2: one shared QuantizeLinear per tensor; 3: a weight's switch is an
# If (int8 DequantizeLinear / float16 copy cast to float32), no float32 copy of the weight
SWITCHABLE_FORMAT_VERSION = 3
MODES = ("isolated", "leave-one-out")
SENSITIVITY_COLUMNS = ["rank", "name", "op_type", "macs", "mode", "method", "cosine", "delta", "snr_db"]


# --- trials on the switchable model, in worker processes -----------------------------------
_W: dict = {}


def _ref_file(path: Path, i: int) -> Path:
    return path.with_name(f"{path.stem}-ref{i}.npy")


def _extra_file(path: Path, j: int, i: int) -> Path:
    return path.with_name(f"{path.stem}-x{j}-ref{i}.npy")


def _save_trial_data(path: Path, data: "TrialData") -> None:
    """The trial data as files the workers load: the pickled start-up message of a spawned worker stays
    small (a worker that dies while the parent writes a large one hangs the parent). The FP32 reference
    outputs are .npy files of their own, which every worker maps (one copy in the page cache for all of
    them: a 151,936-wide vocabulary's logits are hundreds of MB); the batches and labels are one .npz."""
    arrays = trial_arrays(data.batches, [], data.labels)
    for i, r in enumerate(data.ref):
        np.save(_ref_file(path, i), np.ascontiguousarray(r))
    extra = list((data.extra or {}).items())  # the other graph outputs the metrics read (issue 22 §3)
    for j, (_, refs) in enumerate(extra):
        for i, r in enumerate(refs):
            np.save(_extra_file(path, j, i), np.ascontiguousarray(r))
    names = {"extra_names": np.array([n for n, _ in extra], dtype=str)} if extra else {}
    np.savez(path, refs=np.array(len(data.ref)), **names, **arrays)


def _load_trial_data(path: str, out_name: str, metrics: MetricSpec | None = None) -> "TrialData":
    with np.load(path, allow_pickle=False) as z:
        n = int(z["refs"])
        ref = [np.load(_ref_file(Path(path), i), mmap_mode="r") for i in range(n)]
        files = list(z.keys())
        batches = [{k.split("/", 1)[1]: z[k] for k in files if k.startswith(f"b{i}/")} for i in range(n)]
        labels = z["labels"] if "labels" in files else None
        names = [str(s) for s in z["extra_names"]] if "extra_names" in files else []
    extra = {name: [np.load(_extra_file(Path(path), j, i), mmap_mode="r") for i in range(n)]
             for j, name in enumerate(names)}
    return TrialData(batches, ref, out_name, labels, metrics, extra or None)


WORKER_LOG = "workers.log"  # in the pool's temp folder: what the workers print (their fds 1 and 2)


def _guard_worker(owner: tuple[int, str | None], log: str) -> None:
    """A worker lives only as long as the process that opened its pool (``owner``: pid, start time), and holds
    none of its output: fds 1 and 2 go to the pool's log (a pipeline reading a killed CLI's stdout ends; issue 23
    fault 3). Its parent is the forkserver, which lives while any worker does, so the kernel's parent-death
    signal alone would not fire: a thread watches the owner (multiprocessing's parent sentinel, ready the moment
    the owner dies; its pid as a fallback) and ends the worker, in the middle of a trial too."""
    detach_output(log)
    die_with_parent(signal.SIGKILL)  # the forkserver killed
    parent = mp.parent_process()
    exit_when_gone(owner[0], owner[1], getattr(parent, "sentinel", None))


def _worker_init(owner: tuple[int, str | None], log: str, model_path: str, data_path: str, switch_inputs: list[str],
                 out_name: str, threads: int, metrics: MetricSpec | None = None):
    _guard_worker(owner, log)
    data = _load_trial_data(data_path, out_name, metrics)
    _W.update(sess=trial_session(model_path, threads), batches=data.batches, switches=switch_inputs, ref=data.ref,
              out=out_name, labels=data.labels, metrics=metrics, extra=data.extra)


def _worker_eval(on: frozenset) -> Quality:
    return run_trial(_W["sess"], _W["batches"], _W["switches"], _W["ref"], _W["out"], _W["labels"], on,
                     _W["metrics"], _W["extra"])


@dataclass
class TrialData:
    """What trials are measured on: evaluation batches of one dataset and their FP32 outputs."""

    batches: list
    ref: list
    out_name: str
    labels: np.ndarray | None = None
    metrics: MetricSpec | None = None  # what quality is measured on (core.measure.evaluation; None: out_name)
    extra: dict | None = None  # the FP32 outputs of the other graph outputs ``metrics`` reads, by name


def trial_data(project: Project, ds: Dataset, metrics: MetricSpec | None = None) -> TrialData:
    """``ds`` in evaluation batches with its FP32 outputs (ONNX Runtime, cached per model, data and output):
    of every output ``metrics`` reads (default: the first float output)."""
    be, _ = select_backend("onnxruntime")
    project = settle_eval_batch(be, replace(project, eval_data=ds))
    batches = eval_batches(project, ds)
    names = project_outputs(project, metrics)
    ref = {n: reference_on(be, project, ds, batches, n) for n in names}
    return TrialData(batches, ref[names[0]], names[0], ds.labels, metrics, {n: ref[n] for n in names[1:]} or None)


@dataclass
class Switchable:
    """A compiled switchable model: its path and the boolean input of each layer's Q/DQ."""

    path: str
    switches: dict[str, str]  # layer -> input name


def worker_context():
    """How trial workers start: forked from a forkserver that imported this module once (the first pool of a
    process starts it; later pools' workers start in milliseconds instead of an interpreter start and ~1.5 s of
    imports each, as with ``spawn``). The server is a fresh single-threaded interpreter, so no thread or ONNX
    Runtime session of the caller is forked. ``spawn`` where there is no forkserver (Windows), or where the
    forkserver's socket could not be made: its path, ``$TMPDIR/pymp-*/listener-*``, would pass the kernel's 107
    bytes (a deep ``TMPDIR``; the start failed with "AF_UNIX path too long")."""
    if "forkserver" not in mp.get_all_start_methods() or not _socket_fits(tempfile.gettempdir()):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


AF_UNIX_PATH_MAX = 107  # sun_path's bytes on Linux, its NUL aside
FORKSERVER_SOCKET = "/pymp-xxxxxxxx/listener-xxxxxxxx"  # multiprocessing's names under the temp folder


def _socket_fits(tmp: str) -> bool:
    return len(os.fsencode(tmp)) + len(FORKSERVER_SOCKET) <= AF_UNIX_PATH_MAX


class TrialPool:
    """Worker processes that each hold one session of the switchable model (the default; trials on a
    Ray cluster: ``core.sensitivity.distributed.RayTrialPool``, see :func:`open_trial_pool`). The trial data
    and the workers' log are in a temp folder of the workspace ``ws`` (``tmp/mixprec-trials-*``, swept if this
    process is killed); the workers die with this process (:func:`_guard_worker`)."""

    def __init__(self, model_path, batches, switch_inputs: dict[str, str], ref, out_name, workers: int = 2,
                 labels=None, metrics: MetricSpec | None = None, extra: dict | None = None,
                 ws: Workspace | None = None):
        self.names = switch_inputs  # layer -> input name
        self.where = f"local process pool ({workers} worker{'s' * (workers != 1)})"
        threads = 1 if workers > 1 else 0
        self._tmp = TempFolder(ws or Workspace.default(), "mixprec-trials-")
        data_path = self._tmp.path / "trial-data.npz"
        self.log = self._tmp.path / WORKER_LOG
        try:
            _save_trial_data(data_path, TrialData(batches, ref, out_name, labels, metrics, extra))
            owner = (os.getpid(), process_start(os.getpid()))
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=worker_context(),
                                            initializer=_worker_init,
                                            initargs=(owner, str(self.log), str(model_path), str(data_path),
                                                      list(switch_inputs.values()), out_name, threads, metrics))
        except BaseException:
            self._tmp.cleanup()
            raise

    @classmethod
    def on(cls, switchable: Switchable, data: TrialData, workers: int = 2, ws: Workspace | None = None) -> "TrialPool":
        return cls(switchable.path, data.batches, switchable.switches, data.ref, data.out_name, workers, data.labels,
                   data.metrics, data.extra, ws)

    def evaluate(self, int8_sets: list[set[str]], progress=None, should_stop=None) -> list[Quality]:
        # what calibrating, the FP32 reference and compiling freed goes back to the OS before the workers
        # start: glibc kept 1.1 GiB of it in this process on the 0.5B decoder (1.53 → 0.44 GiB), through every trial
        release_memory()
        futures = [self.pool.submit(_worker_eval, frozenset(self.names[l] for l in s)) for s in int8_sets]
        results = []
        for i, f in enumerate(futures):
            if should_stop and should_stop():
                for g in futures:
                    g.cancel()
                raise MixprecError("the search was cancelled", "start it again when you are ready")
            try:
                results.append(f.result())
            except BrokenProcessPool as e:
                last = self._last_words()
                raise MixprecError("a search worker process died (out of memory, or a crash in ONNX Runtime)"
                                   + (f"; its last output: {last}" if last else ""),
                                   "run with --workers 1, or free memory, and try again") from e
            if progress:
                progress((i + 1) / len(futures), f"trial {i + 1}/{len(futures)}")
        return results

    def _last_words(self, lines: int = 3, chars: int = 400) -> str:
        """The last lines the workers printed (their log), for the error of a worker that died."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4 * chars))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join([l.strip() for l in text.splitlines() if l.strip()][-lines:])[-chars:]

    def close(self, wait: bool = True):
        """Shut the workers down and remove the temp folder. ``wait=False`` (the pool is left on an error, a
        cancel, a SIGTERM): queued trials are dropped and the workers killed at once, running trials and all."""
        if wait:
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            workers = list((getattr(self.pool, "_processes", None) or {}).values())  # the executor's own list
            self.pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    w.kill()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(wait=exc_type is None)


def open_trial_pool(switchable: Switchable, data: TrialData, workers: int = 2, ray: str | None = None,
                    ws: Workspace | None = None):
    """The pool trials run on: Ray tasks when an address is given (``ray``, else
    ``$MIXPREC_RAY_ADDRESS``; see ``core.sensitivity.distributed``), else local worker processes. A switchable
    model whose weights are in external data files is opened by the workers from the workspace (which
    must then be on storage every node reads), never sent through the object store. ``ws``: the workspace the
    local pool's temp folder goes in (default: ``Workspace.default()``)."""
    address = ray_address(ray)
    if address is None:
        return TrialPool.on(switchable, data, workers, ws)
    if data.metrics is not None and not data.metrics.is_default:
        raise MixprecError("trials on a Ray cluster measure the first float output only: --metric-output, --task and "
                           "--metric-file are not sent to Ray workers yet", "run the trials locally (leave out --ray)")
    external = data_files(onnx.load(switchable.path, load_external_data=False))
    # weights in data files beside the model (over 2 GB): the workers read them from the workspace
    return RayTrialPool.on(switchable, data, address, workers, share="path" if external else None)


def split_eval(ds: Dataset) -> tuple[Dataset, Dataset]:
    """Dev half (used for choosing) and test half (held out for verifying)."""
    n = ds.num_samples
    if n < 4:
        raise MixprecError(f"the evaluation data has {n} samples: too few to split into dev and held-out halves",
                           "give at least 4 evaluation samples (--eval)")
    fb = ds.fixed_batch or 1
    if fb > 1 and n < 2 * fb:
        raise MixprecError(f"the evaluation data has {n} samples: the model's batch is fixed at {fb}, so dev and "
                           "held-out halves need a whole batch each", f"give at least {2 * fb} evaluation samples")
    cut = (n // 2) // fb * fb  # whole batches on both sides when the model fixes its batch
    return ds.slice(0, cut), ds.slice(cut)


def switchable_model(project: Project, base: Policy, calib, method_tag: str) -> Switchable:
    """All eligible layers INT8-switchable on top of ``base``; cached in the workspace."""
    pol = base.with_layers({l.name: "int8" for l in project.layers if l.eligible})
    key = sha256_bytes(f"{SWITCHABLE_FORMAT_VERSION}|{project.model.sha256}|{pol.sha256}|{calib.key}".encode())[:24]
    path = project.ws.search_dir(project.model.sha256) / f"switch-{method_tag}-{key}.onnx"
    meta = path.with_suffix(".json")
    if path.is_file() and meta.is_file():
        try:  # the meta stamps the model it describes: a model rewritten or truncated since is built again
            doc = json.loads(meta.read_text())
            if doc["stamp"] == file_stamp(path):
                return Switchable(str(path), dict(doc["switch_inputs"]))
            raise ValueError("the model changed since it was written")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            discard_corrupt(path, "switchable model", f"{type(e).__name__}: {e}")
            meta.unlink(missing_ok=True)
    compiled = compile_policy(project.model, pol, calib, target="ort", switchable=True)
    compiled.save(path)  # external weights (core.model.external): its own data file and links beside it
    atomic_write_json(meta, {"switch_inputs": compiled.switch_inputs, "stamp": file_stamp(path)})
    return Switchable(str(path), compiled.switch_inputs)


# --- isolated / leave-one-out sensitivity ---------------------------------------------------
@dataclass
class Sensitivity:
    """An isolated or leave-one-out sensitivity table, stored as a ``"sensitivity"`` document."""

    FORMAT_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "sensitivity"

    table: pd.DataFrame  # SENSITIVITY_COLUMNS, most harmful first
    mode: str
    method: str
    baseline: Quality  # all switches off (isolated) / all on (leave-one-out)
    seconds: float
    cache_hit: bool
    trials_on: str = ""  # where the trials ran: the local process pool or a Ray cluster

    @property
    def title(self) -> str:
        """What this table is, in a sentence's words (a run's warning names the ranking it used)."""
        return f"the {self.mode} ranking ({self.method})"

    def to_json(self) -> dict:
        return {"kind": self.KIND, "format_version": self.FORMAT_VERSION, "mode": self.mode, "method": self.method,
                "baseline": self.baseline.to_dict(), "seconds": self.seconds, "cache_hit": self.cache_hit,
                "trials_on": self.trials_on, "table": frame_to_json(self.table)}

    @classmethod
    def from_json(cls, doc: dict) -> "Sensitivity":
        doc = check_format(doc, cls.KIND, cls.FORMAT_VERSION, "sensitivity table")
        return cls(frame_from_json(doc["table"], SENSITIVITY_COLUMNS, "sensitivity table"), doc["mode"],
                   doc["method"], Quality.from_dict(doc["baseline"]), float(doc["seconds"]), bool(doc["cache_hit"]),
                   str(doc.get("trials_on", "")))


def _sensitivity_key(project, base: Policy, calib_key: str, mode: str, ds: Dataset,
                     metrics: MetricSpec | None = None) -> str:
    spec = metrics.key if metrics is not None else ""  # "" for the default: the keys tables always had
    return sha256_bytes(f"{SWITCHABLE_FORMAT_VERSION}|s{Sensitivity.FORMAT_VERSION}|{project.model.sha256}|"
                        f"{ds.sha256}|{calib_key}|{base.sha256}|{mode}".encode() + (f"|m={spec}".encode() if spec else b""))[:24]


# --- where a table is stored: once, in rankings/ -------------------------------------------
# The table of the project's default policy and dev half is stored under the key the store lists
# (``core.store.results.load_sensitivity``: model, data, method, mode), so the Sensitivity page, the
# job and the search read one file; the document also names the exact inputs it was measured on
# (``inputs``: the switchable model's format, data, calibration, base policy), and a table of other
# inputs is computed again and replaces it. Another base policy or dev set has a key of its own.
INPUTS_FIELD = "inputs"


def _inputs(project: Project, method: str, base: Policy | None, data: Dataset | None) -> tuple[Policy, Dataset]:
    """The base policy (calibrated by ``method``) and the dev data a table is measured on: those given,
    else the project's default policy and the first half of its evaluation data."""
    base = base or project.default_policy(method=method)
    return base.with_calibration(replace(base.calibration, method=method)), data or split_eval(project.eval_data)[0]


def _is_default(project: Project, method: str, base: Policy, data: Dataset) -> bool:
    try:
        dev = split_eval(project.eval_data)[0]
    except MixprecError:
        return False
    return data.sha256 == dev.sha256 and base.sha256 == project.default_policy(method=method).sha256


def sensitivity_file(project: Project, mode: str = "isolated", method: str = "minmax", base: Policy | None = None,
                     data: Dataset | None = None, metrics: MetricSpec | None = None) -> Path:
    """Where :func:`sensitivity` stores (and looks for) the table of these arguments: the project's
    rankings file of ``method`` and ``mode`` for its default policy and dev half (what the store and
    the Sensitivity page read), else a file of its own in the same folder."""
    base, data = _inputs(project, method, base, data)
    tag = method if _is_default(project, method, base, data) else f"{method}|base={base.sha256}|data={data.sha256}"
    if metrics is not None and metrics.key:  # measured on other metric outputs: a table of its own
        tag += f"|metrics={metrics.key}"
    key = analysis_key(project.model.sha256, project.calib_data.sha256, project.eval_data.sha256, tag, mode)
    return project.ws.ranking_file(key)


def write_sensitivity(path: Path, sens: Sensitivity, inputs: str = "") -> Path:
    """The one writer of a sensitivity table: ``sens`` at ``path`` (atomically), with the key of the
    inputs it was measured on (empty: not known, e.g. a table stored by hand; :func:`sensitivity`
    then measures again). A ranking stored as CSV by an older mixprec is removed."""
    atomic_write_json(path, sens.to_json() | ({INPUTS_FIELD: inputs} if inputs else {}))
    path.with_suffix(".csv").unlink(missing_ok=True)
    return path


def _read_table(path: Path, what: str) -> tuple[Sensitivity | None, str]:
    """The table at ``path`` and the inputs key it names; (None, "") when there is none, and when it
    is corrupt or damaged (then removed with a note: it is measured again)."""
    if not path.is_file():
        return None, ""
    try:
        doc = json.loads(path.read_text())
        return Sensitivity.from_json(doc), str(doc.get(INPUTS_FIELD, ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MixprecError) as e:
        discard_corrupt(path, what, f"{type(e).__name__}: {e}")
        return None, ""


def _stored(project: Project, path: Path, mode: str, key: str) -> Sensitivity | None:
    """The stored table measured on the inputs ``key``, or None. A table an older mixprec kept in the
    search's folder (``search/<sha>/sensitivity-<mode>-<key>.json``) is read and moved to ``path``."""
    sens, inputs = _read_table(path, f"{mode} sensitivity")
    if sens is not None and inputs == key:
        return sens
    legacy = project.ws.legacy_sensitivity_file(project.model.sha256, mode, key)
    sens, _ = _read_table(legacy, f"{mode} sensitivity")
    if sens is not None:
        write_sensitivity(path, sens, key)
        legacy.unlink(missing_ok=True)
    return sens


def _trial_sets(mode: str, eligible: list[str]) -> list[set[str]]:
    """The baseline (nothing / everything INT8), then one trial per eligible layer."""
    all_on = set(eligible)
    if mode == "isolated":
        return [set()] + [{n} for n in eligible]
    return [all_on] + [all_on - {n} for n in eligible]


def _table(mode: str, method: str, eligible, baseline: Quality, trials: list[Quality]) -> pd.DataFrame:
    sign = -1.0 if mode == "isolated" else 1.0  # drop (isolated) / gain (leave-one-out): positive = sensitive
    rows = [(l.name, l.op_type, l.macs, mode, method, q.cosine_mean, sign * (q.cosine_mean - baseline.cosine_mean),
             q.snr_db) for l, q in zip(eligible, trials)]
    df = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS[1:]).sort_values("delta", ascending=False, kind="stable",
                                                                          ignore_index=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    return df


def sensitivity(project: Project, mode: str = "isolated", method: str = "minmax", base: Policy | None = None,
                data: Dataset | None = None, workers: int = 2, progress=None, should_stop=None,
                pool=None, ray: str | None = None, metrics: MetricSpec | None = None) -> Sensitivity:
    """Per-layer quality drop with only that layer INT8 (isolated), or gain with every other
    eligible layer INT8 (leave-one-out); stored once (:func:`sensitivity_file`, read by the store and the
    search alike) and used again for the same model, data, calibration and base policy.
    ``pool``: trials on an open pool of the switchable model of ``base`` (the search's); else a pool
    of its own (:func:`open_trial_pool`: on the Ray cluster at ``ray`` / ``$MIXPREC_RAY_ADDRESS``)."""
    if mode not in MODES:
        raise MixprecError(f"unknown sensitivity mode {mode!r}", f"use one of {', '.join(MODES)}")
    step = progress or (lambda f, t: None)
    t0 = time.perf_counter()
    base, data = _inputs(project, method, base, data)
    eligible = require_eligible(project.model.name, project.layers, "measure")
    calib = calibrate_policy(project.model, project.calib_data, base.with_layers({l.name: "int8" for l in eligible}),
                             project.layers, project.ws)
    key = _sensitivity_key(project, base, calib.key, mode, data, metrics)
    path = sensitivity_file(project, mode, method, base, data, metrics)
    found = _stored(project, path, mode, key)
    if found is not None:
        return replace(found, seconds=time.perf_counter() - t0, cache_hit=True)
    own = pool is None
    if own:
        step(0.05, "compiling the switchable model")
        pool = open_trial_pool(switchable_model(project, base, calib, method), trial_data(project, data, metrics),
                               workers, ray, project.ws)
    with pool if own else contextlib.nullcontext():  # a pool of its own is closed here (at once on an error)
        res = pool.evaluate(_trial_sets(mode, [l.name for l in eligible]),
                            lambda f, t: step(0.1 + 0.9 * f, f"{mode}: {t}"), should_stop)
    sens = Sensitivity(_table(mode, method, eligible, res[0], res[1:]), mode, method, res[0],
                       time.perf_counter() - t0, False, getattr(pool, "where", ""))
    write_sensitivity(path, sens, key)
    return sens
