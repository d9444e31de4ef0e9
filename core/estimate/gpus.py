"""The GPU table the cost model prices engine layers with: dense peak throughput per math
precision, memory bandwidth and SM count, from NVIDIA's datasheets and architecture whitepapers
(each entry's source and table are listed in docs/tensorrt.md, section "GPU table").

All throughputs are **dense** (no 2:4 structured sparsity): where a datasheet gives only the
sparse figure (marked with an asterisk there), it is halved here and ``halved`` says which.
Figures NVIDIA does not publish are derived (SM count × boost clock × the architecture's per-SM
rate, docs/tensorrt.md says how for each row) and ``derived`` says which.
``fp16_tflops`` is FP16 tensor-core math with FP32 accumulation and ``fp16_acc16_tflops`` with
FP16 accumulation; they differ on GeForce cards (RTX 3090, RTX 4090), where FP32 accumulation runs
at half rate. ``tf32_tflops`` is ``None`` before Ampere (no TF32 tensor cores).

A GPU that is not in the table is described by a JSON document with the same fields
(:func:`load_gpu_spec`, ``--gpu-spec FILE.json``; :meth:`GPU.from_json` validates it), or saved in
the workspace from the dashboard (``core.store.results.save_gpu_spec``). :func:`gpu` resolves a key, a
product name as ``nvidia-smi`` prints it (``Tesla V100-SXM2-16GB``, ``NVIDIA GeForce RTX 3080
Laptop GPU``) or a :class:`GPU` to its entry, and refuses a name it cannot place honestly (a
"RTX 4070 Ti SUPER" never becomes a "RTX 4070 Ti")."""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Mapping

from core.errors import MixprecError
from core.workspace import read_user_file

ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
TF32_ARCHITECTURES = ARCHITECTURES[ARCHITECTURES.index("ampere"):]  # TF32 tensor cores from Ampere on
FIGURES = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops", "bandwidth_gbs")
REQUIRED = ("key", "name", "arch", "sm_count", "fp32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops",
            "bandwidth_gbs")
MAX_FIGURE = 100_000.0      # TFLOPS / TOPS / GB/s: more than any GPU (a figure in FLOPS, not TFLOPS, is caught)
MAX_SMS = 1_000
MAX_NAME = 100
KEY_PATTERN = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
SPEC_MAX_BYTES = 64 * 1024

# what each field is, for the errors and the dashboard's form
FIELD_HELP = {
    "key": "the short name used on the command line (lowercase letters, digits and '-', e.g. my-rtx-a6000)",
    "name": "the product as NVIDIA names it (e.g. NVIDIA RTX A6000)",
    "arch": "the architecture: " + ", ".join(ARCHITECTURES),
    "sm_count": "number of streaming multiprocessors (SMs)",
    "fp32_tflops": "peak FP32 TFLOPS on the CUDA cores (non-tensor)",
    "tf32_tflops": "peak TF32 tensor-core TFLOPS, dense (null before Ampere: no TF32 tensor cores)",
    "fp16_tflops": "peak FP16 tensor-core TFLOPS with FP32 accumulate, dense",
    "fp16_acc16_tflops": "peak FP16 tensor-core TFLOPS with FP16 accumulate, dense (the same figure where "
                         "the datasheet gives one)",
    "int8_tops": "peak INT8 tensor-core TOPS, dense (a datasheet figure with sparsity, marked *, is halved)",
    "bandwidth_gbs": "memory bandwidth, GB/s",
    "memory_gb": "memory size, GB (optional; 0 = not given)",
    "base_clock_mhz": "base clock, MHz (optional; 0 = not given; with the boost clock, what the cost model takes "
                      "as the clock sustained under load)",
    "boost_clock_mhz": "boost clock, MHz, the clock the datasheet's peaks are given at (optional; 0 = not given)",
    "halved": "figures the source gives with sparsity only, halved here (a list of field names)",
    "derived": "figures the source does not give, derived (a list of field names)",
}


