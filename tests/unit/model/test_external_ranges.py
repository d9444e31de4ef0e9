"""Issue 23 fault 9: a model's data file bigger than what its tensors reference (a 20 GiB file around 64 KiB
of weights took 50 s to hash and counted as 20 GiB of weights). Only the referenced byte ranges count as
weights and go into the model's hash (``core.model.external.referenced_ranges``); a change of a byte a
tensor reads still changes the hash, and an ordinary data file keeps the hash it always had."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.model.external import RANGED_HASH_FROM, referenced_bytes, referenced_ranges
from core.model.load import load_model
from core.workspace import Workspace, sha256_file

BIG = 20 << 30  # the data file's size: sparse (os.truncate), so it costs no disk
W_BYTES = 256 * 64 * 4


def _rchar() -> int:
    """Bytes this process has read through read() calls so far (/proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def external_model(folder: Path, offset: int = 0) -> Path:
    """x [1, 256] -> MatMul(W [256, 64], external in ``w.bin`` at ``offset``) -> y."""
    folder.mkdir(parents=True, exist_ok=True)
    w = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    init = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=w.shape, data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "w.bin"), ("offset", str(offset)), ("length", str(w.nbytes))):
        init.external_data.add(key=k, value=v)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with open(folder / "w.bin", "wb") as f:
        f.seek(offset)
        f.write(w.tobytes())
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("offset", [0, 10 << 30])
def test_a_20_gib_data_file_is_read_for_the_bytes_the_model_references(tmp_path, offset):
    path = external_model(tmp_path / "m", offset)
    os.truncate(path.parent / "w.bin", BIG)
    ws = Workspace(tmp_path / "ws")
    before = _rchar()
    m = load_model(str(path), ws=ws)
    read = _rchar() - before
    assert read < 64 << 20, f"read {read / 2 ** 20:.0f} MiB of a 20 GiB data file around 64 KiB of weights"
    assert m.size_bytes == path.stat().st_size + W_BYTES  # the weights, not the file around them
    assert m.weights is None  # 64 KiB of weights are read into the graph, not kept external as 20 GiB would be
    ranges = referenced_ranges(onnx.load(str(path), load_external_data=False), path.parent)
    assert ranges == {"w.bin": [(offset, offset + W_BYTES)]} and referenced_bytes(ranges) == W_BYTES

    # a byte the model reads changed: a new hash (the file's new mtime defeats the stamp cache)
    with open(path.parent / "w.bin", "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\x7f\x7f\x7f\x7f")
    changed = load_model(str(path), ws=ws)
    assert changed.sha256 != m.sha256
    # bytes no tensor reads are not the model's: they leave its hash as it is; the file's size is in it
    with open(path.parent / "w.bin", "r+b") as f:
        f.seek(offset + W_BYTES + (1 << 20))
        f.write(b"unread")
    assert load_model(str(path), ws=ws).sha256 == changed.sha256
    os.truncate(path.parent / "w.bin", BIG + 4096)
    assert load_model(str(path), ws=ws).sha256 != changed.sha256


def test_an_ordinary_data_file_keeps_its_hash(tmp_path):
    """A data file its tensors fill (onnx's own save, alignment gaps included) is hashed whole, as before:
    the model's runs, caches and policies keep their key."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((300, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("MatMul", ["h", "b"], ["y"], name="mm2")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="d.bin", size_threshold=0)
    size = (tmp_path / "d.bin").stat().st_size
    assert size - referenced_bytes(referenced_ranges(onnx.load(str(path), load_external_data=False), tmp_path)) \
        <= RANGED_HASH_FROM
    data = path.read_bytes()
    want = hashlib.sha256(data + b"\0d.bin\0" + bytes.fromhex(sha256_file(tmp_path / "d.bin"))).hexdigest()
    m = load_model(str(path), ws=Workspace(tmp_path / "ws"))
    assert m.sha256 == want and m.size_bytes == len(data) + referenced_bytes(
        referenced_ranges(onnx.load(str(path), load_external_data=False), tmp_path))
