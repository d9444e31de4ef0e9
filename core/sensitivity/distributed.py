"""Where trials run: in local worker processes (``core.sensitivity.TrialPool``, the default) or as
Ray tasks on a cluster (:class:`RayTrialPool`), and engine builds spread over GPUs (:func:`gpu_map`).

A *trial* is one evaluation of the switchable model (``core.sensitivity.switchable_model``) with a
set of layers switched to INT8. Both pools run the same code (:func:`trial_session`,
:func:`run_trial`), so a trial gives the same numbers wherever it runs (one ONNX Runtime thread per
worker in both).

Ray is optional (``pip install ray==2.60.0``; ``scripts/setup.sh`` installs it) and imported only
when an address is given: ``--ray ADDRESS`` on the CLI, else ``$MIXPREC_RAY_ADDRESS``. ``ADDRESS``
is what ``ray.init`` takes (``auto``, ``HOST:6379``, ``ray://HOST:10001``), or ``local`` for a Ray
instance started in this process. mixprec's ``core`` package is shipped to the workers with the job
(``runtime_env`` ``py_modules``); the workers need the same Python packages (requirements.txt).

The switchable model and the trial data are put in Ray's object store once per pool and read by
each worker once (it keeps its session for the next trials of that pool); with
``$MIXPREC_RAY_SHARE=path`` the workers read them from the workspace instead, which then must be
on storage every node mounts at the same path. Results stream back in completion order with
progress; a cancel stops the queued and running tasks; a task whose worker died (a crash, an OOM
kill, a lost node) runs again, up to :data:`TRIAL_RETRIES` times."""
from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnxruntime as ort

from core.errors import MixprecError
from core.measure.evaluation import evaluate
from core.measure.metrics import Quality
from core.sensitivity.memory import release_memory

RAY_ENV = "MIXPREC_RAY_ADDRESS"
SHARE_ENV = "MIXPREC_RAY_SHARE"  # "object-store" (default) or "path"
OBJECT_STORE_ENV = "MIXPREC_RAY_OBJECT_STORE"  # object store of a `local` instance, e.g. 512M
LOCAL = "local"
OFF = ("", "off", "none", "no")
TRIAL_RETRIES = 3  # runs of a task whose worker died, after the first
CORE_DIR = Path(__file__).resolve().parent.parent
RAY_PIN = "ray==2.60.0"
_SESSIONS_KEPT = 2  # per worker process: the sessions of the last pools it served
WAIT_SECONDS = 0.2
_CONNECTED: list[str] = []  # the address this process connected to


# --- what every trial worker runs (a local process or a Ray task) -------------------------------
_EXACT_ARENA: list = []  # this process's CPU arena that grows by what is asked (registered once)


def _exact_arena() -> None:
    """Register a CPU arena that extends by the size asked (``arena_extend_strategy`` 1), not by powers
    of two: a switchable model makes every weight's float32 values at each run (its switch's If is not
    folded), and the default arena keeps more of those buffers, while no arena pays page faults for
    them at every run. Measured with the former Where switches (3.0 GB switchable model), 217
    isolated trials of the Qwen2-0.5B-shaped decoder (bench/bench_large.py): worker peak 6.9 GiB in
    751 s, against 7.5 GiB / 588 s (default arena) and 5.9 GiB / 1283 s (none)."""
    if not _EXACT_ARENA:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))
        _EXACT_ARENA.append(info)


TRIAL_DISABLED_OPTIMIZERS = ["ConstantFolding"]


def trial_session(model, threads: int) -> ort.InferenceSession:
    """A CPU session of the switchable model (a path or the serialized bytes), on :func:`_exact_arena`,
    without ONNX Runtime's ConstantFolding (:data:`TRIAL_DISABLED_OPTIMIZERS`): a weight's switch
    (``core.quant.compile``, ``If(flag)``) casts the weight's float16 copy to float32 in its off branch, which
    ConstantFolding would fold into a float32 initializer (4 bytes a weight value, resident for the
    session's life). The other optimizations run; trial outputs are bit-identical either way.
    Qwen2-0.5B-shaped decoder (bench/bench_large.py), 8 trials: worker peak 3.3-3.5 GiB and 0.6-1.3 s
    a run, against 6.6 GiB and 3.3 s with the former ``Where`` switches."""
    return ort.InferenceSession(model, trial_options(threads), providers=["CPUExecutionProvider"],
                                disabled_optimizers=TRIAL_DISABLED_OPTIMIZERS)