@dataclass(frozen=True)
class GPU:
    key: str                    # the name used on the command line: a100, t4, …
    name: str                   # the product as NVIDIA names it
    arch: str                   # volta / turing / ampere / ada / hopper / blackwell
    sm_count: int
    fp32_tflops: float          # non-tensor FP32 (CUDA cores)
    tf32_tflops: float | None   # TF32 tensor cores, dense; None before Ampere
    fp16_tflops: float          # FP16 tensor cores, FP32 accumulate, dense
    fp16_acc16_tflops: float    # FP16 tensor cores, FP16 accumulate, dense
    int8_tops: float            # INT8 tensor cores, dense (Volta: DP4A on the CUDA cores)
    bandwidth_gbs: float        # memory bandwidth, GB/s
    memory_gb: float = 0.0
    halved: tuple[str, ...] = ()  # figures the source gives with sparsity only, halved here
    derived: tuple[str, ...] = ()  # figures the source does not give, derived (docs/tensorrt.md says how)
    base_clock_mhz: float = 0.0   # optional (0: not given): the cost model's sustained-clock term reads them
    boost_clock_mhz: float = 0.0

    @property
    def has_tf32(self) -> bool:
        return self.tf32_tflops is not None

    def peak_tflops(self, precision: str, accumulate16: bool = True) -> float:
        """Dense peak of tensor-core math at ``precision`` (``fp32`` is the non-tensor FP32 rate)."""
        if precision == "tf32":
            return self.tf32_tflops if self.tf32_tflops is not None else self.fp32_tflops
        if precision in ("fp16", "bf16"):
            return self.fp16_acc16_tflops if accumulate16 else self.fp16_tflops
        if precision in ("int8", "fp8"):
            return self.int8_tops
        return self.fp32_tflops

    def to_json(self) -> dict:
        d = asdict(self)
        d["halved"], d["derived"] = list(self.halved), list(self.derived)
        return d

    @classmethod
    def from_json(cls, doc, source: str = "the GPU spec") -> GPU:
        """A GPU from a document with the fields of a table row, validated (:func:`check_spec`): a
        MixprecError names each problem's field and how to fix it."""
        return check_spec(doc, source)


# --- validation of a GPU spec ----------------------------------------------------------------------
_FIELDS = tuple(f.name for f in fields(GPU))


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _figure_problem(name: str, v, unit: str) -> tuple[str, str] | None:
    if not _number(v):
        return f"is {json.dumps(v)[:40]}, not a number", f"give {name} as a number of {unit}"
    if not math.isfinite(v):
        return f"is {v}, not a finite number", f"give {name} as a positive number of {unit}"
    if v <= 0:
        return f"is {v:g}, not positive", f"give {name} as a positive number of {unit} ({FIELD_HELP[name]})"
    if v > MAX_FIGURE:
        return (f"is {v:g}, more than any GPU has", f"give {name} in {unit} (e.g. 312 for 312 {unit}), "
                                                     "not in FLOPS or bytes")
    return None


def _identity_problems(doc: dict):
    """Problems with the required fields, the key, the name and the architecture (and those three)."""
    problems: list[tuple[str, str, str]] = []  # (field, what, fix)
    for k in REQUIRED:
        if doc.get(k) is None:
            problems.append((k, "is missing", f"give {k}: {FIELD_HELP[k]}"))

    key, name, arch = doc.get("key"), doc.get("name"), doc.get("arch")
    if key is not None and not (isinstance(key, str) and KEY_PATTERN.fullmatch(key)):
        problems.append(("key", f"{json.dumps(key)[:50]} is not a safe key",
                         "use 1-40 lowercase letters, digits and '-' (not first or last), e.g. my-rtx-a6000"))
    if name is not None and not (isinstance(name, str) and name.strip() and len(name) <= MAX_NAME
                                 and name.isprintable()):
        problems.append(("name", f"{json.dumps(name)[:50]} is not a product name",
                         f"give the product's name as text (1-{MAX_NAME} printable characters)"))
    if isinstance(arch, str):
        arch = arch.strip().lower()
    if arch is not None and arch not in ARCHITECTURES:
        problems.append(("arch", f"{json.dumps(arch)[:40]} is not a known architecture",
                         "use one of " + ", ".join(ARCHITECTURES)))
    return problems, key, name, arch


