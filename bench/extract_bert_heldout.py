"""Held-out validation rows of NVIDIA's published TensorRT BERT latencies (demo/BERT/README.md of the
NVIDIA/TensorRT repository), written to bench/data/trt-bert-heldout.json.

    .venv/bin/python bench/extract_bert_heldout.py [--repo /work/.mirror/NVIDIA+TensorRT/repo]

These rows are NOT fitting data (the fit uses ../shared/fixtures/trt-bert-published/ only: BERT-base on
A100-40GB and T4). They are the other GPUs' tables (A30, L40S at the fixture's commit; V100 16GB from the
TensorRT 7.2 README) and BERT-Large on every GPU, kept for validation only."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "data" / "trt-bert-heldout.json"
# (commit, TensorRT version its Version Info table gives, {heading gpu -> our name})
SOURCES = (
    ("9973b2f4ab5c0d0055e9d36cd94a5692f8f8da1f", "10.8 release (Version Info 10.7.0.23)",
     {"NVIDIA A100 (40GB)": "A100-40GB", "NVIDIA A30": "A30", "NVIDIA L40S": "L40S"}),
    ("1d6bf36034bb07fc88d924ebf5d34d358298e545", "8.5.1", {"NVIDIA T4 (16GB)": "T4-16GB"}),
    ("ab20a8ac26da03df5e434b4f9d1da0156ca019b6", "7.2.3.4", {"NVIDIA V100 (16GB)": "V100-16GB"}),
)
FIXTURE = {("A100-40GB", "bert-base"), ("T4-16GB", "bert-base")}  # the fitting data: never here


def tables(text: str):
    gpu = model = None
    for line in text.splitlines():
        m = re.match(r"^#{3,4} Inference [Pp]erformance:? (.+?)\s*$", line)
        if m:
            gpu, model = m.group(1).strip(), None
            continue
        m = re.match(r"^#{5} (BERT [Bb]ase|BERT [Ll]arge|Megatron.*)\s*$", line)
        if m:
            model = m.group(1).lower().replace(" ", "-")
            continue
        if line.startswith("## "):
            gpu = model = None
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if gpu and model and len(cells) == 8 and cells[0].isdigit():
            yield gpu, model, cells


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default="/work/.mirror/NVIDIA+TensorRT/repo")
    args = ap.parse_args()
    rows = []
    for commit, version, gpus in SOURCES:
        text = subprocess.run(["git", "-C", args.repo, "show", f"{commit}:demo/BERT/README.md"], check=True,
                              capture_output=True, text=True).stdout
        for heading, model, c in tables(text):
            if heading not in gpus or model not in ("bert-base", "bert-large"):
                continue
            name = gpus[heading]
            if (name, model) in FIXTURE:
                continue
            for precision, avg in (("int8", c[4]), ("fp16", c[7])):
                rows.append({"gpu": name, "model": model, "seq": int(c[0]), "batch": int(c[1]),
                             "precision": precision, "avg_ms": float(avg), "trt_version": version,
                             "source": f"NVIDIA/TensorRT demo/BERT/README.md@{commit}", "use": "validation only"})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(rows)} rows -> {OUT}")
    for key in sorted({(r['gpu'], r['model']) for r in rows}):
        print(key, sum((r['gpu'], r['model']) == key for r in rows))


if __name__ == "__main__":
    main()
