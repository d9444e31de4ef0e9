"""Trials on a Ray cluster (issue 14 §4): a two-node local cluster (``ray.cluster_utils.Cluster``)
gives exactly the local process pool's results; a killed worker's trial is retried; a cancel stops
the tasks; engine builds are scheduled one declared GPU each. Kept small: one CPU on the head, two
on the second node (which also declares two GPUs), 100 MB object stores."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from core.errors import MixprecError
from core.jobs.distributed_builds import build_policies
from core.project import open_project
from core.quant.calibration import calibrate_policy
from core.search import SearchConfig, search
from core.sensitivity import MODES, TrialPool, open_trial_pool, sensitivity, sensitivity_file, split_eval, \
    switchable_model, trial_data
from core.sensitivity.distributed import RAY_ENV, RayTrialPool, gather, ray_address
from core.sensitivity.isolated import _trial_sets
from core.workspace import Workspace

ray = pytest.importorskip("ray", reason="Ray is not installed (scripts/setup.sh installs it)")
from ray.cluster_utils import Cluster  # noqa: E402

STORE = 100 << 20


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine; this process is the driver (``core.sensitivity.distributed.connect``)."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE,
                                                      "include_dashboard": False})
    c.add_node(num_cpus=2, num_gpus=2, object_store_memory=STORE)  # GPUs declared only: the scheduling test
    c.wait_for_nodes()
    from core.sensitivity.distributed import connect

    connect(c.address)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def rws(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("ray-ws"))


def _fresh(project):
    """Forget the stored sensitivity tables, so the next call measures again."""
    for mode in MODES:  # stored once, in rankings/ (the default policy and dev half: all these tests use)
        sensitivity_file(project, mode).unlink(missing_ok=True)


def _switchable(project):
    base = project.default_policy()
    elig = [l for l in project.layers if l.eligible]
    calib = calibrate_policy(project.model, project.calib_data, base.with_layers({l.name: "int8" for l in elig}),
                             project.layers, project.ws)
    return switchable_model(project, base, calib, "minmax"), trial_data(project, split_eval(project.eval_data)[0]), \
        [l.name for l in elig]


def test_address_from_flag_then_environment(monkeypatch):
    monkeypatch.delenv(RAY_ENV, raising=False)
    assert ray_address() is None and ray_address("auto") == "auto"
    monkeypatch.setenv(RAY_ENV, "10.0.0.1:6379")
    assert ray_address() == "10.0.0.1:6379" and ray_address("ray://h:10001") == "ray://h:10001"
    assert ray_address("off") is None  # --ray off: the local pool even with the variable set


def test_local_process_pool_stays_the_default(rws, monkeypatch):
    monkeypatch.delenv(RAY_ENV, raising=False)
    p = open_project("sample:tiny-cnn", ws=rws)
    sw, data, _ = _switchable(p)
    with open_trial_pool(sw, data, 1) as pool:
        assert isinstance(pool, TrialPool) and pool.where.startswith("local process pool")


def test_unreachable_cluster_fails_fast_and_clearly(rws):
    p = open_project("sample:tiny-cnn", ws=rws)
    sw, data, _ = _switchable(p)
    t0 = time.monotonic()
    with pytest.raises(MixprecError, match="cannot connect to the Ray cluster at 127.0.0.1:9"):
        RayTrialPool.on(sw, data, "127.0.0.1:9")
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("sample", ["tiny-cnn", "tiny-transformer"])
@pytest.mark.parametrize("mode", ["isolated", "leave-one-out"])
def test_two_node_cluster_gives_exactly_the_local_results(cluster, rws, sample, mode, monkeypatch):
    monkeypatch.delenv(RAY_ENV, raising=False)
    p = open_project(f"sample:{sample}", ws=rws)
    _fresh(p)
    local = sensitivity(p, mode, workers=2)
    _fresh(p)
    remote = sensitivity(p, mode, workers=2, ray=cluster.address)
    assert local.trials_on.startswith("local") and remote.trials_on == "Ray cluster: 2 nodes, 3 CPUs, 2 GPUs"
    assert not local.cache_hit and not remote.cache_hit
    pd.testing.assert_frame_equal(local.table, remote.table, check_exact=True)
    assert local.baseline == remote.baseline


def test_environment_variable_sends_trials_to_the_cluster(cluster, rws, monkeypatch):
    p = open_project("sample:tiny-cnn", ws=rws)
    _fresh(p)
    monkeypatch.setenv(RAY_ENV, cluster.address)
    assert sensitivity(p, "isolated").trials_on.startswith("Ray cluster: 2 nodes")


def test_trials_share_the_model_once_and_reuse_worker_sessions(cluster, rws, monkeypatch):
    p = open_project("sample:tiny-transformer", ws=rws)
    sw, data, names = _switchable(p)
    sets = _trial_sets("isolated", names)
    with TrialPool.on(sw, data, 2) as pool:
        want = pool.evaluate(sets)
    for share in ("object-store", "path"):  # path: the workspace is the storage every node reads
        with RayTrialPool.on(sw, data, cluster.address, share=share) as pool:
            seen = []
            assert pool.evaluate(sets, progress=lambda f, t: seen.append(f)) == want
            assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == len(sets)
            t0 = time.perf_counter()
            assert pool.evaluate(sets * 5) == want * 5  # sessions are open: no model sent per trial
            assert time.perf_counter() - t0 < 10
            assert pool.shared_bytes >= Path(sw.path).stat().st_size
    assert not list(Path(sw.path).parent.glob("trial-data-*.npz"))  # the path share's file is removed


def test_a_model_with_external_weights_is_read_from_the_workspace(cluster, rws, tmp_path, monkeypatch):
    """Weights kept in data files (core.model.external; here forced from 1 byte on) never go through the
    object store: the workers open the switchable model and its data files from the workspace."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.delenv(RAY_ENV, raising=False)
    monkeypatch.setenv("MIXPREC_EXTERNAL_WEIGHTS_FROM", "1")
    rng, ch, x, nodes, inits = np.random.default_rng(0), 192, "x", [], []
    for i in range(3):  # 147 KB weights each: their float16 copies (74 KB) are above the size read into the graph
        inits.append(numpy_helper.from_array((rng.standard_normal((ch, ch, 1, 1)) * 0.1).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], name="pool", keepdims=0, axes=[2, 3]))
    g = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ch, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ch])], inits)
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "ext.onnx"),
                    save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    p = open_project(str(tmp_path / "ext.onnx"), ws=rws)
    assert p.model.weights is not None  # the weights stayed external
    _fresh(p)
    local = sensitivity(p, "isolated")
    _fresh(p)
    remote = sensitivity(p, "isolated", ray=cluster.address)
    assert remote.trials_on.endswith("(the workers read the model from the workspace)")
    pd.testing.assert_frame_equal(local.table, remote.table, check_exact=True)