def _figure_problems(doc: dict, arch):
    """Problems with the SM count and the throughput/bandwidth/memory figures (and the values read)."""
    problems: list[tuple[str, str, str]] = []
    sms = doc.get("sm_count")
    if sms is not None:
        if not (_number(sms) and math.isfinite(sms) and float(sms).is_integer() and 0 < sms <= MAX_SMS):
            problems.append(("sm_count", f"is {json.dumps(sms)[:40]}, not a whole number of SMs",
                             f"give sm_count as a whole number from 1 to {MAX_SMS} ({FIELD_HELP['sm_count']})"))
    for f in FIGURES:
        v = doc.get(f)
        if v is None:
            continue
        p = _figure_problem(f, v, "GB/s" if f == "bandwidth_gbs" else "TOPS" if f == "int8_tops" else "TFLOPS")
        if p:
            problems.append((f, *p))
    tf32 = doc.get("tf32_tflops")
    if arch in ARCHITECTURES:
        if arch not in TF32_ARCHITECTURES and tf32 is not None:
            problems.append(("tf32_tflops", f"is given, but {arch} GPUs have no TF32 tensor cores",
                             "set tf32_tflops to null (TF32 tensor cores exist from Ampere on)"))
        if arch in TF32_ARCHITECTURES and tf32 is None:
            problems.append(("tf32_tflops", f"is missing: {arch} GPUs have TF32 tensor cores",
                             f"give tf32_tflops: {FIELD_HELP['tf32_tflops']}"))
    acc32, acc16 = doc.get("fp16_tflops"), doc.get("fp16_acc16_tflops")
    if _number(acc32) and _number(acc16) and 0 < acc16 < acc32:
        problems.append(("fp16_acc16_tflops", f"({acc16:g}) is below fp16_tflops ({acc32:g})",
                         "FP16 accumulation is never slower than FP32 accumulation: swap the two, or give the "
                         "same figure twice where the datasheet gives one FP16 figure"))
    mem = doc.get("memory_gb")
    if mem is not None and not (_number(mem) and math.isfinite(mem) and 0 <= mem <= MAX_FIGURE):
        problems.append(("memory_gb", f"is {json.dumps(mem)[:40]}, not a memory size",
                         "give memory_gb as a number of GB (or leave it out)"))
    return problems, sms, tf32, acc32, acc16, mem


def _other_problems(doc: dict):
    """Problems with the clocks, the halved/derived lists and unknown fields (and the clocks read)."""
    problems: list[tuple[str, str, str]] = []
    clocks = {}
    for c in ("base_clock_mhz", "boost_clock_mhz"):
        v = doc.get(c)
        if v is not None and not (_number(v) and math.isfinite(v) and 0 <= v <= 10_000):
            problems.append((c, f"is {json.dumps(v)[:40]}, not a clock in MHz",
                             f"give {c} in MHz (e.g. 1410), or leave it out"))
        elif v is not None:
            clocks[c] = float(v)
    if clocks.get("base_clock_mhz", 0) > 0 and clocks.get("boost_clock_mhz", 0) > 0 \
            and clocks["base_clock_mhz"] > clocks["boost_clock_mhz"]:
        problems.append(("base_clock_mhz", f"({clocks['base_clock_mhz']:g}) is above boost_clock_mhz "
                         f"({clocks['boost_clock_mhz']:g})", "swap the two clocks"))
    for lst in ("halved", "derived"):
        v = doc.get(lst, [])
        if not (isinstance(v, (list, tuple)) and all(isinstance(x, str) and x in FIGURES for x in v)):
            problems.append((lst, f"is {json.dumps(v)[:60]}, not a list of figure names",
                             f"list some of {', '.join(FIGURES)} (or leave it out)"))
    for k in doc:
        if k not in _FIELDS:
            close = difflib.get_close_matches(str(k), _FIELDS, n=1)
            problems.append((str(k)[:40], "is not a field of a GPU table row",
                             (f"did you mean {close[0]!r}? " if close else "") + "remove it; the fields are "
                             + ", ".join(_FIELDS)))
    return problems, clocks


def check_spec(doc, source: str = "the GPU spec") -> GPU:
    """Validate a GPU spec document (the fields of a GPU table row) and return its :class:`GPU`.
    Every problem is listed in one MixprecError: the first is its message, the others its details,
    each naming the field and how to fix it."""
    if not isinstance(doc, dict):
        kind = "a JSON list" if isinstance(doc, list) else f"a JSON {type(doc).__name__}"
        raise MixprecError(f"{source} is {kind}, not an object with the fields of a GPU table row",
                           'write one object: {"key": "my-gpu", "name": …, "arch": "ampere", "sm_count": …, '
                           '"fp32_tflops": …} (docs/tensorrt.md, "GPU table")')
    problems, key, name, arch = _identity_problems(doc)
    more, sms, tf32, acc32, acc16, mem = _figure_problems(doc, arch)
    rest_, clocks = _other_problems(doc)
    problems += more + rest_
    if problems:
        (f, what, fix), rest = problems[0], problems[1:]
        raise MixprecError(f"{source}: {f} {what}", fix, details=[f"{f2} {w2} (fix: {x2})" for f2, w2, x2 in rest])
    return GPU(key=key, name=name.strip(), arch=arch, sm_count=int(sms), fp32_tflops=float(doc["fp32_tflops"]),
               tf32_tflops=None if tf32 is None else float(tf32), fp16_tflops=float(acc32),
               fp16_acc16_tflops=float(acc16), int8_tops=float(doc["int8_tops"]),
               bandwidth_gbs=float(doc["bandwidth_gbs"]), memory_gb=float(mem or 0.0),
               halved=tuple(doc.get("halved", ())), derived=tuple(doc.get("derived", ())), **clocks)