def trial_options(threads: int) -> ort.SessionOptions:
    """The session options of :func:`trial_session` (all optimizations, :func:`_exact_arena`)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    _exact_arena()
    so.add_session_config_entry("session.use_env_allocators", "1")
    return so


def run_trial(sess, batches: list, switches: list[str], ref: list, out_name: str, labels, on, metrics=None,
              extra: dict | None = None) -> Quality:
    """Quality of the switchable model with the switches ``on`` (input names) set, the rest off, measured as a
    build measures it (``core.measure.evaluation.evaluate`` under ``metrics``; ``extra``: the FP32 outputs of the
    other graph outputs it reads)."""
    flags = {name: np.array(name in on) for name in switches}
    names = [out_name, *(extra or {})]
    outs = [sess.run(names, {**b, **flags}) for b in batches]
    cand = {n: [o[i] for o in outs] for i, n in enumerate(names)}
    return evaluate(metrics, {out_name: ref, **(extra or {})}, cand, labels, batches)


def trial_arrays(batches: list, ref: list, labels) -> dict[str, np.ndarray]:
    """The trial data as flat named arrays (one .npz, or one object in Ray's object store)."""
    arrays = {f"r{i}": r for i, r in enumerate(ref)}
    for i, b in enumerate(batches):
        arrays.update({f"b{i}/{k}": v for k, v in b.items()})
    if labels is not None:
        arrays["labels"] = np.asarray(labels)
    return arrays


def from_trial_arrays(z) -> tuple[list, list, np.ndarray | None]:
    """(batches, ref, labels) from :func:`trial_arrays` (a dict or an open .npz)."""
    files = list(z.keys())
    ref = [z[f"r{i}"] for i in range(sum(1 for k in files if k.startswith("r")))]
    batches = [{k.split("/", 1)[1]: z[k] for k in files if k.startswith(f"b{i}/")} for i in range(len(ref))]
    return batches, ref, (z["labels"] if "labels" in files else None)


# --- Ray: address, connection, streaming ---------------------------------------------------------
def ray_address(explicit: str | None = None) -> str | None:
    """The Ray address to use: ``explicit`` (``--ray``), else ``$MIXPREC_RAY_ADDRESS``, else None
    (the local process pool). ``off``/``none``/empty means no Ray."""
    value = explicit if explicit is not None else os.environ.get(RAY_ENV)
    if value is None or value.strip().lower() in OFF:
        return None
    return value.strip()


def _ray():
    try:
        import ray  # optional: only with --ray / $MIXPREC_RAY_ADDRESS
    except ImportError as e:
        raise MixprecError("Ray is not installed, so trials cannot run on a Ray cluster",
                           f"install it (scripts/setup.sh, or .venv/bin/pip install {RAY_PIN}), or run without "
                           f"--ray (and unset {RAY_ENV})") from e
    return ray


def connect(address: str, num_cpus: int | None = None, num_gpus: int | None = None,
            object_store_bytes: int | None = None):
    """The ``ray`` module, connected to ``address`` (``local``: a new instance in this process with
    ``num_cpus``/``num_gpus`` and an object store of ``object_store_bytes`` or
    ``$MIXPREC_RAY_OBJECT_STORE``). A process talks to one cluster: connected already, it keeps that
    connection (another address is an error)."""
    ray = _ray()
    if ray.is_initialized():
        if _CONNECTED and _CONNECTED[0] != address:
            raise MixprecError(f"this process is connected to the Ray cluster at {_CONNECTED[0]}, not {address}",
                               f"use --ray {_CONNECTED[0]}, or start a new process for the other cluster")
        return ray
    kwargs = {"runtime_env": {"py_modules": [str(CORE_DIR)], "excludes": ["__pycache__", "*.pyc"]},
              "log_to_driver": False, "logging_level": logging.WARNING, "namespace": "mixprec"}
    if address == LOCAL:
        kwargs.update(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                      object_store_memory=_store_bytes(os.environ.get(OBJECT_STORE_ENV), object_store_bytes))
    else:
        _check_reachable(address)
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise MixprecError(f"cannot connect to the Ray cluster at {address}: {e}",
                           "start it (ray start --head), check the address, or run without --ray "
                           f"(and unset {RAY_ENV})") from e
    _CONNECTED[:] = [address]
    return ray


def _check_reachable(address: str, seconds: float = 5.0) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) that accepts no TCP connection fails in seconds (Ray
    itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray resolves them, and fails fast when there is nothing
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=seconds).close()
    except OSError as e:
        raise MixprecError(f"cannot connect to the Ray cluster at {address}: {e.strerror or e}",
                           "start it (ray start --head), check the address and the firewall, or run without --ray "
                           f"(and unset {RAY_ENV})") from e


