"""Issue 11, section 4, "Static checks": every attribute, method and enum member that core uses on
TensorRT objects, found by an AST scan of the code (``trt_scan``: it infers which values are TensorRT
objects, so no list of names is trusted), checked against the version table of
docs/tensorrt-api-check.md (10.0 ... 11.1): a use the table does not cover fails, and so does a use
of an API deprecated in 10.12 or removed in 11 outside the legacy-only (<= 10.11) code."""
from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

import core.backends.tensorrt as tb
from core.backends.tensorrt import api, legacy
from core.quant.policy import Policy
from tests.fixtures import ROOT
from tests.fixtures.trt_scan import scan_source

REPO = ROOT
DOC = (REPO / "docs" / "tensorrt-api-check.md").read_text()
PACKAGE = sorted(p.resolve() for p in Path(tb.__file__).parent.glob("*.py"))  # the backend's modules, read as one
SOURCE = "\n".join(p.read_text() for p in PACKAGE)
# Polygraphy's calling conventions for the post-process scripts (polygraphy/tools/args/backend/trt/
# loader.py: "postprocess ... a named argument `network` of type `trt.INetworkDefinition`"; config.py:
# postprocess_config "should take a builder, network, and config")
SCRIPT_SEEDS = {"postprocess": {"network": "INetworkDefinition"},
                "postprocess_config": {"builder": "Builder", "network": "INetworkDefinition",
                                       "config": "IBuilderConfig"}}
NAME = re.compile(r"^(?:trt\.)?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")


