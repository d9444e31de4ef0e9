"""Streamlit AppTest of the Model page (views/model.py) on the tiny samples: the layer inventory, a bad path
that recovers, uploads checked before they are stored, the shape editor and generated data, normalisation
steps."""
from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.errors import MixprecError
from core.store.results import store_upload
from tests.fixtures.apptest import APP, ok, page, shown, wait_all
from tests.fixtures.models import dynamic_cnn


def test_home_and_model_page(ws):
    ok(page())
    at = ok(page("model"))
    assert at.metric[0].label == "Layers" and at.metric[0].value == "8"
    assert "sha256" in at.caption[-1].value or any("sha256" in c.value for c in at.caption)
    at.multiselect(key="inv_ops").select("Conv").run()
    assert any(c.value.startswith("3 of 8 layers") for c in at.caption)
    assert len(at.get("plotly_chart")) == 1


def test_model_page_bad_path_shows_error_and_recovers(ws, tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes((ws.samples.parent / "x").as_posix().encode() * 3)
    at = page("model")
    at.radio(key="model_how").set_value("Path on the server").run()
    at.text_input(key="model_path").input(str(bad))
    at.button(key="load_path").click().run()
    assert at.error and "Fix:" in shown(at.error[0])
    at.radio(key="model_how").set_value("Bundled sample").run()
    at.selectbox(key="sample_pick").select("sample:tiny-transformer").run()
    ok(at)
    assert at.session_state["source"]["model"] == "sample:tiny-transformer"


def test_upload_validation(ws, tmp_path):
    with pytest.raises(MixprecError, match="Fix"):
        store_upload(ws, b"not an onnx file", "x.onnx", "model")
    from core.project import open_project

    model = open_project("sample:tiny-cnn", ws=ws).model
    bad = tmp_path / "pickled.npz"
    np.savez(bad, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(MixprecError, match="pickled"):
        store_upload(ws, bad.read_bytes(), "pickled.npz", "data", model)
    good = store_upload(ws, model.path.read_bytes(), "tiny.onnx", "model")
    assert good.parent == ws.models / model.sha256 and good.name == "tiny.onnx"  # keeps its file name (issue 13)


def test_model_page_shape_editor_and_generated_data(ws, tmp_path):
    """The Model page lists every dynamic dim with its value and source (guesses marked), Apply
    reopens the project at the edited shapes (kept in the session and the URL), and every job
    started from then on carries them; the data is said to be generated."""
    model = str(dynamic_cnn(tmp_path / "dyn.onnx"))
    at = ok(page("model", model=model))
    keys = {n.label: n.key for n in at.number_input}
    assert [n.value for n in at.number_input] == [1, 224, 224] and len(keys) == 3
    assert sum("guessed: 224 — set it" in c.value.replace("\\", "") for c in at.caption) == 2
    assert any("calibration and evaluation data is generated" in i.value for i in at.info)
    origin = next(d.value for d in at.dataframe if "origin" in d.value.columns)
    assert origin["origin"].tolist() == ["generated", "generated"]
    assert any("Nothing changed" in c.value for c in at.caption)
    h, w = (next(k for label, k in keys.items() if label.endswith(f"· {axis}")) for axis in "HW")
    at.number_input(key=h).set_value(320)
    at.number_input(key=w).set_value(320)
    at.button(key="apply_shapes").click().run()
    ok(at)
    assert at.session_state["source"]["shapes"] == {"images": [1, 3, 320, 320]}
    assert json.loads(at.query_params["shapes"]) == {"images": [1, 3, 320, 320]}
    io = next(d.value for d in at.dataframe if "resolved shape" in d.value.columns)
    assert io["resolved shape"].iloc[0] == "(1, 3, 320, 320)"
    assert sum("set by you" in c.value for c in at.caption) == 3 and [n.value for n in at.number_input] == [1, 320, 320]
    at.switch_page("views/precision.py").run()
    at.button(key="rebuild").click().run()
    (job,) = wait_all(ws)
    assert job.params["shapes"] == {"images": [1, 3, 320, 320]}
    res = ok(page("build_and_results", model=model, state={"source": dict(at.session_state["source"])}))
    cosine = next(m for m in res.metric if m.label == "Cosine (mean)")
    assert "on generated data" in cosine.delta
    assert any("images=1x3x320x320" in c.value.replace("\\", "") and "on generated data" in c.value
               for c in res.caption)
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload keeps the shapes (URL)
    reloaded.query_params.update({"model": model, "shapes": at.query_params["shapes"]})
    reloaded.run()
    ok(reloaded.switch_page("views/model.py").run())
    assert [n.value for n in reloaded.number_input] == [1, 320, 320]
    reloaded.button(key="reset_shapes").click().run()
    ok(reloaded)
    assert reloaded.session_state["source"]["shapes"] is None and "shapes" not in reloaded.query_params
    assert [n.value for n in reloaded.number_input] == [1, 224, 224]


def test_shape_editor_min_and_max_shapes_are_the_profile(ws, tmp_path):
    """Issue 22 §4: a dynamic input's optional min and max shape fields make its optimisation profile around the
    shape set (opt), saved with the project (a reload by project id keeps it); a bad one is refused with the fix;
    "Back to the default shapes" clears it."""
    model = str(dynamic_cnn(tmp_path / "dyn.onnx"))
    at = ok(page("model", model=model))
    fields = {t.label.replace("\\", ""): t for t in at.text_input if "shape (optional)" in t.label}
    assert set(fields) == {"images · min shape (optional)", "images · max shape (optional)"}
    assert all(f.value == "" for f in fields.values())
    fields["images · min shape (optional)"].input("1x3x224x224")
    fields["images · max shape (optional)"].input("8x3x640x640")
    at.button(key="apply_shapes").click().run()
    ok(at)
    want = {"images": [[1, 3, 224, 224], [1, 3, 224, 224], [8, 3, 640, 640]]}
    assert at.session_state["source"]["profiles"] == want
    assert [t.value for t in at.text_input if "shape (optional)" in t.label] == ["1x3x224x224", "8x3x640x640"]
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload of the saved project keeps the profile
    reloaded.query_params.update({"project": at.query_params["project"]})
    reloaded.run()
    ok(reloaded.switch_page("views/model.py").run())
    assert reloaded.session_state["source"]["profiles"] == want
    assert [t.value for t in reloaded.text_input if "shape (optional)" in t.label] == ["1x3x224x224", "8x3x640x640"]
    bad = next(t for t in reloaded.text_input if t.label.replace("\\", "") == "images · max shape (optional)")
    bad.input("8x3x100x100")
    reloaded.button(key="apply_shapes").click().run()
    assert reloaded.error and "not min <= opt <= max" in shown(reloaded.error[0]).replace("\\", "")
    assert "Fix:" in shown(reloaded.error[0]) and reloaded.session_state["source"]["profiles"] == want
    reloaded.button(key="reset_shapes").click().run()
    ok(reloaded)
    assert reloaded.session_state["source"]["profiles"] is None
    assert [t.value for t in reloaded.text_input if "shape (optional)" in t.label] == ["", ""]


def test_model_page_shows_normalisation_steps(ws, tmp_path):
    model = str(dynamic_cnn(tmp_path / "old.onnx", opset=11))
    at = ok(page("model", model=model))
    steps = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "detail"])
    assert len(steps) >= 1 and steps["detail"].str.contains("13").any()
    assert any("step(s) made the model fit" in c.value and "Opset 11 → 13" in c.value for c in at.caption)