def describe(ray) -> str:
    """``Ray cluster: 2 nodes, 4 CPUs, 1 GPU``."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    res = ray.cluster_resources()
    gpus = int(res.get("GPU", 0))
    cpus = int(res.get("CPU", 0))
    return f"Ray cluster: {len(alive)} node{'s' * (len(alive) != 1)}, {cpus} CPU{'s' * (cpus != 1)}" + \
        (f", {gpus} GPU{'s' * (gpus != 1)}" if gpus else "")


def gather(ray, refs: list, progress=None, should_stop=None, what: str = "trial",
           retries: int = TRIAL_RETRIES) -> list:
    """The results of ``refs`` in their order, collected as they finish (``progress(fraction, text)``
    after each). ``should_stop()`` true: the remaining tasks are cancelled (running ones killed); so
    are they when anything else ends the wait (an error, a job's SIGTERM, Ctrl-C)."""
    index = {r: i for i, r in enumerate(refs)}
    results, pending, done = [None] * len(refs), list(refs), 0
    try:
        while pending:
            if should_stop and should_stop():
                raise MixprecError(f"the {what}s were cancelled", "start again when you are ready")
            ready, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SECONDS)
            for r in ready:
                try:
                    results[index[r]] = ray.get(r)
                except Exception as e:  # noqa: BLE001 - Ray's exception types: mapped to one message
                    raise _task_error(ray, e, what, retries) from e
                done += 1
                if progress:
                    progress(done / len(refs), f"{what} {done}/{len(refs)}")
    except BaseException:
        cancel(ray, pending)
        raise
    return results


