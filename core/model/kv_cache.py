"""Decoders exported with their KV cache (the "with past" export of transformers / optimum and of most LLM
deployment guides): ``past_key_values.N.key/value`` inputs ``[batch, kv_heads, past, head_dim]``,
``present.N.key/value`` outputs, an ``attention_mask`` of length past + seq and ``position_ids`` past …
past + seq − 1 for the seq new tokens.

:func:`kv_cache` recognises one by its inputs' names and shapes; the input shapes
(:mod:`core.model.shapes`) then keep the mask at past + seq, and the generated data (:mod:`core.model.data`)
fills the cache by running the model once on a prompt of ``past`` tokens (the cache then holds the model's
own keys and values, not random ones), with the positions and mask of the tokens that follow it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.model.data_errors import ort_feed_errors
from core.model.load import LoadedModel, TensorSpec

KV_SEQ = 16    # new tokens per sample when neither the user nor the data says
KV_PAST = 48   # cached tokens per sample when neither the user nor the data says (the mask: 64)
_CACHE = re.compile(r"(?:past|cache)[^0-9]*?(\d+)[^0-9]*?(key|value|k|v)\b|(?:past|cache)[._]?(key|value)s?[._]?(\d+)",
                    re.IGNORECASE)
_PRESENT = re.compile(r"(?:present|cache)[^0-9]*?(\d+)[^0-9]*?(key|value|k|v)\b|present[._]?(key|value)s?[._]?(\d+)",
                      re.IGNORECASE)


def _layer_kind(rx: re.Pattern, name: str) -> tuple[int, str] | None:
    m = rx.search(name)
    if not m:
        return None
    layer, kind = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(4), m.group(3))
    return int(layer), "key" if kind.lower().startswith("k") else "value"


@dataclass(frozen=True)
class KvCache:
    """What makes a model a KV-cache decoder: its cache inputs and the outputs that return them grown, the
    symbols of the cached length (``past``), of the new tokens (``seq``) and of the mask (``total``), and the
    inputs that carry the tokens, the mask and the positions (None where the model has no such input)."""

    cache_inputs: tuple[str, ...]
    present: dict          # cache input -> the output holding it after this step (when the model has one)
    past_axis: int         # the axis of the cached length in every cache input (2: [batch, heads, past, dim])
    past: str              # its symbol ("?" when the export left it unnamed)
    ids: str | None
    seq: str | None
    mask: str | None
    total: str | None
    positions: str | None

    def relation(self) -> str:
        """"attention_mask axis 1 = past + seq", as inspect and the Model page show it."""
        if self.mask is None:
            return ""
        return f"{self.mask} axis 1 = {self.past} + {self.seq or 'seq'}"

    def to_json(self) -> dict:
        return {"cache_inputs": list(self.cache_inputs), "present": dict(self.present), "past_axis": self.past_axis,
                "past": self.past, "seq": self.seq, "total": self.total, "ids": self.ids, "mask": self.mask,
                "positions": self.positions, "relation": self.relation()}


def _sym(spec: TensorSpec, axis: int) -> str | None:
    if axis >= len(spec.shape):
        return None
    d = spec.shape[axis]
    if isinstance(d, int) and d > 0:
        return None
    return d if isinstance(d, str) and d else "?"


def _find(inputs: list[TensorSpec], *names: str) -> TensorSpec | None:
    by = {s.name.lower(): s for s in inputs}
    return next((by[n] for n in names if n in by), None)


def kv_cache(model: LoadedModel) -> KvCache | None:
    """The model's KV cache, or None: float inputs of rank 4 named like a layer's past key / value
    (``past_key_values.0.key``, ``past_key_0``, ``cache.0.value`` …) whose axis 2 is dynamic."""
    cache = [s for s in model.inputs if s.is_float and len(s.shape) == 4 and _layer_kind(_CACHE, s.name)
             and _sym(s, 2) is not None]
    if not cache:
        return None
    syms = {_sym(s, 2) for s in cache}
    past = next(iter(syms)) if len(syms) == 1 else "?"
    outs = {_layer_kind(_PRESENT, o.name): o.name for o in model.outputs if _layer_kind(_PRESENT, o.name)}
    present = {s.name: outs[_layer_kind(_CACHE, s.name)] for s in cache if _layer_kind(_CACHE, s.name) in outs}
    others = [s for s in model.inputs if s not in cache]
    ids = _find(others, "input_ids", "ids", "tokens", "input")
    mask = _find(others, "attention_mask", "mask")
    positions = _find(others, "position_ids", "positions")
    seq = _sym(ids, len(ids.shape) - 1) if ids is not None and ids.shape else None
    total = _sym(mask, len(mask.shape) - 1) if mask is not None and len(mask.shape) == 2 else None
    return KvCache(tuple(s.name for s in cache), present, 2, past, ids.name if ids else None, seq,
                   mask.name if mask is not None and len(mask.shape) == 2 else None, total,
                   positions.name if positions else None)


PROMPT_CHUNK = 8  # prompts run at a time when the cache is filled (bounds the memory of the activations)


def decoding_positions(kv: KvCache, arrays: dict, past: int) -> None:
    """The new tokens follow ``past`` cached ones: position ids past … past + seq − 1 (in place)."""
    if kv.positions in arrays and arrays[kv.positions].ndim >= 1:
        pos = arrays[kv.positions]
        seq = pos.shape[-1]
        arrays[kv.positions] = np.broadcast_to(np.arange(past, past + seq, dtype=pos.dtype), pos.shape).copy()


def fill_cache(model: LoadedModel, kv: KvCache, arrays: dict, vocab: int | None, rng) -> str:
    """Fill the cache inputs of generated ``arrays`` with the model's own keys and values: each sample's
    prompt of ``past`` tokens (random ids within the vocabulary, its mask of ones, positions 0 … past − 1)
    runs once with an empty cache, and its ``present`` outputs become the cache. Returns what was done
    (a note); where that run cannot be made (no present outputs, no ids or vocabulary, or ONNX Runtime
    refuses an empty cache) the cache stays N(0, 1) and the note says so."""
    first = arrays[kv.cache_inputs[0]]
    n, past = first.shape[0], first.shape[kv.past_axis]
    if past == 0:
        return "the KV cache is empty (past = 0)"
    if len(kv.present) != len(kv.cache_inputs) or kv.ids is None or vocab is None:
        return "the KV cache is random (N(0, 1)): the model has no present outputs or token ids to fill it with"
    import onnxruntime as ort


    with model.scratch("mixprec-kv-") as tmp:  # in the workspace, swept if this process is killed
        path = model.save(Path(tmp) / "model.onnx")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        ids_spec = next(s for s in model.inputs if s.name == kv.ids)
        outs = [kv.present[c] for c in kv.cache_inputs]
        filled = {c: [] for c in kv.cache_inputs}
        for start in range(0, n, PROMPT_CHUNK):
            b = min(PROMPT_CHUNK, n - start)
            feeds = {kv.ids: rng.integers(0, vocab, (b, past)).astype(ids_spec.dtype)}
            for name, other in ((kv.mask, arrays.get(kv.mask)), (kv.positions, arrays.get(kv.positions))):
                if name is not None and other is not None:
                    feeds[name] = (np.ones((b, past), other.dtype) if name == kv.mask
                                   else np.broadcast_to(np.arange(past, dtype=other.dtype), (b, past)).copy())
            for c in kv.cache_inputs:
                shape = list(arrays[c].shape)
                shape[0], shape[kv.past_axis] = b, 0
                feeds[c] = np.zeros(shape, arrays[c].dtype)
            for s in model.inputs:  # anything else the model takes (e.g. token types): its generated slice
                if s.name not in feeds:
                    feeds[s.name] = arrays[s.name][start:start + b]
            try:
                with ort_feed_errors(feeds, "filling the KV cache from a prompt"):
                    got = sess.run(outs, feeds)
            except Exception as e:  # noqa: BLE001 - an export that refuses an empty cache keeps a random one
                return f"the KV cache is random (N(0, 1)): running the prompt with an empty cache failed ({e})"
            for c, v in zip(kv.cache_inputs, got):
                if v.shape[kv.past_axis] != past:
                    return (f"the KV cache is random (N(0, 1)): {kv.present[c]} has {v.shape[kv.past_axis]} "
                            f"positions after a {past}-token prompt")
                filled[c].append(v.astype(arrays[c].dtype, copy=False))
        del sess
    for c in kv.cache_inputs:
        arrays[c] = np.concatenate(filled[c], axis=0)
    return f"the KV cache holds the model's own keys and values of a prompt of {past} tokens"


def describe(kv: KvCache, shapes: dict) -> str:
    """"KV-cache decoder: attention_mask axis 1 = past + seq = 48 + 16 = 64 …" at the input ``shapes``."""
    past = shapes[kv.cache_inputs[0]][kv.past_axis] if kv.cache_inputs[0] in shapes else None
    seq = shapes[kv.ids][-1] if kv.ids in shapes and shapes[kv.ids] else None
    text = f"KV-cache decoder ({len(kv.cache_inputs)} cache inputs, cache length {kv.past} on axis {kv.past_axis})"
    if kv.mask and past is not None and seq is not None:
        text += f": {kv.relation()} = {past} + {seq} = {past + seq}"
    dims = [f"--dim {s}=N" for s in (kv.past, kv.seq) if s and s != "?"]
    if dims:
        text += f"; set them with {' '.join(dims)}"
    return text


def kv_relation(model: LoadedModel) -> str:
    """The KV-cache decoder's relation of sizes ("attention_mask axis 1 = past + seq"), else "" (for errors)."""
    kv = kv_cache(model)
    return kv.relation() if kv is not None else ""