def custom_gpu(spec: GPU | dict, source: str = "the GPU spec") -> GPU:
    """A user's GPU (a spec document or a :class:`GPU`), validated, that is not mistaken for a row of
    the table: its key and its name must not be a table row's unless it *is* that row."""
    g = spec if isinstance(spec, GPU) else check_spec(spec, source)
    if isinstance(spec, GPU):
        check_spec(spec.to_json(), source)
    row = GPUS.get(g.key)
    if row is not None and row != g:
        raise MixprecError(f"{source}: key {g.key!r} is the GPU table's row for the {row.name}",
                           f"give your GPU a key of its own (e.g. {g.key}-custom), or use --gpu {g.key}")
    same = next((r for r in GPUS.values() if _norm(r.name) == _norm(g.name) and r != g), None)
    if same is not None:
        raise MixprecError(f"{source}: name {g.name!r} is the name of the GPU table's row {same.key}",
                           f"name it differently (e.g. {g.name} (my clocks)), or use --gpu {same.key}")
    return row if row is not None else g


def load_gpu_spec(path: str | Path) -> GPU:
    """The GPU described by the JSON file ``path`` (``--gpu-spec``): a bad or missing file, bad
    JSON or a field in error is a MixprecError that says what to fix."""
    data = read_user_file(path, "GPU spec", SPEC_MAX_BYTES)
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise MixprecError(f"the GPU spec {path} is not UTF-8 text", "save it as a UTF-8 JSON file") from e
    except ValueError as e:
        where = f" (line {e.lineno}, column {e.colno}: {e.msg})" if hasattr(e, "lineno") else ""
        raise MixprecError(f"the GPU spec {path} is not valid JSON{where}",
                           'fix the JSON: one object with the fields of a GPU table row, e.g. {"key": "my-gpu", '
                           '"name": "…", "arch": "ampere", …} (docs/tensorrt.md, "GPU table")') from e
    return custom_gpu(doc, f"the GPU spec {Path(path).name}")


# --- the table ---------------------------------------------------------------------------------------
_SPARSE_ONLY = ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops")
_TENSOR = ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops")
_TENSOR_PRE_AMPERE = ("fp16_tflops", "fp16_acc16_tflops", "int8_tops")
_FROM_INT8 = ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops")  # derived from a published (sparse) INT8 figure


def _mhz(base: float, boost: float) -> dict:
    """A row's base and boost clocks in MHz (each row's source: docs/tensorrt.md, "GPU table", "Clocks")."""
    return {"base_clock_mhz": float(base), "boost_clock_mhz": float(boost)}


