"""Estimates in a child process of their own, for the dashboard.

A policy's TensorRT estimate (:func:`core.estimate.predict.predict`) compiles the policy and walks its
graph: about a second of pure Python on MiniLM. In a thread of the dashboard's server it holds the
GIL that every session's page run needs, so under load each edit made every page wait. Here it runs in
one long-lived child process (``python -m core.estimate.service``), which loads each model once (by
its source: a path or ``sample:NAME``; checked against the model's sha256) and answers one request at
a time. The server side is :class:`EstimateService`: ``submit(...)`` returns a ``Future`` resolved by a
thread that only waits on the child's pipe (waiting releases the GIL).

Not ``multiprocessing``: under ``streamlit run`` and AppTest, ``sys.modules["__main__"]`` is the page
script while it runs, and a spawned worker would run the page again as its main module.

Protocol: length-prefixed pickles on the child's stdin and on a private copy of its stdout (fd 1 is
pointed at stderr, so nothing a library prints can corrupt the replies). Requests and replies come
from this module on both ends; the pipe is never exposed to anything else."""
from __future__ import annotations

import gc
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from core.errors import MixprecError
from core.estimate.cost import CostParams
from core.estimate.predict import Prediction, predict
from core.model.load import LoadedModel, load_model
from core.quant.policy import Policy
from core.workspace import Workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_KEPT = 2  # models the child keeps loaded (a session usually works on one)
_HEADER = struct.Struct("!Q")


def model_source(model: LoadedModel) -> tuple[str, tuple]:
    """What :func:`core.model.load.load_model` loads ``model`` from again: its sample or its file, and
    the branches fixed on load (a merged decoder's)."""
    return (f"sample:{model.sample}" if model.sample else str(model.path)), tuple(sorted(model.branches.items()))


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the estimate process closed its pipe")
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the estimate process closed its pipe")
    return pickle.loads(data)  # noqa: S301 - our own child's reply


class EstimateService:
    """One estimate child process for a server (started on first use, restarted once if it dies)."""

    def __init__(self, ws_root: str | os.PathLike):
        self.ws_root = str(ws_root)
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mixprec-estimate-pipe")

    def submit(self, model: LoadedModel, policy: Policy, input_shapes: dict, gpu: str,
               params: CostParams) -> "Future[Prediction]":
        req = (model_source(model), model.sha256, policy, dict(input_shapes or {}), gpu, params)
        return self._pool.submit(self._call, req)

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        return subprocess.Popen([sys.executable, "-m", "core.estimate.service", self.ws_root], cwd=REPO_ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def _call(self, req) -> Prediction:
        with self._lock:
            for _ in range(2):  # a dead child is started again once
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                try:
                    _send(self._proc.stdin, req)
                    ok, value = _recv(self._proc.stdout)
                except (OSError, EOFError, pickle.UnpicklingError):
                    self._stop()
                    continue
                if ok:
                    return value
                raise MixprecError(*value)
        raise MixprecError("the estimate process died twice (out of memory, or a crash)",
                           "free memory and edit the policy again; the builds are not affected")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()
        self._pool.shutdown(wait=False)


# --- the child ------------------------------------------------------------------------------------
def _answer(models: OrderedDict, ws: Workspace, req):
    source, sha, policy, shapes, gpu, params = req
    model = models.get((source, sha))
    if model is None:
        model = load_model(source[0], ws, branches=dict(source[1]) or None)
        if model.sha256 != sha:
            raise MixprecError(f"{model.name} changed on disk since it was loaded",
                               "load the model again on the Model page")
        models[(source, sha)] = model
        while len(models) > MODELS_KEPT:
            models.popitem(last=False)
        _settle()
    models.move_to_end((source, sha))
    return predict(model, policy, shapes, gpu, params)


def _settle() -> None:
    """After a model is loaded: collect, then freeze what is left (the loaded models), so that the
    collections of later estimates do not walk it again and again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def serve(ws_root: str, inp, out) -> None:
    """Answer requests from ``inp`` on ``out`` until ``inp`` closes. No garbage collection runs while
    an estimate is computed (on BERT-base it took ~15 % of an estimate): the estimate's garbage (its
    compiled graph's reference cycles) is collected once its reply is sent, while the child waits."""
    ws, models = Workspace(Path(ws_root)), OrderedDict()
    while True:
        try:
            req = _recv(inp)
        except EOFError:
            return
        gc.disable()
        try:
            reply = (True, _answer(models, ws, req))
        except MixprecError as e:
            reply = (False, (e.what, e.fix))
        except Exception as e:  # noqa: BLE001 - any failure is an answer, never a dead server
            reply = (False, (f"the estimate failed: {type(e).__name__}: {e}",
                             "edit the policy again; if it keeps failing, the Build page still measures it"))
        try:
            _send(out, reply)
        finally:
            gc.enable()
            gc.collect()


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the replies
    serve(sys.argv[1], sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
