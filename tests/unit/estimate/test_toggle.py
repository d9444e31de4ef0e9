"""The estimate child's loop (core.estimate.service.serve) run in this process: answers in order,
no garbage collection while an estimate is computed, collection back on after each reply, the
loaded model frozen out of later collections."""
from __future__ import annotations

import gc
import io

from core.estimate.cost import FITTED
from core.estimate.predict import predict
from core.estimate.service import _recv, _send, model_source, serve


def test_serve_answers_with_collection_off_while_computing(tiny_cnn, monkeypatch):
    import core.estimate.service as service

    seen, real = [], service.predict

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(service, "predict", spy)
    pol = tiny_cnn.default_policy()
    fp32 = pol.with_layers({l.name: "fp32" for l in tiny_cnn.layers})
    inp = io.BytesIO()
    for p in (pol, fp32):
        _send(inp, (model_source(tiny_cnn.model), tiny_cnn.model.sha256, p, tiny_cnn.input_shapes, "a100", FITTED))
    inp.seek(0)
    out = io.BytesIO()
    assert gc.isenabled()
    try:
        serve(str(tiny_cnn.ws.root), inp, out)
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()
    out.seek(0)
    replies = [_recv(out), _recv(out)]
    assert seen == [False, False] and gc.isenabled()
    assert frozen > 0  # the loaded model is out of later collections
    want = [predict(tiny_cnn.model, p, tiny_cnn.input_shapes, "a100", FITTED) for p in (pol, fp32)]
    assert [ok for ok, _ in replies] == [True, True]
    assert [r.total_ms for _, r in replies] == [w.total_ms for w in want]
