"""The GPU table the cost model prices engine layers with: dense peak throughput per math
precision, memory bandwidth and SM count, from NVIDIA's datasheets and architecture whitepapers
(each entry's source and table are listed in docs/tensorrt.md, section "GPU table").

All throughputs are **dense** (no 2:4 structured sparsity): where a datasheet gives only the
sparse figure (marked with an asterisk there), it is halved here and ``halved`` says which.
``fp16_tflops`` is FP16 tensor-core math with FP32 accumulation and ``fp16_acc16_tflops`` with
FP16 accumulation; they differ on GeForce cards (RTX 3090, RTX 4090), where FP32 accumulation runs
at half rate. ``tf32_tflops`` is ``None`` before Ampere (no TF32 tensor cores)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import MixprecError


@dataclass(frozen=True)
class GPU:
    key: str                    # the name used on the command line: a100, t4, …
    name: str                   # the product as NVIDIA names it
    arch: str                   # turing / ampere / ada / hopper
    sm_count: int
    fp32_tflops: float          # non-tensor FP32 (CUDA cores)
    tf32_tflops: float | None   # TF32 tensor cores, dense; None before Ampere
    fp16_tflops: float          # FP16 tensor cores, FP32 accumulate, dense
    fp16_acc16_tflops: float    # FP16 tensor cores, FP16 accumulate, dense
    int8_tops: float            # INT8 tensor cores, dense
    bandwidth_gbs: float        # memory bandwidth, GB/s
    memory_gb: float = 0.0
    halved: tuple[str, ...] = ()  # figures the source gives with sparsity only, halved here
    derived: tuple[str, ...] = ()  # figures the source does not give, derived (docs/tensorrt.md says how)

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
    def from_json(cls, doc: dict) -> GPU:
        return cls(**{**doc, "halved": tuple(doc.get("halved", ())), "derived": tuple(doc.get("derived", ()))})


_SPARSE_ONLY = ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops", "int8_tops")

GPUS: dict[str, GPU] = {g.key: g for g in (
    #   key          name                          arch  SMs  FP32  TF32   FP16(acc32) FP16(acc16) INT8  GB/s  GB
    GPU("t4", "NVIDIA T4", "turing", 40, 8.1, None, 65.0, 65.0, 130.0, 320.0, 16),
    GPU("titanrtx", "NVIDIA TITAN RTX", "turing", 72, 16.3, None, 130.0, 130.0, 261.0, 672.0, 24),
    GPU("a10", "NVIDIA A10", "ampere", 72, 31.2, 62.5, 125.0, 125.0, 250.0, 600.0, 24),
    GPU("a100", "NVIDIA A100 80GB SXM", "ampere", 108, 19.5, 156.0, 312.0, 312.0, 624.0, 2039.0, 80),
    GPU("a100-40gb", "NVIDIA A100 40GB SXM", "ampere", 108, 19.5, 156.0, 312.0, 312.0, 624.0, 1555.0, 40),
    GPU("l4", "NVIDIA L4", "ada", 58, 30.3, 60.0, 121.0, 121.0, 242.5, 300.0, 24, _SPARSE_ONLY),
    GPU("l40s", "NVIDIA L40S", "ada", 142, 91.6, 183.0, 362.05, 362.05, 733.0, 864.0, 48),
    GPU("h100", "NVIDIA H100 SXM", "hopper", 132, 67.0, 494.5, 989.5, 989.5, 1979.0, 3350.0, 80, _SPARSE_ONLY),
    GPU("h100-pcie", "NVIDIA H100 PCIe", "hopper", 114, 51.0, 378.0, 756.5, 756.5, 1513.0, 2000.0, 80,
        _SPARSE_ONLY),
    GPU("rtx3090", "NVIDIA GeForce RTX 3090", "ampere", 82, 35.6, 35.6, 71.0, 142.0, 284.0, 936.0, 24),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090", "ada", 128, 82.6, 82.6, 165.2, 330.3, 660.6, 1008.0, 24),
    GPU("orin", "NVIDIA Jetson AGX Orin 64GB", "ampere", 16, 5.3, 21.25, 42.5, 42.5, 85.0, 204.8, 64,
        ("int8_tops",), ("tf32_tflops", "fp16_tflops", "fp16_acc16_tflops")),
)}

# the GPU the shipped fit was made on (the A100 fixtures)
FIXTURE_GPU = "a100"


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _tokens(text: str) -> set[str]:
    """Words of a product name and each pair of adjacent words joined: "RTX 4090" → rtx4090."""
    words = [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]
    return set(words) | {a + b for a, b in zip(words, words[1:])}


def gpu(name: str | GPU) -> GPU:
    """The table entry named ``name``: a key (``a100``), or a product name as TensorRT or
    ``nvidia-smi`` prints it (``NVIDIA A100-SXM4-80GB``, ``Tesla T4``, ``NVIDIA GeForce RTX 4090``)."""
    if isinstance(name, GPU):
        return name
    want = _norm(str(name))
    for key, g in GPUS.items():
        if want in (_norm(key), _norm(g.name)):
            return g
    tokens = _tokens(str(name))
    for key in ("a100", "h100", "l40s", "l4", "a10", "t4", "rtx3090", "rtx4090", "orin", "titanrtx"):
        if key in tokens:
            if key == "a100" and "40gb" in tokens:
                return GPUS["a100-40gb"]
            if key == "h100" and "pcie" in tokens:
                return GPUS["h100-pcie"]
            return GPUS[key]
    raise MixprecError(f"No GPU named {name!r} in the estimate's GPU table",
                       "use one of: " + ", ".join(GPUS))


def gpu_table() -> list[dict]:
    """The table as rows (for the CLI and the docs)."""
    return [g.to_json() for g in GPUS.values()]
