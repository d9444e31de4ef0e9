"""Inputs that ONNX Runtime refuses while it runs (a mask shorter than past + seq, a sequence longer than the
position table, a Reshape that does not fit): one clear error naming the inputs, their shapes and the
``--dim`` / ``--shape`` that fixes it, never ONNX Runtime's traceback. For every model, where mixprec runs
ONNX Runtime on data (calibration, evaluation, timing, the ranking, the trials)."""
from __future__ import annotations

import re
from contextlib import contextmanager

from core.errors import MixprecError

_STATUS = re.compile(r"Status Message:\s*(.*)", re.S)
_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")
MAX_SHOWN = 12  # inputs named in the message; more are counted


def is_ort_run_error(e: BaseException) -> bool:
    """An error ONNX Runtime raised (its pybind exceptions: InvalidArgument, Fail, RuntimeException …)."""
    return type(e).__module__.startswith("onnxruntime") or "[ONNXRuntimeError]" in str(e)


def _shape(v) -> str:
    shape = getattr(v, "shape", None)
    return "a scalar" if shape == () else "x".join(str(int(d)) for d in shape) if shape is not None else "?"


def feed_error(e: BaseException, feeds: dict | None, what: str, relation: str = "") -> MixprecError:
    """The MixprecError of ONNX Runtime's error ``e`` while ``what`` on ``feeds`` (input name → array)."""
    text = str(e)
    status = _STATUS.search(text)
    node = _NODE.search(text)
    why = (status.group(1) if status else text.split(" : ")[-1]).strip().splitlines()[0]
    why = re.sub(r"^/onnxruntime_src/\S+:\d+\s+", "", why)  # ORT's source line and C++ signature: not the user's
    if " was false. " in why:
        why = why.split(" was false. ", 1)[1]
    why = why[:300]
    where = f" in its {node.group(1)} node {node.group(2)}" if node else ""
    shown = ""
    if feeds:
        items = [f"{k} {_shape(v)}" for k, v in feeds.items()]
        shown = "; the inputs were " + ", ".join(items[:MAX_SHOWN]) + (
            f" and {len(items) - MAX_SHOWN} more" if len(items) > MAX_SHOWN else "")
    hint = f" ({relation})" if relation else ""
    return MixprecError(
        f"ONNX Runtime refused the inputs while {what}{where}: {why}{shown}",
        f"give inputs the model accepts{hint}: sizes with --dim NAME=V for a named dim or --shape INPUT=DIMS, "
        "--no-batch INPUT for an input whose axis 0 is not a batch (e.g. an audio model's [frames, bins]) "
        "(python -m core inspect MODEL lists every dim and where its size came from; on the dashboard: the Model "
        "page's Input shapes), or data (--data / --eval .npz) of such sizes and with values it takes (token ids "
        "within its vocabulary)")


def _quiet_ort() -> None:
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(4)  # fatal only
    except Exception:  # noqa: BLE001 - no onnxruntime: nothing to silence
        pass


@contextmanager
def ort_feed_errors(feeds, what: str, relation: str = ""):
    """Turn an error ONNX Runtime raises inside the block into :func:`feed_error` (other errors pass);
    ``feeds`` may be a callable that gives them (called only then). ONNX Runtime's own log of the error (a
    red line on stderr) is silenced: the error is raised, translated."""
    _quiet_ort()
    try:
        yield
    except MixprecError:
        raise
    except Exception as e:  # noqa: BLE001 - only ONNX Runtime's own errors are translated
        if not is_ort_run_error(e):
            raise
        raise feed_error(e, feeds() if callable(feeds) else feeds, what, relation) from None