def test_a_kv_cache_decoder_shows_the_relation_and_setting_past_and_seq_keeps_the_mask(ws, tmp_path):
    """Issue 21 §1 on the Model page: the relation is shown, past and seq are set in the shape editor, and the
    mask follows them (the with-past export of a 2-layer Qwen2, built in code)."""
    from tests.fixtures.decoders import kv_decoder

    model = str(kv_decoder(tmp_path / "with_past.onnx"))
    at = ok(page("model", model=model))
    assert any("attention_mask axis 1 = past + seq = 48 + 16 = 64" in shown(i) for i in at.info)
    import re

    keys = {re.sub(r"\\(.)", r"\1", n.label): n.key for n in at.number_input}  # labels are escaped Markdown
    past = next(k for label, k in keys.items() if label.startswith("past_key_values.0.key") and label.endswith("past"))
    seq = next(k for label, k in keys.items() if label.startswith("input_ids") and label.endswith("seq"))
    at.number_input(key=past).set_value(8)
    at.number_input(key=seq).set_value(4)
    at.button(key="apply_shapes").click().run()
    ok(at)
    io = next(d.value for d in at.dataframe if "resolved shape" in d.value.columns).set_index("name")
    assert io.loc["attention_mask", "resolved shape"] == "(1, 12)" and io.loc["position_ids", "resolved shape"] == "(1, 4)"
    assert any("= 8 + 4 = 12" in shown(i) for i in at.info)


