"""Memory of the layer-wise comparison: its budget (``--max-memory``), the plan of chunks of marked
outputs that fits it, and the peak resident memory a comparison actually reached.

ONNX Runtime keeps every graph output of a run alive until the run ends, fetched or not (measured:
MiniLM at 8 x 256 tokens with all 251 float layer outputs marked peaks at 1.97 GB for a run that
fetches one of them, 0.56 GB with none marked). So a comparison under a budget marks only one chunk
of outputs per session, and runs a session pair per chunk."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from dataclasses import dataclass

from core.errors import MixprecError
from core.model.shapes import memory_budget
from core.workspace import human_bytes

COMPARE_BUDGET_SHARE = 0.5  # of the process's memory budget (core.model.shapes.memory_budget: 80 % of free RAM)
# working memory, in bytes of the largest marked tensor: its float64 copies and temporaries while its
# error is accumulated (core.measure.metrics.StreamingError, ~10), and ONNX Runtime's own activations (~4)
WORKING_COPIES = 14
# a session holds its model's weights about twice (ONNX Runtime pre-packs MatMul weights; measured on
# MiniLM: +168 MiB for 87 MiB of weights) and, while it is created, the serialized model once more
SESSION_COPIES = 3
MMAP_THRESHOLD = 1 << 20  # glibc: allocations from 1 MiB on are mapped, and unmapped when freed
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def parse_memory(text: str | int | float) -> int | float:
    """``4G``, ``512M``, ``1.5GiB``, ``1000000`` → bytes (int); ``40%`` → the fraction 0.4 (float)
    of the default budget's base (the free memory)."""
    if isinstance(text, (int, float)):
        return text
    s = str(text).strip().upper()
    try:
        if s.endswith("%"):
            frac = float(s[:-1]) / 100
            if not 0 < frac <= 1:
                raise ValueError
            return frac
        s = s.removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
        value = int(float(s[:-1] if mult > 1 else s) * mult)
        if value <= 0:
            raise ValueError
        return value
    except ValueError as e:
        raise MixprecError(f"--max-memory {text!r} is not a memory size",
                           "write a size such as 4G or 512M, or a share of the free memory such as 40%") from e


def comparison_budget(max_memory: str | int | float | None = None) -> tuple[int, str]:
    """(bytes the comparison may add to this process, where the number comes from)."""
    base, where = memory_budget()
    value = parse_memory(max_memory) if max_memory is not None else None
    if value is None:
        return int(COMPARE_BUDGET_SHARE * base), f"{int(100 * COMPARE_BUDGET_SHARE)} % of the memory budget ({where})"
    if isinstance(value, float):
        return int(value * base), f"{100 * value:g} % of the memory budget ({where})"
    return int(value), "--max-memory"


@dataclass(frozen=True)
class ChunkPlan:
    """The marked tensors in chunks, and what the plan expects to cost."""

    chunks: list[list[str]]
    budget: int
    fixed: int  # bytes every chunk pays: both sessions' weights, working activations, error accumulation
    largest_chunk: int  # bytes of marked outputs of the largest chunk (both runners)
    note: str = ""


def plan_chunks(marked: list[str], sizes: dict[str, int], weights: int, budget: int) -> ChunkPlan:
    """Pack ``marked`` (in graph order) into as few chunks as fit ``budget``. ``sizes``: bytes of each
    tensor for one sample (unknown → the largest known); ``weights``: bytes of both models. A chunk
    costs twice its tensors (the FP32 outputs are kept while the candidate runs)."""
    known = [v for v in sizes.values() if v > 0]
    biggest = max(known, default=1 << 20)
    size = {t: sizes.get(t) or biggest for t in marked}
    largest = max(size.values(), default=0)
    fixed = weights * SESSION_COPIES + WORKING_COPIES * largest
    room = budget - fixed
    chunks, cur, cur_bytes = [], [], 0
    for t in marked:
        if cur and cur_bytes + 2 * size[t] > room:
            chunks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += 2 * size[t]
    if cur:
        chunks.append(cur)
    worst = max((sum(2 * size[t] for t in c) for c in chunks), default=0)
    note = ""
    if fixed + worst > budget:
        note = (f"the memory budget {human_bytes(budget)} is below what the comparison needs at least "
                f"(~{human_bytes(fixed + worst)}: the two models and one layer's outputs); it compared one "
                "output at a time")
    return ChunkPlan(chunks, budget, fixed, worst, note)


_LIBC: list = []


def _libc():
    if not _LIBC:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            _LIBC.append(lib if lib is not None and hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def bound_heap() -> None:
    """Make freed tensors go back to the OS (glibc; elsewhere nothing): by default glibc raises its
    mmap threshold after the first large free, and later tensor-sized blocks come from a heap that
    keeps its pages, so resident memory creeps up chunk after chunk (measured: +165 MiB against a
    64 MiB budget, +68 MiB with this). Process-wide, once; big blocks are then mapped per allocation."""
    lib = _libc()
    if lib is not None:
        lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def release_memory() -> None:
    """Collect garbage and hand the heap's free pages back to the OS (glibc's malloc_trim)."""
    gc.collect()
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


def rss_bytes() -> int:
    """This process's resident memory now (0 where /proc is missing)."""
    return _status("VmRSS")


def _status(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakMemory:
    """The peak resident memory of this process while the block runs: the kernel's high-water mark
    when the block set a new one (exact), else the highest of samples every 10 ms. ``added``: the
    peak over the resident memory when the block started."""

    def __init__(self, interval: float = 0.01):
        self.interval, self.start, self.peak = interval, 0, 0
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> "PeakMemory":
        self.start = self.peak = rss_bytes()
        self._hwm0 = _status("VmHWM")
        self._thread = threading.Thread(target=self._sample, name="mixprec-peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        hwm = _status("VmHWM")
        self.peak = hwm if hwm > self._hwm0 else max(self.peak, rss_bytes())

    @property
    def added(self) -> int:
        return max(0, self.peak - self.start)