def test_a_worker_killed_mid_run_is_retried(cluster, rws, tmp_path):
    p = open_project("sample:tiny-cnn", ws=rws)
    sw, data, names = _switchable(p)
    sets = _trial_sets("leave-one-out", names)
    with TrialPool.on(sw, data, 2) as pool:
        want = pool.evaluate(sets)
    marker = tmp_path / "killed"
    with RayTrialPool.on(sw, data, cluster.address, kill_once=str(marker)) as pool:
        assert pool.evaluate(sets) == want
    pid = int(marker.read_text())  # a worker was SIGKILLed mid-trial, and its trial ran again
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_worker_that_keeps_dying_is_a_clean_error(cluster, rws, tmp_path):
    p = open_project("sample:tiny-cnn", ws=rws)
    sw, data, names = _switchable(p)
    with RayTrialPool.on(sw, data, cluster.address, retries=0, kill_once=str(tmp_path / "k")) as pool:
        with pytest.raises(MixprecError, match="a Ray worker died 1 time running one trial"):
            pool.evaluate(_trial_sets("isolated", names))


def test_cancel_stops_the_tasks(cluster):
    def nap(seconds):  # pickled by value: the workers cannot import this test module
        time.sleep(seconds)

    slow = ray.remote(nap).options(num_cpus=1, max_retries=0)
    refs = [slow.remote(30) for _ in range(6)]
    t0 = time.monotonic()
    with pytest.raises(MixprecError, match="cancelled"):
        gather(ray, refs, should_stop=lambda: time.monotonic() - t0 > 1.0)
    assert time.monotonic() - t0 < 10
    for r in refs:  # queued and running tasks alike: none finishes its 30 s
        with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
            ray.get(r, timeout=20)
    assert time.monotonic() - t0 < 30


def test_search_trials_on_the_cluster_match_local(cluster, rws, monkeypatch):
    monkeypatch.delenv(RAY_ENV, raising=False)
    p = open_project("sample:tiny-cnn", ws=rws)
    cfg = SearchConfig(budget="cosine_mean>=0.99995", methods=("minmax",), verify=False, objective="mac_share",
                       workers=2)
    _fresh(p)
    local = search(p, cfg)
    _fresh(p)
    remote = search(p, replace(cfg, ray=cluster.address))
    assert remote.policy.layers == local.policy.layers and remote.met_on_dev == local.met_on_dev

    def tried(r):  # every candidate evaluated, with its quality (est_ms is a timing fit: it varies run to run)
        return sorted(zip(r.candidates.int8_layers, r.candidates.quality))

    assert tried(remote) == tried(local) and len(tried(local)) > 2
    _fresh(p)
    with pytest.raises(MixprecError, match="connected to the Ray cluster at .*, not 127.0.0.1:9"):
        search(p, replace(cfg, ray="127.0.0.1:9"))  # the search's trials do go through its --ray


