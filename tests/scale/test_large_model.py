"""Models over 2 GB (issue 14 §1): weights that stay in their external data files (core.model.external).

The model over 2 GB is built in code with a sparse data file (an embedding table of 2.15 GB whose
first rows hold data and the rest is a hole), so it takes a few hundred KB on disk. It loads, builds
and exports in a child process whose peak resident memory must stay far below the table's size:
neither a proto over 2 GB nor a copy of the weights is ever made.

A small model with weights over ``INLINE_BELOW`` runs in external mode (``MIXPREC_EXTERNAL_WEIGHTS_FROM``
lowered) through calibration, ranking, isolated sensitivity, search, build and export, and must give
exactly what the same model gives with its weights read into the graph.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.errors import MixprecError
from core.model.external import INLINE_BELOW, copy_file, data_files, read_tensor
from core.model.load import load_model
from core.workspace import Workspace
from tests.fixtures import ROOT
from tests.fixtures.large_models import DIM, RSS_LIMIT, big_model


def small_model(folder: Path) -> Path:
    """A small transformer-like block whose weights are over INLINE_BELOW (so they stay external):
    Gather embedding, two MatMuls with a residual Add, LayerNorm, a head; saved with external data."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    w = {"E": rng.standard_normal((500, 128)), "W1": rng.standard_normal((128, 256)) / 11,
         "W2": rng.standard_normal((256, 128)) / 16, "H": rng.standard_normal((128, 200)) / 11}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.ones(128, np.float32), "g"), numpy_helper.from_array(np.zeros(128, np.float32), "b")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
             helper.make_node("MatMul", ["x", "W1"], ["u"], name="up"),
             helper.make_node("Relu", ["u"], ["ur"], name="act"),
             helper.make_node("MatMul", ["ur", "W2"], ["d"], name="down"),
             helper.make_node("Add", ["x", "d"], ["s"], name="residual"),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], name="norm", axis=-1),
             helper.make_node("MatMul", ["n", "H"], ["logits"], name="head")]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 12])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 12, 200])], inits)
    path = folder / "small.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path),
                    save_as_external_data=True, location="small.onnx.data", size_threshold=0)
    for split, n, seed in (("calib", 16, 2), ("eval", 16, 3)):
        ids = np.random.default_rng(seed).integers(0, 500, (n, 12), dtype=np.int64)
        np.savez(folder / f"{split}.npz", ids=ids)
    return path


# --- over 2 GB, end to end, in a child process with its peak RSS measured ----------------------------
CHILD = textwrap.dedent('''
    import json, resource, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import onnx
    from core.export import export_policy
    from core.project import open_project
    from core.measure.runs import build_and_measure
    from core.workspace import Workspace
    folder, ws = Path(sys.argv[2]), Workspace(Path(sys.argv[3]))

    def peak_rss():
        # this process's own high-water mark: ru_maxrss of a child started by vfork/posix_spawn (subprocess)
        # reports the parent's peak at exec, i.e. the test runner's, not this child's
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    p = open_project(folder / "big.onnx", data=folder / "calib.npz", eval_data=folder / "eval.npz", ws=ws)
    pol = p.default_policy().with_layers({"emb": "fp32", "fc1": "int8", "fc2": "fp16"})
    run = build_and_measure(p, pol, backend="onnxruntime", iterations=3, warmup=1, profile_iterations=1)
    out = export_policy(p, pol, "trtexec-typed", folder / "export" / "big.sh")
    onnx_out = export_policy(p, pol, "onnx", folder / "export-onnx" / "big.mixprec.onnx", target="ort")
    print(json.dumps({"external": p.model.external, "size": p.model.size_bytes, "graph": p.model.proto.ByteSize(),
                      "cosine": run.quality.cosine_mean, "run_dir": str(run.run_dir), "export": str(out),
                      "onnx_export": str(onnx_out), "sha256": p.model.sha256,
                      "peak_rss": peak_rss()}))
''')


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    return big_model(folder)


@pytest.fixture(scope="module")
def big_run(big, tmp_path_factory):
    ws = tmp_path_factory.mktemp("big-ws")
    script = big.parent / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "MIXPREC_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(ROOT), str(big.parent), str(ws)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), ws


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