GPUS: dict[str, GPU] = {g.key: g for g in (
    #   key          name                          arch  SMs  FP32  TF32   FP16(acc32) FP16(acc16) INT8  GB/s  GB
    # --- data center -------------------------------------------------------------------------------------
    GPU("v100", "NVIDIA Tesla V100 SXM2", "volta", 80, 15.7, None, 125.0, 125.0, 62.8, 900.0, 32, (), ("int8_tops",),
        **_mhz(1290, 1530)),
    GPU("v100-pcie", "NVIDIA Tesla V100 PCIe", "volta", 80, 14.0, None, 112.0, 112.0, 56.0, 900.0, 32, (),
        ("int8_tops",), **_mhz(1245, 1380)),
    GPU("t4", "NVIDIA T4", "turing", 40, 8.1, None, 65.0, 65.0, 130.0, 320.0, 16, **_mhz(585, 1590)),
    GPU("titanrtx", "NVIDIA TITAN RTX", "turing", 72, 16.3, None, 130.0, 130.0, 261.0, 672.0, 24, **_mhz(1350, 1770)),
    GPU("a10", "NVIDIA A10", "ampere", 72, 31.2, 62.5, 125.0, 125.0, 250.0, 600.0, 24, **_mhz(885, 1695)),
    GPU("a30", "NVIDIA A30", "ampere", 56, 10.3, 82.0, 165.0, 165.0, 330.0, 933.0, 24, **_mhz(930, 1440)),
    GPU("a100", "NVIDIA A100 80GB SXM", "ampere", 108, 19.5, 156.0, 312.0, 312.0, 624.0, 2039.0, 80,
        **_mhz(1275, 1410)),
    GPU("a100-40gb", "NVIDIA A100 40GB SXM", "ampere", 108, 19.5, 156.0, 312.0, 312.0, 624.0, 1555.0, 40,
        **_mhz(1095, 1410)),
    GPU("l4", "NVIDIA L4", "ada", 58, 30.3, 60.0, 121.0, 121.0, 242.5, 300.0, 24, _SPARSE_ONLY, **_mhz(795, 2040)),
    GPU("l40", "NVIDIA L40", "ada", 142, 90.5, 90.5, 181.05, 181.05, 362.0, 864.0, 48, **_mhz(735, 2490)),
    GPU("l40s", "NVIDIA L40S", "ada", 142, 91.6, 183.0, 362.05, 362.05, 733.0, 864.0, 48, **_mhz(1110, 2520)),
    GPU("h100", "NVIDIA H100 SXM", "hopper", 132, 67.0, 494.5, 989.5, 989.5, 1979.0, 3350.0, 80, _SPARSE_ONLY,
        **_mhz(1590, 1980)),
    GPU("h100-pcie", "NVIDIA H100 PCIe", "hopper", 114, 51.0, 378.0, 756.5, 756.5, 1513.0, 2000.0, 80,
        _SPARSE_ONLY, **_mhz(1095, 1755)),
    GPU("h200", "NVIDIA H200 SXM", "hopper", 132, 67.0, 494.5, 989.5, 989.5, 1979.0, 4800.0, 141, _SPARSE_ONLY,
        **_mhz(1590, 1980)),
    # --- GeForce RTX 20 (Turing; FP32 accumulation at half rate) ------------------------------------------
    GPU("rtx2060", "NVIDIA GeForce RTX 2060", "turing", 30, 6.45, None, 25.8, 51.6, 103.2, 336.0, 6, (),
        ("fp32_tflops", *_TENSOR_PRE_AMPERE), **_mhz(1365, 1680)),
    GPU("rtx2070", "NVIDIA GeForce RTX 2070", "turing", 36, 7.46, None, 29.9, 59.7, 119.4, 448.0, 8, (),
        ("fp32_tflops", *_TENSOR_PRE_AMPERE), **_mhz(1410, 1620)),
    GPU("rtx2080", "NVIDIA GeForce RTX 2080", "turing", 46, 10.07, None, 40.3, 80.5, 161.1, 448.0, 8, (),
        ("fp32_tflops", *_TENSOR_PRE_AMPERE), **_mhz(1515, 1710)),
    GPU("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti", "turing", 68, 13.4, None, 53.8, 107.6, 215.2, 616.0, 11,
        **_mhz(1350, 1545)),
    # --- GeForce RTX 30 (Ampere GA10x) -----------------------------------------------------------------
    GPU("rtx3060", "NVIDIA GeForce RTX 3060", "ampere", 28, 12.74, 12.6, 25.25, 50.5, 101.0, 360.0, 12,
        ("fp16_acc16_tflops",), ("fp32_tflops", "tf32_tflops", "fp16_tflops", "int8_tops"), **_mhz(1320, 1777)),
    GPU("rtx3070", "NVIDIA GeForce RTX 3070", "ampere", 46, 20.31, 20.31, 40.6, 81.3, 162.5, 448.0, 8, (),
        ("fp32_tflops", *_TENSOR), **_mhz(1500, 1725)),
    GPU("rtx3080", "NVIDIA GeForce RTX 3080", "ampere", 68, 29.77, 29.77, 59.5, 119.1, 238.1, 760.0, 10, (),
        ("fp32_tflops", *_TENSOR), **_mhz(1440, 1710)),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090", "ampere", 82, 35.6, 35.6, 71.0, 142.0, 284.0, 936.0, 24,
        **_mhz(1395, 1695)),
    GPU("rtx3070-laptop", "NVIDIA GeForce RTX 3070 Laptop GPU", "ampere", 40, 16.59, 16.59, 33.2, 66.4, 132.7,
        448.0, 8, (), ("fp32_tflops", *_TENSOR, "bandwidth_gbs"), **_mhz(1290, 1620)),
    GPU("rtx3080-laptop", "NVIDIA GeForce RTX 3080 Laptop GPU", "ampere", 48, 21.01, 21.01, 42.0, 84.0, 168.1,
        448.0, 16, (), ("fp32_tflops", *_TENSOR, "bandwidth_gbs"), **_mhz(1245, 1710)),
    # --- GeForce RTX 40 (Ada) ------------------------------------------------------------------------------
    GPU("rtx4060", "NVIDIA GeForce RTX 4060", "ada", 24, 15.11, 15.11, 30.2, 60.5, 120.9, 272.0, 8, (),
        ("fp32_tflops", *_TENSOR), **_mhz(1830, 2460)),
    GPU("rtx4070", "NVIDIA GeForce RTX 4070", "ada", 46, 29.15, 29.15, 58.3, 116.6, 233.2, 504.0, 12, (),
        ("fp32_tflops", *_TENSOR), **_mhz(1920, 2475)),
    GPU("rtx4070ti", "NVIDIA GeForce RTX 4070 Ti", "ada", 60, 40.09, 40.09, 80.2, 160.4, 320.7, 504.0, 12, (),
        ("fp32_tflops", *_TENSOR), **_mhz(2310, 2610)),
    GPU("rtx4080", "NVIDIA GeForce RTX 4080", "ada", 76, 48.74, 48.74, 97.5, 194.9, 389.9, 716.8, 16, (),
        ("fp32_tflops", *_TENSOR), **_mhz(2205, 2505)),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090", "ada", 128, 82.6, 82.6, 165.2, 330.3, 660.6, 1008.0, 24,
        **_mhz(2235, 2520)),
    GPU("rtx4050-laptop", "NVIDIA GeForce RTX 4050 Laptop GPU", "ada", 20, 12.13, 12.13, 24.25, 48.5, 97.0,
        192.0, 6, ("int8_tops",), ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(1605, 2370)),
    GPU("rtx4060-laptop", "NVIDIA GeForce RTX 4060 Laptop GPU", "ada", 24, 14.56, 14.56, 29.1, 58.25, 116.5,
        256.0, 8, ("int8_tops",), ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(1470, 2370)),
    GPU("rtx4070-laptop", "NVIDIA GeForce RTX 4070 Laptop GPU", "ada", 36, 20.04, 20.04, 40.1, 80.25, 160.5,
        256.0, 8, ("int8_tops",), ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(1230, 2175)),
    GPU("rtx4080-laptop", "NVIDIA GeForce RTX 4080 Laptop GPU", "ada", 58, 33.85, 33.85, 67.75, 135.5, 271.0,
        432.0, 12, ("int8_tops",), ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(1350, 2280)),
    GPU("rtx4090-laptop", "NVIDIA GeForce RTX 4090 Laptop GPU", "ada", 76, 39.69, 42.9, 85.75, 171.5, 343.0,
        576.0, 16, ("int8_tops",), ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(1455, 2040)),
    # --- Jetson (GPU only; Orin's GA10B has A100-class tensor cores per SM) --------------------------------
    GPU("orin", "NVIDIA Jetson AGX Orin 64GB", "ampere", 16, 5.3, 21.25, 42.5, 42.5, 85.0, 204.8, 64,
        ("int8_tops",), ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops"), **_mhz(1300, 1300)),
    GPU("orin-nx-16gb", "NVIDIA Jetson Orin NX 16GB", "ampere", 8, 1.88, 7.52, 15.04, 15.04, 30.08, 102.4, 16, (),
        ("fp32_tflops", *_TENSOR), **_mhz(918, 918)),
    GPU("orin-nx-8gb", "NVIDIA Jetson Orin NX 8GB", "ampere", 6, 1.18, 4.7, 9.4, 9.4, 18.8, 102.4, 8, (),
        ("fp32_tflops", *_TENSOR), **_mhz(765, 765)),
    GPU("orin-nano-8gb", "NVIDIA Jetson Orin Nano 8GB", "ampere", 8, 1.28, 5.0, 10.0, 10.0, 20.0, 68.0, 8,
        ("int8_tops",), ("fp32_tflops", *_FROM_INT8), **_mhz(625, 625)),
    GPU("orin-nano-4gb", "NVIDIA Jetson Orin Nano 4GB", "ampere", 4, 0.64, 2.5, 5.0, 5.0, 10.0, 34.0, 4, (),
        ("fp32_tflops", *_FROM_INT8, "bandwidth_gbs"), **_mhz(625, 625)),
    GPU("orin-nano-8gb-super", "NVIDIA Jetson Orin Nano 8GB (Super)", "ampere", 8, 2.09, 8.375, 16.75, 16.75,
        33.5, 102.0, 8, ("int8_tops",), ("fp32_tflops", *_FROM_INT8), **_mhz(1020, 1020)),
)}

