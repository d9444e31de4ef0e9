"""Quality per output, per named slice of an output, per task, and by the user's own metric (issue 22 §3).

A :class:`MetricSpec` says what quality is measured on:

* **metric outputs** (``--metric-output``, repeatable): ``OUTPUT`` (a graph output) or
  ``NAME=OUTPUT[...,A:B]`` (a named slice of the output's last axis, e.g. ``scores=output[...,4:]``
  for a detector's score channels). Every metric of :func:`core.measure.metrics.quality` is computed
  for each one; the first is the headline (the top-level numbers of the :class:`Quality`, what
  ``--warn-below`` and an unprefixed budget read), and all of them are in ``Quality.outputs`` by name.
  A budget addresses one with ``NAME:METRIC``, e.g. ``--budget 'scores:cosine_mean>=0.99'``.
  Without any, quality is measured on the model's first float output, as it always was.
* **the task** (``--task classification|dense|detection|auto``; auto: from the output's shape and values,
  :func:`detect_task`):

  - ``classification``: top-1 agreement with FP32 (and top-1 accuracy with labels) — the headline;
  - ``dense`` (probability maps ``[b, H, W]`` / ``[b, ≤4, H, W]`` in [0, 1]): ``mask_iou``, the IoU of the
    maps thresholded at ``threshold`` (default 0.5; DBNet's binarisation uses 0.3: ``--map-threshold 0.3``),
    FP32 vs candidate, per sample (both empty: 1); a sample whose FP32 map is near-empty (under 0.1 % of
    its pixels above the threshold) is scored by its IoU and left out of ``map_cosine_mean``;
  - ``detection`` (``[b, boxes, 4 + scores]``: channels 0-3 the box, the rest scores in [0, 1]):
    ``score_cosine`` (per-sample cosine of the score channels), ``score_topk`` (overlap of the top-k boxes
    by score, FP32 vs candidate; a box's score is the maximum of its score channels) and ``box_iou`` (mean IoU
    of FP32's top-k boxes with the candidate's top-k, matched one to one greedily by IoU; an unmatched
    box counts 0). Boxes are ``cxcywh`` (default) or ``xyxy``. The score channels are the metric
    output's slice when it is one starting at channel 4 or later, else channels 4 and up.

  ``top1_agreement``, ``kl_div`` and ``knn5_overlap`` are left out for dense and detection heads.
* **a user metric** (``--metric-file FILE``): ``def score(reference: dict, candidate: dict, inputs: dict) ->
  float``, higher is better. It is called **once per evaluation, on the whole evaluation set**: ``reference`` and
  ``candidate`` map every float output of the model to its array over all samples (the per-batch outputs
  concatenated along axis 0, the sample axis), ``inputs`` every model input the same way. It runs where
  quality is computed: the build's process (a job's child process, never the dashboard's server) and the trial
  workers. Its value is ``Quality.user``, a budget as ``user>=VALUE``. Its errors (a syntax error, an
  exception, a return value that is not a finite number) are a MixprecError whose details are the user's own
  traceback lines (frames of that file only), labelled as the user's code.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from core.errors import MixprecError
from core.measure.metrics import VOCAB_MIN, Quality, cosine_rows, looks_like_logits, looks_like_vocab_logits, quality

TASKS = ("auto", "classification", "dense", "detection", "none")
BOX_FORMATS = ("cxcywh", "xyxy")
DEFAULT_THRESHOLD = 0.5
DEFAULT_TOP_K = 10
EMPTY_FRACTION = 1e-3  # a dense map with fewer of its pixels above the threshold is near-empty
METRIC_OUTPUT_FORM = "OUTPUT or NAME=OUTPUT[...,A:B] (a slice of the last axis), e.g. 'scores=output[...,4:]'"
_SPEC = re.compile(r"\s*(?:(?P<name>[A-Za-z_][\w.-]*)\s*=\s*)?(?P<out>[^\[\]=]+?)\s*"
                   r"(?:\[\s*(?:\.\.\.\s*,\s*)?(?P<a>-?\d*)\s*:\s*(?P<b>-?\d*)\s*\])?\s*")


@dataclass(frozen=True)
class MetricOutput:
    """A graph output, or a slice ``[..., start:stop]`` of its last axis, under a name."""

    name: str
    output: str
    start: int | None = None
    stop: int | None = None

    @classmethod
    def parse(cls, text: str) -> "MetricOutput":
        m = _SPEC.fullmatch(text or "")
        if not m or not m["out"].strip():
            raise MixprecError(f"cannot read the metric output {text!r}", f"write {METRIC_OUTPUT_FORM}")
        sliced = "[" in text
        a = int(m["a"]) if m["a"] not in (None, "") else None
        b = int(m["b"]) if m["b"] not in (None, "") else None
        out = m["out"].strip()
        if sliced and a is None and b is None:
            sliced = False
        name = m["name"] or (f"{out}[...,{'' if a is None else a}:{'' if b is None else b}]" if sliced else out)
        return cls(name, out, a, b)

    @property
    def sliced(self) -> bool:
        return self.start is not None or self.stop is not None

    @property
    def label(self) -> str:
        """``scores (output[..., 4:])`` / ``logits``."""
        if not self.sliced:
            return self.name
        part = f"{self.output}[..., {'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}]"
        return part if self.name == part.replace(" ", "") else f"{self.name} ({part})"

    def take(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return a[..., self.start:self.stop] if self.sliced else a


@dataclass(frozen=True)
class MetricSpec:
    """What quality is measured on (the module's docstring). The default — no metric outputs, ``auto``
    task, no user metric — measures the first float output, as mixprec always did."""

    outputs: tuple = ()  # MetricOutput, the first one the headline
    task: str = "auto"
    threshold: float = DEFAULT_THRESHOLD  # dense: the map threshold
    box_format: str = "cxcywh"            # detection: channels 0-3
    top_k: int = DEFAULT_TOP_K            # detection: boxes compared
    metric_file: str | None = None        # the user metric (its absolute path)

    def __post_init__(self):
        outs = tuple(MetricOutput.parse(o) if isinstance(o, str) else
                     MetricOutput(**o) if isinstance(o, dict) else o for o in self.outputs)
        object.__setattr__(self, "outputs", outs)
        if self.task not in TASKS:
            raise MixprecError(f"unknown task {self.task!r}", f"use one of {', '.join(TASKS)}")
        if self.box_format not in BOX_FORMATS:
            raise MixprecError(f"unknown box format {self.box_format!r}", f"use one of {', '.join(BOX_FORMATS)}")
        if not 0 < int(self.top_k):
            raise MixprecError(f"--top-boxes {self.top_k} is not a positive count", "give at least 1")
        if not math.isfinite(float(self.threshold)):
            raise MixprecError(f"the map threshold {self.threshold} is not a number", "give e.g. 0.5 or 0.3")
        names = [o.name for o in outs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MixprecError(f"the metric output name {dup[0]!r} is given twice", "give each slice its own NAME=")
        if self.metric_file:
            object.__setattr__(self, "metric_file", str(Path(self.metric_file).expanduser().resolve()))

    @property
    def is_default(self) -> bool:
        return self == MetricSpec()

    def to_json(self) -> dict:
        return {"outputs": [asdict(o) for o in self.outputs], "task": self.task, "threshold": float(self.threshold),
                "box_format": self.box_format, "top_k": int(self.top_k), "metric_file": self.metric_file}

    @classmethod
    def from_json(cls, doc: dict | None) -> "MetricSpec":
        if not doc:
            return cls()
        return cls(tuple(doc.get("outputs") or ()), str(doc.get("task", "auto")),
                   float(doc.get("threshold", DEFAULT_THRESHOLD)), str(doc.get("box_format", "cxcywh")),
                   int(doc.get("top_k", DEFAULT_TOP_K)), doc.get("metric_file"))

    @property
    def key(self) -> str:
        """A short key of the spec for cache keys ("" for the default; the user metric file by its content)."""
        if self.is_default:
            return ""
        doc = self.to_json()
        if self.metric_file:
            try:
                doc["metric_file"] = hashlib.sha256(Path(self.metric_file).read_bytes()).hexdigest()
            except OSError:
                pass
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def needed_outputs(self, model_outputs: list[str], float_outputs: list[str]) -> list[str]:
        """The graph outputs quality reads, the headline's first: the metric outputs' (default: the first float
        output) and, with a user metric, every float output."""
        names = [o.output for o in self.outputs] or float_outputs[:1]
        unknown = [n for n in names if n not in model_outputs]
        if unknown:
            raise MixprecError(f"the model has no output {unknown[0]!r}",
                               f"name one of its outputs: {', '.join(model_outputs)}")
        if self.metric_file:
            names += float_outputs
        return list(dict.fromkeys(names))


def spec_for(spec: "MetricSpec | None") -> MetricSpec:
    return spec if spec is not None else MetricSpec()


def project_outputs(project, spec: "MetricSpec | None") -> list[str]:
    """The graph outputs quality reads for ``project`` under ``spec`` (:meth:`MetricSpec.needed_outputs`)."""
    outs = project.model.outputs
    return spec_for(spec).needed_outputs([o.name for o in outs], [o.name for o in outs if o.is_float])


# --- tasks ---------------------------------------------------------------------------------------
def _looks_like_detection(ref: np.ndarray, name: str) -> bool:
    """``[batch, boxes, 4 + scores]`` with scores in [0, 1], non-negative w/h (or x2, y2) and many more boxes
    than channels: a decoded detector head (YOLOX: ``[b, 8400, 85]``)."""
    lname = name.lower()
    if ref.ndim != 3 or not 5 <= ref.shape[-1] < VOCAB_MIN or any(w in lname for w in ("hidden", "embed", "state")):
        return False
    if ref.shape[1] < 4 * ref.shape[-1] or not ref.size:
        return False
    scores = ref[..., 4:]
    return bool(np.all(ref[..., 2:4] >= 0) and scores.min() >= 0 and scores.max() <= 1)


def _looks_like_dense(ref: np.ndarray) -> bool:
    """A probability map: ``[b, H, W]`` or ``[b, C<=4, H, W]`` with H, W >= 8 and values in [0, 1]."""
    if ref.ndim == 4 and ref.shape[1] <= 4:
        hw = ref.shape[2:]
    elif ref.ndim == 3:
        hw = ref.shape[1:]
    else:
        return False
    return min(hw) >= 8 and ref.size > 0 and float(ref.min()) >= 0 and float(ref.max()) <= 1


def detect_task(ref: np.ndarray, name: str = "") -> str | None:
    """The task an output says it is (first batch of the whole graph output): classification for logits
    (``[b, classes]`` or vocabulary logits), detection, dense, else None."""
    ref = np.asarray(ref)
    if looks_like_vocab_logits(ref, name) or looks_like_logits(ref, name):
        return "classification"
    if _looks_like_detection(ref, name):
        return "detection"
    if _looks_like_dense(ref):
        return "dense"
    return None


def dense_metrics(ref: list, cand: list, threshold: float) -> dict:
    """mask_iou (mean and min over samples), map_cosine_mean over the samples whose FP32 map is not
    near-empty (None when all are), empty_maps."""
    ious, cos, empty = [], [], []
    for r, c in zip(ref, cand):
        r = np.asarray(r, np.float64).reshape(len(r), -1)
        c = np.asarray(c, np.float64).reshape(r.shape)
        mr, mc = r > threshold, c > threshold
        inter, union = (mr & mc).sum(1), (mr | mc).sum(1)
        ious.append(np.where(union == 0, 1.0, inter / np.maximum(union, 1)))
        cos.append(cosine_rows(r, c))
        empty.append(mr.mean(1) < EMPTY_FRACTION)
    iou, cs, em = np.concatenate(ious), np.concatenate(cos), np.concatenate(empty)
    return {"mask_iou": float(iou.mean()), "mask_iou_min": float(iou.min()),
            "map_cosine_mean": float(cs[~em].mean()) if (~em).any() else None, "empty_maps": int(em.sum())}


def _xyxy(b: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "xyxy":
        return b
    cx, cy, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


def box_iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` with every box of ``b`` (both ``[n, 4]`` x1, y1, x2, y2)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def matched_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over the boxes of ``a`` of the IoU with their match in ``b`` (one to one, greedily by IoU; unmatched: 0)."""
    if not len(a):
        return 1.0
    m = box_iou_matrix(a, b).copy()
    total = 0.0
    for _ in range(min(len(a), len(b))):
        i, j = np.unravel_index(np.argmax(m), m.shape)
        if m[i, j] <= 0:
            break
        total += m[i, j]
        m[i, :], m[:, j] = -1, -1
    return total / len(a)


def detection_metrics(ref: list, cand: list, scores: tuple, box_format: str, k: int) -> dict:
    """score_cosine, score_topk and box_iou (the module's docstring) of ``[b, boxes, channels]`` outputs;
    ``scores``: the (start, stop) of the score channels."""
    s0, s1 = scores
    cos, agree, ious = [], [], []
    for r, c in zip(ref, cand):
        r, c = np.asarray(r, np.float64), np.asarray(c, np.float64)
        rs, cs = r[..., s0:s1], c[..., s0:s1]
        if rs.shape[-1] == 0:
            raise MixprecError(f"the detection head has no score channels at [..., {s0}:{s1}] (it has "
                               f"{r.shape[-1]} channels)", "slice the score channels, e.g. 'scores=output[...,4:]'")
        cos.append(cosine_rows(rs.reshape(len(rs), -1), cs.reshape(len(cs), -1)))
        sr, sc = rs.max(-1), cs.max(-1)
        kk = min(k, r.shape[1])
        for i in range(len(r)):
            tr = np.argsort(-sr[i], kind="stable")[:kk]
            tc = np.argsort(-sc[i], kind="stable")[:kk]
            agree.append(len(set(tr.tolist()) & set(tc.tolist())) / kk)
            ious.append(matched_iou(_xyxy(r[i, tr, :4], box_format), _xyxy(c[i, tc, :4], box_format)))
    return {"score_cosine": float(np.concatenate(cos).mean()), "score_topk": float(np.mean(agree)),
            "box_iou": float(np.mean(ious))}


def _score_channels(mo: MetricOutput) -> tuple:
    if mo.sliced and mo.start is not None and mo.start >= 4:
        return mo.start, mo.stop
    return 4, None


def output_quality(spec: MetricSpec, mo: MetricOutput, ref: list, cand: list, labels=None) -> Quality:
    """Every metric of one metric output (its slice of the graph output's per-batch arrays), with its task's."""
    r, c = [mo.take(a) for a in ref], [mo.take(a) for a in cand]
    if r and r[0].size == 0:
        raise MixprecError(f"the metric output {mo.label} is empty (the output {mo.output!r} has shape "
                           f"{list(np.shape(ref[0]))})", "slice channels the output has")
    q = quality(r, c, mo.output, labels)
    task = spec.task if spec.task != "auto" else (detect_task(np.asarray(ref[0]), mo.output) if ref else None)
    if task == "none":
        task = None
    extra: dict = {}
    if task == "dense":
        extra = dense_metrics(r, c, float(spec.threshold))
    elif task == "detection":
        if np.ndim(ref[0]) != 3 or np.shape(ref[0])[-1] < 5:
            raise MixprecError(f"the output {mo.output!r} of shape {list(np.shape(ref[0]))} is not a detection head",
                               "detection needs [batch, boxes, 4 + scores]; use --task auto, dense or classification")
        extra = detection_metrics(ref, cand, _score_channels(mo), spec.box_format, int(spec.top_k))
    if task in ("dense", "detection"):  # a map's or a head's argmax is no class
        extra.update(top1_agreement=None, kl_div=None, knn5_overlap=None, top1_accuracy=None, fp32_top1_accuracy=None)
    return replace(q, task=task, **extra)


# --- the user's metric ---------------------------------------------------------------------------
_USER: dict = {}  # path -> (stamp, score function): loaded once per process and file version


def user_error(path: str, exc: BaseException, what: str) -> MixprecError:
    """A MixprecError for the user's metric file whose details are the user's traceback: the frames in that file
    and the exception, never mixprec's."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    lines = [f"user code {path}: Traceback (most recent call last)"]
    lines += [ln.rstrip() for ln in traceback.format_list(frames) for ln in ln.splitlines()]
    lines += [ln.rstrip() for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
    return MixprecError(f"the metric file {path} {what}: {type(exc).__name__}: {exc}".rstrip(": "),
                        "fix your metric file (the details are your code's traceback, not mixprec's)", details=lines)


def load_user_metric(path: str):
    """The ``score`` function of the user's metric file (MixprecError with the user's traceback on failure)."""
    p = Path(path)
    try:
        stamp = (p.stat().st_mtime_ns, p.stat().st_size)
        if _USER.get(path, (None,))[0] == stamp:
            return _USER[path][1]
        src = p.read_text()
    except OSError as e:
        raise MixprecError(f"cannot read the metric file {path}: {e.strerror or e}",
                           "give a readable Python file with def score(reference, candidate, inputs)") from e
    try:
        code = compile(src, path, "exec")
    except SyntaxError as e:
        raise user_error(path, e, "has a syntax error") from None
    ns = {"__name__": "mixprec_user_metric", "__file__": path}
    try:
        exec(code, ns)  # noqa: S102 - the user's own metric, run in the job's process
    except Exception as e:  # noqa: BLE001 - the user's code: any exception is theirs
        raise user_error(path, e, "failed while loading") from None
    fn = ns.get("score")
    if not callable(fn):
        raise MixprecError(f"the metric file {path} defines no function score",
                           "define def score(reference: dict, candidate: dict, inputs: dict) -> float")
    _USER[path] = (stamp, fn)
    return fn


def _whole(batches: list) -> np.ndarray:
    return np.concatenate([np.asarray(b) for b in batches], axis=0) if len(batches) > 1 else np.asarray(batches[0])


def user_score(path: str, ref: dict, cand: dict, batches: list | None) -> float:
    """The user metric on the whole evaluation set (the module's docstring)."""
    fn = load_user_metric(path)
    inputs = {k: _whole([b[k] for b in batches]) for k in (batches[0] if batches else {})}
    try:
        v = fn({k: _whole(v) for k, v in ref.items()}, {k: _whole(v) for k, v in cand.items()}, inputs)
    except Exception as e:  # noqa: BLE001 - the user's code
        raise user_error(path, e, "raised an exception in score()") from None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) and \
            not (isinstance(v, np.ndarray) and v.ndim == 0 and np.issubdtype(v.dtype, np.number)):
        raise MixprecError(f"the metric file {path}: score() returned {type(v).__name__} {str(v)[:80]!r}, not a number",
                           "return one float, higher is better")
    v = float(v)
    if not math.isfinite(v):
        raise MixprecError(f"the metric file {path}: score() returned {v}", "return a finite float, higher is better")
    return v