def test_model_over_2gb_loads_builds_exports_in_bounded_memory(big, big_run):
    doc, ws = big_run
    assert doc["external"] and doc["size"] > (2 << 30) and doc["graph"] < (1 << 20)
    assert doc["peak_rss"] < RSS_LIMIT, f"peak RSS {doc['peak_rss'] / 2**20:.0f} MiB"
    assert 0.99 < doc["cosine"] <= 1.0 + 1e-6  # fc1 INT8 and fc2 FP16 on live embedding rows
    # the workspace holds no dense copy of the table: its copy for the runtimes kept the hole
    assert _disk_bytes(ws) < (64 << 20)
    # the user's data files are never linked (onnx refuses a data file with several links)
    assert (big.parent / "embedding.bin").stat().st_nlink == 1
    onnx.checker.check_model(str(big))


def test_compiled_model_has_its_own_data_file(big_run):
    doc, _ = big_run
    run = Path(doc["run_dir"])
    proto = onnx.load(str(run / "compiled.onnx"), load_external_data=False)
    files = data_files(proto)
    assert "compiled.onnx.data" in files and "embedding.bin" in files  # new weights, and the untouched table
    own = {i.name: i for i in proto.graph.initializer if any(e.value == "compiled.onnx.data" for e in i.external_data)}
    int8 = [t for t in own.values() if t.data_type == TensorProto.INT8]
    assert [t.name for t in int8] == ["W1__int8"] and tuple(int8[0].dims) == (DIM, 256)
    q = read_tensor(int8[0], run / "compiled.onnx.data")
    w1 = np.frombuffer((Path(doc["export"]).parent.parent / "weights.bin").read_bytes()[:DIM * 256 * 4],
                       np.float32).reshape(DIM, 256)
    scale = np.abs(w1).max(axis=0) / 127
    assert np.abs(q * scale - w1).max() <= scale.max() * 0.5 + 1e-6  # per-channel symmetric INT8 of W1


def test_export_is_self_contained_and_loads_with_onnx(big, big_run):
    doc, _ = big_run
    out = Path(doc["export"])
    compiled = out.with_name("big.mixprec.onnx")
    assert compiled.is_file() and out.is_file() and "big.mixprec.onnx" in out.read_text()
    for f in compiled.parent.iterdir():  # real copies (one link each), the table's still sparse
        assert f.stat().st_nlink == 1
    assert (compiled.parent / "embedding.bin").stat().st_blocks * 512 < (16 << 20)
    onnx.checker.check_model(str(compiled))  # by path: onnx accepts its data files
    import onnxruntime as ort

    ids = np.load(big.parent / "eval.npz")["ids"][:1]
    exported = ort.InferenceSession(doc["onnx_export"], providers=["CPUExecutionProvider"])
    fp32 = ort.InferenceSession(str(big), providers=["CPUExecutionProvider"])
    a, b = exported.run(None, {"ids": ids})[0], fp32.run(None, {"ids": ids})[0]
    cos = float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))
    assert 0.99 < cos < 1.0


