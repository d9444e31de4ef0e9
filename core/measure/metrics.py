"""Quality of a candidate against FP32 on held-out evaluation data.

Every output gets cosine, SNR and max abs error (one row per sample). Logits get top-1 agreement
with FP32 and the mean KL divergence of their softmax, ``KL(p_fp32 || p_candidate)`` in nats;
embeddings get the overlap of their 5 nearest neighbours. *Vocabulary logits* of a language model
(:func:`looks_like_vocab_logits`: ``[batch, seq, vocab]``) are scored per position: ``top1_agreement``
is next-token top-1 agreement with FP32 over all positions, ``kl_div`` the mean over positions,
and with labels (``[batch, seq]`` next-token ids, negative = not scored) ``perplexity`` and
``fp32_perplexity`` are exp(mean negative log-likelihood of the labels) and ``top1_accuracy`` the
next-token accuracy. These are computed batch by batch (float64 per batch, never all at once)."""
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
    kl_div: float | None = None              # logits: mean KL(softmax FP32 || softmax candidate), nats
    perplexity: float | None = None          # vocabulary logits with next-token labels
    fp32_perplexity: float | None = None     # FP32's perplexity on the same labels
    # issue 22 §3 (core.measure.evaluation): what the numbers above are of, the task metrics, the user metric
    output: str | None = None          # the metric output (a graph output, or a named slice); None: the first float output
    task: str | None = None            # "classification", "dense", "detection" (None: none recognised)
    mask_iou: float | None = None      # dense: mean IoU of the thresholded maps, FP32 vs candidate
    mask_iou_min: float | None = None
    map_cosine_mean: float | None = None  # dense: cosine over the samples whose FP32 map is not near-empty
    empty_maps: int | None = None      # dense: samples whose FP32 map is near-empty (scored by IoU only)
    score_cosine: float | None = None  # detection: mean per-sample cosine of the score channels
    score_topk: float | None = None    # detection: overlap of the top-k boxes by score, FP32 vs candidate
    box_iou: float | None = None       # detection: mean IoU of FP32's top-k boxes with their matched candidate boxes
    user: float | None = None          # the user metric (--metric-file), higher is better
    outputs: dict | None = None        # metric output name -> its Quality (every --metric-output)

    def to_dict(self) -> dict:
        """JSON-safe: an infinite SNR (no noise) is stored as "inf", NaN as None; ``outputs`` as
        their own documents."""
        doc = {k: (None if math.isnan(v) else str(v)) if isinstance(v, float) and not math.isfinite(v) else v
               for k, v in asdict(self).items() if k != "outputs"}
        doc["outputs"] = None if self.outputs is None else {k: q.to_dict() for k, q in self.outputs.items()}
        return doc

    @classmethod
    def from_dict(cls, doc: dict) -> "Quality":
        """The quality of :meth:`to_dict` (unknown keys are ignored, missing ones are None; "inf" comes
        back as a float)."""
        names = {f.name for f in fields(cls)} - {"outputs"}
        kw = {k: float(v) if isinstance(v, str) and k not in ("output", "task") else v
              for k, v in doc.items() if k in names}
        kw.update({k: None for k in ("top1_agreement", "knn5_overlap") if k not in kw})
        outs = doc.get("outputs")
        return cls(**kw, outputs=None if not isinstance(outs, dict) else
                   {str(k): cls.from_dict(v) for k, v in outs.items()})


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


CHUNK_BYTES = 64 << 20  # float64 working set of one step of the metrics (a few samples or positions)
VOCAB_MIN = 1000  # a [batch, seq, N] output not named like logits counts as vocabulary logits from this N


def looks_like_vocab_logits(ref: np.ndarray, name: str = "") -> bool:
    """Per-position logits of a language model: ``[batch, seq, vocab]`` named like ``logits``, or
    (unnamed) at least :data:`VOCAB_MIN` wide; never an output named like hidden states or embeddings."""
    lname = name.lower()
    if ref.ndim != 3 or ref.shape[-1] < 2 or any(w in lname for w in ("hidden", "embed", "state")):
        return False
    return "logit" in lname or ref.shape[-1] >= VOCAB_MIN


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_rows(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(cand)) in nats over the last axis, one value per row/position."""
    lp, lq = log_softmax(ref_logits), log_softmax(cand_logits)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def _nll(logp: np.ndarray, labels: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of the scored labels."""
    return -np.take_along_axis(logp, np.where(scored, labels, 0)[..., None], axis=-1)[..., 0][scored]


