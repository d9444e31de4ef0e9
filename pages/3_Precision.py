"""Precision: one row per layer with a FP32/FP16/INT8 select, bulk actions, summary, diff, Rebuild."""
import streamlit as st

from core.backends import BACKENDS
from core.dashboard import editor_table, last_built_policy, policy_diff, policy_summary, search_tables, \
    select_layers, set_precision, top_sensitive
from core.errors import MixprecError
from core.inventory import PRECISIONS
from core.jobs import build_params, load_search, search_params
from core.plots import plot_pareto
from core.search import BUDGET_METRICS, Budget, front_policy
from ui import common as ui

ui.header("Precision", "Choose FP32 / FP16 / INT8 per layer, then Rebuild. INT8 applies to eligible layers only "
          "(MatMul, Gemm, Conv, ConvTranspose).")
p = ui.project()
pol = ui.policy(p)
rank = ui.ranking(p)
summary = st.container()


def apply(names, precision, what):
    new, skipped = set_precision(ui.policy(p), p.layers, names, precision)
    ui.set_policy(p, new)
    ui.flash(f"{what}: {len(names) - len(skipped)} layer(s) → {precision.upper()}"
             + (f"; {len(skipped)} not INT8-eligible, left as they were" if skipped else ""))


with st.expander("Bulk actions", expanded=True):
    b1, b2, b3 = st.columns(3)
    with b1.form("by_type"):
        ops = st.multiselect("Op types", sorted({l.op_type for l in p.layers}), key="bulk_ops")
        prec = st.selectbox("Precision", PRECISIONS, key="bulk_ops_prec")
        if st.form_submit_button("Set by op type", key="apply_ops") and ops:
            apply(select_layers(p.layers, op_types=ops), prec, f"op types {', '.join(ops)}")
    with b2.form("by_regex"):
        regex = st.text_input("Layer name (regular expression)", key="bulk_regex",
                              placeholder=r"layer\.5/output/dense/MatMul$")
        prec2 = st.selectbox("Precision", PRECISIONS, index=1, key="bulk_regex_prec")
        if st.form_submit_button("Set by name", key="apply_regex") and regex:
            try:
                apply(select_layers(p.layers, regex=regex), prec2, f"/{regex}/")
            except MixprecError as e:
                st.error(str(e))
    with b3.form("top_k"):
        k = st.number_input("k", 1, max(1, sum(l.eligible for l in p.layers)), 3, key="bulk_k")
        st.caption("The k most sensitive eligible layers (cosine drop) → FP16." if rank is not None
                   else "Needs a ranking: run it on the Sensitivity page.")
        if st.form_submit_button("Top-k → FP16", key="apply_topk"):
            try:
                apply(top_sensitive(rank, int(k)), "fp16", f"top {k} most sensitive")
            except MixprecError as e:
                st.error(str(e))
    if st.button("Reset to defaults", key="reset"):
        ui.set_policy(p, p.default_policy())
        ui.flash("Reset: LayerNorm, Softmax and embeddings FP16; eligible layers INT8")

