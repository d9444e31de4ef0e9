"""The model over 2 GB that tests build in code (tests/test_large_model.py, tests/test_estimate_external.py):
an embedding table of 2.15 GB in a sparse data file (its first rows hold data, the rest is a hole), so it
takes a few hundred KB on disk."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

BIG_ROWS, DIM, LIVE_ROWS = 525_000, 1024, 256  # 2.15 GB of float32: over protobuf's 2 GiB
RSS_LIMIT = 1900 << 20  # the child's peak RSS: under the table's 2.15 GB (2.0 GiB), so holding the table once
# (a proto over 2 GB, or a weight copy) breaks it. 173 MiB measured on a warm developer tree, 1.5 GiB on a
# fresh clone (mapped pages of the data file counted in RSS); see the session note


def _external(name: str, dims: list[int], location: str, offset: int) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    length = int(np.prod(dims)) * 4
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)
    return t


def big_model(folder: Path) -> Path:
    """ids [1, 8] -> Gather(E [525000, 1024], 2.15 GB, sparse) -> MatMul W1 -> Relu -> MatMul W2 -> y,
    with W1, W2 in a second data file; calibration and evaluation data with ids in E's live rows."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(folder / "embedding.bin", "wb") as f:  # live rows, then a hole up to 2.15 GB
        f.write(rng.standard_normal((LIVE_ROWS, DIM)).astype(np.float32).tobytes())
        f.truncate(BIG_ROWS * DIM * 4)
    w1 = (rng.standard_normal((DIM, 256)) / 32).astype(np.float32)
    w2 = (rng.standard_normal((256, 64)) / 16).astype(np.float32)
    (folder / "weights.bin").write_bytes(w1.tobytes() + w2.tobytes())
    inits = [_external("E", [BIG_ROWS, DIM], "embedding.bin", 0), _external("W1", [DIM, 256], "weights.bin", 0),
             _external("W2", [256, 64], "weights.bin", w1.nbytes)]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"], name="emb"),
             helper.make_node("MatMul", ["h", "W1"], ["a"], name="fc1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64])], inits)
    path = folder / "big.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    for split, n in (("calib", 16), ("eval", 16)):
        np.savez(folder / f"{split}.npz", ids=rng.integers(0, LIVE_ROWS, (n, 8), dtype=np.int64))
    return path