def _ppl(mean_nll: float) -> float:
    """exp(mean NLL); inf past float64's range, NaN stays NaN."""
    return math.exp(mean_nll) if mean_nll < 709.0 else (mean_nll if math.isnan(mean_nll) else float("inf"))


class TokenMetrics:
    """Next-token metrics of vocabulary logits, accumulated batch by batch (module docstring)."""

    def __init__(self):
        self.kl, self.agree, self.tokens = 0.0, 0, 0
        self.nll_ref, self.nll_cand, self.right_ref, self.right_cand, self.scored = 0.0, 0.0, 0, 0, 0

    def add(self, ref: np.ndarray, cand: np.ndarray, labels: np.ndarray | None = None):
        """One batch ``[batch, seq, vocab]`` (labels ``[batch, seq]``), a few positions at a time: the
        float64 softmax of a whole batch of a 151,936-wide vocabulary would be gigabytes."""
        v = ref.shape[-1]
        r2, c2 = np.asarray(ref).reshape(-1, v), np.asarray(cand).reshape(-1, v)
        l2 = None if labels is None else np.asarray(labels, np.int64).reshape(-1)
        step = max(1, CHUNK_BYTES // (8 * v))
        for i in range(0, len(r2), step):
            self._add(r2[i:i + step], c2[i:i + step], None if l2 is None else l2[i:i + step])

    def _add(self, ref: np.ndarray, cand: np.ndarray, labels: np.ndarray | None):
        lp, lq = log_softmax(ref), log_softmax(cand)
        self.kl += float(np.sum(np.exp(lp) * (lp - lq)))
        top_ref, top_cand = lp.argmax(-1), lq.argmax(-1)
        self.agree += int(np.sum(top_ref == top_cand))
        self.tokens += int(top_ref.size)
        if labels is not None:
            scored = (labels >= 0) & (labels < lp.shape[-1])
            self.nll_ref += float(_nll(lp, labels, scored).sum())
            self.nll_cand += float(_nll(lq, labels, scored).sum())
            self.right_ref += int(np.sum((top_ref == labels) & scored))
            self.right_cand += int(np.sum((top_cand == labels) & scored))
            self.scored += int(scored.sum())

    def fields(self) -> dict:
        """The Quality fields these metrics fill."""
        out = {"top1_agreement": self.agree / max(self.tokens, 1), "kl_div": self.kl / max(self.tokens, 1)}
        if self.scored:
            out.update(perplexity=_ppl(self.nll_cand / self.scored), fp32_perplexity=_ppl(self.nll_ref / self.scored),
                       top1_accuracy=self.right_cand / self.scored, fp32_top1_accuracy=self.right_ref / self.scored)
        return out


def token_metrics(ref_outputs: list[np.ndarray], cand_outputs: list[np.ndarray],
                  labels: np.ndarray | None = None) -> dict:
    """:class:`TokenMetrics` over per-batch ``[batch, seq, vocab]`` outputs; ``labels`` [samples, seq]
    next-token ids (negative: not scored) are used when they fit the outputs, else ignored."""
    acc, start = TokenMetrics(), 0
    n = sum(len(r) for r in ref_outputs)
    fits = labels is not None and np.ndim(labels) == 2 and len(labels) >= n \
        and all(np.shape(labels)[1] == np.shape(r)[1] for r in ref_outputs)
    for r, c in zip(ref_outputs, cand_outputs):
        acc.add(r, c, np.asarray(labels)[start:start + len(r)] if fits else None)
        start += len(r)
    return acc.fields()


class _RowStats:
    """Per-row sums of a batch of flattened outputs (dot product, squared norms, argmax) and the
    batch's signal, noise and max abs error, taken in float64 blocks of at most CHUNK_BYTES: rows of
    a few samples, or column blocks of one sample's row when a row alone is larger."""

    def __init__(self, r: np.ndarray, c: np.ndarray):
        n, width = r.shape
        self.dot, self.nr2, self.nc2 = np.zeros(n), np.zeros(n), np.zeros(n)
        self.top_r, self.top_c = np.zeros(n, np.int64), np.zeros(n, np.int64)
        best_r, best_c = np.full(n, -np.inf), np.full(n, -np.inf)
        self.signal = self.noise = self.max_abs = 0.0
        items = max(1, CHUNK_BYTES // 8)
        rows = max(1, items // max(width, 1))
        cols = width if rows > 1 else min(width, items)
        for i in range(0, n, rows):
            for k in range(0, width, max(cols, 1)):
                a = r[i:i + rows, k:k + cols].astype(np.float64)
                b = c[i:i + rows, k:k + cols].astype(np.float64)
                d = a - b
                self.dot[i:i + rows] += np.einsum("ij,ij->i", a, b)
                self.nr2[i:i + rows] += np.einsum("ij,ij->i", a, a)
                self.nc2[i:i + rows] += np.einsum("ij,ij->i", b, b)
                self.signal += float(np.einsum("ij,ij->", a, a))
                self.noise += float(np.einsum("ij,ij->", d, d))
                if d.size:
                    self.max_abs = max(self.max_abs, float(np.max(np.abs(d))))
                    for x, best, top in ((a, best_r, self.top_r), (b, best_c, self.top_c)):
                        j = x.argmax(1)
                        v = x[np.arange(len(x)), j]
                        better = v > best[i:i + rows]
                        best[i:i + rows][better] = v[better]
                        top[i:i + rows][better] = j[better] + k

    def cosine(self) -> np.ndarray:
        """:func:`cosine_rows` of the rows."""
        na, nb = np.sqrt(self.nr2), np.sqrt(self.nc2)
        both_zero = (na == 0) & (nb == 0)
        return np.where(both_zero, 1.0, self.dot / np.maximum(na * nb, 1e-30))


def quality(ref_outputs: list[np.ndarray], cand_outputs: list[np.ndarray], output_name: str = "",
            labels: np.ndarray | None = None) -> Quality:
    """Compare the primary output batch by batch (lists of arrays with the sample axis first);
    with ``labels`` (one class index per sample; for vocabulary logits, next-token ids per
    position) also top-1 accuracy of both, and perplexity of both for vocabulary logits.
    Computed a few samples at a time (float64 chunks of at most CHUNK_BYTES), never on float64
    copies of every output at once."""
    first = np.asarray(ref_outputs[0]) if ref_outputs else np.zeros((0, 0), np.float32)
    vocab = bool(ref_outputs) and looks_like_vocab_logits(first, output_name)
    raw2d = first.ndim == 2
    cos, norms, top_ref, top_cand, kl = [], [], [], [], []
    signal = noise = max_abs = 0.0
    width = 0
    for r_b, c_b in zip(ref_outputs, cand_outputs):
        r_b, c_b = np.asarray(r_b), np.asarray(c_b)
        flat_r, flat_c = r_b.reshape(len(r_b), -1), c_b.reshape(len(r_b), -1)
        width = flat_r.shape[1]
        st = _RowStats(flat_r, flat_c)
        cos.append(st.cosine())
        norms.append(np.sqrt(st.nr2))
        signal, noise, max_abs = signal + st.signal, noise + st.noise, max(max_abs, st.max_abs)
        top_ref.append(st.top_r)
        top_cand.append(st.top_c)
        if raw2d and width >= 2:
            step = max(1, CHUNK_BYTES // (8 * width))
            kl += [kl_rows(flat_r[i:i + step], flat_c[i:i + step]) for i in range(0, len(flat_r), step)]
    cos_all = np.concatenate(cos) if cos else np.zeros(0)
    rows = len(cos_all)
    lname = output_name.lower()
    logits = width >= 2 and "embed" not in lname and (
        "logit" in lname or not np.allclose(np.concatenate(norms), 1.0, atol=1e-3))
    agree = np.concatenate(top_ref) == np.concatenate(top_cand) if top_ref else np.zeros(0, bool)
    top1 = float(np.mean(agree)) if logits else None
    knn = None
    if rows > 5 and width >= 8 and not (logits or vocab):  # unit-norm rows: embeddings of a retrieval set
        knn = knn_overlap(_rows(ref_outputs), _rows(cand_outputs))
    extra: dict = {}
    acc = ref_acc = None
    if vocab:
        extra = token_metrics(ref_outputs, cand_outputs, labels)
        top1, acc, ref_acc = extra.pop("top1_agreement"), extra.pop("top1_accuracy", None), \
            extra.pop("fp32_top1_accuracy", None)
    elif logits and raw2d:  # classifier logits [batch, classes]
        extra = {"kl_div": float(np.concatenate(kl).mean())}
    if labels is not None and not vocab and width >= 2 and np.ndim(labels) == 1:
        labels = np.asarray(labels)[:rows]
        ref_top, cand_top = np.concatenate(top_ref), np.concatenate(top_cand)
        acc, ref_acc = float(np.mean(cand_top == labels)), float(np.mean(ref_top == labels))
    return Quality(float(cos_all.mean()), float(cos_all.min()), snr_from_sums(signal, noise), max_abs,
                   top1, knn, rows, acc, ref_acc, **extra)
