"""Issue 23 (fault 9, Markdown escapes): what the export writes as text. A tensor name with a line break
never writes lines of its own into the TensorRT calibration cache (refused, with the names as literals);
the bundle README renders names, shapes and file names as they are (code spans: no ``\\_``, ``\\:``,
``\\=``), escapes other user text only where Markdown would read it, and has no empty step."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.display.markdown import code_span, md_text, renders_literally
from core.errors import MixprecError
from core.export import BUNDLE_SCRIPTS, README_NAME, export_bundle, export_policy
from core.project import open_project
from core.quant.calibration import trt_calibration_cache
from core.workspace import Workspace
from tests.unit.export.test_export_bundle import HTML_NAME, MD_NAME, odd_names_model

INJECTED = "INJECTED: 3f800000"


def conv_model(path: Path, tensor: str) -> Path:
    """x [1, 3, 8, 8] -> Conv -> ``tensor`` -> Relu -> Conv -> y: two INT8 convolutions (a policy whose
    TensorRT <= 10.11 build reads the calibration cache), the first one's output named ``tensor``."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], [tensor], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [tensor], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def newline_project(tmp_path):
    return open_project(str(conv_model(tmp_path / "nl.onnx", "h\n" + INJECTED)), ws=Workspace(tmp_path / "ws"))


@pytest.mark.parametrize("sep", ["\n", "\r", "\x00", "\u2028"])
def test_a_control_character_in_a_tensor_name_is_refused_by_the_calibration_cache(tmp_path, sep):
    p = open_project(str(conv_model(tmp_path / "m.onnx", f"h{sep}{INJECTED}")), ws=Workspace(tmp_path / "ws"))
    pol = p.default_policy()
    assert set(pol.layers.values()) >= {"int8"}
    from core.export import policy_calibration

    calib = policy_calibration(p, pol)
    assert f"h{sep}{INJECTED}" in calib.ranges
    with pytest.raises(MixprecError, match="line break or another control character") as e:
        trt_calibration_cache(calib)
    assert repr(f"h{sep}{INJECTED}") in e.value.details and "\n" not in str(e.value)  # one line, the name as a literal
    assert "Fix: rename those tensors" in str(e.value)
    with pytest.raises(MixprecError, match="control character"):  # the CLI's --format calib-cache: refused, not written
        export_policy(p, pol, "calib-cache", tmp_path / "out.cache")
    assert not (tmp_path / "out.cache").exists()


def test_a_plain_tensor_name_still_writes_the_cache(tmp_path):
    p = open_project(str(conv_model(tmp_path / "m.onnx", "h: with colon")), ws=Workspace(tmp_path / "ws"))
    from core.export import policy_calibration

    cache = trt_calibration_cache(policy_calibration(p, p.default_policy()))
    assert any(line.startswith("h: with colon: ") for line in cache.splitlines())  # TensorRT splits at the last ':'


def test_the_bundle_of_a_newline_name_leaves_the_cache_out_and_says_why(newline_project):
    bundle = export_bundle(newline_project, newline_project.default_policy())
    assert "model.calib.cache" not in bundle.files
    assert BUNDLE_SCRIPTS["legacy"] not in bundle.files  # its trtexec --calib needs the cache
    assert BUNDLE_SCRIPTS["typed"] in bundle.files  # the strongly typed build needs no cache
    for name, data in bundle.files.items():
        if not name.endswith(".onnx"):
            assert not any(line.startswith(INJECTED) for line in data.decode().splitlines()), name
    readme = bundle.files[README_NAME].decode()
    left = readme.split("## Left out")[1]
    assert "model.calib.cache" in left and r"'h\nINJECTED" in left


def _steps(readme: str) -> dict[str, str]:
    """The README's numbered steps: title -> body."""
    parts = re.split(r"^## (\d+\. .*)$", readme, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0].strip() for i in range(1, len(parts), 2)}


def _check_readme(readme: str) -> None:
    assert not re.search(r"\\[_:=]", readme), re.findall(r".{20}\\[_:=].{20}", readme)
    steps = _steps(readme)
    assert list(steps)[0] == "1. Build the engine (on the GPU machine)"
    assert [int(t.split(".")[0]) for t in steps] == list(range(1, len(steps) + 1))  # numbered in turn
    assert all(body for body in steps.values()), steps  # no empty step