def test_loading_again_reuses_the_hash_and_the_copy(big, big_run, monkeypatch):
    """A second load reads the big data file's digest from the workspace (no 2 GB re-hash) and finds
    the runtime copy made by the first."""
    doc, ws = big_run
    import core.model.external as ext

    hashed = []
    real = ext.sha256_file
    monkeypatch.setattr(ext, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    m = load_model(big, Workspace(ws))
    assert m.sha256 == doc["sha256"] and m.external
    assert "embedding.bin" not in hashed
    copy = m.weights.folder / "embedding.bin"
    assert copy.is_file() and copy.stat().st_size == (big.parent / "embedding.bin").stat().st_size


# --- external data: hash, checks, refusals ----------------------------------------------------------
def test_hash_covers_the_data_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = small_model(tmp_path / "m")
    ws = Workspace(tmp_path / "ws")
    a = load_model(path, ws)
    data = path.with_name("small.onnx.data")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    b = load_model(path, ws)
    assert a.external and b.external and a.sha256 != b.sha256
    assert a.size_bytes == path.stat().st_size + data.stat().st_size


def test_external_mode_keeps_the_traversal_and_missing_file_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = small_model(tmp_path / "m")
    proto = onnx.load(str(path), load_external_data=False)
    for loc, match in (("../secret.bin", "outside its folder"), ("gone.bin", "external data files are missing")):
        for e in proto.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = loc
        bad = tmp_path / "m" / "bad.onnx"
        onnx.save_model(proto, str(bad))
        with pytest.raises(MixprecError, match=match):
            load_model(bad, Workspace(tmp_path / "ws"))


def test_weights_stay_out_of_the_proto(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    path = small_model(tmp_path / "m")
    m = load_model(path, Workspace(tmp_path / "ws"))
    big = [i for i in m.proto.graph.initializer if i.name in ("E", "W1", "W2", "H")]
    assert len(big) == 4 and all(i.data_location == TensorProto.EXTERNAL and not i.raw_data for i in big)
    small = [i for i in m.proto.graph.initializer if i.name in ("g", "b")]
    assert all(i.data_location != TensorProto.EXTERNAL for i in small)  # under INLINE_BELOW: read into the graph
    assert m.proto.ByteSize() < INLINE_BELOW
    with pytest.raises(MixprecError, match="external data"):
        m.serialized()
    out = m.save(tmp_path / "copy" / "model.onnx", copy=True)
    onnx.checker.check_model(str(out))
    assert (out.parent / "small.onnx.data").stat().st_nlink == 1
    assert path.with_name("small.onnx.data").stat().st_nlink == 1  # the user's file is never linked


def test_sparse_copy_keeps_holes(tmp_path):
    src = tmp_path / "sparse.bin"
    with open(src, "wb") as f:
        f.write(b"\x01" * 4096)
        f.seek(256 << 20)
        f.write(b"\x02" * 4096)
    dst = copy_file(src, tmp_path / "out" / "sparse.bin")
    assert dst.stat().st_size == src.stat().st_size and dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_blocks * 512 < (1 << 20)


# --- external mode gives exactly the inline results -------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The small model opened twice: weights external (threshold lowered) and read into the graph."""
    from core.project import open_project

    folder = tmp_path_factory.mktemp("small")
    path = small_model(folder)
    ws = Workspace(tmp_path_factory.mktemp("small-ws"))
    kw = {"data": folder / "calib.npz", "eval_data": folder / "eval.npz", "ws": ws}
    os.environ["MIXPREC_EXTERNAL_WEIGHTS_FROM"] = "1"
    try:
        ext = open_project(path, **kw)
    finally:
        del os.environ["MIXPREC_EXTERNAL_WEIGHTS_FROM"]
    return ext, open_project(path, **kw)


def test_pair_differs_only_in_where_the_weights_are(pair):
    ext, inl = pair
    assert ext.model.external and not inl.model.external and ext.model.sha256 == inl.model.sha256
    assert [(l.name, l.eligible, l.macs) for l in ext.layers] == [(l.name, l.eligible, l.macs) for l in inl.layers]
    assert ext.default_policy().layers == inl.default_policy().layers


def test_external_build_and_calibration_match_inline(pair):
    from core.quant.calibration import calibrate_policy
    from core.measure.runs import build_and_measure

    results = []
    for p in pair:
        pol = p.default_policy().with_layers({l.name: "int8" for l in p.layers if l.eligible})
        pol = pol.with_smoothing({"up": 0.5})  # per-channel statistics: a session of the model with more outputs
        calib = calibrate_policy(p.model, p.calib_data, pol, p.layers, p.ws)
        run = build_and_measure(p, pol, backend="onnxruntime", iterations=3, warmup=1, profile_iterations=1)
        results.append((calib.ranges, {k: v.tolist() for k, v in calib.channels.items()}, run.quality.cosine_mean,
                        run.quality.max_abs))
    assert results[0] == results[1] and results[0][1]


def test_external_rank_and_sensitivity_match_inline(pair):
    from core.sensitivity import rank_layers, sensitivity

    ranks = [rank_layers(p, max_samples=4).table[["name", "cos_drop"]].round(7).values.tolist() for p in pair]
    assert ranks[0] == ranks[1]
    sens = [sensitivity(p, workers=1).table.round(7).values.tolist() for p in pair]
    assert sens[0] == sens[1]


def test_external_search_and_export_match_inline(pair, tmp_path):
    from core.export import export_policy
    from core.search import SearchConfig, search

    found = [search(p, SearchConfig(budget="cosine_mean>=0.999", methods=("minmax",), workers=1, verify=False,
                                    objective="mac_share")).policy.layers for p in pair]
    assert found[0] == found[1]
    outputs = []
    for label, p in zip(("ext", "inl"), pair):
        pol = p.default_policy().with_layers({l.name: "int8" for l in p.layers if l.eligible})
        out = export_policy(p, pol, "onnx", tmp_path / label / "small.mixprec.onnx")
        onnx.checker.check_model(str(out))
        import onnxruntime as ort

        ids = np.arange(24).reshape(2, 12)
        outputs.append(ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0])
    np.testing.assert_array_equal(outputs[0], outputs[1])
