"""Issue 23 §7 on the Precision page: the network-default selector (the CLI's --network-default), "everything
not INT8 → FP16", and every bulk action saying what it changed; each one undoable edit."""
from __future__ import annotations

from core.project import open_project
from core.quant.policy import with_network_default
from tests.fixtures.apptest import LAYER, MODEL, ok, page, policy_key


def _pol(at, ws):
    return at.session_state[policy_key(ws, MODEL)]


def test_network_default_selector_sets_the_clis_default_and_undoes(ws):
    p = open_project(MODEL, ws=ws)
    at = ok(page("precision"))
    radio = at.radio(key="network_default")
    assert radio.value == "fp32" and list(radio.options) == ["FP32", "FP16"]
    moved = sum(p.default_policy().layers[n] != p.default_policy("fp16").layers[n] for n in p.default_policy().layers)
    assert moved > 0
    radio.set_value("fp16").run()
    ok(at)
    pol = _pol(at, ws)
    assert pol.network_default == "fp16" and pol.layers == p.default_policy("fp16").layers  # the CLI's policy
    assert any(f"Network default FP32 → FP16; {moved} layers FP32 → FP16" in s.value for s in at.success)
    at.button(key="undo").click().run()
    assert _pol(ok(at), ws).sha256 == p.default_policy().sha256 and at.radio(key="network_default").value == "fp32"
    at.button(key="redo").click().run()
    assert _pol(ok(at), ws).network_default == "fp16" and at.radio(key="network_default").value == "fp16"


def test_everything_not_int8_to_fp16_says_what_changed(ws):
    p = open_project(MODEL, ws=ws)
    before = p.default_policy()
    fp32 = [n for n, v in before.layers.items() if v == "fp32"]
    at = ok(page("precision"))
    at.button(key="not_int8_fp16").click().run()
    pol = _pol(ok(at), ws)
    assert all(pol.layers[n] == "fp16" for n in fp32) and pol.precision_counts()["int8"] == \
        before.precision_counts()["int8"]
    assert any(f"everything not INT8: {len(fp32)} layer(s) → FP16 — {len(fp32)} layers FP32 → FP16" in s.value
               for s in at.success)
    assert at.button(key="not_int8_fp16").disabled  # nothing FP32 is left
    at.button(key="undo").click().run()
    assert _pol(ok(at), ws).sha256 == before.sha256
    # the same layers under the FP16 network default: what the selector leaves FP32 the bulk action would take
    assert set(with_network_default(before, p.model, p.layers, "fp16").layers.items()) <= \
        set(before.layers.items()) | {(n, "fp16") for n in fp32}


def test_bulk_actions_say_which_precisions_changed(ws):
    at = ok(page("precision"))
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.selectbox(key="bulk_regex_prec").select("fp16")
    at.button(key="apply_regex").click().run()
    assert any("1 layer(s) → FP16 — 1 layer INT8 → FP16" in s.value for s in ok(at).success)
    at.button(key="apply_regex").click().run()  # again: nothing changes, and it says so
    assert any("1 layer(s) → FP16 — no layer changed: it was FP16 already" in s.value for s in ok(at).success)
    at.button(key="reset").click().run()
    at.button(key="reset_confirm").click().run()
    assert any("Reset: " in s.value and "1 layer FP16 → INT8" in s.value for s in ok(at).success)


def _click_precision(at, row: int, label: str):
    """What the browser sends when the user clicks the precision button of a row of the layer table."""
    import json

    from streamlit.proto.Common_pb2 import StringTriggerValue
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    table = next(d for d in at.dataframe if (d.key or "").startswith("layer_table-"))
    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=table.proto.button_click_widgets["precision"],
                                      string_trigger_value=StringTriggerValue(data=json.dumps({"row": row,
                                                                                               "label": label}))))
    return at._run(states)


def test_a_precision_cell_is_a_button_that_moves_the_layer_on(ws):
    """Issue 23: double-clicking a precision cell opened a read-only editor; the cell is a button now."""
    p = open_project(MODEL, ws=ws)
    at = ok(page("precision"))
    table = next(d for d in at.dataframe if (d.key or "").startswith("layer_table-"))
    assert "precision" in table.proto.button_click_widgets  # a button column: no read-only text editor
    names = table.value["name"].tolist()
    row = names.index(LAYER)
    assert table.value["precision"][row] == "INT8"
    _click_precision(at, row, "INT8")  # INT8 → FP32
    assert _pol(ok(at), ws).layers[LAYER] == "fp32"
    assert any(f"1 layer INT8 → FP32" in s.value for s in at.success)
    _click_precision(at, row, "FP32")
    _click_precision(at, row, "FP16")
    assert _pol(ok(at), ws).layers[LAYER] == "int8"
    plain = next(l for l in p.layers if not l.eligible and not l.placement and l.subgraph is None)
    row = names.index(plain.name)
    _click_precision(at, row, "FP32")
    _click_precision(at, row, "FP16")  # a layer that cannot be INT8: FP16 → FP32
    assert _pol(ok(at), ws).layers[plain.name] == "fp32"
    at.button(key="undo").click().run()
    assert _pol(ok(at), ws).layers[plain.name] == "fp16"
