"""The layer-wise ranking on the TensorRT engine itself (TrtRunner), on a GPU box with TensorRT: the same table
as on ONNX Runtime within the drift of fewer fusions (the rest of the ranking through Polygraphy is tested
in tests/unit/sensitivity/test_ranking_polygraphy.py)."""
from __future__ import annotations

import numpy as np
import pytest
from polygraphy.comparator import Comparator

import core.sensitivity.runners as runners
from core.backends import tensorrt_available
from core.sensitivity import RANK_COLUMNS, rank_layers
from tests.fixtures.ranking import ComparatorSpy
from tests.fixtures.trt import trt_version

# --- on TensorRT (a GPU): the candidate's engine itself

TRT_VERSION = trt_version()


@pytest.mark.tensorrt
@pytest.mark.skipif(TRT_VERSION is None, reason="TensorRT not installed")
@pytest.mark.parametrize("max_memory", [None, "400K"])
def test_ranking_on_the_tensorrt_engine(tiny_cnn, monkeypatch, max_memory):
    usable, why = tensorrt_available()
    if not usable:
        pytest.skip(why)
    if runners.resolve_runner("auto") != "tensorrt":
        pytest.skip(f"TensorRT {TRT_VERSION} builds no strongly typed networks")
    spy = ComparatorSpy()
    monkeypatch.setattr(Comparator, "run", spy)
    trt = rank_layers(tiny_cnn, max_samples=4, max_memory=max_memory, runner="tensorrt")
    assert trt.runner == "tensorrt" and spy.calls == trt.chunks
    assert any(type(r).__name__ == "TrtRunner" for r in spy.runner_types)
    ort_ = rank_layers(tiny_cnn, max_samples=4, runner="onnxruntime")
    a, b = trt.table.set_index("name"), ort_.table.set_index("name")
    assert set(a.index) == set(b.index) and list(trt.table.columns) == RANK_COLUMNS
    # the same Q/DQ model on another runtime, with fewer fusions: the same drift to a few 1e-3
    assert np.allclose(a.cosine, b.cosine.loc[a.index], atol=5e-3)
