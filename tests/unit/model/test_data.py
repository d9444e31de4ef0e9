"""Data: .npz loading (no pickles), checks against the inputs, generated data."""
from __future__ import annotations

import numpy as np
import pytest

from core.errors import MixprecError
from core.model.data import Dataset, generate_dataset, load_npz


def test_pickled_npz_refused(tmp_path, tiny_cnn):
    p = tmp_path / "evil.npz"
    np.savez(p, image=np.array([{"a": 1}], dtype=object))
    with pytest.raises(MixprecError, match="object \\(pickled\\) arrays.*Fix: save plain numeric arrays"):
        load_npz(p, tiny_cnn.model)


def test_not_npz_and_wrong_inputs(tmp_path, tiny_cnn):
    with pytest.raises(MixprecError, match="not a .npz"):
        load_npz(b"plain text", tiny_cnn.model)
    p = tmp_path / "wrong.npz"
    np.savez(p, pixels=np.zeros((2, 3, 32, 32), np.float32))
    with pytest.raises(MixprecError, match="missing inputs: image"):
        load_npz(p, tiny_cnn.model)
    np.savez(p, image=np.zeros((2, 3, 16, 16), np.float32))
    with pytest.raises(MixprecError, match="axis 2 is 16, model wants 32"):
        load_npz(p, tiny_cnn.model)


def test_int32_ids_are_cast(tmp_path, tiny_transformer):
    p = tmp_path / "ids.npz"
    np.savez(p, input_ids=np.ones((3, 16), np.int32), attention_mask=np.ones((3, 16), np.int32))
    ds = load_npz(p, tiny_transformer.model)
    assert ds.arrays["input_ids"].dtype == np.int64 and ds.num_samples == 3


def test_generated_data_fits_inputs(minilm):
    ds = generate_dataset(minilm.model, 8, seed=3, shapes=minilm.input_shapes)
    ids = ds.arrays["input_ids"]
    assert ids.shape == (8, minilm.input_shapes["input_ids"][1]) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 30522 and len(np.unique(ids)) > 50
    assert (ds.arrays["attention_mask"] == 1).all() and (ds.arrays["token_type_ids"] == 0).all()


def test_generated_floats_in_range(tiny_cnn):
    ds = generate_dataset(tiny_cnn.model, 4)
    x = ds.arrays["image"]
    assert x.shape == (4, 3, 32, 32) and x.dtype == np.float32 and np.abs(x).max() <= 3.0 and x.std() > 0.5


def test_dataset_hash_changes_with_content(tiny_cnn):
    a = generate_dataset(tiny_cnn.model, 4, seed=0)
    b = generate_dataset(tiny_cnn.model, 4, seed=1)
    assert a.sha256 != b.sha256 and a.sha256 == generate_dataset(tiny_cnn.model, 4, seed=0).sha256


def test_labels_are_kept_apart_and_checked(tmp_path, tiny_cnn):
    p = tmp_path / "labelled.npz"
    np.savez(p, image=np.zeros((4, 3, 32, 32), np.float32), labels=np.array([1, 2, 3, 4]))
    ds = load_npz(p, tiny_cnn.model)
    assert set(ds.arrays) == {"image"} and ds.labels.tolist() == [1, 2, 3, 4]
    assert ds.slice(1, 3).labels.tolist() == [2, 3] and ds.slice(1, 3).num_samples == 2
    np.savez(p, image=np.zeros((4, 3, 32, 32), np.float32), labels=np.array([1, 2]))
    with pytest.raises(MixprecError, match="2 labels for 4 samples"):
        load_npz(p, tiny_cnn.model)