# the GPU the shipped fit was made on (the A100 fixtures)
FIXTURE_GPU = "a100"


# --- product names -----------------------------------------------------------------------------------
# How a product name (as nvidia-smi, TensorRT or a datasheet prints it) finds its row: every word of
# the name must be one of the row's ``required`` words (all present), one of its ``allowed`` words,
# a memory size the row allows (``memory``: None = any) or a word that names no product (IGNORED).
# A word the row does not account for ("ti", "super", "laptop", "nvl", "a10g", "max-q" …) means
# another product: the name matches no row, and the error names the nearest rows (same ``family``).
IGNORED = frozenset("nvidia tesla geforce gpu jetson graphics card module developer kit founders edition "
                    "tensor core series the hbm2 hbm2e hbm3 hbm3e gddr6 gddr6x lpddr5 nvgpu engineering "
                    "reference".split())
_MEMORY = re.compile(r"\d+gb")


@dataclass(frozen=True)
class _Match:
    family: str                  # the model word the near-miss message groups by (3080, a100, orin)
    required: frozenset
    allowed: frozenset = frozenset()
    memory: frozenset | None = None


def _m(family: str, required: str, allowed: str = "", memory: str | None = None) -> _Match:
    return _Match(family, frozenset(required.split()), frozenset(allowed.split()),
                  None if memory is None else frozenset(memory.split()))


