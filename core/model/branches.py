"""Merged decoders: one graph with an ``If`` on a boolean input (optimum's ``decoder_model_merged.onnx``:
``use_cache_branch`` picks the decoder with past — the then-branch — or the one without). Compute inside an
``If`` stays FP32 (no Q/DQ goes into a subgraph), so such a model would have nothing to quantize. A branch
input is fixed on load: every ``If`` whose condition is that input is replaced by the nodes of the branch
taken (as onnx-graphsurgeon's ``fold_constants(flatten_subgraphs=True)`` flattens an ``If`` with a constant
condition; done here on the proto, so the weights never leave their external data files), the input is
removed, and graph inputs only the dropped branch read go too.

The choice is part of the model's identity: ``LoadedModel.sha256`` is the file's digest combined with it
(:func:`branch_sha256`), so runs, caches and rankings of the two branches never mix.
"""
from __future__ import annotations

import hashlib
import re

import onnx
from onnx import TensorProto

from core.errors import MixprecError
from core.model.graph import all_nodes, subgraphs

BRANCH_DEFAULT = True  # a cache branch input not given: the decoder with past (every generated token but the first)
_CACHE_BRANCH = re.compile(r"use_?cache|cache_?branch", re.IGNORECASE)


def branch_inputs(proto: onnx.ModelProto) -> list[str]:
    """The graph inputs that only pick an ``If`` branch: boolean, one element, read only as the
    condition of main-graph ``If`` nodes."""
    g = proto.graph
    inits = {i.name for i in g.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, t in enumerate(n.input):
            readers.setdefault(t, []).append((n, k))
        for sub in subgraphs(n):
            for inner in all_nodes(sub):
                for t in inner.input:
                    readers.setdefault(t, []).append((inner, -1))
    out = []
    for i in g.input:
        if i.name in inits or i.type.tensor_type.elem_type != TensorProto.BOOL:
            continue
        dims = i.type.tensor_type.shape.dim if i.type.tensor_type.HasField("shape") else []
        if len(dims) > 1 or any(d.HasField("dim_value") and d.dim_value != 1 for d in dims):
            continue
        uses = readers.get(i.name, [])
        if uses and all(n.op_type == "If" and k == 0 for n, k in uses):
            out.append(i.name)
    return out


def default_branches(proto: onnx.ModelProto, given: dict[str, bool] | None) -> dict[str, bool]:
    """The branch of every branch input that is fixed: the ones given, and a cache-branch input
    (``use_cache_branch``…) at :data:`BRANCH_DEFAULT`. A name given that is no branch input is refused."""
    found = branch_inputs(proto)
    given = dict(given or {})
    unknown = sorted(set(given) - set(found))
    if unknown:
        raise MixprecError(
            f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a branch input of this model",
            (f"branch inputs: {', '.join(found)}" if found else "this model has no If on a boolean input")
            + "; give --branch INPUT=true|false with one of them, or leave it out")
    chosen = {n: bool(given[n]) for n in found if n in given}
    chosen.update({n: BRANCH_DEFAULT for n in found if n not in chosen and is_cache_branch(n)})
    return chosen


def is_cache_branch(name: str) -> bool:
    """Whether a branch input picks the decoder with or without its KV cache (fixed by default)."""
    return bool(_CACHE_BRANCH.search(name))


def branch_sha256(sha: str, chosen: dict[str, bool]) -> str:
    """The identity of the model with ``chosen`` branches fixed (``sha`` itself when none is)."""
    if not chosen:
        return sha
    text = sha + "".join(f"|branch:{k}={int(v)}" for k, v in sorted(chosen.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _rename_all(graph: onnx.GraphProto, ren: dict[str, str]) -> None:
    for n in graph.node:
        n.input[:] = [ren.get(t, t) for t in n.input]
        n.output[:] = [ren.get(t, t) for t in n.output]
        for sub in subgraphs(n):  # a nested subgraph may read the renamed tensors from its outer scope
            _rename_all(sub, ren)
    for vi in graph.value_info:
        vi.name = ren.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = ren.get(t.name, t.name)


def _inline(g: onnx.GraphProto, index: int, branch: onnx.GraphProto) -> int:
    """Replace node ``index`` (an If) by ``branch``'s nodes; the number of nodes inlined."""
    node = g.node[index]
    made = {o for n in branch.node for o in n.output} | {t.name for t in branch.initializer}
    ren, bridges, seen = {}, [], set()
    for bo, io in zip(branch.output, node.output):
        if not io:
            continue
        if bo.name in made and bo.name not in seen:
            ren[bo.name] = io  # the branch's tensor takes the If output's name
        else:  # an outer tensor (or one returned twice) passes through
            bridges.append(onnx.helper.make_node("Identity", [ren.get(bo.name, bo.name)], [io],
                                                 name=f"{node.name or 'If'}/{io}/passthrough"))
        seen.add(bo.name)
    body = onnx.GraphProto()
    body.CopyFrom(branch)
    _rename_all(body, ren)
    new = list(body.node) + bridges
    del g.node[index]
    for k, n in enumerate(new):
        g.node.insert(index + k, n)
    g.initializer.extend(body.initializer)
    g.value_info.extend(body.value_info)
    return len(new)


def _used(g: onnx.GraphProto) -> set[str]:
    names = {o.name for o in g.output}
    for n in all_nodes(g):
        names.update(n.input)
    return names


def fold_branches(proto: onnx.ModelProto, chosen: dict[str, bool]) -> str | None:
    """Fix the branch inputs of ``chosen`` in ``proto`` (in place); what was done (for the load's
    normalisation steps), or None when nothing was."""
    if not chosen:
        return None
    g = proto.graph
    folded = []
    k = 0
    while k < len(g.node):
        n = g.node[k]
        if n.op_type == "If" and n.input and n.input[0] in chosen:
            take = chosen[n.input[0]]
            branch = next(a.g for a in n.attribute if a.name == ("then_branch" if take else "else_branch"))
            count = _inline(g, k, branch)
            folded.append(f"If {n.name or n.output[0]!r} → its {'then' if take else 'else'} branch ({count} nodes)")
            k += count
        else:
            k += 1
    used = _used(g)
    before = [i.name for i in g.input]
    keep = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(keep)
    dropped = [n for n in before if n not in {i.name for i in keep} and n not in chosen]
    unused = {t.name for t in g.initializer} - used
    if unused:
        keep_inits = [t for t in g.initializer if t.name not in unused]
        del g.initializer[:]
        g.initializer.extend(keep_inits)
    if any(not v and is_cache_branch(k) for k, v in chosen.items()):
        _mask_follows_ids(g)
    what = ", ".join(f"{k} = {str(v).lower()}" for k, v in chosen.items())
    text = f"{what}: folded {'; '.join(folded)}"
    if dropped:
        text += f"; inputs only the other branch read are removed ({_listed(dropped)})"
    if unused:
        text += f"; {len(unused)} weights only the other branch used are dropped"
    return text + " (pick the other branch with --branch INPUT=true|false, or on the Model page)"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f", … ({len(names)} in all)" if len(names) > 6 else "")


def _mask_follows_ids(g: onnx.GraphProto) -> None:
    """The branch without past: ``attention_mask`` covers the new tokens only, so its length is the ids'
    (the merged graph names it past + seq, which no longer exists)."""
    by = {i.name: i for i in g.input}
    ids, mask = by.get("input_ids"), by.get("attention_mask")
    if ids is None or mask is None:
        return
    idd, md = ids.type.tensor_type.shape.dim, mask.type.tensor_type.shape.dim
    if len(idd) >= 2 and len(md) >= 2 and idd[1].HasField("dim_param") and not md[1].HasField("dim_value"):
        md[1].dim_param = idd[1].dim_param