def test_batches_follow_each_inputs_batch_axis():
    ds = Dataset({"x": np.arange(24.0).reshape(6, 4), "state": np.zeros((2, 6, 4)), "sr": np.array(16000)},
                 "t", labels=np.arange(6), batch_axes={"x": 0, "state": 1, "sr": None})
    assert ds.num_samples == 6 and not ds.generated
    feeds = ds.batches(3)
    assert len(feeds) == 2 and feeds[1]["x"][0, 0] == 12 and feeds[1]["state"].shape == (2, 3, 4)
    assert feeds[0]["sr"] == 16000  # no batch axis: passed whole
    part = ds.slice(4)
    assert part.num_samples == 2 and part.labels.tolist() == [4, 5] and part.batch_axes == ds.batch_axes
    whole = Dataset({"sr": np.array(1)}, "t", batch_axes={"sr": None})
    assert whole.num_samples == 1 and len(whole.batches(16)) == 1
    fixed = Dataset({"x": np.zeros((70, 2))}, "t", fixed_batch=32)
    assert [f["x"].shape for f in fixed.batches(1)] == [(32, 2), (32, 2)]


def test_generated_flags(tiny_cnn, tiny_transformer):
    assert generate_dataset(tiny_cnn.model, 4).generated
    assert not tiny_cnn.data_generated and not tiny_cnn.calib_data.generated  # the sample's bundled data
    ds = generate_dataset(tiny_transformer.model, 4, shapes=tiny_transformer.input_shapes)
    assert (ds.arrays["attention_mask"] == 1).all() and ds.arrays["input_ids"].max() > 1


def test_npz_samples_along_the_batch_axis_in_the_fix(tmp_path, tiny_cnn):
    p = tmp_path / "bad.npz"
    np.savez(p, image=np.zeros((4, 3, 16, 32), np.float32))
    with pytest.raises(MixprecError, match="Fix: save one array per input, keyed by input name, samples along axis 0"):
        load_npz(p, tiny_cnn.model)


def test_token_ids_are_found_through_a_dequantized_embedding_table(tmp_path):
    """An int8 embedding table dequantized by Cast and Mul (weight-only int8 exports) still makes
    input_ids token ids within its vocabulary, not an input mixprec refuses to invent."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from core.model.load import load_model

    table = numpy_helper.from_array(np.ones((100, 8), np.int8), "table_q")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    nodes = [helper.make_node("Cast", ["table_q"], ["table_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["table_f", "scale"], ["table"]),
             helper.make_node("Gather", ["table", "input_ids"], ["emb"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", "seq", 8])],
                          [table, scale])
    path = tmp_path / "emb.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    ds = generate_dataset(load_model(path), 8, shapes={"input_ids": (1, 12)})
    ids = ds.arrays["input_ids"]
    assert ids.shape == (8, 12) and ids.min() >= 0 and ids.max() < 100 and len(np.unique(ids)) > 2


def test_fewer_than_200_calibration_samples_of_the_users_get_a_note(ws, tmp_path, capfd, monkeypatch):
    """Issue 22 §2: the field's advice is 200–500 calibration samples; the user's smaller set is said so (inspect,
    the Model page), a sample's bundled data and generated data are not the user's and get no such note."""
    from core.project import open_project
    from tests.fixtures.cli import cli_in_process

    p = open_project("sample:tiny-cnn", ws=ws)
    assert p.data_notes == [] and open_project("sample:tiny-cnn", ws=ws, sample_data=False).data_notes == []
    shape = p.input_shapes["image"]
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "few.npz", image=rng.standard_normal((12, *shape[1:])).astype(np.float32))
    few = open_project("sample:tiny-cnn", data=tmp_path / "few.npz", ws=ws)
    (note,) = few.data_notes
    assert note.startswith("12 calibration samples (few.npz)") and "200–500" in note
    run = cli_in_process(capfd, monkeypatch, ["inspect", "sample:tiny-cnn", "--data", tmp_path / "few.npz"],
                         {"MIXPREC_WORKSPACE": str(ws.root)})
    assert run.returncode == 0 and "data: 12 calibration samples" in run.stdout
    np.savez(tmp_path / "many.npz", image=rng.standard_normal((280, *shape[1:])).astype(np.float32))
    assert open_project("sample:tiny-cnn", data=tmp_path / "many.npz", ws=ws).data_notes == []
