"""What a link (``?model=…&project=…``) opens: issue 23 §5 — the model it names, with that model's own draft, not the
project's current model; fault 4 — a ``?model=`` no file can have (5000 characters, a NUL) is one clear error on the
page (st.error, never a traceback) and the app stays usable."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.test_frame import mlp
from tests.fixtures.apptest import APP, LAYER, ok, page, policy_key, shown

OTHER = "sample:tiny-transformer"
OTHER_LAYER = "/attn/q/MatMul"  # INT8 by default


def _set_by_name(at: AppTest, layer: str, precision: str) -> AppTest:
    at.text_input(key="bulk_regex").input(f"^{layer}$")
    at.selectbox(key="bulk_regex_prec").select(precision)
    at.button(key="apply_regex").click().run()
    return ok(at)


def _link(params: dict, script: str = "precision") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(params)
    at.run()
    return at.switch_page(f"views/{script}.py").run()


def test_each_model_keeps_its_draft_and_a_link_opens_the_model_it_names(ws):
    """tiny-cnn's edit stays tiny-cnn's while the project moves on to tiny-transformer (edited too); an old link
    ``?project=P`` alone opens the project's current model with its own edit, ``?model=sample:tiny-cnn&project=P`` (an
    old link) tiny-cnn with its edit, and switching back in the first tab finds tiny-cnn's edit."""
    at = ok(page("precision"))
    pid = at.query_params["project"]
    cnn = _set_by_name(at, LAYER, "fp16").session_state[policy_key(ws, "sample:tiny-cnn")]
    assert cnn.layers[LAYER] == "fp16"
    at.switch_page("views/model.py").run()
    at.selectbox(key="sample_pick").select(OTHER).run()
    ok(at.switch_page("views/precision.py").run())
    assert at.session_state["source"]["model"] == OTHER and at.query_params["model"] == OTHER
    fresh = at.session_state[policy_key(ws, OTHER)]
    assert fresh.layers[OTHER_LAYER] == "int8"  # the other model's own draft: its defaults, nothing of tiny-cnn's
    tt = _set_by_name(at, OTHER_LAYER, "fp32").session_state[policy_key(ws, OTHER)]

    now = ok(_link({"project": pid}))
    assert now.session_state["source"]["model"] == OTHER
    assert now.session_state[policy_key(ws, OTHER)].sha256 == tt.sha256
    old = ok(_link({"project": pid, "model": "sample:tiny-cnn"}))
    assert old.session_state["source"]["model"] == "sample:tiny-cnn" and old.query_params["model"] == "sample:tiny-cnn"
    assert old.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == cnn.sha256
    assert any("tiny-cnn" in shown(m) for m in old.sidebar.markdown)

    at.switch_page("views/model.py").run()
    at.selectbox(key="sample_pick").select("sample:tiny-cnn").run()
    ok(at.switch_page("views/precision.py").run())
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == cnn.sha256
    assert LAYER in at.button(key="undo").help  # its history too


@pytest.mark.parametrize("model,needle", [("a" * 5000, "longer than a path can be"),
                                          ("/srv/" + "a/" * 2500 + "m.onnx", "longer than a path can be"),
                                          ("/srv/m\x00.onnx", "NUL character")],
                         ids=["5000_characters", "5000_character_path", "nul"])
def test_a_model_link_no_file_can_have_is_one_error_and_the_app_stays_usable(ws, tmp_path, model, needle):
    at = _link({"model": model})
    assert not at.exception, [e.value[:300] for e in at.exception]
    (err,) = at.error
    assert needle in shown(err) and "Fix:" in shown(err) and len(err.value) < 1000  # the path is cut short
    assert all(len(m.value) < 400 for m in at.sidebar.markdown)
    at.switch_page("views/model.py").run()
    assert not at.exception and any(needle in shown(e) for e in at.error)
    good = str(mlp(tmp_path / "good.onnx", 2))  # the way out: another model, here a path on the server
    at.radio(key="model_how").set_value("Path on the server").run()
    at.text_input(key="model_path").input(good)
    at.button(key="load_path").click().run()
    ok(at)
    assert at.session_state["source"]["model"] == good and at.query_params["model"] == good
    ok(at.switch_page("views/precision.py").run())