with st.expander("Search under a budget"):
    src = ui.source()
    s1, s2 = st.columns([3, 1])
    budget = s1.text_input("Quality budget", "cosine_mean>=0.99", key="search_budget",
                           help="METRIC>=VALUE, or top1_drop<=VALUE (e.g. 0.5%); METRIC: " + ", ".join(BUDGET_METRICS))
    smooth = s2.checkbox("SmoothQuant-style smoothing", key="search_smooth")
    try:
        params = search_params(src["model"], src["data"], src["eval_data"], budget, smooth)
    except MixprecError as e:
        st.error(str(e))
        params = None
    doc = params and load_search(p.ws, p, params["budget"], smooth)
    if params:
        ui.job_button("search", params, f"search {params['budget']} · {p.model.name}", "Start the search",
                      "start_search", doc is not None, "Not searched yet for this budget: the search chooses on half "
                      "of the evaluation data and verifies on the other half (MiniLM: a few minutes).")
    if doc:
        (st.success if doc["met_on_dev"] and doc["met_on_holdout"] is not False else st.warning)(doc["message"])
        cands, front = search_tables(doc)
        st.plotly_chart(plot_pareto(cands, doc.get("chosen"), Budget.parse(doc["budget"])), key="pareto_chart")
        st.dataframe(front, hide_index=True)
        f1, f2 = st.columns([3, 1])
        points = {r.candidate: f"#{r.candidate}{' (chosen)' if r.candidate == doc.get('chosen') else ''}: "
                  f"{r.n_int8} layers INT8, {r.method}, {r.est_ms:.3f} ms, {r.quality:.4f}" for r in front.itertuples()}
        pick = f1.selectbox("Front point", list(points), format_func=points.get, key="front_pick")
        f2.write("")
        if f2.button("Use this policy", type="primary", key="use_front"):
            try:
                ui.set_policy(p, front_policy(doc, int(pick), p))
                ui.flash(f"Front point #{pick} is now the current policy: Rebuild to measure it.", rerun=True)
            except MixprecError as e:
                st.error(str(e))
ui.show_flash()

pol = ui.policy(p)
table = editor_table(p, pol, rank)
view_ops = st.multiselect("Show op types", sorted(table["op_type"].unique()), key="view_ops")
view = table[table["op_type"].isin(view_ops)] if view_ops else table
edited = st.data_editor(
    view, hide_index=True, height=420, key=f"editor-{st.session_state.get('editor_version', 0)}-{'|'.join(view_ops)}",
    disabled=[c for c in view.columns if c != "precision"],
    column_config={"precision": st.column_config.SelectboxColumn("precision", options=list(PRECISIONS), required=True),
                   "sensitivity": st.column_config.NumberColumn("sensitivity (cos drop)", format="%.5f"),
                   "macs": st.column_config.NumberColumn("MACs", format="compact")})
changes = {n: v for n, v in zip(edited["name"], edited["precision"]) if pol.layers.get(n) != v}
if changes:
    new = pol
    for precision in set(changes.values()):
        new, skipped = set_precision(new, p.layers, [n for n, v in changes.items() if v == precision], precision)
        if skipped:
            st.warning(f"INT8 is not available for {', '.join(skipped)} (not MatMul/Gemm/Conv): kept as before.")
    ui.set_policy(p, new, reset_editor=False)
    pol = new

with summary:
    s = policy_summary(p, pol)
    c = st.columns(4)
    for col, key in zip(c, ("fp32", "fp16", "int8")):
        col.metric(key.upper(), s[key])
    c[3].metric("INT8 share of MACs", f"{100 * s['int8_mac_share']:.1f}%")

built = last_built_policy(p)
diff = policy_diff(built, pol, p.layers)
with st.expander(f"Diff against the last built policy: {len(diff)} layer(s) differ" if built
                 else "Diff against the last built policy: nothing built yet", expanded=bool(built) and 0 < len(diff) < 30):
    st.dataframe(diff, hide_index=True)

r1, r2, r3 = st.columns([3, 1, 1])
label = r1.text_input("Run label", value="", placeholder="e.g. layer5 down-proj fp16", key="run_label")
backend = r2.selectbox("Backend", BACKENDS, key="backend")
r3.write("")
if r3.button("Rebuild", type="primary", key="rebuild"):
    src = ui.source()
    job = ui.submit("build", build_params(src["model"], pol.to_json(), src["data"], src["eval_data"], backend, label),
                    label or f"int8={s['int8']} fp16={s['fp16']} fp32={s['fp32']}")
    if job:
        st.toast(f"Build queued: {job.label}")
mine = st.session_state.get("my_jobs", [])
if mine:
    st.caption("Your builds (details and results on **Build and results**):")
    ui.job_panel(kind="build", only=mine, limit=3)