def test_a_merged_decoder_says_which_branch_it_folded_and_picks_the_other(ws, tmp_path):
    """Issue 21 §1: a merged decoder (If on use_cache_branch) is folded to the branch with the cache and
    says so; picking the other branch loads the model again without the past inputs (kept in the URL)."""
    from tests.fixtures.decoders import merged_decoder

    model = str(merged_decoder(tmp_path / "decoder_model_merged.onnx"))
    at = ok(page("model", model=model))
    assert any("Merged decoder" in h.value for h in at.subheader)
    steps = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "detail"])
    assert steps["detail"].str.contains("use_cache_branch = true").any()
    io = next(d.value for d in at.dataframe if "resolved shape" in d.value.columns)
    assert "past_key_values.0.key" in set(io["name"])
    pick = at.radio(key="branch_pick:use_cache_branch")
    assert pick.value.startswith("true")
    pick.set_value(next(o for o in pick.options if o.startswith("false"))).run()
    ok(at)
    io = next(d.value for d in at.dataframe if "resolved shape" in d.value.columns)
    assert "past_key_values.0.key" not in set(io["name"])
    assert at.session_state["source"]["branches"] == {"use_cache_branch": False}
    assert at.query_params["branch"] == "use_cache_branch:0"
    steps = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "detail"])
    assert steps["detail"].str.contains("use_cache_branch = false").any()
    link = AppTest.from_file(APP, default_timeout=120)  # a shared link opens the branch it names
    link.query_params.update(model=model, branch="use_cache_branch:0")
    link.run()
    ok(link.switch_page("views/model.py").run())
    assert link.radio(key="branch_pick:use_cache_branch").value.startswith("false")


def test_shape_editor_no_batch_axis_checkbox(ws, tmp_path):
    """Issue 22 §1: an input whose axis 0 mixprec took for the batch can be marked "no batch axis" in the shape
    editor; Apply reopens the project with it fed whole (one sample per array), kept in the URL and the saved
    project. A model that adds its own batch axis says so, with nothing to tick."""
    from tests.fixtures.axes import frames_bins

    model = str(frames_bins(tmp_path / "audio_r.onnx", named=False, reshape=True))
    at = ok(page("model", model=model))
    (box,) = [c for c in at.checkbox if c.key.startswith("nobatch:")]
    assert box.value is False and "no batch axis" in box.label
    box.check()
    at.button(key="apply_shapes").click().run()
    ok(at)
    assert at.session_state["source"]["no_batch"] == ["input"] and at.query_params["no_batch"] == "input"
    assert [c.value for c in at.checkbox if c.key.startswith("nobatch:")] == [True]
    reloaded = AppTest.from_file(APP, default_timeout=120)
    reloaded.query_params.update({"project": at.query_params["project"]})
    reloaded.run()
    ok(reloaded.switch_page("views/model.py").run())
    assert reloaded.session_state["source"]["no_batch"] == ["input"]
    own = ok(page("model", model=str(frames_bins(tmp_path / "audio.onnx"))))
    assert not [c for c in own.checkbox if c.key.startswith("nobatch:")]
    assert any("has no batch axis" in c.value for c in own.caption)