def test_the_minilm_readme_has_names_as_code_and_every_step(minilm):
    """``sample:minilm`` and ``input_ids=1x…`` as code spans, no backslash escapes; each step has its text."""
    bundle = export_bundle(minilm, minilm.default_policy(), source="The session's policy")
    readme = bundle.files[README_NAME].decode()
    _check_readme(readme)
    assert readme.startswith("# mixprec export: `sample:minilm`\n")
    shape = "x".join(map(str, minilm.input_shapes["input_ids"]))
    assert f"`input_ids={shape}`" in readme and f"`attention_mask={shape}`" in readme
    assert "bash build-trt-10.12.sh" in _steps(readme)["1. Build the engine (on the GPU machine)"]


def test_a_bundle_without_build_scripts_has_no_empty_build_step(tmp_path):
    """An input name trtexec's lists cannot express: both build scripts are left out; the build step says so
    and gives the Polygraphy command that builds the compiled ONNX (it was a heading with nothing under it)."""
    p = open_project(str(odd_names_model(tmp_path / "odd.onnx", input_name="x,y")), ws=Workspace(tmp_path / "ws"))
    bundle = export_bundle(p, p.default_policy(), source="Run **bold** <img src=x> under_score a_b")
    assert not {BUNDLE_SCRIPTS["typed"], BUNDLE_SCRIPTS["legacy"]} & set(bundle.files)
    readme = bundle.files[README_NAME].decode()
    _check_readme(readme)
    build = _steps(readme)["1. Build the engine (on the GPU machine)"]
    assert "no build script" in build and "Left out" in build
    assert "polygraphy convert model.mixprec.onnx --convert-to trt --strongly-typed -o model.plan" in build
    assert "bash build-trt" not in build
    assert "Input shapes: `x,y=1x16`." in readme
    assert r"Run \*\*bold\*\* \<img src=x> under_score a_b." in readme  # prose: escaped where Markdown reads it


@pytest.mark.parametrize("text", ["input_dim_0", "sample:minilm", "input_ids=1x63", "_under_", MD_NAME, HTML_NAME,
                                  "# heading", "- item", "1. item", "---", "a\\*b", "__init__", "&amp; AT&T",
                                  "x`y``z", "www.example.com a@b.co http://x.y :smile: :red[x]",
                                  "two\nlines", "tab\there"])
def test_markdown_text_renders_as_the_text(text):
    """``md_text`` and ``code_span`` render, through a CommonMark parser, as one paragraph of the text itself
    (control characters shown as their escapes); names of plain characters need no escape at all."""
    markdown_it = pytest.importorskip("markdown_it")
    from core.display.markdown import visible_controls

    parser = markdown_it.MarkdownIt("commonmark").enable("strikethrough")
    want = visible_controls(text)
    for src in (md_text(text), code_span(text)):
        tokens = parser.parse(src)
        assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], src
        kids = tokens[1].children
        assert {k.type for k in kids} <= {"text", "code_inline"}, (src, [k.type for k in kids])
        assert "".join(k.content for k in kids) == want, src
    assert renders_literally(text) == (text in ("input_dim_0", "sample:minilm", "input_ids=1x63"))
    for special in (":smile:", ":red[", "://", "www.", "@b"):  # autolinks, emoji and colour directives broken
        if special in text:
            assert not re.search(r"(?<!\\)" + re.escape(special), md_text(text)), special


def test_a_code_span_keeps_spaces_and_backticks():
    assert code_span(" padded ") == "`  padded  `" and code_span("a`b") == "``a`b``" and code_span("`x") == "`` `x ``"


def test_a_model_name_cannot_write_code_into_the_postprocess_script(tmp_path):
    """The Polygraphy post-process script names the model in its docstring: a file name with '\"\"\"' and a
    line break stays inside it (the script parses to its docstring, then imports), never a statement."""
    import ast

    from core.backends.tensorrt.legacy import legacy_postprocess_script

    hostile = 'm"""\nimport os; os.system("echo pwned")\n"""'
    p = open_project(str(odd_names_model(tmp_path / f"{hostile}.onnx")), ws=Workspace(tmp_path / "ws"))
    pol = p.default_policy()
    assert pol.model_name == hostile
    tree = ast.parse(legacy_postprocess_script(pol, None))
    doc = ast.get_docstring(tree)
    assert hostile in doc and "pwned" not in ast.unparse(tree.body[1:])
