"""Why the issue expected "about 0.83 -> 0.985": quantizing the *outputs* of INT8 layers too
(implicit INT8, trtexec --layerOutputTypes=int8) against mixprec's placement (outputs stay float),
on MiniLM's 64 held-out sentences.

    .venv/bin/python bench/bench_int8_outputs.py

Prints held-out cosine_mean of the default policy, with the six FFN down-projections in FP16 and
with the six FFN up-projections in FP16, under both placements."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

from core.measure.metrics import quality  # noqa: E402
from core.project import open_project  # noqa: E402
from core.quant.calibration import calibrate  # noqa: E402
from core.quant.compile import compile_policy  # noqa: E402


def main():
    p = open_project("sample:minilm", target="onnxruntime")
    base = p.default_policy()
    calib = calibrate(p.model, p.calib_data, base.calibration, p.ws)
    feeds = p.eval_data.batches(1)
    name = p.model.proto.graph.output[0].name

    def outputs(proto):
        s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return [s.run([name], f)[0] for f in feeds]

    ref = outputs(p.model.proto)
    policies = {
        "default": base,
        "default + 6 FFN-down FP16": base.with_layers({f"/encoder/layer.{i}/output/dense/MatMul": "fp16" for i in range(6)}),
        "default + 6 FFN-up FP16": base.with_layers({f"/encoder/layer.{i}/intermediate/dense/MatMul": "fp16"
                                                     for i in range(6)}),
    }
    print("| policy | outputs float (mixprec) | outputs INT8 too (implicit INT8) |\n|---|---|---|")
    for label, pol in policies.items():
        cos = [quality(ref, outputs(compile_policy(p.model, pol, calib, int8_outputs=o).proto), name, None).cosine_mean
               for o in (False, True)]
        print(f"| {label} | {cos[0]:.4f} | {cos[1]:.4f} |")


if __name__ == "__main__":
    main()