def test_switching_models_keeps_each_models_data_and_shapes_and_a_link_opens_the_model_it_names(ws, tmp_path):
    """Issue 22 §2 (issue 23 §5): data, shapes and no-batch inputs are kept per model in a project: switching
    to another model and back restores them (said so), the saved project keeps them, and an old link
    (``?model=A&project=P`` after P moved on to B) opens A with what A had, not P's current model."""
    from tests.fixtures.axes import frames_bins

    model = str(frames_bins(tmp_path / "audio_r.onnx", named=False, reshape=True))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", input=rng.standard_normal((8, 120, 105)).astype(np.float32))
    at = ok(page("model", model=model))
    (box,) = [c for c in at.checkbox if c.key.startswith("nobatch:")]
    box.check()
    at.button(key="apply_shapes").click().run()
    ok(at)
    at.radio(key="model_how").set_value("Path on the server").run()
    at.text_input(key="model_path").input(model)
    at.session_state["source"] = {**at.session_state["source"], "data": str(tmp_path / "c.npz")}
    at.run()
    pid = at.query_params["project"]
    before = dict(at.session_state["source"])
    assert before["no_batch"] == ["input"] and before["data"] == str(tmp_path / "c.npz")
    at.radio(key="model_how").set_value("Bundled sample").run()
    at.selectbox(key="sample_pick").select("sample:tiny-cnn").run()
    ok(at)
    assert at.session_state["source"]["model"] == "sample:tiny-cnn" and at.session_state["source"]["data"] is None
    old_link = AppTest.from_file(APP, default_timeout=120)  # ?model= names the model left, ?project= moved on
    old_link.query_params.update({"project": pid, "model": model})
    old_link.run()
    ok(old_link.switch_page("views/model.py").run())
    assert old_link.session_state["source"]["model"] == model
    assert old_link.session_state["source"]["no_batch"] == ["input"] and old_link.session_state["source"]["data"] == before["data"]
    at.radio(key="model_how").set_value("Path on the server").run()
    at.text_input(key="model_path").input(model)
    at.button(key="load_path").click().run()
    ok(at)
    assert {k: at.session_state["source"][k] for k in ("model", "data", "no_batch")} == \
        {k: before[k] for k in ("model", "data", "no_batch")}
    assert any("is back with its data" in s.value for s in at.success)


def test_data_from_a_server_path(ws, tmp_path):
    """Issue 22 §2: the calibration / evaluation .npz can be a path on the server (no upload limit), as a model
    can; a file that does not fit the model is refused with its fix and nothing changes."""
    from core.project import open_project

    shape = open_project("sample:tiny-cnn", ws=ws).input_shapes["image"]
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", image=rng.standard_normal((20, *shape[1:])).astype(np.float32))
    np.savez(tmp_path / "bad.npz", image=rng.standard_normal((20, 5)).astype(np.float32))
    at = ok(page("model", model="sample:tiny-cnn"))
    at.text_input(key="calib_path").input(str(tmp_path / "bad.npz"))
    at.button(key="load_data_path").click().run()
    assert at.error and "does not fit the model's inputs" in shown(at.error[0]) and "Fix:" in shown(at.error[0])
    assert at.session_state["source"]["data"] is None
    at.text_input(key="calib_path").input(str(tmp_path / "calib.npz"))
    at.button(key="load_data_path").click().run()
    ok(at)
    assert at.session_state["source"]["data"] == str(tmp_path / "calib.npz")
    samples = next(m for m in at.metric if m.label == "Samples (calib / eval)")
    assert samples.value.startswith("20 / ")
    assert any("20 calibration samples" in w.value for w in at.warning)