def cancel(ray, refs: list) -> None:
    for r in refs:
        try:
            ray.cancel(r, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass


def _task_error(ray, e: Exception, what: str, retries: int) -> MixprecError:
    exc = ray.exceptions
    if isinstance(e, exc.RayTaskError) and isinstance(getattr(e, "cause", None), MixprecError):
        return e.cause
    if isinstance(e, (exc.WorkerCrashedError, exc.NodeDiedError, exc.ObjectLostError)):
        runs = retries + 1
        return MixprecError(f"a Ray worker died {runs} time{'s' * (runs != 1)} running one {what} (out of memory, a "
                            f"crash in ONNX Runtime, or a lost node): {type(e).__name__}",
                            "free memory on the cluster's nodes, or run without --ray")
    return MixprecError(f"a {what} failed on the Ray cluster: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                        "check the workers' environment (the packages of requirements.txt), or run without --ray")


def _store_bytes(env_value: str | None, hint: int | None) -> int:
    """A local instance's object store: ``$MIXPREC_RAY_OBJECT_STORE``, else room for the shared
    objects (``hint``), at least 200 MB (a shared machine: not Ray's default 30 % of RAM)."""
    if env_value:
        text = env_value.strip().upper().removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            return int(float(text[:-1] if mult > 1 else text) * mult)
        except ValueError as e:
            raise MixprecError(f"{OBJECT_STORE_ENV}={env_value!r} is not a size", "write e.g. 512M") from e
    return max(200 << 20, int(1.5 * (hint or 0)))


# --- trials as Ray tasks -------------------------------------------------------------------------
_SESSIONS: OrderedDict = OrderedDict()  # in a Ray worker: pool id -> (session, batches, ref, labels)


def _open_shared(shared: dict):
    import ray  # in a Ray worker, where the task came from

    if shared["share"] == "path":
        model = shared["model"]
        with np.load(shared["data"], allow_pickle=False) as z:
            batches, ref, labels = from_trial_arrays(z)
    else:
        model = ray.get(shared["model"]).tobytes()  # zero-copy view of the object store, one copy for ORT
        batches, ref, labels = from_trial_arrays(ray.get(shared["data"]))
    return trial_session(model, 1), batches, ref, labels


def ray_trial(pool_id: str, shared: dict, on: frozenset, kill_once: str | None = None) -> Quality:
    """One trial in a Ray worker. The worker opens the pool's session on its first trial and keeps
    it (the object refs in ``shared`` are nested, so Ray does not fetch them for every task).
    ``kill_once`` (tests): a file path; the first trial that finds it missing creates it and kills
    its own worker with SIGKILL, as the OOM killer would."""
    entry = _SESSIONS.get(pool_id)
    if entry is None:
        entry = _SESSIONS[pool_id] = _open_shared(shared)
        while len(_SESSIONS) > _SESSIONS_KEPT:
            _SESSIONS.popitem(last=False)
    if kill_once and not os.path.exists(kill_once):
        Path(kill_once).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    sess, batches, ref, labels = entry
    return run_trial(sess, batches, shared["switches"], ref, shared["out"], labels, on)


class RayTrialPool:
    """Trials as Ray tasks, with the interface of ``core.sensitivity.TrialPool`` (``names``,
    ``evaluate``, ``close``, a context manager). ``share``: ``object-store`` (default, or
    ``$MIXPREC_RAY_SHARE``) or ``path`` (the model and a trial-data file in the model's folder)."""

    def __init__(self, model_path, switch_inputs: dict[str, str], batches, ref, out_name, labels, address: str,
                 workers: int = 2, share: str | None = None, retries: int = TRIAL_RETRIES,
                 kill_once: str | None = None):
        self.names = switch_inputs
        self.id = uuid.uuid4().hex
        self.share = share or os.environ.get(SHARE_ENV, "object-store")
        if self.share not in ("object-store", "path"):
            raise MixprecError(f"{SHARE_ENV}={self.share!r} is not a way to share trial data",
                               "use object-store (default) or path")
        arrays = trial_arrays(batches, ref, labels)
        size = Path(model_path).stat().st_size + sum(a.nbytes for a in arrays.values())
        self.ray = connect(address, num_cpus=workers, object_store_bytes=size)
        self.where = describe(self.ray) + (" (the workers read the model from the workspace)"
                                           if self.share == "path" else "")
        self._data_file = None
        if self.share == "path":
            self._data_file = Path(model_path).with_name(f"trial-data-{self.id[:12]}.npz")
            np.savez(self._data_file, **arrays)
            model, data = str(model_path), str(self._data_file)
        else:
            model, data = self.ray.put(np.fromfile(model_path, dtype=np.uint8)), self.ray.put(arrays)
        self._shared = {"share": self.share, "model": model, "data": data, "out": out_name,
                        "switches": list(switch_inputs.values())}
        self._task = self.ray.remote(ray_trial).options(max_retries=retries, retry_exceptions=False, num_cpus=1)
        self._retries = retries
        self._kill_once = kill_once
        self.shared_bytes = size

    @classmethod
    def on(cls, switchable, data, address: str, workers: int = 2, **kwargs) -> "RayTrialPool":
        return cls(switchable.path, switchable.switches, data.batches, data.ref, data.out_name, data.labels,
                   address, workers, **kwargs)

    def evaluate(self, int8_sets: list[set[str]], progress=None, should_stop=None) -> list[Quality]:
        release_memory()  # as TrialPool.evaluate: this process only waits from here
        refs = [self._task.remote(self.id, self._shared, frozenset(self.names[l] for l in s), self._kill_once)
                for s in int8_sets]
        return gather(self.ray, refs, progress, should_stop, "trial", self._retries)

    def close(self):
        self._shared = None  # drops the object refs: Ray frees the shared objects
        if self._data_file is not None:
            self._data_file.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- engine builds over GPUs ---------------------------------------------------------------------
def gpu_map(fn, items: list, address: str, num_gpus: float = 1, num_cpus: float = 1, progress=None,
            should_stop=None, what: str = "engine build") -> list:
    """``fn(item)`` for every item as Ray tasks that each hold ``num_gpus`` GPUs (Ray sets
    ``CUDA_VISIBLE_DEVICES`` to the task's GPUs), in order. ``fn`` is a module-level function of
    ``core`` (the workers import it). Fails at once when the cluster declares too few GPUs (Ray
    would otherwise queue the tasks for ever)."""
    ray = connect(address, num_gpus=None)
    have = ray.cluster_resources().get("GPU", 0)
    if have < num_gpus:
        raise MixprecError(f"the Ray cluster declares {int(have)} GPUs; each {what} needs {num_gpus:g}",
                           "start the GPU nodes with their GPUs (ray start --num-gpus N), or build without --ray")
    task = ray.remote(fn).options(num_gpus=num_gpus, num_cpus=num_cpus, max_retries=TRIAL_RETRIES,
                                  retry_exceptions=False)
    return gather(ray, [task.remote(it) for it in items], progress, should_stop, what)

