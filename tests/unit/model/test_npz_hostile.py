"""Issue 23, faults 1 and 4: hostile .npz files are refused with a MixprecError before they are unpacked:
a decompression bomb (members declaring more than the memory budget), a non-array member, a nested
archive, a header declaring a huge shape, a header over numpy's size limit, a truncated member."""
from __future__ import annotations

import io
import resource
import zipfile

import numpy as np
import pytest

from core.errors import MixprecError
from core.model.data import NPY_MAX_HEADER, load_npz


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a)
    return buf.getvalue()


def _zip(members: dict[str, bytes], deflate: bool = True) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _header(shape, dtype="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def test_a_decompression_bomb_is_refused_before_it_is_unpacked(monkeypatch):
    monkeypatch.setenv("MIXPREC_MEMORY_BUDGET", "256M")
    bomb = _zip({"x.npy": _npy(np.zeros((512, 1024, 1024), np.uint8))})  # 512 MiB of zeros, ~0.5 MB packed
    assert len(bomb) < 2 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(MixprecError) as e:
        load_npz(bomb)
    assert "memory budget" in e.value.what and "not unpacked" in e.value.what and "x" in e.value.what
    assert "MIXPREC_MEMORY_BUDGET" in e.value.fix
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss: KiB
    assert grown_mib < 100, grown_mib  # nothing near the 512 MiB was inflated


def test_the_budget_counts_all_members_together(monkeypatch):
    monkeypatch.setenv("MIXPREC_MEMORY_BUDGET", "3M")
    two = _zip({"a.npy": _npy(np.zeros((2 << 20) // 4, np.float32)), "b.npy": _npy(np.zeros((2 << 20) // 4, np.float32))})
    with pytest.raises(MixprecError, match="memory budget"):
        load_npz(two)
    monkeypatch.setenv("MIXPREC_MEMORY_BUDGET", "5M")
    assert set(load_npz(two).arrays) == {"a", "b"}  # under the budget: read


@pytest.mark.parametrize("members, words", [
    ({"x.npy": _npy(np.ones(3, np.float32)), "notes.txt": b"hello"}, "not an array"),
    ({"x.npy": _zip({"y.npy": _npy(np.ones(3, np.float32))})}, "nested archive"),
    ({"x.npy": b"plain bytes, no npy magic"}, "not an .npy array"),
    ({"x.npy": _header((1 << 40, 1 << 20)) + b"\0" * 64}, "declares"),  # a huge shape: never allocated
    ({"x.npy": _header((4, 4)) + b"\0" * 8}, "truncated"),  # 64 bytes declared, 8 held
    ({"x.npy": b"\x93NUMPY\x02\x00" + (NPY_MAX_HEADER * 3).to_bytes(4, "little") + b" " * (NPY_MAX_HEADER * 3)},
     "header larger"),
])
def test_hostile_members_are_refused_with_a_clear_error(members, words):
    with pytest.raises(MixprecError) as e:
        load_npz(_zip(members), name="hostile.npz")
    assert "hostile.npz" in e.value.what and words in e.value.what, e.value.what
    assert "numpy.savez" in e.value.fix


def test_object_arrays_are_still_refused():
    buf = io.BytesIO()
    np.savez(buf, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(MixprecError, match="object .pickled. arrays"):
        load_npz(buf.getvalue())


def test_plain_npz_reads_as_before_with_fortran_and_compressed_members():
    buf = io.BytesIO()
    x = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.savez_compressed(buf, x=x, ids=np.arange(5, dtype=np.int64))
    ds = load_npz(buf.getvalue())
    np.testing.assert_array_equal(ds.arrays["x"], x)
    np.testing.assert_array_equal(ds.arrays["ids"], np.arange(5))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_memory_budget_reads_a_cgroup_limit(tmp_path, monkeypatch, version):
    """Issue 23, fault 9: a cgroup v1 limit caps the budget as v2's does (before, v1 was ignored and a huge
    batch was killed with no message)."""
    from core.model import shapes

    limit, used = tmp_path / "limit", tmp_path / "used"
    limit.write_text(str(3 << 30)), used.write_text(str(1 << 30))
    missing = (str(tmp_path / "none"), str(tmp_path / "none2"))
    files = ((str(limit), str(used)), missing) if version == "v2" else (missing, (str(limit), str(used)))
    monkeypatch.setattr(shapes, "CGROUP_MEMORY_FILES", files)
    monkeypatch.delenv("MIXPREC_MEMORY_BUDGET", raising=False)
    assert shapes._available_memory() <= 2 << 30
    limit.write_text(str(2**63 - 4096))  # v1's "no limit"
    assert shapes._available_memory() > 0
