"""``python -m core estimate MODEL [--policy P] --gpu a100 [--shape …] [--json]``: the TensorRT engine a
policy would build on a GPU and its estimated time, without TensorRT or a GPU. Every number it prints
is labelled as an estimate, with its GPU and its basis (the fit on the fixture engines, or the user's
calibration stored for that GPU).

``--gpu`` takes a key of the GPU table, a product name as ``nvidia-smi`` prints it, or the key of a
GPU saved in the workspace ("Add a GPU" on the Precision page); ``--gpu-spec FILE.json`` describes a
GPU that is in neither (the fields of a table row, validated by ``core.estimate.gpus``). The search
(``python -m core search``) takes the same two options (:func:`add_gpu_args`, :func:`gpu_from_args`)."""
from __future__ import annotations

import argparse

from core.cli.source import source_from_args
from core.errors import MixprecError
from core.estimate.cost import FITTED
from core.estimate.gpus import FIELD_HELP, FIXTURE_GPU, GPU, GPUS, gpu as gpu_entry, gpu_keys, load_gpu_spec
from core.estimate.predict import PREDICTION_COLUMNS, Prediction, predict
from core.model.samples import SAMPLES
from core.quant.policy import NETWORK_DEFAULTS, load_policy
from core.cli.output import print_document
from core.store.results import load_gpu_calibration, read_gpu_specs, resolve_gpu
from core.workspace import Workspace, default_root

NAME_WIDTH = 90


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``estimate`` command on the CLI's subparsers."""
    sp = sub.add_parser("estimate", help="estimate a policy's TensorRT engine time on a GPU, without TensorRT")
    sp.add_argument("model", help="path to a .onnx file or " + "|".join(f"sample:{n}" for n in SAMPLES))
    sp.add_argument("--policy", help="policy JSON (default: the default policy)")
    sp.add_argument("--network-default", default="fp32", choices=NETWORK_DEFAULTS,
                    help="the default policy's precision for layers it does not set otherwise (default fp32)")
    add_gpu_args(sp)
    sp.add_argument("--batch", type=int, default=1, help="batch size for dynamic batch dims (default 1)")
    sp.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a named dynamic dim")
    sp.add_argument("--shape", action="append", metavar="INPUT=1x3x224x224",
                    help="the full shape of an input (every dim, named or not; repeatable)")
    sp.add_argument("--profile", action="append", metavar="INPUT=MIN:OPT:MAX",
                    help="an input's dynamic-shape profile, e.g. input_ids=1x16:4x128:8x512: the estimate is at OPT")
    sp.add_argument("--branch", action="append", metavar="INPUT=true|false",
                    help="a merged decoder's If branch, fixed on load (default: use_cache_branch=true)")
    sp.add_argument("--no-tf32", action="store_true", help="FP32 layers without TF32 (trtexec --noTF32)")
    sp.add_argument("--fixture-fit", action="store_true",
                    help="use the shipped fit on the fixture engines even when a calibration for this GPU is stored")
    sp.add_argument("--top", type=int, default=0, help="print only the N slowest layers (default: all)")
    sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    sp.set_defaults(func=run)
    return sp


GPU_HELP = (f"GPU of the estimate: a key of the GPU table ({gpu_keys()}), a product name as nvidia-smi prints it "
            f"(e.g. 'NVIDIA GeForce RTX 3080 Laptop GPU') or the key of a GPU saved in the workspace (default "
            f"{FIXTURE_GPU}); a calibration stored for it is used")
GPU_SPEC_HELP = ("a GPU that is not in the table: a JSON file with the fields of a table row ("
                 + ", ".join(k for k in FIELD_HELP if k not in ("halved", "derived"))
                 + "; docs/tensorrt.md, 'GPU table')")


def _gpu_name(text: str) -> str:
    """``--gpu`` checked when the command line is read (a table key or product name, or a GPU saved in
    the workspace): an unknown GPU stops with argparse's usage error, before any model is loaded."""
    saved, _ = read_gpu_specs(Workspace(default_root()))
    try:
        return gpu_entry(text, saved).key
    except MixprecError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def add_gpu_args(sp, check: bool = False) -> None:
    """``--gpu NAME`` or ``--gpu-spec FILE.json`` (one of them) on a command that estimates on a GPU.
    ``check``: resolve ``--gpu`` while parsing (an unknown one is argparse's usage error); else
    :func:`gpu_from_args` resolves it (an unknown one is a MixprecError)."""
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--gpu", default=None, type=_gpu_name if check else str, help=GPU_HELP)
    g.add_argument("--gpu-spec", metavar="FILE.json", help=GPU_SPEC_HELP)


def gpu_from_args(args, ws: Workspace | None = None) -> GPU:
    """The GPU of ``--gpu-spec`` (a file, validated) or ``--gpu`` (the table, or a GPU saved in ``ws``),
    default the fixtures' A100."""
    if getattr(args, "gpu_spec", None):
        return load_gpu_spec(args.gpu_spec)
    return resolve_gpu(ws or Workspace(default_root()), getattr(args, "gpu", None) or FIXTURE_GPU)


def gpu_doc(g: GPU) -> dict:
    """What a JSON result says of its GPU: its key and name, and every figure when it is not a table row."""
    return {"key": g.key, "name": g.name} | ({} if GPUS.get(g.key) == g else {"spec": g.to_json()})


def _text(r: Prediction, top: int) -> str:
    rows = r.layers.sort_values("est_ms", ascending=False, kind="stable").head(top) if top else r.layers
    lines = [f"ESTIMATE (not measured): {r.caption()}",
             f"{'est ms':>8}  {'precision':9}  {'reformat':8}  engine layer"]
    for row in rows.itertuples():
        name = row.engine_layer if len(row.engine_layer) <= NAME_WIDTH else row.engine_layer[:NAME_WIDTH - 1] + "…"
        lines.append(f"{row.est_ms:8.4f}  {row.precision:9}  {'yes' if row.is_reformat else '':8}  {name}")
    return "\n".join(lines)




def run(args) -> int:
    """The ``estimate`` command: predict, price and print (text, or one JSON document)."""
    g = gpu_from_args(args)  # before the model loads: a bad GPU fails at once
    src = source_from_args(args)
    # the estimate needs no data: a sample's own data must not pin the shapes the user asks for
    p = src.open(sample_data=not (src.shapes or src.dims or src.profiles or src.batch != 1))
    policy = load_policy(args.policy, p.model, p.layers) if args.policy else p.default_policy(args.network_default)
    params = None if args.fixture_fit else load_gpu_calibration(p.ws, g)
    r = predict(p.model, policy, p.input_shapes, g, params or FITTED, tf32=not args.no_tf32)
    if args.json:
        doc = r.to_json() | {"command": "estimate", "policy": args.policy or f"default ({args.network_default})",
                             "input_shapes": {k: list(v) for k, v in p.input_shapes.items()},
                             "columns": PREDICTION_COLUMNS}
        doc["gpu"] = {**doc.get("gpu", {}), **gpu_doc(g)}
        print_document(doc)
    else:
        print(_text(r, args.top))
    return 0
