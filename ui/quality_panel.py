"""Build page, what quality is measured on and what it says (issue 22 §3): the selector of the metric
outputs (graph outputs and named slices of an output's last axis), the task and its settings and a user metric
file — kept in the session, so every build queued from this session (the Build page's baseline, the Precision
page's Rebuild) carries it in its job params; the user's file is run by the job's child process, never here — and
the latest run's headline: its task's numbers first (top-1 agreement and accuracy for a classifier, mask IoU for
dense maps, score agreement and box IoU for a detector, the user metric), then one row per metric output."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from core.errors import MixprecError
from core.measure.evaluation import (BOX_FORMATS, DEFAULT_THRESHOLD, DEFAULT_TOP_K, METRIC_OUTPUT_FORM, TASKS,
                                     MetricSpec, headline, headline_text)
from core.measure.runs import GENERATED_NOTE
from ui.session import md

SPEC_KEY = "quality:metric_spec"  # MetricSpec.to_json of the selector, None for the default


def current() -> dict | None:
    """The metric spec the session's builds carry (None: the first float output, as always)."""
    return st.session_state.get(SPEC_KEY)


def describe(spec_json: dict) -> str:
    """One line of a spec: its outputs and slices, task and user metric file."""
    spec = MetricSpec.from_json(spec_json)
    parts = [", ".join(o.label for o in spec.outputs) or "the first float output"]
    if spec.task not in (None, "auto"):
        parts.append(f"task {spec.task}")
    if spec.metric_file:
        parts.append(f"user metric {spec.metric_file}")
    return "; ".join(parts)


def selector(project) -> None:
    """The selector; a spec that cannot be read is an error under it, and builds keep the last good one."""
    floats = [o.name for o in project.model.outputs if o.is_float]
    with st.expander("Quality: outputs, slices, task", icon=":material/tune:"):
        slices = st.text_area("Slices, one per line", key="quality:slices", placeholder="scores=output[...,4:]",
                              help=f"{METRIC_OUTPUT_FORM}. The first line (else the first output picked below) is "
                                   "the headline; a search budget addresses one as NAME:METRIC")
        outs = st.multiselect("Whole outputs", floats, key="quality:outputs",
                              help="Graph outputs measured whole (default: the first float output)")
        c = st.columns(4)
        task = c[0].selectbox("Task", TASKS, key="quality:task", help="auto: from the output's shape and values")
        thr = c[1].number_input("Map threshold", 0.0, 1.0, DEFAULT_THRESHOLD, 0.05, key="quality:threshold",
                                help="dense maps: the mask IoU's threshold (DBNet binarises at 0.3)")
        fmt = c[2].selectbox("Boxes", BOX_FORMATS, key="quality:boxes", help="detection: channels 0-3 of a box")
        k = c[3].number_input("Top boxes", 1, 1000, DEFAULT_TOP_K, key="quality:top_k")
        path = st.text_input("User metric file", key="quality:metric_file",
                             placeholder="/path/to/metric.py with def score(reference, candidate, inputs)",
                             help="Run by the build job's process on the whole evaluation set; its value is the "
                                  "metric 'user' (budget user>=VALUE)")
    lines = [s.strip() for s in (slices or "").splitlines() if s.strip()]
    try:
        spec = MetricSpec(tuple(lines + list(outs)), task, float(thr), fmt, int(k), path.strip() or None)
    except MixprecError as e:
        st.error(md(e))
        return
    st.session_state[SPEC_KEY] = None if spec.is_default else spec.to_json()


def headline_section(run) -> None:
    """The run's quality headline and, with metric outputs, one row per output."""
    q = run.quality
    rows = headline(q)
    label, _, value = rows[0]
    rest = " · ".join(f"{l} {v:.4f}" for l, f, v in rows[1:] if v is not None and f != "fp32_top1_accuracy")
    st.metric(f"Quality headline: {label}" + (f" of {q.output}" if q.output else ""),
              "-" if value is None else f"{value:.4f}",
              rest + (f" · {GENERATED_NOTE}" if run.data_generated else ""), delta_color="off", delta_arrow="off",
              help=md(headline_text(q)))
    if q.outputs:
        st.dataframe(pd.DataFrame([{"output": n, "task": o.task or "-", "cosine mean": o.cosine_mean,
                                    "headline": headline_text(o)} for n, o in q.outputs.items()]),
                     hide_index=True)
