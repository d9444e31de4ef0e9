"""The engine cache. Engines are bound to the GPU model and the TensorRT version: they are cached in
``engines/tensorrt/`` under a key of everything they depend on (:func:`engine_cache_key`), each plan
with a record written after it (:func:`store_engine`) that says whether it is still whole
(:func:`cached_engine`), and placed in a build's folder as a hard link (:func:`place_engine`)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from core.workspace import atomic_write_bytes, atomic_write_json, cache_note, file_stamp, sha256_bytes, stamps_match

CACHE_FORMAT = 2  # 2: the key covers the parsed ONNX's digest, the legacy constraints and TF32 (issue 11, bugs 4/5)


def engine_cache_key(parts: dict) -> str:
    """Cache key over everything an engine depends on (model, policy, calibration, TensorRT
    version, GPU, profiles, build settings); ``parts`` must be JSON-serialisable."""
    doc = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=list)
    return sha256_bytes(doc.encode())[:32]


def constraints_digest(precisions: dict, outputs: dict, ranges: dict) -> str:
    """A digest of the legacy path's per-layer precisions, output types and INT8 ranges."""
    doc = {"precisions": {k: str(v) for k, v in precisions.items()},
           "outputs": {k: str(v) for k, v in outputs.items()}, "ranges": {k: float(v) for k, v in ranges.items()}}
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())[:32]


def cached_engine(cache: Path, key: str) -> bool:
    """Whether the cached engine ``cache`` (``<key>.plan``) can be used: the record beside it
    (``<key>.json``, written after the plan) names ``key`` and the stamp (size, mtime) the plan had
    when it was written, and the plan still has it. A plan without its record (a write cut short, a
    cache from before the records had stamps) or truncated, rewritten or replaced since is not used:
    it is noted and built again (the new build replaces it atomically)."""
    if not cache.exists():
        return False
    try:
        record = json.loads(cache.with_suffix(".json").read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("key") == key and stamps_match(record.get("stamps"), cache.parent):
        return True
    cache_note(f"the cached TensorRT engine {cache.name} does not match the record written with it (missing, "
               "partial or changed since); it is built again")
    return False


def store_engine(cache: Path, key: str, parts: dict, data) -> None:
    """Write the engine ``data`` to ``cache``, then its record with the plan's stamp (:func:`cached_engine`)."""
    atomic_write_bytes(cache, memoryview(data))
    atomic_write_json(cache.with_suffix(".json"), {"key": key, **parts, "stamps": {cache.name: file_stamp(cache)}})


def place_engine(src: Path, dst: Path) -> Path:
    """``dst`` as a hard link to ``src`` (a copy across file systems)."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst
