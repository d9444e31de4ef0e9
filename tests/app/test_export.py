"""Streamlit AppTest of the Export page (views/export.py): downloads, compile, policy import, the estimate in
the bundle."""
from __future__ import annotations

import json

from core.estimate.predict import predict
from core.export import ESTIMATE_NAME, README_NAME, export_bundle
from core.project import open_project
from tests.fixtures.apptest import LAYER, MODEL, ok, page


def test_export_and_import(ws):
    at = ok(page("export"))
    assert [b.proto.label for b in at.get("download_button")][0] == "Policy JSON"
    assert len(at.get("download_button")) == 3 and len(at.code) == 6  # 3 commands folded, each whole in an expander
    at.button(key="compile").click().run()
    ok(at)
    assert len(at.get("download_button")) > 3 and not [b for b in at.button if b.key == "compile"]
    from core.project import open_project

    other = open_project("sample:tiny-transformer", ws=ws).default_policy().to_json()
    at.text_area(key="policy_text").input(other)
    at.button(key="import").click().run()
    assert at.error and "does not fit the model" in at.error[0].value and "unknown layer" in at.error[0].value
    mine = json.loads(open_project("sample:tiny-cnn", ws=ws).default_policy().to_json())
    mine["layers"][LAYER] = "fp32"
    at.text_area(key="policy_text").input(json.dumps(mine))
    at.button(key="import").click().run()
    ok(at)
    fp32 = list(mine["layers"].values()).count("fp32")  # the imported policy is the one shown (and exported)
    assert at.success and f"fp32 {fp32} · " in at.caption[1].value and at.selectbox(key="export_run").value == "session"


def test_export_bundle_labels_the_estimate(ws):
    p = open_project(MODEL, ws=ws)
    pol = p.default_policy()
    r = predict(p.model, pol, p.input_shapes, "h100")
    b = export_bundle(p, pol, estimate=r)
    doc = json.loads(b.files[ESTIMATE_NAME])
    assert doc["label"] == "estimate" and doc["gpu"]["key"] == "h100" and doc["basis"] == "fit on the fixture engines (A100 ResNet-18, TITAN RTX MobileNetV2)"
    assert abs(doc["total_ms"] - r.total_ms) < 1e-12
    readme = b.files[README_NAME].decode()
    assert "an estimate, not measured" in readme and "NVIDIA H100" in readme and "basis" in readme
    assert ESTIMATE_NAME not in export_bundle(p, pol).files
