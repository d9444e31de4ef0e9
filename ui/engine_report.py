"""The TensorRT engine-report import (trtexec --exportLayerInfo / --exportProfile, and optionally trtexec's
log, which names the GPU), as in NVIDIA's TREx: how much of the report is this model's, four charts and the
reformats next to this model's layers, and the calibration it offers.

Each file is an upload or a path on the server; the most recent of the two wins (a path typed after an
upload is used, and the reverse), and the page says which one is used."""
from __future__ import annotations

import re

import streamlit as st

from core.backends.reports import PCT_LABEL, engine_device, load_engine_report, match_model, node_names, reformat_table
from core.display.charts import plot_latency_by_type, plot_layer_latency, plot_precision_distribution, \
    plot_reformat_overhead
from core.display.tables import ms_text
from core.errors import MixprecError
from ui import estimate_panel, tables
from ui.session import code, md

# the inputs: (kind, label of the upload, file types)
INPUTS = (("graph", "Layer info JSON (--exportLayerInfo)", ["json"]),
          ("profile", "Profile JSON (--exportProfile)", ["json"]),
          ("log", "trtexec log (optional: it names the GPU)", ["txt", "log", "json"]))
WHAT = {"graph": "Layer info", "profile": "Profile", "log": "trtexec log"}


def upload_key(kind: str) -> str:
    return f"trt_{kind}_upload"


def path_key(kind: str) -> str:
    return f"trt_{kind}_path"


def last_key(kind: str) -> str:
    """Which of the two inputs of ``kind`` changed last: "upload" or "path" (set by their on_change)."""
    return f"trt_{kind}:last"


def _changed(kind: str, which: str) -> None:
    st.session_state[last_key(kind)] = which


def chosen(kind: str) -> tuple[bytes | str | None, str, str]:
    """``(source, file name, what is used)`` of input ``kind``: the upload or the typed path, whichever
    was given last (the other, when both are there, is named as not used); ``(None, "", "")`` when
    neither is given."""
    up = st.session_state.get(upload_key(kind))
    path = str(st.session_state.get(path_key(kind)) or "").strip()
    last = st.session_state.get(last_key(kind))
    if up is not None and (not path or last != "path"):
        note = f" (given after the path {code(path)}, which is not used)" if path else ""
        return up.getvalue(), up.name, f"the uploaded file {code(up.name)}{note}"
    if path:
        note = f" (typed after the upload {code(up.name)}, which is not used)" if up is not None else ""
        return path, re.split(r"[\\/]", path)[-1], f"the path {code(path)}{note}"
    return None, "", ""


def _stem(name: str) -> str:
    return re.sub(r"(\.graph|\.profile)?\.json$", "", name) or name


def section(layer_names: list[str], p=None) -> None:
    with st.expander("Import TensorRT engine reports (from trtexec on any GPU machine)", icon=":material/upload_file:"):
        st.caption("Build with `trtexec --onnx=… --profilingVerbosity=detailed --exportLayerInfo=layers.json "
                   "--exportProfile=profile.json > trtexec.log` (the Export page's scripts and bundle do), then load "
                   "the files: the log is optional and names the GPU the engine was built on.")
        cols = st.columns(3)
        for col, (kind, label, types) in zip(cols, INPUTS):
            col.file_uploader(label, type=types, key=upload_key(kind), on_change=_changed, args=(kind, "upload"))
            col.text_input("…or its path on the server", key=path_key(kind), on_change=_changed, args=(kind, "path"))
        picked = {kind: chosen(kind) for kind, _, _ in INPUTS}
        graph, graph_name, _ = picked["graph"]
        profile, _, _ = picked["profile"]
        log, _, _ = picked["log"]
        used = [f"{WHAT[k]}: {text}" for k, (src, _, text) in picked.items() if src is not None]
        if used:
            st.caption("Used — " + "; ".join(used) + ". Of an upload and a typed path, the one given last is used.")
        if graph is None:
            return
        try:
            rep = load_engine_report(graph, profile, name=_stem(graph_name))
            device = engine_device(graph, profile, log)
        except MixprecError as e:
            st.error(md(e))
            return
        rf = rep.reformat
        st.markdown(f"**{md(rep.name)}**: {len(rep.layers)} engine layers; {rf.count} reformat layers"
                    + (f", {ms_text(rf.ms)} of {ms_text(rf.total_ms)} ({rf.pct:.1f} {PCT_LABEL})" if rep.has_profile
                       else " (no profile loaded: no times)"))
        nodes = node_names(p.model.proto.graph) if p is not None else list(layer_names)
        match = match_model(rep.layers, nodes, f"this model ({p.model.name})" if p is not None else "this model")
        if match.enough:
            st.caption(f"{md(match.text())}.")
        else:
            st.warning(f"{md(match.text())}: this report is of another model. The charts below are that engine's; "
                       "it calibrates nothing here.", icon=":material/warning:")
        st.caption(f"GPU: {md(device.text())}.")
        if rep.has_profile:
            st.caption("Latency: TensorRT on the GPU that ran trtexec, measured (the imported profile).")
            if p is not None:
                estimate_panel.calibration_offer(p, graph, profile, name=rep.name, nodes=nodes, match=match,
                                                 device=device)
        if rep.has_profile:
            c1, c2 = st.columns(2)
            c1.plotly_chart(plot_layer_latency(rep.layers), key="trt_layers_chart")
            c2.plotly_chart(plot_latency_by_type(rep.latency_by_type()), key="trt_types_chart")
            c3, c4 = st.columns(2)
            c3.plotly_chart(plot_reformat_overhead(reformat_table([rep])), key="trt_reformat_chart")
            c4.plotly_chart(plot_precision_distribution(rep.precision_distribution()), key="trt_precision_chart")
        joined = rep.join_onnx(layer_names)
        if len(joined.neighbours):
            st.caption("Your layers next to a reformat (before/after it in the engine):")
            tables.show(joined.neighbours, hide_index=True)
        tables.show(rep.layers.drop(columns=["in_tensors", "out_tensors"], errors="ignore"), hide_index=True,
                    height=260)
