"""``python -m core data MODEL --images DIR|ZIP [--recipe R] --out data.npz``: the ``.npz`` mixprec reads,
made from what users have (``core.model.data_import``): a folder or .zip of images with a preprocessing
recipe, a text file of lines with the model's tokenizer (``--text FILE [--tokenizer tokenizer.json]``), or a
folder of WAV files (``--audio DIR [--rate 16000]``). The input shapes come from the same flags as every
command's (``--shape``, ``--dim``, ``--batch``); the recipe is written beside the .npz."""
from __future__ import annotations

import argparse
from dataclasses import replace

from core.cli.source import parse_branches, parse_dims, parse_shapes
from core.model.data_import import import_data, parse_recipe, write_npz
from core.model.load import load_model
from core.model.samples import SAMPLES
from core.model.shapes import resolve_input_shapes, shape_text
from core.cli.output import print_document
from core.workspace import Workspace

RECIPE_HELP = ("the preprocessing recipe: a JSON file, inline JSON, or key=value pairs separated by commas (lists "
               "with ':'), e.g. resize=letterbox,pad=114,channels=BGR,scale=1/255,mean=0.485:0.456:0.406,"
               "std=0.229:0.224:0.225,layout=NCHW. Keys: resize (stretch|letterbox|center_crop), pad (letterbox "
               "border, 0-255), interpolation (bilinear|bicubic|nearest|lanczos), channels (RGB|BGR; grayscale for a "
               "1-channel input), scale (first), mean and std (per channel, after scale), layout (NCHW|NHWC; default "
               "the input's), size (H:W; default the input shapes'), rate (audio Hz), input (which model input), "
               "max_samples (the first N files or lines). Default: stretch, RGB, scale 1/255, mean 0, std 1")


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``data`` command on the CLI's subparsers."""
    sp = sub.add_parser("data", help="make the .npz of a model's inputs from images, text lines or WAV files",
                        description="Write the .npz mixprec reads (--data) from a folder or .zip of images, a text "
                                    "file of lines, or a folder of WAV files, with the recipe beside it "
                                    "(<out>.recipe.json).")
    sp.add_argument("model", help="path to a .onnx file or " + "|".join(f"sample:{n}" for n in SAMPLES))
    what = sp.add_mutually_exclusive_group(required=True)
    what.add_argument("--images", metavar="DIR|ZIP", help="a folder or .zip of images (PNG, JPEG, BMP, WebP, GIF, "
                      "TIFF, PPM), read in sorted path order; other files are skipped")
    what.add_argument("--text", metavar="FILE", help="a UTF-8 text file, one sample a line, for the token inputs "
                      "input_ids / attention_mask / token_type_ids (padded and truncated to the sequence length)")
    what.add_argument("--audio", metavar="DIR|ZIP", help="a folder or .zip of WAV files (PCM or float, mixed down to "
                      "mono), for a float input [batch, samples] or [batch, 1, samples]")
    sp.add_argument("--recipe", metavar="RECIPE", help=RECIPE_HELP)
    sp.add_argument("--tokenizer", metavar="tokenizer.json", help="the tokenizer of --text (default: tokenizer.json "
                    "beside the model; the bundled one for sample:minilm)")
    sp.add_argument("--rate", type=int, help="the sample rate --audio is resampled to (default 16000, or the recipe's)")
    sp.add_argument("--out", required=True, help="the .npz to write")
    sp.add_argument("--batch", type=int, default=1, help="batch size for dynamic batch dims (default 1)")
    sp.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a named dynamic dim "
                    "(e.g. --dim sequence=128 for --text, --dim H=320 --dim W=320 for --images)")
    sp.add_argument("--shape", action="append", metavar="INPUT=1x3x320x320",
                    help="the full shape of an input (every dim, named or not; repeatable)")
    sp.add_argument("--branch", action="append", metavar="INPUT=true|false",
                    help="a merged decoder's If branch, fixed on load")
    sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    sp.set_defaults(func=cmd_data)
    return sp


def cmd_data(args):
    """Import, write the .npz and its recipe, say what was written (``--json``: one document with the notes)."""
    recipe = parse_recipe(args.recipe)
    if args.rate:
        recipe = replace(recipe, rate=args.rate)
    ws = Workspace.default()
    model = load_model(args.model, ws, branches=parse_branches(args.branch))
    shapes = resolve_input_shapes(model, None, args.batch, parse_dims(args.dim), parse_shapes(args.shape))
    imported = import_data(model, shapes, images=args.images, text=args.text, audio=args.audio, recipe=recipe,
                           tokenizer=args.tokenizer, ws_root=ws.root)
    r = write_npz(imported, args.out, model)
    lines = [f"wrote {r.path}: {r.num_samples} samples ({imported.kind}), "
             + ", ".join(f"{k} {shape_text(v)}" for k, v in r.shapes.items()), f"recipe: {r.recipe_path}"]
    lines += [f"note: {n}" for n in r.notes]
    if args.json:
        print_document(r.to_json() | {"kind": imported.kind, "recipe": recipe.to_json()})
    else:
        print("\n".join(lines))