_MATCH: dict[str, _Match] = {
    "v100": _m("v100", "v100", "sxm2", "16gb 32gb"),
    "v100-pcie": _m("v100", "v100 pcie", "", "16gb 32gb"),
    "t4": _m("t4", "t4", "", "16gb"),
    "titanrtx": _m("titan", "titan rtx", "", "24gb"),
    "a10": _m("a10", "a10", "pcie", "24gb"),
    "a30": _m("a30", "a30", "pcie", "24gb"),
    "a100": _m("a100", "a100", "sxm sxm4 pcie", "80gb"),          # no memory size: the 80 GB
    "a100-40gb": _m("a100", "a100 40gb", "sxm sxm4 pcie", "40gb"),
    "l4": _m("l4", "l4", "", "24gb"),
    "l40": _m("l40", "l40", "", "48gb"),
    "l40s": _m("l40s", "l40s", "", "48gb"),
    "h100": _m("h100", "h100", "sxm sxm5", "80gb"),
    "h100-pcie": _m("h100", "h100 pcie", "", "80gb"),
    "h200": _m("h200", "h200", "sxm sxm5", "141gb"),
    "rtx2060": _m("2060", "rtx 2060", "", "6gb"),
    "rtx2070": _m("2070", "rtx 2070", "", "8gb"),
    "rtx2080": _m("2080", "rtx 2080", "", "8gb"),
    "rtx2080ti": _m("2080", "rtx 2080 ti", "", "11gb"),
    "rtx3060": _m("3060", "rtx 3060", "", "12gb"),
    "rtx3070": _m("3070", "rtx 3070", "", "8gb"),
    "rtx3080": _m("3080", "rtx 3080", "", "10gb"),
    "rtx3090": _m("3090", "rtx 3090", "", "24gb"),
    "rtx3070-laptop": _m("3070", "rtx 3070 laptop", "", "8gb"),
    "rtx3080-laptop": _m("3080", "rtx 3080 laptop", "", "8gb 16gb"),
    "rtx4060": _m("4060", "rtx 4060", "", "8gb"),
    "rtx4070": _m("4070", "rtx 4070", "", "12gb"),
    "rtx4070ti": _m("4070", "rtx 4070 ti", "", "12gb"),
    "rtx4080": _m("4080", "rtx 4080", "", "16gb"),
    "rtx4090": _m("4090", "rtx 4090", "", "24gb"),
    "rtx4050-laptop": _m("4050", "rtx 4050 laptop", "", "6gb"),
    "rtx4060-laptop": _m("4060", "rtx 4060 laptop", "", "8gb"),
    "rtx4070-laptop": _m("4070", "rtx 4070 laptop", "", "8gb"),
    "rtx4080-laptop": _m("4080", "rtx 4080 laptop", "", "12gb"),
    "rtx4090-laptop": _m("4090", "rtx 4090 laptop", "", "16gb"),
    "orin": _m("orin", "orin agx 64gb", "", "64gb"),
    "orin-nx-16gb": _m("orin", "orin nx 16gb", "", "16gb"),
    "orin-nx-8gb": _m("orin", "orin nx 8gb", "", "8gb"),
    "orin-nano-8gb": _m("orin", "orin nano 8gb", "", "8gb"),
    "orin-nano-4gb": _m("orin", "orin nano 4gb", "", "4gb"),
    "orin-nano-8gb-super": _m("orin", "orin nano super", "", "8gb"),
}
# whole names that say which row without the words the rows require
_ALIASES = {"jetsonorinnanodeveloperkit": "orin-nano-8gb",  # the developer kit exists in 8 GB only
            "jetsonagxorin64gbdeveloperkit": "orin"}
