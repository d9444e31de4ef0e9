"""Large-model benchmark (issue 14): the Qwen2-0.5B-shaped decoder, exported with torch, then
inspect, build, rank and isolated sensitivity of all its MatMuls (locally and on a Ray cluster).

    .venv/bin/python bench/bench_large.py [--out /tmp/qwen2-05b] [--stages export,...] [--seq 32]
        [--layers N] [--vocab V]   # export a smaller decoder of the same shape (experiments)

Every stage runs in its own child process, so its seconds and peak RSS are its own; the script
prints one markdown row per stage (recorded in docs/benchmarks.md).

Stages:

* ``export`` -- ``Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)`` (issue 14's config, untied
  LM head: 630 M parameters, ~2.5 GB in FP32) with seeded random weights (``core.model.samples.decoder_module``),
  exported by torch's TorchScript exporter at opset 17 with dynamic batch and sequence. torch writes
  a model over 2 GB with one external file per tensor (in a temp folder); they are gathered into
  one ``model.onnx.data`` beside ``model.onnx``, which is checked by path (``onnx.checker``). Also writes ``calib.npz`` (32 sequences) and
  ``eval.npz`` (16 sequences, with next-token ``labels``) of ``--seq`` uniform random token ids.
  No download: the config and the weights are made here. ``--layers N`` / ``--vocab V`` override
  ``num_hidden_layers`` / ``vocab_size`` (e.g. ``--layers 4 --vocab 32000``: a ~120 M-parameter
  decoder, for experiments that take a minute).

The other stages (inspect, build, rank, sensitivity, Ray) are added with the large-model support
(issue 14 §1, §3, §4); each is a function ``stage(out_dir, args) -> dict`` in ``STAGES``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.model.samples import (QWEN2_05B_CONFIG, decoder_feeds, decoder_module, export_decoder,  # noqa: E402
                                next_token_labels)
from core.workspace import atomic_save_npz  # noqa: E402

DATA_FILE = "model.onnx.data"


def _gather_external_data(exported: Path, model_path: Path) -> None:
    """Write the model torch exported (one external file per tensor, in a temp folder) to
    ``model_path`` with all its tensors in one file beside it, ``model.onnx.data``."""
    import onnx

    model = onnx.load(str(exported), load_external_data=True)
    onnx.save_model(model, str(model_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)


def export_config(args) -> dict:
    """QWEN2_05B_CONFIG with ``--layers`` / ``--vocab`` applied."""
    config = dict(QWEN2_05B_CONFIG)
    if getattr(args, "layers", None):
        config["num_hidden_layers"] = args.layers
    if getattr(args, "vocab", None):
        config["vocab_size"] = args.vocab
    return config


def stage_export(out: Path, args) -> dict:
    import onnx

    t0 = time.perf_counter()
    config = export_config(args)
    module = decoder_module(config, seed=0)
    params = sum(p.numel() for p in module.parameters())
    built = time.perf_counter()
    rng = np.random.default_rng(0)
    vocab = config["vocab_size"]
    calib, eval_ = (rng.integers(0, vocab, (n, args.seq), dtype=np.int64) for n in (32, 16))
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "model.onnx", out / DATA_FILE):
        stale.unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        export_decoder(module, calib[:1, :8], tmp / "model.onnx")
        exported = time.perf_counter()
        del module
        _gather_external_data(tmp / "model.onnx", out / "model.onnx")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    atomic_save_npz(out / "calib.npz", decoder_feeds(calib))
    atomic_save_npz(out / "eval.npz", {**decoder_feeds(eval_), "labels": next_token_labels(eval_)})
    onnx.checker.check_model(str(out / "model.onnx"))  # by path: works past 2 GB
    return {"parameters": params, "model_bytes": (out / "model.onnx").stat().st_size,
            "data_bytes": (out / DATA_FILE).stat().st_size, "build_s": built - t0, "export_s": exported - built,
            "gather_s": time.perf_counter() - exported, "seq": args.seq, "layers": config["num_hidden_layers"],
            "vocab": vocab}


STAGES = {"export": stage_export}


# --- inspect, build, rank, isolated sensitivity: the model over 2 GB end to end (issue 14 §1) -------
BUILD_EVAL = 8   # evaluation sequences of the build (of eval.npz's 16): logits are vocab-wide (151936 floats a token)
RANK_SAMPLES = 4  # sequences the cumulative ranking compares on
SENS_EVAL = 4    # the reduced evaluation set of isolated sensitivity: the first 4 sequences of the dev half
SENS_WORKERS = 1  # trial processes (each holds a session of the switchable model; 2 cores in all)


def _project(out: Path, eval_samples: int | None = None):
    from core.project import open_project
    from core.workspace import Workspace

    p = open_project(out / "model.onnx", data=out / "calib.npz", eval_data=out / "eval.npz", ws=Workspace(out / "ws"))
    if eval_samples is not None:
        from dataclasses import replace

        p = replace(p, eval_data=p.eval_data.slice(0, eval_samples))
    return p


def stage_inspect(out: Path, args) -> dict:
    """What ``python -m core inspect`` does: load (hash by streaming, check and infer by path), inventory."""
    t0 = time.perf_counter()
    p = _project(out)
    m, counts = p.model, p.default_policy().precision_counts()
    return {"load_s": time.perf_counter() - t0, "external": m.external, "graph_bytes": m.proto.ByteSize(),
            "on_disk_bytes": m.size_bytes, "layers": len(p.layers), "eligible": sum(l.eligible for l in p.layers),
            "matmuls": sum(l.op_type == "MatMul" for l in p.layers), **{f"default_{k}": v for k, v in counts.items()}}


def stage_build(out: Path, args) -> dict:
    """The default policy (LLM defaults: embedding, LM head, RMSNorm FP16; MatMuls INT8) calibrated,
    compiled, built on ONNX Runtime and measured on BUILD_EVAL sequences."""
    from core.measure.runs import build_and_measure

    p = _project(out, BUILD_EVAL)
    t0 = time.perf_counter()
    run = build_and_measure(p, p.default_policy(), backend="onnxruntime", warmup=1, iterations=5, profile_iterations=1)
    q = run.quality
    return {"build_s": time.perf_counter() - t0, "eval_sequences": BUILD_EVAL, "cosine_mean": q.cosine_mean,
            **{k: getattr(q, k) for k in ("top1_agreement", "kl_div", "perplexity") if getattr(q, k, None) is not None},
            "speedup": run.latency.speedup, "int8_mac_fraction": run.int8_mac_fraction,
            "compiled_data_bytes": sum(f.stat().st_size for f in run.run_dir.glob("compiled.onnx.data"))}


def stage_rank(out: Path, args) -> dict:
    """The cumulative ranking (every eligible layer INT8, compared layer by layer in chunks under the
    memory budget) on RANK_SAMPLES sequences."""
    from core.sensitivity import rank_layers

    p = _project(out)
    t0 = time.perf_counter()
    r = rank_layers(p, max_samples=RANK_SAMPLES)
    return {"rank_s": time.perf_counter() - t0, "layers_ranked": len(r.table), "chunks": r.chunks,
            "budget_bytes": r.budget_bytes, "ranking_peak_bytes": r.peak_bytes, "samples": r.samples}


def stage_sensitivity(out: Path, args) -> dict:
    """Isolated sensitivity of every eligible layer (all the MatMuls) on the switchable model, on
    SENS_EVAL sequences, SENS_WORKERS trial processes."""
    from core.sensitivity import sensitivity, split_eval

    p = _project(out)
    dev = split_eval(p.eval_data)[0].slice(0, SENS_EVAL)
    t0 = time.perf_counter()
    with TreePeak() as tree:  # the trial workers are children of the pool's forkserver: RUSAGE_CHILDREN misses them
        s = sensitivity(p, mode="isolated", data=dev, workers=SENS_WORKERS)
    return {"sensitivity_s": time.perf_counter() - t0, "trials": len(s.table), "eval_sequences": SENS_EVAL,
            "workers": SENS_WORKERS, "cache_hit": s.cache_hit, "worker_peak_rss_bytes": tree.peak,
            "matmuls": int((s.table["op_type"] == "MatMul").sum())}


def process_tree(root: int) -> set[int]:
    """``root`` and every process under it (from /proc's parent links)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    mine, grew = {root}, True
    while grew:
        new = {pid for pid, pp in parent.items() if pp in mine and pid not in mine}
        mine |= new
        grew = bool(new)
    return mine


class TreePeak:
    """The highest VmHWM (the kernel's per-process peak RSS) of any descendant of this process, sampled
    every second: Ray's workers are children of its raylet, so RUSAGE_CHILDREN does not see them."""

    def __init__(self):
        import threading

        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _descendants(self) -> list[int]:
        return sorted(process_tree(os.getpid()) - {os.getpid()})

    def _run(self):
        while not self._stop.wait(1.0):
            for pid in self._descendants():
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
                except OSError:
                    pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _stage_ray(workers: int):
    def stage(out: Path, args) -> dict:
        """Isolated sensitivity as ``stage_sensitivity``, its trials as Ray tasks on a local Ray instance
        (``ray="local"``: started in this process with ``workers`` CPUs, one task per CPU, 1 thread each;
        the switchable model's weights are external, so every worker reads it from the workspace path).
        The stored table of an earlier run is removed first, so the trials run again."""
        from core.sensitivity import sensitivity, sensitivity_file, split_eval

        p = _project(out)
        dev = split_eval(p.eval_data)[0].slice(0, SENS_EVAL)
        sensitivity_file(p, "isolated", data=dev).unlink(missing_ok=True)
        t0 = time.perf_counter()
        with TreePeak() as tree:
            s = sensitivity(p, mode="isolated", data=dev, workers=workers, ray="local")
        return {"sensitivity_s": time.perf_counter() - t0, "trials": len(s.table), "eval_sequences": SENS_EVAL,
                "workers": workers, "cache_hit": s.cache_hit, "trials_on": s.trials_on,
                "worker_peak_rss_bytes": tree.peak}

    return stage


STAGES.update(inspect=stage_inspect, build=stage_build, rank=stage_rank, sensitivity=stage_sensitivity,
              ray1=_stage_ray(1), ray2=_stage_ray(2))


def _run_child(stage: str, args) -> dict:
    """Run one stage in a child process; its result plus the child's seconds and peak RSS."""
    t0 = time.perf_counter()
    cmd = [sys.executable, __file__, "--child", stage, "--out", str(args.out), "--seq", str(args.seq)]
    cmd += [a for k in ("layers", "vocab") if getattr(args, k) for a in (f"--{k}", str(getattr(args, k)))]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        return {"stage": stage, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return {"stage": stage, "seconds": time.perf_counter() - t0, **doc}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/mixprec-qwen2-05b"))
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--seq", type=int, default=32, help="tokens per calibration / evaluation sequence")
    ap.add_argument("--layers", type=int, help="export: num_hidden_layers instead of 24 (a smaller decoder)")
    ap.add_argument("--vocab", type=int, help="export: vocab_size instead of 151936")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        doc = STAGES[args.child](args.out, args)
        doc["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps(doc))
        return
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; model in {args.out}\n")
    print("| stage | seconds | peak RSS (GiB) | details |\n|---|---|---|---|")
    for stage in args.stages.split(","):
        r = _run_child(stage, args)
        if "error" in r:
            print(f"| {stage} | failed | | {r['error']} |")
            continue
        details = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                            if k not in ("stage", "seconds", "peak_rss_bytes"))
        print(f"| {stage} | {r['seconds']:.1f} | {r['peak_rss_bytes'] / 2**30:.2f} | {details} |")


if __name__ == "__main__":
    main()
