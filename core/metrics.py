"""Quality of a candidate against FP32 on held-out evaluation data."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass(frozen=True)
class Quality:
    cosine_mean: float
    cosine_min: float
    snr_db: float
    max_abs: float
    top1_agreement: float | None  # where the output looks like logits
    knn5_overlap: float | None    # where the output looks like embeddings (rows of a retrieval set)
    samples: int
    top1_accuracy: float | None = None       # with labelled evaluation data
    fp32_top1_accuracy: float | None = None  # FP32's accuracy on the same labels

    def to_dict(self) -> dict:
        """JSON-safe: an infinite SNR (no noise) is stored as "inf", NaN as None."""
        return {k: (None if math.isnan(v) else str(v)) if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, doc: dict) -> "Quality":
        """The quality of :meth:`to_dict` (unknown keys are ignored; "inf" comes back as a float)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) if isinstance(v, str) else v for k, v in doc.items() if k in names})


def _rows(outputs: list[np.ndarray]) -> np.ndarray:
    """Stack per-batch outputs into one row per sample."""
    return np.concatenate([np.asarray(o, dtype=np.float64).reshape(len(o), -1) for o in outputs], axis=0)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.sum(a * b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    return np.where(both_zero, 1.0, dot / np.maximum(na * nb, 1e-30))


def snr_from_sums(signal: float, noise: float) -> float:
    """SNR in dB from the sums of squares of the reference and of the error."""
    if noise == 0:
        return float("inf")
    return 10.0 * np.log10(max(signal, 1e-30) / noise)


def snr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    return snr_from_sums(float(np.sum(ref**2)), float(np.sum((ref - cand) ** 2)))


class StreamingError:
    """Cosine, SNR and max abs error of one tensor against its reference, accumulated sample
    batch by sample batch (sample axis first): the mean of the per-sample cosines
    (:func:`cosine_rows`), the SNR of the summed signal and noise (:func:`snr_from_sums`)."""

    def __init__(self):
        self.cos_sum, self.n, self.signal, self.noise, self.max_abs = 0.0, 0, 0.0, 0.0, 0.0

    def add(self, ref: np.ndarray, cand: np.ndarray):
        r = ref.astype(np.float64).reshape(ref.shape[0] if ref.ndim else 1, -1)
        c = cand.astype(np.float64).reshape(r.shape)
        cos = cosine_rows(r, c)
        self.cos_sum += float(cos.sum())
        self.n += len(cos)
        self.signal += float(np.sum(r * r))
        self.noise += float(np.sum((r - c) ** 2))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(r - c))) if r.size else 0.0)

    @property
    def cosine(self) -> float:
        return self.cos_sum / max(self.n, 1)

    @property
    def snr_db(self) -> float:
        return snr_from_sums(self.signal, self.noise)


def knn_overlap(ref: np.ndarray, cand: np.ndarray, k: int = 5) -> float:
    """Mean overlap of each row's k nearest neighbours (cosine) under ref vs candidate."""
    def nn(x):
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    a, b = nn(ref), nn(cand)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


def looks_like_logits(ref: np.ndarray, name: str = "") -> bool:
    if ref.ndim != 2 or ref.shape[1] < 2 or "embed" in name.lower():
        return False
    return "logit" in name.lower() or not np.allclose(np.linalg.norm(ref, axis=1), 1.0, atol=1e-3)


def looks_like_embeddings(ref: np.ndarray, k: int = 5) -> bool:
    return ref.ndim == 2 and ref.shape[0] > k and ref.shape[1] >= 8


def quality(ref_outputs: list[np.ndarray], cand_outputs: list[np.ndarray], output_name: str = "",
            labels: np.ndarray | None = None) -> Quality:
    """Compare the primary output batch by batch (lists of arrays with the sample axis first);
    with ``labels`` (one class index per sample) also top-1 accuracy of both."""
    ref, cand = _rows(ref_outputs), _rows(cand_outputs)
    cos = cosine_rows(ref, cand)
    logits = looks_like_logits(ref, output_name)
    top1 = float(np.mean(ref.argmax(1) == cand.argmax(1))) if logits else None
    knn = knn_overlap(ref, cand) if looks_like_embeddings(ref) and not logits else None
    acc = ref_acc = None
    if labels is not None and ref.ndim == 2 and ref.shape[1] >= 2:
        labels = np.asarray(labels)[: ref.shape[0]]
        acc, ref_acc = float(np.mean(cand.argmax(1) == labels)), float(np.mean(ref.argmax(1) == labels))
    return Quality(float(cos.mean()), float(cos.min()), snr_db(ref, cand), float(np.max(np.abs(ref - cand))),
                   top1, knn, int(ref.shape[0]), acc, ref_acc)
