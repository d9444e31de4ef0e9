"""The estimate child process (core.estimate.service): same answer as in-process, errors as
MixprecError, and a dead child restarted."""
from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest

from core.errors import MixprecError
from core.estimate.cost import FITTED
from core.estimate.predict import predict
from core.estimate.service import EstimateService, model_source
from core.project import open_project


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    from core.workspace import Workspace

    ws = Workspace(tmp_path_factory.mktemp("ws"))
    return open_project("sample:tiny-cnn", ws=ws)


@pytest.fixture()
def service(cnn):
    s = EstimateService(cnn.ws.root)
    yield s
    s.close()


def test_child_answers_like_the_in_process_predictor(cnn, service):
    pol = cnn.default_policy()
    got = service.submit(cnn.model, pol, cnn.input_shapes, "a100", FITTED).result(timeout=300)
    want = predict(cnn.model, pol, cnn.input_shapes, "a100", FITTED)
    assert got.total_ms == pytest.approx(want.total_ms, rel=1e-12)
    assert got.reformat_count == want.reformat_count
    assert list(got.layers.engine_layer) == list(want.layers.engine_layer)
    fp32 = pol.with_layers({l.name: "fp32" for l in cnn.layers})
    slower = service.submit(cnn.model, fp32, cnn.input_shapes, "a100", FITTED).result(timeout=300)
    assert slower.total_ms != got.total_ms  # a second request on the loaded model answers its own policy
    assert service._proc is not None and os.getpid() != service._proc.pid


def test_errors_come_back_as_mixprec_errors(cnn, service):
    with pytest.raises(MixprecError, match="GPU|gpu"):
        service.submit(cnn.model, cnn.default_policy(), cnn.input_shapes, "no-such-gpu", FITTED).result(timeout=300)
    moved = replace(cnn.model, sha256="0" * 64)  # the file on disk is not the model the page loaded
    with pytest.raises(MixprecError, match="changed on disk"):
        service.submit(moved, cnn.default_policy(), cnn.input_shapes, "a100", FITTED).result(timeout=300)
    # the child survives errors
    assert service.submit(cnn.model, cnn.default_policy(), cnn.input_shapes, "t4", FITTED).result(timeout=300).gpu == "t4"


def test_a_killed_child_is_restarted(cnn, service):
    pol = cnn.default_policy()
    first = service.submit(cnn.model, pol, cnn.input_shapes, "a100", FITTED).result(timeout=300)
    pid = service._proc.pid
    os.kill(pid, signal.SIGKILL)
    service._proc.wait()
    again = service.submit(cnn.model, pol, cnn.input_shapes, "a100", FITTED).result(timeout=300)
    assert again.total_ms == first.total_ms and service._proc.pid != pid


def test_model_source_is_what_load_model_reads(cnn):
    assert model_source(cnn.model) == ("sample:tiny-cnn", ())
    assert model_source(replace(cnn.model, sample=None)) == (str(cnn.model.path), ())
    assert model_source(replace(cnn.model, branches={"use_cache_branch": False}))[1] == (("use_cache_branch", False),)
