"""Any GPU (issue 19 §4): a GPU spec (the fields of a GPU table row) validated field by field,
``--gpu-spec`` on ``estimate`` and ``search``, GPUs saved in the workspace, a spec'd GPU through the
search config, the search job's params and the estimate service, and product names as nvidia-smi
prints them resolved to their rows — or refused, never a silent near miss."""
from __future__ import annotations

import json
import math
import pickle

import pytest

from core.cli.commands import main as cli_main
from core.errors import MixprecError
from core.estimate import cost, gpus
from core.estimate.gpus import GPU, GPUS, check_spec, custom_gpu, gpu, load_gpu_spec
from core.store.results import (delete_gpu_spec, gpu_calibration_path, load_gpu_calibration, read_gpu_specs, resolve_gpu,
                                save_gpu_calibration, save_gpu_spec)
from core.workspace import Workspace, take_notes

A6000 = {"key": "rtx-a6000", "name": "NVIDIA RTX A6000", "arch": "ampere", "sm_count": 84, "fp32_tflops": 38.7,
         "tf32_tflops": 77.4, "fp16_tflops": 154.8, "fp16_acc16_tflops": 154.8, "int8_tops": 309.7,
         "bandwidth_gbs": 768.0, "memory_gb": 48.0}


def spec(**changes) -> dict:
    doc = {**A6000, **changes}
    return {k: v for k, v in doc.items() if v is not ...}


# ------------------------------------------------------------------------------ the spec and its checks

def test_round_trip_of_every_table_row_and_of_a_spec():
    for g in GPUS.values():
        assert GPU.from_json(json.loads(json.dumps(g.to_json()))) == g
    g = GPU.from_json(spec())
    assert g.key == "rtx-a6000" and g.sm_count == 84 and isinstance(g.sm_count, int) and g.has_tf32
    again = GPU.from_json(json.loads(json.dumps(g.to_json())))
    assert again == g and pickle.loads(pickle.dumps(g)) == g
    assert GPU.from_json(spec(arch="Ampere", memory_gb=...)).arch == "ampere"  # case, optional memory
    clocked = GPU.from_json(spec(base_clock_mhz=1410, boost_clock_mhz=1800))
    assert (clocked.base_clock_mhz, clocked.boost_clock_mhz) == (1410.0, 1800.0)
    assert GPU.from_json(json.loads(json.dumps(clocked.to_json()))) == clocked
    from core.estimate.cost import clocks
    assert clocks(clocked) == (1410.0, 1800.0)  # the cost model's sustained-clock term reads a spec's clocks
    turing = GPU.from_json(spec(key="t-1", arch="turing", tf32_tflops=None))
    assert not turing.has_tf32 and turing.peak_tflops("tf32") == turing.fp32_tflops


@pytest.mark.parametrize("changes, field, words", [
    ({"key": ...}, "key", "missing"),
    ({"fp16_acc16_tflops": ...}, "fp16_acc16_tflops", "missing"),
    ({"bandwidth_gbs": -5}, "bandwidth_gbs", "not positive"),
    ({"int8_tops": 0}, "int8_tops", "not positive"),
    ({"fp32_tflops": math.inf}, "fp32_tflops", "not a finite number"),
    ({"fp32_tflops": math.nan}, "fp32_tflops", "not a finite number"),
    ({"fp32_tflops": "38.7"}, "fp32_tflops", "not a number"),
    ({"fp32_tflops": True}, "fp32_tflops", "not a number"),
    ({"int8_tops": 3.1e14}, "int8_tops", "more than any GPU"),
    ({"arch": "kepler"}, "arch", "not a known architecture"),
    ({"arch": "turing"}, "tf32_tflops", "no TF32 tensor cores"),
    ({"arch": "volta", "tf32_tflops": 10.0}, "tf32_tflops", "no TF32 tensor cores"),
    ({"tf32_tflops": None}, "tf32_tflops", "missing: ampere GPUs have TF32"),
    ({"key": "My GPU"}, "key", "not a safe key"),
    ({"key": "../a100"}, "key", "not a safe key"),
    ({"key": "-x"}, "key", "not a safe key"),
    ({"name": ""}, "name", "not a product name"),
    ({"name": None}, "name", "missing"),
    ({"name": "bad\nname"}, "name", "not a product name"),
    ({"sm_count": 84.5}, "sm_count", "not a whole number"),
    ({"sm_count": 0}, "sm_count", "not a whole number"),
    ({"fp16_acc16_tflops": 77.0}, "fp16_acc16_tflops", "below fp16_tflops"),
    ({"halved": ["int8"]}, "halved", "not a list of figure names"),
    ({"memory_gb": -1}, "memory_gb", "not a memory size"),
    ({"fp16": 154.8}, "fp16", "not a field"),
    ({"boost_clock_mhz": -1}, "boost_clock_mhz", "not a clock in MHz"),
    ({"base_clock_mhz": 1800, "boost_clock_mhz": 1410}, "base_clock_mhz", "above boost_clock_mhz"),
])
def test_each_problem_names_its_field_and_how_to_fix_it(changes, field, words):
    with pytest.raises(MixprecError) as e:
        check_spec(spec(**changes), "my spec")
    assert e.value.what.startswith(f"my spec: {field} ") and words in e.value.what, e.value.what
    assert e.value.fix  # every problem says how to fix it


