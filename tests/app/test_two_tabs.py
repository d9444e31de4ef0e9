"""Issue 23 fault 2: two browser tabs on one project edit its draft at the same time; no edit is lost."""
from __future__ import annotations

import threading

from streamlit.testing.v1 import AppTest

from core.project import open_project
from core.store.drafts import draft_key, load_draft, new_project_id
from tests.app.test_frame import mlp

GATE: dict = {}  # the tabs' script reads its barrier and layer names here (this module, imported by the script)


def _tab_script():
    """One tab: the Precision page's by-name action (ui.bulk_actions.apply, what the button's callback runs) on
    each of its layers in turn, each one click's edit of the draft."""
    import streamlit as st

    from tests.app import test_two_tabs as gate
    from ui import bulk_actions, saved_project

    tab = st.session_state["tab"]
    p = saved_project.project()
    gate.GATE["barrier"].wait()
    for name in gate.GATE["layers"][tab]:
        bulk_actions.apply(p, [name], "fp16", f"tab {tab}: {name}")
        st.session_state.pop("flash", None)
    st.write("done")


def test_two_tabs_editing_one_draft_at_once_lose_nothing(ws, tmp_path):
    """Two sessions on one project each set their own 15 layers to FP16, one click each, at the same time, through
    the pages' code path: every one of the 30 edits is in the saved draft afterwards."""
    model = str(mlp(tmp_path / "mlp.onnx", 30))
    p = open_project(model, ws=ws)
    names = [l.name for l in p.layers if l.op_type == "MatMul"]
    assert len(names) == 30 and all(p.default_policy().layers[n] == "int8" for n in names)
    pid = new_project_id()
    GATE.update(barrier=threading.Barrier(2, timeout=120), layers={0: names[0::2], 1: names[1::2]})
    tabs = []
    for tab in (0, 1):
        at = AppTest.from_function(_tab_script, default_timeout=300)
        at.query_params["project"] = pid
        at.session_state["source"] = {"model": model, "data": None, "eval_data": None}
        at.session_state["tab"] = tab
        tabs.append(at)
    threads = [threading.Thread(target=at.run) for at in tabs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for at in tabs:
        assert not at.exception, [e.value for e in at.exception]
        assert [m.value for m in at.markdown] == ["done"]
    saved = load_draft(ws, pid, draft_key(p.model.sha256, p.calib_data.sha256))
    lost = [n for n in names if saved.policy["layers"][n] != "fp16"]
    assert not lost, f"{len(lost)} of {len(names)} edits lost: {lost}"


def _stale_edit_script():
    """A tab draws the page (reads the draft), another tab sets the same layer to FP32, then this tab's click sets
    it to FP16 on what it drew."""
    import streamlit as st

    from core.store import drafts
    from tests.fixtures.apptest import LAYER
    from ui import draft, saved_project
    from ui.session import workspace

    p = saved_project.project()
    pol = draft.policy(p)
    if not st.session_state.get("clicked"):
        st.session_state["clicked"] = True
        key, pid = drafts.draft_key(p.model.sha256, p.calib_data.sha256), saved_project.project_id()
        other = drafts.load_draft(workspace(), pid, key) or drafts.Draft(p.default_policy().to_dict())
        drafts.commit_draft(workspace(), pid, key, other, other.edited(
            {**other.policy, "layers": {**other.policy["layers"], LAYER: "fp32"}}, "the other tab"), "the other tab")
        draft.set_policy(p, pol.with_layers({LAYER: "fp16", "/conv1/Conv": "fp16"}), what="two layers → FP16")
    text, failed = draft.autosave_status(p)
    (st.warning if failed else st.caption)(text)


def test_an_edit_both_tabs_made_differently_is_said_not_dropped(ws):
    """The one case a merge cannot decide (both tabs changed one layer, to different values): the other tab's value
    stays, this tab's other change is applied, and the tab is told which layer and how to overwrite it."""
    from tests.fixtures.apptest import LAYER

    at = AppTest.from_function(_stale_edit_script, default_timeout=300)
    at.query_params["project"] = pid = new_project_id()
    at.session_state["source"] = {"model": "sample:tiny-cnn", "data": None, "eval_data": None}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (warning,) = at.warning
    assert "Another tab on this project changed" in warning.value and LAYER in warning.value
    assert "Make the change again to overwrite it" in warning.value
    p = open_project("sample:tiny-cnn", ws=ws)
    stored = load_draft(ws, pid, draft_key(p.model.sha256, p.calib_data.sha256))
    assert stored.policy["layers"][LAYER] == "fp32" and stored.policy["layers"]["/conv1/Conv"] == "fp16"
    at.run()  # drawn again: still said until the next edit
    assert any("Another tab" in w.value for w in at.warning)


def _stale_bulk_script():
    """A bulk action (ui.bulk_actions.apply, what its button runs) on ``st.session_state["names"]`` racing another tab:
    the other tab's edit of LAYER (→ FP32) lands between this action's read of the draft and its write. Then the
    page's message as the next run shows it."""
    import streamlit as st

    from core.store import drafts
    from tests.fixtures.apptest import LAYER
    from ui import bulk_actions, draft, saved_project, session

    p = saved_project.project()
    if not st.session_state.get("clicked"):
        st.session_state["clicked"] = True
        real = drafts.commit_draft

        def racing(ws, pid, key, base, new, what):
            other = drafts.load_draft(ws, pid, key) or drafts.Draft(p.default_policy().to_dict())
            real(ws, pid, key, other, other.edited(
                {**other.policy, "layers": {**other.policy["layers"], LAYER: "fp32"}}, "the other tab"), "the other tab")
            return real(ws, pid, key, base, new, what)

        drafts.commit_draft = racing
        try:
            bulk_actions.apply(p, st.session_state["names"], "fp16", "by name")
        finally:
            drafts.commit_draft = real
    session.show_flash()
    text, failed = draft.autosave_status(p)
    (st.warning if failed else st.caption)(text)


def test_a_bulk_action_whose_change_another_tab_overrode_says_so_not_success(ws):
    """A bulk action on a layer another tab changed meanwhile: no "1 layer(s) → FP16" success for what was not
    applied; only the conflict. With a second layer that was applied, the message counts that one and says the other."""
    from tests.fixtures.apptest import LAYER

    def run(names):
        at = AppTest.from_function(_stale_bulk_script, default_timeout=300)
        at.query_params["project"] = new_project_id()
        at.session_state["source"] = {"model": "sample:tiny-cnn", "data": None, "eval_data": None}
        at.session_state["names"] = names
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    only = run([LAYER])
    assert not only.success, [s.value for s in only.success]
    assert any("Another tab on this project changed" in w.value for w in only.warning)
    both = run([LAYER, "/conv1/Conv"])
    (ok,) = both.success
    assert "by name: 1 layer(s) → FP16" in ok.value and "1 not applied: another tab changed it" in ok.value, ok.value