# --- all of it -----------------------------------------------------------------------------------
def evaluate(spec: MetricSpec | None, ref: dict, cand: dict, labels=None, batches: list | None = None) -> Quality:
    """The quality of a candidate under ``spec``: ``ref`` / ``cand`` map graph outputs (at least
    :func:`project_outputs`'s, the headline's first) to their per-batch arrays; ``batches`` are the evaluation
    batches (the user metric's inputs). The top-level numbers are the first metric output's (default: the first
    output of ``ref``, and then ``output`` and ``outputs`` are None, as results were before)."""
    spec = spec_for(spec)
    first = next(iter(ref))
    mos = spec.outputs or (MetricOutput(first, first),)
    per = {mo.name: output_quality(spec, mo, ref[mo.output], cand[mo.output], labels) for mo in mos}
    head = per[mos[0].name]
    if spec.outputs:
        per = {k: replace(q, output=k) for k, q in per.items()}
        head = replace(per[mos[0].name], outputs=per)
    if spec.metric_file:
        head = replace(head, user=user_score(spec.metric_file, ref, cand, batches))
    return head


def headline(q: Quality) -> list[tuple[str, str, float]]:
    """The numbers that say the most about ``q`` for its task, first first: (label, field, value)."""
    rows = []
    if q.user is not None:
        rows.append(("user metric", "user", q.user))
    if q.task == "classification" and q.top1_agreement is not None:
        rows.append(("top-1 agreement", "top1_agreement", q.top1_agreement))
        if q.top1_accuracy is not None:
            rows.append(("top-1 accuracy", "top1_accuracy", q.top1_accuracy))
            rows.append(("FP32 top-1 accuracy", "fp32_top1_accuracy", q.fp32_top1_accuracy))
    elif q.task == "dense":
        rows.append(("mask IoU", "mask_iou", q.mask_iou))
        if q.map_cosine_mean is not None:
            rows.append(("cosine (non-empty maps)", "map_cosine_mean", q.map_cosine_mean))
    elif q.task == "detection":
        rows += [("score cosine", "score_cosine", q.score_cosine), ("top-k agreement", "score_topk", q.score_topk),
                 ("box IoU", "box_iou", q.box_iou)]
    rows.append(("cosine mean", "cosine_mean", q.cosine_mean))
    return rows


def headline_text(q: Quality) -> str:
    """``top-1 agreement 0.9800 · top-1 accuracy 0.9100 (FP32 0.9200) · cosine mean 0.9990`` (of scores: ...)."""
    parts, rows = [], headline(q)
    acc = {f: v for _, f, v in rows}
    for label, f, v in rows:
        if f == "fp32_top1_accuracy":
            continue
        text = f"{label} {v:.4f}" if v is not None else f"{label} -"
        if f == "top1_accuracy" and acc.get("fp32_top1_accuracy") is not None:
            text += f" (FP32 {acc['fp32_top1_accuracy']:.4f})"
        parts.append(text)
    return " · ".join(parts) + (f" (of {q.output})" if q.output else "")


def per_output_lines(q: Quality) -> list[str]:
    """One line per metric output: its name and headline numbers (none without --metric-output)."""
    return [f"{name}: {headline_text(replace(o, output=None))}" for name, o in (q.outputs or {}).items()]
