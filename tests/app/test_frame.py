"""Streamlit AppTest of the frame (app.py, ui/frame.py): the sidebar (backend, deployment target, new project),
the session saved under ?project= and restored on every page with undo/redo, a reload that reattaches to a
job, user text kept literal, and every page on models with 0, 1, 2 INT8 layers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from tests.fixtures.apptest import APP, LAYER, ok, page, policy_key, shown, wait_all


def test_reload_reattaches_to_job(ws):
    at = page("precision")
    at.button(key="rebuild").click().run()
    job_id = at.query_params["job"]
    wait_all(ws)
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload: new session, same URL
    reloaded.query_params.update({"model": "sample:tiny-cnn", "job": job_id})
    reloaded.run()  # lands on the home page, then opens the Precision page
    ok(reloaded.switch_page("views/precision.py").run())
    assert reloaded.session_state["my_jobs"] == [job_id]
    assert any("build" in m.value and "done" in m.value for m in reloaded.markdown)


def test_sidebar_says_which_backend_and_why(ws):
    at = ok(page("model"))
    text = " ".join(c.value for c in at.sidebar.caption)
    assert "Backend (auto): onnxruntime" in text and "TensorRT not chosen" in text


def test_user_text_is_literal_in_markdown():
    from ui.session import code, md

    assert md("a_b*c :red[x] $y$ <b>") == r"a\_b\*c \:red\[x\] \$y\$ \<b\>"
    assert md("sample:tiny-cnn") == r"sample\:tiny-cnn"
    assert code("/tmp/x_y.onnx") == "`/tmp/x_y.onnx`" and code("a`b") == "``a`b``" and code("`a") == "`` `a ``"


def test_sidebar_shows_and_keeps_the_deployment_target(ws):
    """TensorRT by default (where mixprec's users deploy), with the caveat that this machine's CPU
    latency does not predict it; picking ONNX Runtime keeps it in the session and the URL, and
    jobs carry it."""
    at = ok(page("precision"))
    pick = at.sidebar.selectbox(key="target_pick")
    assert pick.value == "tensorrt" and any("**Target:** TensorRT (GPU)" in m.value for m in at.sidebar.markdown)
    assert any("does not predict TensorRT latency" in c.value for c in at.sidebar.caption)
    pick.select("onnxruntime").run()
    ok(at)
    assert at.session_state["source"]["target"] == "onnxruntime" and at.query_params["target"] == "onnxruntime"
    assert any("**Target:** ONNX Runtime (CPU)" in m.value for m in at.sidebar.markdown)
    assert not any("does not predict" in c.value for c in at.sidebar.caption)
    at.button(key="rebuild").click().run()
    (job,) = wait_all(ws)
    assert job.params["target"] == "onnxruntime"
    reloaded = AppTest.from_file(APP, default_timeout=120)  # a reload keeps the target (URL)
    reloaded.query_params.update({"model": "sample:tiny-cnn", "target": "onnxruntime"})
    ok(reloaded.run())
    assert reloaded.sidebar.selectbox(key="target_pick").value == "onnxruntime"


def reload(query: dict, page_script: str | None = None) -> AppTest:
    """A browser reload (or a shared link): a new session with only the URL."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    if page_script:
        at.switch_page(f"views/{page_script}.py").run()
    return at


def counts(at: AppTest) -> dict[str, int]:
    return {m.label: int(m.value) for m in at.metric if m.label in ("FP32", "FP16", "INT8")}


def test_reload_restores_project_and_draft_on_every_page_with_undo_redo(ws):
    """The project (tiny-cnn, not the default MiniLM), its draft policy and the run label are saved
    under ?project=; a reload onto any page restores them; undo/redo walk the edits, also after a
    reload."""
    from core.project import open_project

    base = open_project("sample:tiny-cnn", ws=ws).default_policy()
    at = ok(page("precision"))
    pid = at.query_params["project"]
    assert at.query_params["model"] == "sample:tiny-cnn" and len(pid) >= 8
    assert at.button(key="undo").disabled and at.button(key="redo").disabled
    before = counts(at)
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.selectbox(key="bulk_regex_prec").select("fp16")
    at.button(key="apply_regex").click().run()
    at.text_input(key="run_label").input("conv2 *fp16*").run()
    edited = at.session_state[policy_key(ws, "sample:tiny-cnn")]
    assert edited.layers[LAYER] == "fp16" and counts(ok(at))["FP16"] == before["FP16"] + 1
    at.switch_page("views/model.py").run()
    at.switch_page("views/precision.py").run()  # another page in between: the label is kept
    assert at.text_input(key="run_label").value == "conv2 *fp16*"
    for script in ("model", "sensitivity", "precision", "build_and_results", "export"):
        again = ok(reload({"project": pid}, script))
        assert again.session_state["source"]["model"] == "sample:tiny-cnn", script
        assert any("tiny-cnn" in shown(m) for m in again.sidebar.markdown), script
        assert again.query_params["project"] == pid and again.query_params["model"] == "sample:tiny-cnn"
    assert again.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256  # the Export page
    at = ok(reload({"project": pid}, "precision"))
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256
    assert counts(at) == counts(at) | {"FP16": before["FP16"] + 1}
    assert at.text_input(key="run_label").value == "conv2 *fp16*"
    undo = at.button(key="undo")
    assert not undo.disabled and LAYER in undo.help and at.button(key="redo").disabled
    undo.click().run()
    assert counts(ok(at)) == before and at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == base.sha256
    assert any(s.value.startswith("Undone:") for s in at.success)
    at.button(key="redo").click().run()
    assert at.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == edited.sha256
    at.button(key="undo").click().run()
    assert ok(reload({"project": pid}, "precision")).session_state[policy_key(ws, "sample:tiny-cnn")].sha256 \
        == base.sha256  # the undo was saved too
    fresh = ok(reload({"project": "../../etc", "model": "sample:tiny-cnn"}, "precision"))  # hostile id: ignored
    assert fresh.query_params["project"] != "../../etc" and not (ws.root / "etc").exists()
    assert fresh.session_state[policy_key(ws, "sample:tiny-cnn")].sha256 == base.sha256


def test_a_damaged_saved_project_starts_again_with_a_note(ws):
    from core.store.drafts import new_project_id, project_path

    pid = new_project_id()
    path = project_path(ws, pid)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    at = reload({"project": pid, "model": "sample:tiny-cnn"})  # said once, on the first page
    assert not at.exception and any("could not be read" in shown(w) for w in at.sidebar.warning)
    ok(at.switch_page("views/precision.py").run())
    assert at.session_state["source"]["model"] == "sample:tiny-cnn"
    assert json.loads(path.read_text())["model"] == "sample:tiny-cnn"  # replaced at the next save


def mlp(path: Path, n_matmul: int) -> Path:
    """x[1,4] → (MatMul → Relu) × n → Relu: a model with exactly ``n_matmul`` INT8-eligible layers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(n_matmul)
    nodes, inits, t = [], [], "x"
    for i in range(n_matmul):
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [t, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        t = f"r{i}"
    nodes.append(helper.make_node("Sigmoid", [t], ["y"], name="out"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_models_with_0_1_2_eligible_layers_on_every_page(ws, tmp_path):
    """Every page works on models with 0, 1 and 2 INT8-eligible layers: no number box defaults above
    its maximum (the issue's StreamlitValueAboveMaxError with k = 3), also when the same page moves
    on to a model with fewer layers."""
    scripts = ("model", "sensitivity", "build_and_results", "export", "precision")
    models = {n: str(mlp(tmp_path / f"mlp{n}.onnx", n)) for n in (2, 1, 0)}
    for n in (2, 1):  # rankings first: the k boxes need one
        at = ok(page("sensitivity", model=models[n]))
        at.button(key="run_rank").click().run()
        wait_all(ws)
    at = ok(page("sensitivity", model=models[2]))
    assert next(b for b in at.number_input if b.key == "rank_top").max == 2  # the 2 INT8-eligible layers first
    at.toggle(key="rank_eligible").set_value(False).run()
    top = next(b for b in at.number_input if b.key == "rank_top")
    assert top.max == 5 and top.value == 5  # the cumulative ranking lists all 5 layers
    top.set_value(5).run()
    at.session_state["source"] = {"model": models[1], "data": None, "eval_data": None}
    ok(at.run())  # the same page, the next model: 3 layers, a kept 5 must not break it
    assert next(b for b in at.number_input if b.key == "rank_top").max == 3
    at.session_state["source"] = {"model": models[2], "data": None, "eval_data": None}
    at.switch_page("views/precision.py").run()
    k = next(b for b in ok(at).number_input if b.key == "bulk_k")
    assert k.max == 2 and k.value == 2
    k.set_value(2)
    at.button(key="apply_topk").click().run()
    assert any("2 layer(s) → FP16" in s.value for s in ok(at).success)
    for n in (1, 0):
        at.session_state["source"] = {"model": models[n], "data": None, "eval_data": None}
        at.run()  # the same page, a model with fewer eligible layers
        for script in scripts:
            at.switch_page(f"views/{script}.py").run()
            ok(at)
        k = [b for b in at.number_input if b.key == "bulk_k"]  # the Precision page, last
        if n:
            assert k and k[0].max == n and k[0].value == n
            at.button(key="apply_topk").click().run()
            assert any(f"{n} layer(s) → FP16" in s.value for s in ok(at).success)
        else:
            assert not k and not at.get("plotly_chart")
            assert any("No sensitivity ranking" in c.value for c in at.caption)


def test_new_project_leaves_the_old_one_saved(ws):
    at = ok(page("precision"))
    old = at.query_params["project"]
    at.text_input(key="bulk_regex").input(LAYER + "$")
    at.button(key="apply_regex").click().run()
    at = ok(reload({"project": old}))  # on the home page, which opens no model
    assert at.session_state["source"]["model"] == "sample:tiny-cnn"
    at.sidebar.button(key="new_project").click().run()
    ok(at)
    assert at.query_params["project"] != old and at.session_state["source"]["model"] == "sample:minilm"
    back = ok(reload({"project": old}, "precision"))
    assert back.session_state[policy_key(ws, "sample:tiny-cnn")].layers[LAYER] == "fp16"
