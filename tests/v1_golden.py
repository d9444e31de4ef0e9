"""Golden record of how policy-format-1 documents compiled before the INT8 placement (issue 11 §1).

:func:`record` was run on the format-1 code (commit a964255, with ``tests/fixtures/nets.py`` copied in) and wrote
``tests/data/policy_v1_compiled.json``: for each case, the v1 policy document and a node-by-node
signature of its compiled ONNX (both targets). ``tests/test_policy.py`` loads each v1 document through
the migration and checks that today's compiler produces the same signature, i.e. that a v1 policy
keeps its compiled model. Calibration ranges are synthetic (a digest of the tensor name), so the
record depends on nothing but the model bytes and the policy. To record again (only if a model's
bytes change), on the format-1 code::

    git archive a964255 core | tar -x -C /tmp/v1 && cp tests/fixtures/nets.py /tmp/v1/core/
    cd /tmp && PYTHONPATH=/tmp/v1 python -c "import sys; sys.path.insert(0, '/path/to/repo/tests'); \
        import v1_golden; v1_golden.record()"
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from onnx import numpy_helper

GOLDEN = Path(__file__).with_name("data") / "policy_v1_compiled.json"
TARGETS = ("trt", "ort")


def synthetic_calib(model):
    """A CalibrationResult with a deterministic range for every float tensor of the model."""
    from core.quant.calibration import CalibrationResult
    from core.quant.policy import CalibrationSettings

    names = {vi.name for vi in [*model.proto.graph.input, *model.proto.graph.value_info, *model.proto.graph.output]}
    names |= {o for n in model.proto.graph.node for o in n.output}
    ranges = {}
    for name in sorted(names):
        amax = 0.5 + int(hashlib.sha256(name.encode()).hexdigest()[:6], 16) / 0xFFFFFF * 8.0
        ranges[name] = (-amax, amax)
    return CalibrationResult(ranges, CalibrationSettings(), "synthetic", False, 0.0, Path("/nonexistent"))


def signature(proto) -> list:
    """The compiled graph node by node (op, name, inputs, outputs, attributes) and every
    initializer's digest, in graph order."""
    nodes = [[n.op_type, n.domain, n.name, list(n.input), list(n.output),
              hashlib.sha256(b"".join(a.SerializeToString() for a in n.attribute)).hexdigest()[:12]]
             for n in proto.graph.node]
    inits = sorted((t.name, t.data_type, list(t.dims), hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()[:16])
                   for t in proto.graph.initializer)
    io = [[v.name, v.type.tensor_type.elem_type] for v in [*proto.graph.input, *proto.graph.output]]
    return [nodes, [list(i) for i in inits], io]


def case_models():
    """(case name, model bytes) for every golden case."""
    from tests.fixtures.nets import branchy_onnx, resnet18_onnx
    from core.model.samples import materialize_sample
    from core.workspace import Workspace
    import tempfile

    ws = Workspace(Path(tempfile.mkdtemp(prefix="mixprec-golden-")))
    out = {"branchy": branchy_onnx(), "resnet18-b2": resnet18_onnx(batch=2)}
    for s in ("tiny-cnn", "tiny-transformer"):
        out[s] = materialize_sample(s, ws).model.read_bytes()
    return out


def load(name: str, data: bytes, tmp: Path):
    from core.model.load import model_from_bytes

    path = tmp / f"{name}.onnx"
    path.write_bytes(data)
    return model_from_bytes(data, path, name=name)


def record() -> None:
    import tempfile

    from core.quant.compile import compile_policy
    from core.model.inventory import build_inventory
    from core.quant.policy import default_policy, uniform_policy

    tmp = Path(tempfile.mkdtemp(prefix="mixprec-golden-"))
    cases = {}
    for name, data in case_models().items():
        model = load(name, data, tmp)
        layers = build_inventory(model)
        calib = synthetic_calib(model)
        policies = {"default": default_policy(model, layers), "default-fp16": default_policy(model, layers, "fp16"),
                    "fp16": uniform_policy(model, layers, "fp16")}
        for pname, pol in policies.items():
            doc = pol.to_dict()
            assert doc["version"] == 1, "record on the format-1 code (see the module docstring)"
            cases[f"{name}/{pname}"] = {"model": name, "doc": doc, "compiled": {
                t: signature(compile_policy(model, pol, calib if "int8" in pol.layers.values() else None, t).proto)
                for t in TARGETS}}
    GOLDEN.write_text(json.dumps(cases, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(cases)} cases)")