def test_several_problems_are_all_listed_and_an_unknown_field_suggests_the_right_one():
    with pytest.raises(MixprecError) as e:
        check_spec({"key": "x", "arch": "kepler", "fp32_tflops": -1, "int8": 3})
    msg = str(e.value)
    for part in ("name is missing", "arch \"kepler\" is not a known architecture", "fp32_tflops is -1, not positive",
                 "int8 is not a field", "did you mean 'int8_tops'"):
        assert part in msg, msg
    with pytest.raises(MixprecError, match="is a JSON list, not an object"):
        check_spec([A6000])


def test_a_spec_may_not_pass_itself_off_as_a_table_row():
    with pytest.raises(MixprecError, match="key 'a100' is the GPU table's row for the NVIDIA A100 80GB SXM"):
        custom_gpu(spec(key="a100"))
    with pytest.raises(MixprecError, match="name 'NVIDIA T4' is the name of the GPU table's row t4"):
        custom_gpu(spec(name="NVIDIA T4"))
    assert custom_gpu(GPUS["t4"].to_json()) is GPUS["t4"]  # the row itself is fine


def test_load_gpu_spec_errors_for_a_missing_file_bad_json_and_bad_text(tmp_path):
    good = tmp_path / "a6000.json"
    good.write_text(json.dumps(A6000))
    assert load_gpu_spec(good) == GPU.from_json(A6000)
    with pytest.raises(MixprecError, match="does not exist"):
        load_gpu_spec(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"key": "x",')
    with pytest.raises(MixprecError, match=r"not valid JSON \(line 1"):
        load_gpu_spec(tmp_path / "bad.json")
    (tmp_path / "latin.json").write_bytes(b'{"name": "\xff"}')
    with pytest.raises(MixprecError, match="not UTF-8"):
        load_gpu_spec(tmp_path / "latin.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(MixprecError, match="empty"):
        load_gpu_spec(tmp_path / "empty.json")
    (tmp_path / "neg.json").write_text(json.dumps(spec(bandwidth_gbs=-1)))
    with pytest.raises(MixprecError, match="the GPU spec neg.json: bandwidth_gbs is -1, not positive"):
        load_gpu_spec(tmp_path / "neg.json")


# ------------------------------------------------------------------------------------------- the table

def test_new_rows_and_their_dense_figures():
    keys = {"v100", "v100-pcie", "a30", "l40", "h200", "rtx2060", "rtx2070", "rtx2080", "rtx2080ti", "rtx3060",
            "rtx3070", "rtx3080", "rtx4060", "rtx4070", "rtx4070ti", "rtx4080", "rtx3080-laptop", "rtx4090-laptop",
            "orin-nx-16gb", "orin-nx-8gb", "orin-nano-8gb", "orin-nano-4gb"}
    assert keys <= set(GPUS)
    assert GPUS["h200"].fp16_acc16_tflops == GPUS["h100"].fp16_acc16_tflops and GPUS["h200"].bandwidth_gbs == 4800
    assert GPUS["v100"].tf32_tflops is None and "int8_tops" in GPUS["v100"].derived  # Volta: DP4A, no INT8 tensor cores
    assert GPUS["l40"].int8_tops == 362.0 and GPUS["l40"].halved == ()
    for g in GPUS.values():
        assert set(g.halved) <= set(gpus.FIGURES) and set(g.derived) <= set(gpus.FIGURES)
        if g.name.startswith("NVIDIA GeForce"):  # FP32 accumulation at half rate, INT8 at twice FP16
            assert g.fp16_tflops == pytest.approx(g.fp16_acc16_tflops / 2, rel=0.01), g.key
            assert g.int8_tops == pytest.approx(2 * g.fp16_acc16_tflops, rel=0.01), g.key
        if g.arch in ("ampere", "ada", "hopper") and g.key.startswith("rtx"):
            assert g.tf32_tflops == pytest.approx(g.fp16_tflops / 2, rel=0.01), g.key


# dense FP16 tensor FLOP per SM per clock of the rows whose tensor peak NVIDIA publishes
_FP16_PER_SM_CLOCK = {"v100": 1024, "v100-pcie": 1024, "t4": 1024, "titanrtx": 1024, "rtx2080ti": 1024,
                      "a10": 1024, "rtx3090": 1024, "a30": 2048, "a100": 2048, "a100-40gb": 2048, "l4": 1024,
                      "l40": 512, "l40s": 1024, "rtx4090": 1024, "h100": 4096, "h100-pcie": 4096, "h200": 4096}
_HOPPER_TENSOR_MHZ = {"h100": 1830, "h100-pcie": 1620, "h200": 1830}


def test_every_row_has_its_base_and_boost_clocks_and_the_cost_model_reads_only_them():
    assert len(GPUS) == 40
    for g in GPUS.values():
        assert 0 < g.base_clock_mhz <= g.boost_clock_mhz <= 3000, g.key
        assert cost.clocks(g) == (g.base_clock_mhz, g.boost_clock_mhz), g.key
        assert GPU.from_json(json.loads(json.dumps(g.to_json()))) == g  # the clocks go through --gpu-spec
    # the two GPUs the transformer fit uses keep their clocks (nvidia-smi: default application / max clocks)
    assert cost.clocks(GPUS["t4"]) == (585.0, 1590.0) and cost.clocks(GPUS["a100-40gb"]) == (1095.0, 1410.0)
    # the boost clock is the clock the row's tensor peak holds at (SMs x rate x boost), within 1.5 %; Hopper's
    # tensor peaks hold at a lower clock than its maximum boost (1,830 / 1,620 MHz; docs/tensorrt.md, "Clocks")
    for key, per_sm in _FP16_PER_SM_CLOCK.items():
        g = GPUS[key]
        mhz = _HOPPER_TENSOR_MHZ.get(key, g.boost_clock_mhz)
        assert g.base_clock_mhz < mhz <= g.boost_clock_mhz, key
        assert g.sm_count * per_sm * mhz * 1e-6 == pytest.approx(g.fp16_acc16_tflops, rel=0.015), key
    # power-limited parts sustain far below boost: a 70 W T4 below an A100 with the shipped alpha
    alpha = cost.FITTED.clock_alpha
    assert 0 <= alpha < 1
    t4, a100, a100_40 = (cost.sustained_clock(GPUS[k], cost.FITTED) for k in ("t4", "a100", "a100-40gb"))
    assert t4 < a100_40 <= a100 <= 1.0
    assert t4 == pytest.approx((585 + alpha * (1590 - 585)) / 1590)
    # no table of clocks behind the rows: a GPU that gives none is priced at its boost clock (factor 1)
    assert not hasattr(cost, "_CLOCKS")
    bare = GPU.from_json({k: v for k, v in GPUS["t4"].to_json().items()
                          if k not in ("base_clock_mhz", "boost_clock_mhz")} | {"key": "my-t4", "name": "My T4"})
    assert (bare.base_clock_mhz, bare.boost_clock_mhz) == (0.0, 0.0)
    assert cost.clocks(bare) is None and cost.sustained_clock(bare, cost.FITTED) == 1.0


# nvidia-smi / TensorRT names -> the row they must resolve to
NAMES = {
    "Tesla V100-SXM2-16GB": "v100", "Tesla V100-SXM2-32GB": "v100", "Tesla V100-PCIE-32GB": "v100-pcie",
    "Tesla V100-PCIE-16GB": "v100-pcie", "NVIDIA A30": "a30", "NVIDIA L40": "l40", "NVIDIA L40S": "l40s",
    "NVIDIA L4": "l4", "NVIDIA A10": "a10", "NVIDIA A100-SXM4-80GB": "a100", "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb", "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200", "Tesla T4": "t4", "NVIDIA TITAN RTX": "titanrtx",
    "NVIDIA GeForce RTX 2060": "rtx2060", "NVIDIA GeForce RTX 2080 Ti": "rtx2080ti", "NVIDIA GeForce RTX 2080": "rtx2080",
    "NVIDIA GeForce RTX 3080": "rtx3080", "NVIDIA GeForce RTX 3080 Laptop GPU": "rtx3080-laptop",
    "NVIDIA GeForce RTX 3090": "rtx3090", "NVIDIA GeForce RTX 4070 Ti": "rtx4070ti", "NVIDIA GeForce RTX 4070": "rtx4070",
    "NVIDIA GeForce RTX 4090": "rtx4090", "NVIDIA GeForce RTX 4090 Laptop GPU": "rtx4090-laptop",
    "NVIDIA GeForce RTX 4060 Laptop GPU": "rtx4060-laptop", "NVIDIA Jetson Orin Nano Developer Kit": "orin-nano-8gb",
    "NVIDIA Jetson Orin Nano 4GB": "orin-nano-4gb", "NVIDIA Jetson Orin NX 16GB": "orin-nx-16gb",
    "NVIDIA Jetson AGX Orin 64GB": "orin", "NVIDIA Jetson Orin Nano Super Developer Kit": "orin-nano-8gb-super",
    "a100": "a100", "RTX4090": "rtx4090", "rtx 4070 ti": "rtx4070ti", "orin": "orin",
}
# names that must be refused, and a row the refusal names (None: no row is near)
REFUSED = {
    "NVIDIA GeForce RTX 4070 Ti SUPER": "rtx4070ti", "NVIDIA GeForce RTX 3080 Ti": "rtx3080",
    "NVIDIA GeForce RTX 3070 Ti Laptop GPU": "rtx3070-laptop", "NVIDIA GeForce RTX 4080 SUPER": "rtx4080",
    "NVIDIA GeForce RTX 3060 Laptop GPU": "rtx3060", "NVIDIA H100 NVL": "h100", "NVIDIA H200 NVL": "h200",
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb": "a100-40gb", "Orin (nvgpu)": "orin-nano-4gb",
    "NVIDIA Jetson Orin Nano": "orin-nano-8gb", "NVIDIA Jetson Orin NX": "orin-nx-8gb",
    "NVIDIA GeForce RTX 2060 12GB": "rtx2060", "NVIDIA A10G": None, "Tesla V100S-PCIE-32GB": None,
    "Quadro RTX 6000": None, "NVIDIA GeForce RTX 3080 Max-Q": "rtx3080-laptop",
}


@pytest.mark.parametrize("name, key", NAMES.items())
def test_product_names_resolve_to_their_rows(name, key):
    assert gpu(name).key == key


@pytest.mark.parametrize("name, near", REFUSED.items())
def test_a_name_of_another_product_is_refused_naming_the_nearest_rows(name, near):
    with pytest.raises(MixprecError) as e:
        gpu(name)
    msg = str(e.value)
    assert repr(name) in msg and "--gpu" in msg
    if near:
        assert near in msg, msg
    else:
        assert "No GPU named" in msg and "--gpu-spec" in msg


def test_substrings_are_not_matches():
    assert gpu("NVIDIA L4").key == "l4" and gpu("NVIDIA L40").key == "l40" and gpu("NVIDIA L40S").key == "l40s"
    assert gpu("NVIDIA A10").key == "a10" and gpu("NVIDIA A100").key == "a100"
    assert gpu("NVIDIA GeForce RTX 3080").key == "rtx3080" != gpu("NVIDIA GeForce RTX 3080 Laptop GPU").key
    assert gpu("NVIDIA GeForce RTX 4070").key == "rtx4070" != gpu("NVIDIA GeForce RTX 4070 Ti").key


def test_the_unknown_gpu_error_lists_the_keys():
    with pytest.raises(MixprecError) as e:
        gpu("no-such-gpu")
    assert all(k in e.value.fix for k in GPUS)


# ------------------------------------------------------------------------------------- the workspace

def test_saved_gpus_resolve_validate_and_a_corrupt_file_is_skipped_with_a_note(tmp_path):
    ws = Workspace(tmp_path / "ws")
    g = save_gpu_spec(ws, A6000)
    assert (ws.root / "gpus" / "rtx-a6000.json").is_file() and g == GPU.from_json(A6000)
    assert resolve_gpu(ws, "rtx-a6000") == g and resolve_gpu(ws, "NVIDIA RTX A6000") == g
    assert resolve_gpu(ws, "Tesla T4") is GPUS["t4"]
    with pytest.raises(MixprecError, match="bandwidth_gbs is -1, not positive"):
        save_gpu_spec(ws, spec(key="other", name="Other", bandwidth_gbs=-1))
    with pytest.raises(MixprecError, match="row for the NVIDIA T4"):
        save_gpu_spec(ws, GPUS["t4"].to_json() | {"fp32_tflops": 9.0})
    (ws.root / "gpus" / "broken.json").write_text("{not json")
    (ws.root / "gpus" / "liar.json").write_text(json.dumps(spec(key="someone-else", name="Someone else")))
    (ws.root / "gpus" / "neg.json").write_text(json.dumps(spec(key="neg", name="Neg", sm_count=-3)))
    take_notes()
    found, notes = read_gpu_specs(ws)
    assert list(found) == ["rtx-a6000"] and len(notes) == 3
    assert any("broken.json is not readable JSON" in n for n in notes)
    assert any("liar.json has the key 'someone-else'" in n for n in notes)
    assert any("neg.json: sm_count" in n for n in notes)
    assert resolve_gpu(ws, "rtx-a6000") == g  # never fatal
    assert any("broken.json" in n for n in take_notes())  # noted for the CLI / page
    # a calibration is keyed by the saved GPU
    mine = cost.FITTED.with_values(basis=cost.CALIBRATION_BASIS, gpu="rtx-a6000", n_layers=9, median_err=0.1)
    save_gpu_calibration(ws, "rtx-a6000", mine)
    assert gpu_calibration_path(ws, g).name.startswith("rtx-a6000.")
    assert load_gpu_calibration(ws, g) == mine == load_gpu_calibration(ws, "NVIDIA RTX A6000")
    assert delete_gpu_spec(ws, "rtx-a6000") and not delete_gpu_spec(ws, "rtx-a6000")
    with pytest.raises(MixprecError, match="No GPU named 'rtx-a6000'"):
        resolve_gpu(ws, "rtx-a6000")


# --------------------------------------------------------------------------------- the CLI and search

def test_cli_estimate_with_a_gpu_spec(capsys, tmp_path, monkeypatch):
    from core.estimate.predict import predict
    from core.project import open_project

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    path = tmp_path / "a6000.json"
    path.write_text(json.dumps(A6000))
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu-spec", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"]["key"] == "rtx-a6000" and doc["gpu"]["name"] == "NVIDIA RTX A6000"
    assert GPU.from_json(doc["gpu"]["spec"]) == GPU.from_json(A6000)
    p = open_project("sample:tiny-cnn", ws=Workspace(tmp_path / "ws"))
    want = predict(p.model, p.default_policy(), p.input_shapes, GPU.from_json(A6000))
    assert doc["total_ms"] == pytest.approx(want.total_ms) and doc["band"]["arch"] == "ampere"
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "t4", "--json"]) == 0
    assert "spec" not in json.loads(capsys.readouterr().out)["gpu"]  # a table row is named, not spelled out
    (tmp_path / "bad.json").write_text(json.dumps(spec(arch="kepler")))
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu-spec", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert "arch \"kepler\" is not a known architecture" in err and "Traceback" not in err
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu-spec", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one GPU or the other
        cli_main(["estimate", "sample:tiny-cnn", "--gpu", "t4", "--gpu-spec", str(path)])
    # a GPU saved in the workspace is a --gpu too
    save_gpu_spec(Workspace(tmp_path / "ws"), A6000)
    assert cli_main(["estimate", "sample:tiny-cnn", "--gpu", "rtx-a6000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_ms"] == pytest.approx(want.total_ms)


def test_cli_search_carries_the_spec_gpu_and_its_calibration(capsys, tmp_path, monkeypatch):
    import core.cli.commands as cli

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(tmp_path / "ws"))
    path = tmp_path / "a6000.json"
    path.write_text(json.dumps(A6000))
    mine = cost.FITTED.with_values(basis=cost.CALIBRATION_BASIS, gpu="rtx-a6000", n_layers=9, median_err=0.1)
    save_gpu_calibration(Workspace(tmp_path / "ws"), GPU.from_json(A6000), mine)
    seen = []

    def spy(project, config, **kw):
        seen.append(config)
        raise MixprecError("stop here", "the config was seen")

    monkeypatch.setattr(cli, "search", spy)
    argv = ["search", "sample:tiny-cnn", "--budget", "cosine_mean>=0.9", "--workers", "1"]
    assert cli_main(argv + ["--gpu-spec", str(path)]) == 2
    assert seen[-1].gpu == GPU.from_json(A6000) and seen[-1].cost_params == mine
    assert cli_main(argv + ["--gpu", "Tesla V100-SXM2-16GB"]) == 2
    assert seen[-1].gpu == "v100" and seen[-1].cost_params is None
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv + ["--gpu", "NVIDIA GeForce RTX 4070 Ti SUPER"])
    assert "rtx4070ti" in capsys.readouterr().err


