"""The workspace: ``workspace/`` next to the code, or ``$MIXPREC_WORKSPACE``.

Layout::

    models/<sha256>.onnx          imported models, by content hash
    samples/<name>-v<N>/          materialised samples (model.onnx, calib.npz, eval.npz)
    calib/<key>.json              calibration caches (key = hashes + method + format version)
    data/<sha256>.npz             uploaded data, by content hash
    runs/<id>/                    one build: policy.json, metrics.json, compiled.onnx, engine artifact, profile
    rankings/<key>.json           cumulative rankings and isolated / leave-one-out sensitivity tables
    searches/<key>.json           searches under a budget
    jobs/<id>.json                background job records

Where each stored result lives and how it is read back: ``core.store``.

Every write is atomic: a temp file in the same folder, then ``os.replace``.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import MixprecError

REPO_ROOT = Path(__file__).resolve().parent.parent


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_save_npz(path: str | os.PathLike, arrays: dict) -> Path:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def default(cls) -> "Workspace":
        env = os.environ.get("MIXPREC_WORKSPACE")
        root = Path(env).expanduser() if env else REPO_ROOT / "workspace"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MixprecError(
                f"cannot create the workspace folder {root}: {e.strerror}",
                "set MIXPREC_WORKSPACE to a writable folder",
            ) from e
        return cls(root.resolve())

    def sub(self, *parts: str) -> Path:
        p = self.root.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    @property
    def models(self) -> Path:
        return self.sub("models")

    @property
    def samples(self) -> Path:
        return self.sub("samples")

    @property
    def calib(self) -> Path:
        return self.sub("calib")

    @property
    def runs(self) -> Path:
        return self.sub("runs")

    @property
    def jobs(self) -> Path:
        return self.sub("jobs")