def test_cli_sensitivity_with_ray(cluster, rws, monkeypatch, capsys):
    from core.cli.commands import main

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(rws.root))
    p = open_project("sample:tiny-cnn", ws=rws)
    _fresh(p)
    assert main(["sensitivity", "sample:tiny-cnn", "--ray", cluster.address, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trials_on"].startswith("Ray cluster: 2 nodes")
    assert len(doc["layers"]) == sum(l.eligible for l in p.layers)


def test_engine_builds_hold_one_declared_gpu_each(cluster, rws, tiny_cnn):
    p = open_project("sample:tiny-cnn", ws=rws)
    policies = [p.default_policy(), p.default_policy("fp16"), p.default_policy(method="percentile"),
                p.default_policy("fp16", "percentile")]
    builds = build_policies("sample:tiny-cnn", policies, cluster.address, rws, backend="onnxruntime")
    assert len(builds) == 4 and all(Path(b.metrics_path).is_file() for b in builds)
    assert {b.gpus for b in builds} <= {"0", "1"}  # one GPU each, of the two the node declares
    events = sorted([(b.started, 1, b.gpus) for b in builds] + [(b.ended, -1, b.gpus) for b in builds])
    running, most = {}, 0
    for _, kind, gpu in events:
        if kind < 0:
            running[gpu] -= 1
            continue
        assert running.get(gpu, 0) == 0, "two builds held the same GPU at once"
        running[gpu] = 1
        most = max(most, sum(running.values()))
    assert most <= 2
    for b, pol in zip(builds, policies):  # each build ran its own policy, in order
        stored = json.loads((b.run_dir / "policy.json").read_text())
        want = json.loads(pol.to_json())
        assert (stored["layers"], stored["calibration"]["method"]) == (want["layers"], want["calibration"]["method"])


def test_engine_builds_need_declared_gpus(cluster, rws):
    with pytest.raises(MixprecError, match="declares 2 GPUs; each engine build needs 3"):
        build_policies("sample:tiny-cnn", ["{}"], cluster.address, rws, num_gpus=3)


def test_cli_builds_several_policies_on_the_cluster(cluster, rws, tmp_path, monkeypatch, capsys):
    """``python -m core build --policy A --policy B --ray ADDRESS``: build_policies' caller in the product."""
    from core.cli.commands import main

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(rws.root))
    p = open_project("sample:tiny-cnn", ws=rws)
    policies = [p.default_policy("fp16"), p.default_policy(method="percentile")]
    paths = [tmp_path / f"policy-{i}.json" for i in range(len(policies))]
    for path, pol in zip(paths, policies):
        path.write_text(pol.to_json())
    argv = ["build", "sample:tiny-cnn", "--ray", cluster.address, "--backend", "onnxruntime", "--json"]
    assert main(argv[:2] + [a for path in paths for a in ("--policy", str(path))] + argv[2:]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ray"] == cluster.address and [b["policy"] for b in doc["builds"]] == [str(x) for x in paths]
    assert {b["gpus"] for b in doc["builds"]} <= {"0", "1"}  # one declared GPU each
    for b, pol in zip(doc["builds"], policies):  # each build ran its own policy, in order, in the workspace
        stored = json.loads((rws.runs / b["run"]["run_id"] / "policy.json").read_text())
        want = json.loads(pol.to_json())
        assert (stored["layers"], stored["calibration"]["method"]) == (want["layers"], want["calibration"]["method"])
        assert b["run"]["backend"] == "onnxruntime"


def test_cli_build_on_ray_refuses_bad_input(rws, monkeypatch, capsys):
    from core.cli.commands import main

    monkeypatch.setenv("MIXPREC_WORKSPACE", str(rws.root))
    for argv, error in ((["--ray", "not an address"], "is not a Ray cluster address"),
                        (["--policy", "a.json", "--policy", "b.json"], "2 --policy files for one build"),
                        (["--ray", "127.0.0.1:9", "--iterations", "5"], "only a local build takes --iterations"),
                        # nothing listens there (or, after the cluster tests, this process is connected to theirs)
                        (["--ray", "127.0.0.1:9"], r"Ray cluster at (\S+, not )?127\.0\.0\.1:9")):
        assert main(["build", "sample:tiny-cnn", *argv]) == 2
        err = capsys.readouterr().err
        assert re.search(error, err) and "Traceback" not in err