# names that fit several rows equally (nvidia-smi prints "Orin (nvgpu)" on every Jetson Orin module)
_AMBIGUOUS = {"orin": "nvidia-smi and TensorRT name every Jetson Orin module (AGX, NX, Nano) 'Orin'"}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _words(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    out, i = [], 0
    while i < len(words):  # "Max-Q" is one word
        if words[i] == "max" and i + 1 < len(words) and words[i + 1] == "q":
            out.append("maxq")
            i += 2
            continue
        out.append(words[i])
        i += 1
    return out


def _fits(words: set[str], m: _Match) -> bool:
    if not m.required <= words:
        return False
    for w in words - m.required - m.allowed - IGNORED:
        if not (_MEMORY.fullmatch(w) and (m.memory is None or w in m.memory)):
            return False
    return True


def _label(key: str, g: GPU | None = None) -> str:
    return f"{key} ({(g or GPUS[key]).name})"


def gpu_keys(custom: Mapping[str, GPU] | None = None) -> str:
    """The table's keys (and the user's saved GPUs' keys), for help texts and errors."""
    return ", ".join([*GPUS, *(custom or {})])


def _not_found(name: str, custom: Mapping[str, GPU] | None) -> MixprecError:
    words = set(_words(name)) - IGNORED
    fix = ("describe it with --gpu-spec FILE.json (the fields of a GPU table row; docs/tensorrt.md, \"GPU "
           "table\") or with \"Add a GPU\" on the Precision page; the table's keys: " + gpu_keys(custom))
    if words and words <= set(_AMBIGUOUS) | {"nvgpu"}:
        fam = next(iter(words & set(_AMBIGUOUS)), None)
        if fam:
            rows = [k for k, m in _MATCH.items() if m.family == fam]
            return MixprecError(f"{name!r} fits several rows of the estimate's GPU table: {_AMBIGUOUS[fam]}",
                                "say which with --gpu: " + ", ".join(_label(k) for k in rows))
    near = [k for k, m in _MATCH.items() if m.family in words]
    # rows the name would fit if it said their memory size
    sized = [k for k in near if _fits(set(_words(name)) | {w for w in _MATCH[k].required if _MEMORY.fullmatch(w)},
                                      _MATCH[k])]
    if len(sized) > 1:
        return MixprecError(f"{name!r} fits several rows of the estimate's GPU table (it does not say the memory "
                            f"size)", "say which with --gpu: " + ", ".join(_label(k) for k in sized))
    if sized:
        return MixprecError(f"No row of the estimate's GPU table is the {name!r} without its memory size: the row "
                            f"{_label(sized[0])} is that memory size only", f"use --gpu {sized[0]} if it is yours, "
                            "or " + fix)
    if near:
        return MixprecError(f"No row of the estimate's GPU table is the {name!r}: the nearest rows are other products "
                            f"({', '.join(_label(k) for k in near)}), and an estimate for one of them would be wrong "
                            f"for yours", "use one of those rows if it is yours, or " + fix)
    return MixprecError(f"No GPU named {name!r} in the estimate's GPU table", fix)


def gpu(name: str | GPU, custom: Mapping[str, GPU] | None = None) -> GPU:
    """The table entry named ``name``: a key (``a100``), or a product name as TensorRT or ``nvidia-smi``
    prints it (``NVIDIA A100-SXM4-80GB``, ``Tesla V100-PCIE-32GB``, ``NVIDIA GeForce RTX 3080 Laptop
    GPU``); a :class:`GPU` is returned as is. ``custom``: the user's saved GPUs by key, matched by key or
    exact name before the table. A name that fits no row, or several, is a MixprecError naming the
    nearest rows (never a silent near miss: "RTX 4070 Ti SUPER" is not the "RTX 4070 Ti")."""
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str) or not name.strip():
        raise MixprecError(f"{name!r} is not a GPU name", "give a key of the GPU table: " + gpu_keys(custom))
    want = _norm(name)
    for key, g in (custom or {}).items():
        if want in (_norm(key), _norm(g.name)):
            return g
    for key, g in GPUS.items():
        if want in (_norm(key), _norm(g.name)):
            return g
    alias = _ALIASES.get(want.removeprefix("nvidia"))
    if alias:
        return GPUS[alias]
    words = set(_words(name))
    fits = [k for k, m in _MATCH.items() if _fits(words, m)]
    if fits:
        most = max(len(_MATCH[k].required) for k in fits)
        best = [k for k in fits if len(_MATCH[k].required) == most]
        if len(best) == 1:
            return GPUS[best[0]]
        raise MixprecError(f"{name!r} fits several rows of the estimate's GPU table",
                           "say which with --gpu: " + ", ".join(_label(k) for k in best))
    raise _not_found(name, custom)
