"""The TensorRT engine cache trusts a ``.plan`` only when the record written after it (``.json``) holds
its stamp (size, mtime) and the file still has it: a partial, truncated, rewritten or record-less plan
is built again. Without a GPU: the cache functions on files, and the backend's build through the fake
``tensorrt``/Polygraphy of test_tensorrt_flow."""
from __future__ import annotations

import json
import os

from core.backends.tensorrt import engine_cache
from core.workspace import take_notes
from tests.fixtures.fake_tensorrt import build_engine

KEY = "0123456789abcdef0123456789abcdef"


def test_a_stored_engine_is_used_until_its_file_changes(tmp_path):
    cache = tmp_path / f"{KEY}.plan"
    assert not engine_cache.cached_engine(cache, KEY)  # nothing cached: a plain miss, no note
    assert take_notes() == []
    engine_cache.store_engine(cache, KEY, {"gpu": "Fake GPU"}, b"PLAN-1" * 100)
    assert engine_cache.cached_engine(cache, KEY)
    record = json.loads(cache.with_suffix(".json").read_text())
    assert record["key"] == KEY and record["gpu"] == "Fake GPU" and record["stamps"][cache.name]["size"] == 600
    assert not engine_cache.cached_engine(cache, "another key")

    cache.write_bytes(b"PLAN-1" * 50)  # truncated (a copy or a write cut short)
    assert not engine_cache.cached_engine(cache, KEY)
    assert any(cache.name in n and "built again" in n for n in take_notes())

    engine_cache.store_engine(cache, KEY, {}, b"PLAN-2" * 100)
    st = cache.stat()
    os.utime(cache, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # same size, rewritten later
    assert not engine_cache.cached_engine(cache, KEY)

    engine_cache.store_engine(cache, KEY, {}, b"PLAN-3" * 100)
    cache.with_suffix(".json").write_text("{not json")  # the record damaged
    assert not engine_cache.cached_engine(cache, KEY)
    cache.with_suffix(".json").unlink()  # a plan without its record (crash before it, or an older cache)
    assert not engine_cache.cached_engine(cache, KEY)
    cache.with_suffix(".json").write_text(json.dumps({"key": KEY}))  # a record from before the stamps
    assert not engine_cache.cached_engine(cache, KEY)
    take_notes()


def test_the_backend_rebuilds_a_corrupt_cached_engine(fakes, project, tmp_path):  # noqa: F811
    _, _, first = build_engine(project, tmp_path / "a")
    side = json.loads((tmp_path / "a" / "compiled.tensorrt.json").read_text())
    cache = project.ws.root / "engines" / "tensorrt" / f"{side['key']}.plan"
    built = len(fakes.built)
    build_engine(project, tmp_path / "b")
    assert len(fakes.built) == built  # intact: a cache hit
    assert json.loads((tmp_path / "b" / "compiled.tensorrt.json").read_text())["cache_hit"]

    (tmp_path / "b" / "compiled.plan").unlink()  # the run's hard link; the cache keeps its own
    cache.unlink()
    cache.write_bytes(b"PLA")  # a partial engine where the cache's was
    _, _, again = build_engine(project, tmp_path / "c")
    assert len(fakes.built) == built + 1
    assert not json.loads((tmp_path / "c" / "compiled.tensorrt.json").read_text())["cache_hit"]
    assert cache.read_bytes() == again.artifact_path.read_bytes() != b"PLA"
    assert any("built again" in n for n in take_notes())
    build_engine(project, tmp_path / "d")
    assert len(fakes.built) == built + 1  # the rebuilt engine is trusted again