def version_table(doc: str) -> tuple[list[tuple[int, int]], dict[str, list[str]]]:
    """The TensorRT table of the doc: its version columns, and ``{name: [status per version]}`` with
    status ``ok``, ``dep`` or ``removed`` ("✓", "dep", "—" cells)."""
    lines = doc[doc.index("## TensorRT\n"):].splitlines()
    header = next(l for l in lines if l.startswith("| Attribute"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    cols = [i for i, c in enumerate(cells) if re.fullmatch(r"\d+\.\d+", c)]
    versions = [tuple(int(x) for x in cells[i].split(".")) for i in cols]
    table = {}
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip("|").split("|")]
        status = ["ok" if row[i].startswith("✓") else "dep" if row[i].startswith("dep")
                  else "removed" if row[i].startswith("—") else f"unreadable {row[i]!r}" for i in cols]
        for name in re.findall(r"`([^`]+)`", row[0]):
            if NAME.match(name):
                table[name] = status
    return versions, table


VERSIONS, TABLE = version_table(DOC)


def script_source() -> str:
    policy = Policy("m", "0" * 64, "fp32", {"conv": "int8"})
    return tb.legacy_postprocess_script(policy, types.SimpleNamespace(ranges={"x": (-1.0, 1.0)}, amax=lambda t: 1.0))


def scan(source: str = SOURCE, script: str | None = None) -> dict[str, set[tuple[str, int]]]:
    """The uses in the backend module and in the post-process script it exports."""
    uses = {k: set(v) for k, v in scan_source(source, TABLE).uses.items()}
    for k, v in scan_source(script or script_source(), TABLE, SCRIPT_SEEDS, where="POSTPROCESS_SCRIPT:").uses.items():
        uses.setdefault(k, set()).update(v)
    return uses


def problems(uses: dict, legacy_only=legacy.LEGACY_ONLY, removed_from=tb.LEGACY_REMOVED_IN) -> list[str]:
    """What the version table does not allow in ``uses``."""
    out = []
    for use, spots in sorted(uses.items()):
        where = sorted({w for w, _ in spots})
        if use.startswith("?"):
            out.append(f"{use}: the scan cannot type the value this attribute is read on ({where}); "
                       f"give its TensorRT use a result type in trt_scan.RESULT")
            continue
        if use not in TABLE:
            out.append(f"{use} (used in {where}) has no row in docs/tensorrt-api-check.md")
            continue
        status = dict(zip(VERSIONS, TABLE[use]))
        bad = [f"{v[0]}.{v[1]}: {s}" for v, s in status.items() if s not in ("ok", "dep", "removed")]
        out += [f"{use}: {b}" for b in bad]
        outside = [w for w in where if not any(w == f or w.startswith(f + ".") or w.startswith(f + ":")
                                               for f in legacy_only)]
        if outside and any(s != "ok" for s in status.values()):
            out.append(f"{use} is deprecated or removed in some TensorRT version but used outside the "
                       f"legacy-only code: {outside}")
        early = [v for v, s in status.items() if s == "removed" and v < removed_from]
        if early:
            out.append(f"{use} is missing in TensorRT {early}, where mixprec still runs it")
    return out


USES = scan()


BACKEND = set(PACKAGE)


def _tensorrt_modules() -> list[Path]:
    """The core modules that import tensorrt or get it from the backend's ``import_tensorrt()``."""
    pattern = re.compile(r"^\s*(import tensorrt|from tensorrt)|\bimport_tensorrt\(\)", re.M)
    return sorted(p.resolve() for p in (REPO / "core").rglob("*.py") if pattern.search(p.read_text()))


def test_every_other_core_module_using_tensorrt_is_scanned_too():
    """A module besides the backend that uses TensorRT gets the same scan, and no legacy-only exemption."""
    assert BACKEND & set(_tensorrt_modules())
    for path in _tensorrt_modules():
        if path not in BACKEND:
            found = problems(scan_source(path.read_text(), TABLE).uses, legacy_only=())
            assert not found, f"{path.relative_to(REPO)}:\n" + "\n".join(found)


def test_every_tensorrt_use_in_the_code_is_allowed_by_the_version_table():
    assert not problems(USES), "\n".join(problems(USES))


def test_the_uses_found_are_exactly_the_declared_ones():
    found = set(USES)
    assert found == set(api.TENSORRT_API), (f"used but not in TENSORRT_API: {sorted(found - set(api.TENSORRT_API))}; "
                                           f"listed but not used: {sorted(set(api.TENSORRT_API) - found)}")


def test_the_scan_reaches_the_uses_named_in_the_issue():
    """The examples of issue 11 (.dynamic_range, .metadata, .precision, set_flag, enum members), found
    where they are, through the parameters, containers and Polygraphy callbacks they flow through."""
    where = {u: {w for w, _ in s} for u, s in USES.items()}
    assert "_apply_types_and_ranges" in where["ITensor.dynamic_range"]  # a PostprocessNetwork callback
    assert "POSTPROCESS_SCRIPT:postprocess" in where["ITensor.dynamic_range"]
    assert "policy_nodes" in where["ILayer.metadata"]
    assert where["ILayer.precision"] == {"POSTPROCESS_SCRIPT:postprocess"}
    assert where["IBuilderConfig.set_flag"] == {"POSTPROCESS_SCRIPT:postprocess_config"}
    assert "_source_amax" in where["IConstantLayer.weights"]  # after layer.__class__ = trt.IConstantLayer
    assert "legacy_constraints" in where["trt.LayerType.CONVOLUTION"]  # getattr over INT8_COMPUTE
    assert where["IExecutionContext.execute_async_v3"] == {"BoundEngine.enqueue"}  # via TrtRunner.context
    assert "TensorRTBackend.profile" in where["IExecutionContext.profiler"]
    assert where["IProfiler.report_layer_time"] == {"_layer_profiler._Profiler"}  # an override


def _insert(source: str, after: str, code: str) -> str:
    assert source.count(after) == 1, after
    return source.replace(after, after + code)


@pytest.mark.parametrize("after, code, expected", [
    # a new attribute on a layer reached through network.get_layer in a list comprehension
    ("    nodes = [n if n in known else None for n in (layer_node(l.name, l.metadata) for l in layers)]\n",
     "    layers[0].reset_precision()\n", "ILayer.reset_precision (used in ['policy_nodes']) has no row"),
    # through a helper the module calls with a tensor (arguments flow into parameters)
    ("def _apply_types_and_ranges(network, outputs: dict, ranges: dict):\n",
     "    _peek(network.get_input(0))\n", "ITensor.allowed_formats (used in ['_peek']) has no row"),
    # an enum member the table lacks
    ("    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]\n",
     "    _ = trt.TensorFormat.CHW16\n", "trt.TensorFormat.CHW16 (used in ['bind_engine']) has no row"),
    # a 10.12-deprecated API on the strongly typed path
    ("    nodes = [n if n in known else None for n in (layer_node(l.name, l.metadata) for l in layers)]\n",
     "    _ = layers[0].precision\n", "ILayer.precision is deprecated or removed in some TensorRT version but used "
                                   "outside the legacy-only code: ['policy_nodes']"),
    # a method of a context reached through TrtRunner.context and BoundEngine
    ("    def enqueue(self, stream_ptr: int) -> None:\n",
     "        self.context.execute_v2([])\n", "IExecutionContext.execute_v2 (used in ['BoundEngine.enqueue']) has no row"),
    # an attribute on a value the scan cannot type
    ("    def enqueue(self, stream_ptr: int) -> None:\n",
     "        self.context.get_tensor_shape('x').nbDims\n", "?IExecutionContext.get_tensor_shape.nbDims: the scan cannot type"),
])
def test_a_use_the_table_does_not_allow_fails_the_check(after, code, expected):
    source = _insert(SOURCE, after, code)
    if "_peek" in code:
        source += "\n\ndef _peek(t):\n    return t.allowed_formats\n"
    found = problems(scan(source))
    assert any(expected in p for p in found), found


def test_the_exported_script_is_scanned_with_the_same_rules():
    """A new use in the post-process script is refused until documented; its deprecated uses pass only
    because the whole script is legacy-only (it is the <= 10.11 export)."""
    script = _insert(script_source(), "        config.set_flag(trt.BuilderFlag.INT8)\n",
                     "    config.set_flag(trt.BuilderFlag.FP16)\n")
    uses = scan(script=script)
    assert {w for w, _ in uses["trt.BuilderFlag.FP16"]} == {"POSTPROCESS_SCRIPT:postprocess_config"}
    assert any(p.startswith("trt.BuilderFlag.FP16 (used in") and "has no row" in p for p in problems(uses))
    strict = problems(scan(), legacy_only=())
    assert any(p.startswith("ITensor.dynamic_range is deprecated") and "POSTPROCESS_SCRIPT:postprocess" in p
               for p in strict)
    assert not any(p.startswith("trt.float32") for p in strict)  # what exists everywhere stays allowed


def test_the_version_table_reads_as_documented():
    assert VERSIONS == [(10, 0), (10, 8), (10, 11), (10, 12), (10, 16), (11, 0), (11, 1)]
    assert TABLE["ILayer.precision"] == ["ok", "ok", "ok", "dep", "dep", "removed", "removed"]
    assert TABLE["ITensor.dynamic_range"][0] == "dep" and TABLE["trt.TensorIOMode.INPUT"] == ["ok"] * 7
    assert all(s in ("ok", "dep", "removed") for row in TABLE.values() for s in row)


def test_every_listed_name_is_documented():
    missing = [a for a in (*api.TENSORRT_API, *api.TENSORRT_VIA_POLYGRAPHY) if f"`{a}`" not in DOC]
    assert not missing, f"not in docs/tensorrt-api-check.md: {missing}"
    missing = [q for q in api.POLYGRAPHY_CALLS if f"`{q}`" not in DOC]
    assert not missing, f"Polygraphy calls not in docs/tensorrt-api-check.md: {missing}"
    assert set(legacy.LEGACY_ONLY) - {"POSTPROCESS_SCRIPT"} <= {n for n in dir(legacy) if callable(getattr(legacy, n))}


def test_a_module_that_gets_tensorrt_from_the_backend_is_checked():
    snippet = ("from core.backends.tensorrt.versions import import_tensorrt\n\n\ndef flags(config):\n"
               "    trt = import_tensorrt()\n"
               "    config_flag = trt.BuilderFlag.FP16\n    return trt.float16, config_flag\n")
    found = problems(scan_source(snippet, TABLE).uses, legacy_only=())
    assert any(p.startswith("trt.BuilderFlag.FP16 (used in ['flags']) has no row") for p in found), found
    assert not any(p.startswith("trt.float16") for p in found)
