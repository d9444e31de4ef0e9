"""Fixtures of the tests in tests/unit/estimate/: ``resnet18_b32``."""
from __future__ import annotations

import pytest

from tests.fixtures.models import loaded_onnx


@pytest.fixture(scope="session")
def resnet18_b32(tmp_path_factory):
    """ResNet-18 (tests.fixtures.nets, torchvision's layout) at batch 32 x 3 x 224 x 224, with its inventory."""
    from tests.fixtures.nets import resnet18_onnx

    return loaded_onnx(tmp_path_factory, resnet18_onnx(batch=32), "resnet18", {"input": (32, 3, 224, 224)})
