"""Issue 23 (Markdown escapes): the shape editor's widget labels are the input and dimension names as they
are, never escaped for Markdown (a label is the input's accessible name: ``input\\_dim\\_2`` was read out
with its backslashes). A name Markdown would read (``*x*_[1]``) keeps its exact accessible name too: the
widget's own label is collapsed and the name is drawn above it, escaped."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures.apptest import ok, page, shown

ODD = "*x*_[1]"


def two_input_cnn(path: Path) -> Path:
    """``pixel_values [batch_size, 3, input_dim_2, input_dim_3]`` and ``*x*_[1] [batch_size, 3, ?, ?]``, each
    pooled, added, then a MatMul head: dynamic dims named as exporters name them, and unnamed ones."""
    fw = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), "fw")
    nodes = [helper.make_node("GlobalAveragePool", ["pixel_values"], ["g1"], name="gap1"),
             helper.make_node("GlobalAveragePool", [ODD], ["g2"], name="gap2"),
             helper.make_node("Add", ["g1", "g2"], ["s"], name="add"),
             helper.make_node("Flatten", ["s"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fw"], ["logits"], name="head")]
    inputs = [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch_size", 3, "input_dim_2", "input_dim_3"]),
              helper.make_tensor_value_info(ODD, TensorProto.FLOAT, ["batch_size", 3, None, None])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                                                 ["batch_size", 4])], [fw])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _widgets(at):
    return [*at.number_input, *at.text_input, *at.checkbox]


def test_shape_editor_labels_carry_no_markdown_escapes(ws, tmp_path):
    at = ok(page("model", model=str(two_input_cnn(tmp_path / "two.onnx"))))
    labels = [w.label for w in _widgets(at) if w.key and w.key.startswith(("shape:", "profile:", "nobatch:"))]
    assert labels and not [label for label in labels if "\\" in label], labels
    assert {"pixel_values · axis 2 · input_dim_2", "pixel_values · axis 3 · input_dim_3",
            "pixel_values · min shape (optional)", "pixel_values · max shape (optional)",
            f"{ODD} · axis 2 · unnamed", f"{ODD} · max shape (optional)"} <= set(labels)
    plain = [w for w in at.number_input if w.label.startswith("pixel_values")]
    odd = [w for w in at.number_input if w.label.startswith(ODD)]
    assert plain and odd
    visibility = {w.label: w.proto.label_visibility.value for w in [*plain, *odd]}
    assert all(visibility[w.label] == 0 for w in plain)  # VISIBLE: the name is its own label
    assert all(visibility[w.label] != 0 for w in odd)  # COLLAPSED: still its accessible name, drawn above it
    drawn = [shown(m) for m in at.markdown]
    assert f"{ODD} · axis 2 · unnamed" in drawn  # literal on screen
    assert r"\*x\*\_\[1\] · axis 2 · unnamed" in [m.value for m in at.markdown]  # escaped where it is Markdown