def test_search_with_a_spec_gpu_estimates_on_it(tmp_path):
    from core.project import open_project
    from core.search import SearchConfig, search

    g = GPU.from_json(spec(key="slow-gpu", name="A slow GPU", fp16_tflops=10.0, fp16_acc16_tflops=10.0,
                           int8_tops=20.0, tf32_tflops=5.0, fp32_tflops=2.0, bandwidth_gbs=50.0))
    p = open_project("sample:tiny-cnn", ws=Workspace(tmp_path / "ws"))
    r = search(p, SearchConfig("cosine_mean>=0.9", methods=("minmax",), workers=1, verify=False, gpu=g))
    assert r.objective == "trt_estimate" and "A slow GPU" in r.latency_label


def test_search_job_params_carry_the_spec_and_the_job_uses_it(tmp_path, monkeypatch, tiny_cnn_sample):
    import core.jobs.kinds as kinds
    from core.jobs import search_params

    g = GPU.from_json(A6000)
    params = search_params("sample:tiny-cnn", budget="cosine_mean>=0.9", gpu=g)
    assert params["gpu"] == "rtx-a6000" and GPU.from_json(params["gpu_spec"]) == g
    params = json.loads(json.dumps(params))  # a job's params are JSON
    assert search_params("sample:tiny-cnn", gpu=GPUS["t4"])["gpu_spec"] is None
    ws = Workspace(tmp_path / "ws")
    seen = []
    monkeypatch.setattr(kinds, "search", lambda project, config, **kw: seen.append(config) or "result")
    monkeypatch.setattr(kinds, "save_search", lambda ws, project, result, smooth, gpu=None, metrics=None: tmp_path / "search.json")
    kinds.run_search(params, ws, lambda f, t="": None)
    assert seen[-1].gpu == g and seen[-1].cost_params is None
    mine = cost.FITTED.with_values(basis=cost.CALIBRATION_BASIS, gpu="rtx-a6000", n_layers=9, median_err=0.1)
    save_gpu_calibration(ws, g, mine)
    kinds.run_search(params, ws, lambda f, t="": None)
    assert seen[-1].cost_params == mine
    save_gpu_spec(ws, A6000)  # a saved GPU named by its key: resolved in the job's workspace
    kinds.run_search(params | {"gpu_spec": None}, ws, lambda f, t="": None)
    assert seen[-1].gpu == g


def test_the_estimate_service_takes_a_spec_gpu(tmp_path):
    from core.estimate.predict import predict
    from core.estimate.service import EstimateService
    from core.project import open_project

    p = open_project("sample:tiny-cnn", ws=Workspace(tmp_path / "ws"))
    g = GPU.from_json(A6000)
    s = EstimateService(p.ws.root)
    try:
        got = s.submit(p.model, p.default_policy(), p.input_shapes, g, cost.FITTED).result(timeout=300)
    finally:
        s.close()
    want = predict(p.model, p.default_policy(), p.input_shapes, g)
    assert got.gpu == "rtx-a6000" and got.gpu_name == "NVIDIA RTX A6000"
    assert got.total_ms == pytest.approx(want.total_ms)
