"""``python -m core``: the headless twin of the dashboard.

Every command has ``--json`` (one JSON document on stdout). Long work shows a progress bar
on stderr. A :class:`MixprecError` prints one line and exits 2, with no traceback; so does any
OSError (a full disk names the workspace and the space needed). Notes (e.g. a corrupt cache that
was computed again) print as ``note: …`` lines on stderr and, with ``--json``, under ``"notes"``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.backends import BACKENDS
from core.backends.reports import LOG_HINT, engine_device, load_engine_report, match_model, node_names
from core.cli import data as data_command, estimate as estimate_command
from core.cli.source import source_from_args
from core.errors import MixprecError
from core.estimate.gpus import GPUS
from core.export import DEFAULT_TRT_VERSION, EXPORT_FORMATS, export_policy
from core.jobs.distributed_builds import build_policies
from core.jobs.params import RAY_FORMS, ray_param
from core.measure.evaluation import BOX_FORMATS, DEFAULT_THRESHOLD, DEFAULT_TOP_K, METRIC_OUTPUT_FORM, TASKS, \
    MetricSpec, headline_text, per_output_lines
from core.measure.runs import GENERATED_NOTE, WARN_BELOW, build_and_measure, speedup_text
from core.model.profiles import range_text
from core.model.samples import SAMPLES, write_sample
from core.model.shapes import batch_axes, shape_text, stacked_inputs
from core.project import DEFAULT_TARGET, DEPLOY_TARGETS, TARGET_LABELS
from core.quant.compile import TARGETS
from core.quant.policy import CALIB_METHODS, NETWORK_DEFAULTS, load_policy
from core.cli.output import print_document, stdout_for_the_document
from core.search import SearchConfig, search
from core.sensitivity import MODES, RANK_METRICS, rank_layers, sensitivity
from core.sensitivity.runners import RUNNERS
from core.model.data_errors import feed_error, is_ort_run_error
from core.model.kv_cache import describe as describe_kv, kv_cache
from core.model.load import load_model
from core.sensitivity.distributed import RAY_ENV, connect
from core.store.results import cached_ranking, load_gpu_calibration
from core.store.runs import load_run
from core.workspace import Workspace, atomic_write_text, default_root, human_bytes, is_space_error, space_error, take_notes


class Progress:
    """A one-line progress bar on stderr (silent when stderr is not a terminal, except the final line)."""

    def __init__(self, label: str):
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last = ""

    def __call__(self, fraction: float, text: str = ""):
        n = int(30 * max(0.0, min(1.0, fraction)))
        line = f"\r{self.label} [{'#' * n}{'.' * (30 - n)}] {int(100 * fraction):3d}% {text}"[:120]
        if self.tty:
            sys.stderr.write(line.ljust(len(self.last)))
            sys.stderr.flush()
        elif text != self.last:
            sys.stderr.write(line.strip() + "\n")
        self.last = text if not self.tty else line

    def done(self):
        if self.tty:
            sys.stderr.write("\n")




def _emit(args, doc: dict, text: str):
    notes = take_notes()
    _print_notes(notes)
    if args.json:
        print_document(doc | ({"notes": notes} if notes else {}))
    else:
        print(text)


def _os_error(e: OSError) -> MixprecError:
    """An OSError no command wrapped, as a one-line error: a full disk names the workspace."""
    if is_space_error(e):
        return space_error(Path(e.filename) if e.filename else default_root() / "?")
    return MixprecError(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
                        "check the file, its folder and the disk (MIXPREC_WORKSPACE names the workspace)")


def _print_notes(notes: list[str] | None = None) -> None:
    for note in take_notes() if notes is None else notes:
        print(f"note: {note}", file=sys.stderr)


def _shape_lines(p) -> str:
    """The input shapes, each dim's source, and every default or guess with how to set it."""
    axes = batch_axes(p.model)
    stacked = stacked_inputs(p.model, axes)

    def batch_of(name):
        if name in stacked:
            return " (no batch axis: fed whole, one sample per array along a new axis 0 of the .npz)"
        return "" if axes.get(name) is None else f" (batch axis {axes[name]})"

    lines = [f"input {name}: {shape_text(shape)}{batch_of(name)}" for name, shape in p.input_shapes.items()]
    lines += [f"  {c.input} axis {c.axis}{f' ({c.symbol})' if c.symbol and c.symbol != '?' else ''}: {c.note}"
              for c in p.shape_choices if c.source != "fixed"]
    lines += [f"profile {name}: {range_text(r)} (min:opt:max of the exported engine)" for name, r in p.profiles.items()]
    kv = kv_cache(p.model)
    if kv is not None:
        lines.append(describe_kv(kv, p.input_shapes))
    lines += [f"data: {note}" for note in p.data_notes]
    if p.data_problem is not None:
        lines.append(f"data: needed before a build — {p.data_problem}")
    elif p.data_generated:
        lines.append("data: generated (give --data/--eval .npz files for real quality numbers)"
                     + (f"; {p.calib_data.source.split('; ', 1)[1]}" if "; " in p.calib_data.source else ""))
    return "\n" + "\n".join(lines)


def parse_trt_profiles(items: list[str] | None) -> dict:
    """``NAME=MIN:OPT:MAX`` with shapes written ``1x64`` → ``{NAME: ((1, 64), …)}``."""
    out = {}
    for item in items or []:
        name, _, spec = item.partition("=")
        try:
            shapes = tuple(tuple(int(d) for d in part.split("x")) for part in spec.split(":"))
        except ValueError:
            shapes = ()
        if not name or len(shapes) != 3:
            raise MixprecError(f"bad --trt-profile {item!r}",
                               "write --trt-profile INPUT=MIN:OPT:MAX with shapes like 1x16, "
                               "e.g. --trt-profile input_ids=1x16:1x64:16x128")
        out[name] = shapes
    return out


def trt_options(args) -> dict:
    """The TensorRT backend's options from ``--trt-profile`` and ``--trt-workspace-gb``."""
    return {"profiles": parse_trt_profiles(args.trt_profile) or None,
            "workspace_bytes": int(args.trt_workspace_gb * (1 << 30))}


def _project(args, progress=None):
    return source_from_args(args).open(progress=progress)


def _policy(args, project):
    if getattr(args, "policy", None):
        return load_policy(args.policy, project.model, project.layers)
    return project.default_policy(getattr(args, "network_default", "fp32"), getattr(args, "calibration", "minmax"))


def cmd_inspect(args):
    p = _project(args)
    m, inv = p.model, p.inventory()
    doc = {
        "model": {"name": m.name, "path": str(m.path), "sha256": m.sha256, "opset": m.opset,
                  "original_opset": m.original_opset, "size_bytes": m.size_bytes,
                  "inputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in m.inputs],
                  "outputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in m.outputs],
                  "input_shapes": {k: list(v) for k, v in p.input_shapes.items()},
                  "batch_axes": (axes := batch_axes(m)), "no_batch": sorted(stacked_inputs(m, axes)),
                  "profiles": {k: [list(s) for s in r] for k, r in p.profiles.items()},
                  "shape_choices": [c.to_dict() for c in p.shape_choices], "data_generated": p.data_generated,
                  "data_problem": None if p.data_problem is None else str(p.data_problem),
                  "generated_names": m.generated_names,
                  "kv_cache": kv.to_json() if (kv := kv_cache(m)) is not None else None,
                  "branch_inputs": list(m.branch_inputs), "branches": dict(m.branches)},
        "target": p.target,
        "normalization": [s.to_dict() for s in m.normalization],
        "layers": inv.drop(columns=["inputs", "outputs"]).to_dict(orient="records"),
    }
    norm = "".join(f"\nnormalised ({s.step}): {s.detail}" for s in m.normalization)
    unfixed = [b for b in m.branch_inputs if b not in m.branches]
    if unfixed:
        norm += (f"\n{', '.join(unfixed)} pick(s) an If branch at run time: the compute inside the If stays FP32; "
                 "fix it with --branch INPUT=true|false to quantize that branch")
    counts = inv.groupby(["op_type", "default_precision"]).size().to_string()
    _emit(args, doc, f"{m.name}  sha256 {m.sha256[:12]}…  opset {m.opset}  {len(inv)} layers "
                     f"({int(inv.eligible.sum())} INT8-eligible)  target {TARGET_LABELS[p.target]}{norm}\n{counts}"
          + _shape_lines(p))


def cmd_rank(args):
    bar = Progress("rank")
    p = _project(args, bar)
    r = rank_layers(p, method=args.calibration, metric=args.metric, max_samples=args.samples, progress=bar,
                    max_memory=args.max_memory, runner=args.runner)
    bar.done()
    table = r.table
    doc = {"metric": r.metric, "samples": r.samples, "seconds": r.seconds, "runner": r.runner,
           "calibration_cache_hit": r.calibration_cache_hit, "layers": table.to_dict(orient="records"),
           "memory": {"peak_bytes": r.peak_bytes, "added_bytes": r.added_bytes, "budget_bytes": r.budget_bytes,
                      "chunks": r.chunks}}
    shown = table[table.eligible] if not args.all else table
    _emit(args, doc, shown.head(args.top).to_string(index=False) + f"\nthe candidate ran on {r.runner}; "
          f"compared in {r.chunks} chunk(s) under a "
          f"{human_bytes(r.budget_bytes)} budget; peak memory {human_bytes(r.peak_bytes)} "
          f"(+{human_bytes(r.added_bytes)} for the ranking)")


def _on_generated(run) -> str:
    return f" ({GENERATED_NOTE})" if run.data_generated else ""


def metric_spec(args) -> MetricSpec:
    """What quality is measured on, from ``--metric-output``, ``--task``, ``--map-threshold``, ``--box-format``,
    ``--top-boxes`` and ``--metric-file`` (``core.measure.evaluation``)."""
    return MetricSpec(tuple(args.metric_output or ()), args.task, args.map_threshold, args.box_format, args.top_boxes,
                      args.metric_file)


def _quality_lines(q) -> str:
    """The headline of the run's quality (its task's numbers first) and one line per metric output."""
    return f"quality headline: {headline_text(q)}" + "".join(f"\n  {line}" for line in per_output_lines(q))


def cmd_build(args):
    address = ray_param(args.ray) if args.ray is not None else ""  # a bad address: MixprecError
    if address:
        return _cluster_build(args, address)
    if len(args.policy or []) > 1:
        raise MixprecError(f"{len(args.policy)} --policy files for one build",
                           "give one --policy, or build them all at once on a Ray cluster with --ray ADDRESS")
    args.policy = args.policy[0] if args.policy else None
    bar = Progress("build")
    p = _project(args, bar)
    policy = _policy(args, p)
    r = build_and_measure(p, policy, backend=args.backend, progress=bar, iterations=args.iterations,
                          trt_options=trt_options(args), warn_below=args.warn_below,
                          ranking=cached_ranking(p, policy.calibration.method), metrics=metric_spec(args))
    bar.done()
    doc = r.to_json() | {"speedup_text": speedup_text(r.latency.speedup)[0], "latency_note": r.latency_note,
                         "headline": headline_text(r.quality)}
    q = r.quality
    text = (f"run {r.run_id} on {r.backend} ({r.backend_reason})\n"
            f"latency median {r.latency.median_ms:.3f} ms  p95 {r.latency.p95_ms:.3f} ms  "
            f"fp32 {r.latency.ref_median_ms:.3f} ms  speedup {speedup_text(r.latency.speedup)[0]}  "
            f"[{r.latency_label}]" + (f"\nlatency note: {r.latency_note}" if r.latency_note else "") + "\n"
            f"reformat {r.reformat.count} nodes  {r.reformat.ms:.3f} ms  {r.reformat.pct:.1f}%\n"
            f"quality cosine mean {q.cosine_mean:.4f} min {q.cosine_min:.4f}  SNR {q.snr_db:.1f} dB  "
            f"max abs {q.max_abs:.3g}" + (f"  top1 {q.top1_agreement:.3f}" if q.top1_agreement is not None else "")
            + (f"  KL {q.kl_div:.3g}" if q.kl_div is not None else "")
            + (f"  perplexity {q.perplexity:.3f} (FP32 {q.fp32_perplexity:.3f})" if q.perplexity is not None else "")
            + (f"  knn5 {q.knn5_overlap:.3f}" if q.knn5_overlap is not None else "") + _on_generated(r) + "\n"
            + _quality_lines(q) + _on_generated(r) + "\n"
            f"precision {r.precision_counts}  INT8 MAC share {100 * r.int8_mac_fraction:.1f}%\n"
            f"run dir {r.run_dir}" + "".join(f"\nwarning: {w}" for w in r.warnings))
    _emit(args, doc, text)


def _cluster_build(args, address: str):
    """``build --ray ADDRESS``: every ``--policy`` built and measured as a Ray task holding one GPU of
    the cluster (``core.jobs.distributed_builds``), each as a build job runs (its defaults)."""
    local = [flag for flag, given in (("--iterations", args.iterations != 30), ("--trt-profile", bool(args.trt_profile)),
                                      ("--trt-workspace-gb", args.trt_workspace_gb != 4.0),
                                      ("--warn-below", args.warn_below != WARN_BELOW),
                                      ("--metric-output/--task/--metric-file", not metric_spec(args).is_default))
             if given]
    if local:
        raise MixprecError(f"only a local build takes {', '.join(local)} (the builds on a Ray cluster are build jobs, "
                           "with their defaults)", "leave them out, or build without --ray")
    connect(address)  # an unreachable cluster fails before the model loads
    bar = Progress("build")
    source = source_from_args(args)
    p = source.open(progress=bar)
    names = args.policy or ["the default policy"]
    policies = [load_policy(path, p.model, p.layers) for path in args.policy] if args.policy else \
        [p.default_policy(args.network_default, args.calibration)]
    builds = build_policies(source, policies, address, p.ws, backend=args.backend, progress=bar)
    bar.done()
    runs = [load_run(p.ws, b.run_dir.name) for b in builds]
    doc = {"ray": address, "builds": [{"policy": n, "gpus": b.gpus, "host": b.host, "run": r.to_json()}
                                      for n, b, r in zip(names, builds, runs)]}
    _emit(args, doc, "\n".join(
        f"{n}: run {r.run_id} on {r.backend}, GPU {b.gpus or '-'} of {b.host}: latency median "
        f"{r.latency.median_ms:.3f} ms, speedup {speedup_text(r.latency.speedup)[0]} [{r.latency_label}], cosine mean "
        f"{r.quality.cosine_mean:.4f}{_on_generated(r)}" + "".join(f"\n  warning: {w}" for w in r.warnings)
        for n, b, r in zip(names, builds, runs)))


def cmd_export(args):
    p = _project(args)
    policy = _policy(args, p)
    out = export_policy(p, policy, args.format, args.out, target=args.target, trt_version=args.trt_version,
                        tf32=args.tf32, atol=args.atol)
    _emit(args, {"format": args.format, "out": str(out), "policy_sha256": policy.sha256},
          f"wrote {out} ({args.format})")


def cmd_sample(args):
    paths = write_sample(args.name, Path(args.out))
    _emit(args, {"name": paths.name, "model": str(paths.model), "calib": str(paths.calib), "eval": str(paths.eval)},
          f"wrote {paths.model}, {paths.calib}, {paths.eval}")


def cmd_sensitivity(args):
    bar = Progress("sensitivity")
    p = _project(args, bar)
    r = sensitivity(p, args.mode, args.calibration, workers=args.workers, progress=bar, ray=args.ray,
                    metrics=metric_spec(args))
    bar.done()
    doc = {"mode": r.mode, "method": r.method, "seconds": r.seconds, "cache_hit": r.cache_hit,
           "trials_on": r.trials_on, "baseline_cosine": r.baseline.cosine_mean,
           "layers": r.table.to_dict(orient="records")}
    what = "quality drop with only this layer INT8" if r.mode == "isolated" else \
        "quality gain when only this layer leaves INT8"
    _emit(args, doc, f"{r.mode} sensitivity ({what}; cosine_mean delta), {r.seconds:.1f} s"
                     f"{' (cached)' if r.cache_hit else ''}{f' on {r.trials_on}' if r.trials_on else ''}\n"
                     + r.table.head(args.top).to_string(index=False))


def _rank_args(sp):
    sp.add_argument("--calibration", default="minmax", choices=CALIB_METHODS)
    sp.add_argument("--metric", default="cos_drop", choices=RANK_METRICS)
    sp.add_argument("--samples", type=int, default=16, help="evaluation samples to compare (default 16)")
    sp.add_argument("--top", type=int, default=20)
    sp.add_argument("--all", action="store_true", help="show all layers, not only INT8-eligible ones")
    sp.add_argument("--runner", default="auto", choices=RUNNERS, help="where the INT8 candidate runs: Polygraphy's "
                    "TrtRunner on its TensorRT engine (tensorrt: TensorRT 10.12+ and an NVIDIA GPU; marking a layer's "
                    "outputs changes what TensorRT fuses), OnnxrtRunner (onnxruntime), or auto (TensorRT where it runs)")
    sp.add_argument("--max-memory", metavar="SIZE", help="memory the layer-wise comparison may use, e.g. 4G, 512M "
                    "or 40%% (default: half of the memory budget, 80%% of free RAM); outputs are compared in chunks")


def _build_args(sp):
    sp.add_argument("--policy", action="append", help="policy JSON (default: the default policy); with --ray, "
                    "repeat it to build several at once")
    sp.add_argument("--backend", default="auto", choices=BACKENDS)
    sp.add_argument("--calibration", default="minmax", choices=CALIB_METHODS)
    sp.add_argument("--network-default", default="fp32", choices=NETWORK_DEFAULTS)
    sp.add_argument("--iterations", type=int, default=30, help="interleaved timing pairs (default 30)")
    _warn_arg(sp)
    _metric_args(sp)
    _trt_args(sp)
    sp.add_argument("--ray", metavar="ADDRESS",
                    help=f"build every --policy as a Ray task holding one GPU of the cluster at ADDRESS ({RAY_FORMS}); "
                         "every node must see the model, the data and the workspace at the same paths "
                         f"(docs/distributed.md); the builds take the build job's defaults. Only this flag: ${RAY_ENV} "
                         "moves trials, not builds")


def _trial_args(sp):
    sp.add_argument("--workers", type=int, default=2,
                    help="parallel worker processes (default 2; with --ray local: the Ray instance's CPUs)")
    sp.add_argument("--ray", metavar="ADDRESS", default=None,
                    help="run the trials as Ray tasks on the cluster at ADDRESS (auto, HOST:6379, ray://HOST:10001, "
                         f"or local); default ${RAY_ENV}, else local worker processes")


def _warn_arg(sp):
    sp.add_argument("--warn-below", type=float, default=WARN_BELOW, metavar="COSINE",
                    help=f"warn when the build's cosine_mean (of the first --metric-output, else of the first float "
                         f"output) falls below this (default {WARN_BELOW}); the warning names the metric")


def _metric_args(sp):
    """What quality is measured on (``core.measure.evaluation``): per output, per slice, per task, the user's metric."""
    sp.add_argument("--metric-output", action="append", metavar="SPEC",
                    help=f"measure quality on this output or slice of its last axis: {METRIC_OUTPUT_FORM} (repeatable; "
                         "the first is the headline, each is reported by NAME; a budget addresses one as "
                         "NAME:METRIC, e.g. --budget 'scores:cosine_mean>=0.99'). Default: the first float output")
    sp.add_argument("--task", default="auto", choices=TASKS,
                    help="task metrics: classification (top-1 agreement, and accuracy with labels), dense (IoU of "
                         "the thresholded maps), detection (score-channel cosine, top-k agreement, IoU of the top-k "
                         "boxes), none; auto (default) picks from the output's shape and values")
    sp.add_argument("--map-threshold", type=float, default=DEFAULT_THRESHOLD, metavar="T",
                    help=f"dense maps: the threshold of the mask IoU (default {DEFAULT_THRESHOLD}; DBNet binarises at 0.3)")
    sp.add_argument("--box-format", default="cxcywh", choices=BOX_FORMATS,
                    help="detection: channels 0-3 of each box (default cxcywh, as YOLOX; or xyxy)")
    sp.add_argument("--top-boxes", type=int, default=DEFAULT_TOP_K, metavar="K",
                    help=f"detection: the top-K boxes by score compared (default {DEFAULT_TOP_K})")
    sp.add_argument("--metric-file", metavar="FILE",
                    help="a Python file with def score(reference: dict, candidate: dict, inputs: dict) -> float, higher "
                         "is better, called once on the whole evaluation set (output name -> array of all samples, "
                         "input name -> array); its value is the metric 'user', e.g. --budget 'user>=0.98'. It runs "
                         "in the build's or job's process and the trial workers; its errors show its own traceback")


def _gpu_arg(sp):
    """``--gpu`` / ``--gpu-spec`` of the estimated TensorRT time (target tensorrt without TensorRT here)."""
    estimate_command.add_gpu_args(sp, check=True)


def _trt_args(sp):
    sp.add_argument("--trt-profile", action="append", metavar="INPUT=MIN:OPT:MAX",
                    help="TensorRT optimisation profile of a dynamic input for this build's engine only, shapes like "
                         "1x64 (default: --profile's range, else the run's shape as opt; batch 1..16 where the batch "
                         "is dynamic)")
    sp.add_argument("--trt-workspace-gb", type=float, default=4.0, help="TensorRT builder workspace (default 4 GiB)")


def search_kind(args) -> tuple[tuple[str, ...], bool]:
    """The calibration methods ``search`` tries and whether it runs the put-back pass: ``--quick`` is one method
    (``--calibration``, default minmax) without it; the full search, every method with it."""
    if args.calibration and not args.quick:
        raise MixprecError("--calibration picks the one method of the quick search",
                           "add --quick, or leave --calibration out (the full search tries every method)")
    return ((args.calibration or "minmax",), False) if args.quick else (CALIB_METHODS, True)


def cmd_search(args):
    bar = Progress("search")
    methods, refine = search_kind(args)
    g = estimate_command.gpu_from_args(args)  # a bad --gpu-spec fails before the model loads
    p = _project(args, bar)
    custom = GPUS.get(g.key) != g  # a --gpu-spec or a GPU saved in the workspace travels as itself
    config = SearchConfig(budget=args.budget, workers=args.workers, ray=args.ray, smooth=args.smooth,
                          backend=args.backend,
                          trt_options=trt_options(args), warn_below=args.warn_below, gpu=g if custom else g.key,
                          cost_params=load_gpu_calibration(p.ws, g), metrics=metric_spec(args), methods=methods,
                          refine=refine, network_default=args.network_default)
    r = search(p, config, progress=bar)
    bar.done()
    out = Path(args.out) if args.out else p.ws.policies / f"search-{r.policy.sha256[:12]}.json"
    atomic_write_text(out, r.policy.to_json())
    doc = r.to_json() | {"policy_path": str(out), "warnings": list(r.run.warnings) if r.run else [],
                         "data_generated": bool(r.run and r.run.data_generated), "target": p.target,
                         "gpu": g.key, "network_default": args.network_default, "quick": bool(args.quick),
                         "methods": list(methods)}  # "objective" is r's: what ranked the candidates, a fallback too
    if custom:
        doc["gpu_spec"] = g.to_json()
    text = [r.message, f"policy written to {out}  ({r.seconds:.0f} s)"]
    if r.run is not None:
        q, lat = r.run.quality, r.run.latency
        text.append(f"build {r.run.run_id}: cosine mean {q.cosine_mean:.4f} min {q.cosine_min:.4f}, speedup "
                    f"{speedup_text(lat.speedup)[0]} [{r.run.latency_label}], reformat {r.run.reformat.pct:.1f}%, INT8 MAC share "
                    f"{100 * r.run.int8_mac_fraction:.0f}%{_on_generated(r.run)}")
        text.append(_quality_lines(q) + _on_generated(r.run))
    front = r.front
    if front["est_high_ms"].isna().all():  # no TensorRT estimate, no band
        front = front.drop(columns=["est_low_ms", "est_high_ms"])
    text.append("Pareto front (quality on the dev half, estimated latency"
                + (", est_low_ms-est_high_ms: the estimate's band" if "est_high_ms" in front else "") + "):")
    text.append(front.to_string(index=False))
    _emit(args, doc, "\n".join(text))
    return 0 if r.met_on_dev and r.met_on_holdout is not False else 1


def cmd_report(args):
    """A trtexec report: its layers and reformats, the GPU it says it was built on (``--log``: trtexec's output
    names it; the layer info and profile never do) and, with ``--model``, how many of its engine layers are layers
    of that model (by ONNX node name), as the dashboard's report import says them."""
    rep = load_engine_report(args.graph, args.profile)
    doc = rep.to_json()
    rf = doc["reformat"]
    timing = (f", {rf['ms']:.4f} ms of {rf['total_ms']:.4f} ms ({rf['pct']:.1f}% of the per-layer time sum)"
              if rf["ms"] is not None else " (no profile given: no times)")
    device = engine_device(args.graph, args.profile, args.log)
    doc["device"] = device.to_json() | {"text": device.text()}
    lines = [f"{doc['layers']} layers; reformat {rf['count']} layers{timing}",
             f"GPU: {device.text()}" + ("" if device.named else f". {LOG_HINT}: pass it with --log")]
    if args.model:
        model = load_model(args.model, Workspace(default_root()))
        match = match_model(rep.layers, node_names(model.proto.graph), f"the model ({model.name})")
        doc["model_match"] = match.to_json() | {"text": match.text()}
        lines.append(f"Model: {match.text()}" + ("" if match.enough else (
            f". This report is not of {model.name}: a calibration on it is refused (import the reports of an "
            "engine built from this model's ONNX)")))
    else:
        doc["model_match"] = None
        lines.append("Model: not checked (--model MODEL.onnx says how many engine layers are layers of the model)")
    _emit(args, doc, "\n".join(lines))


def _add_module_commands(sub) -> None:
    """The commands whose parser lives in their own module: ``estimate`` and ``data``."""
    estimate_command.add_parser(sub)
    data_command.add_parser(sub)


def _shape_args(sp):
    """``--dim``, ``--shape`` and ``--profile`` of every command that takes the input shapes."""
    sp.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a named dynamic dim")
    sp.add_argument("--shape", action="append", metavar="INPUT=1x3x320x320",
                    help="the full shape of an input (every dim, named or not; repeatable)")
    sp.add_argument("--profile", action="append", metavar="INPUT=MIN:OPT:MAX",
                    help="the dynamic-shape profile of an input's exported TensorRT engine, e.g. "
                         "input_ids=1x16:4x128:8x512 (repeatable): trtexec --minShapes/--optShapes/--maxShapes; "
                         "the project runs at OPT, as if --shape INPUT=OPT were given")


def _search_args(sp):
    """``search``'s own arguments: the budget, where its trials run, the search's kind (--quick, --calibration) and
    network default, the backend, the GPU of the estimate, the quality metrics and TensorRT's options."""
    sp.add_argument("--budget", required=True,
                    help="METRIC>=VALUE (or <= for top1_drop, kl_div, perplexity), e.g. 'cosine_mean>=0.99', "
                         "'snr_db>=30', 'top1_drop<=0.5%%'; NAME:METRIC>=VALUE bounds the metric output NAME "
                         "(--metric-output), e.g. 'scores:cosine_mean>=0.99'; task metrics mask_iou, score_cosine, "
                         "score_topk, box_iou; 'user>=0.98' bounds the --metric-file's score")
    _trial_args(sp)
    sp.add_argument("--out", help="where to write the policy JSON (default: workspace/policies/)")
    sp.add_argument("--smooth", action="store_true",
                    help="also try SmoothQuant-style smoothing (alpha 0.75) of every MatMul with weights (kept only if it pays)")
    sp.add_argument("--backend", default="auto", choices=BACKENDS,
                    help="backend of the latency model and the verifying build (quality trials run on ONNX Runtime)")
    sp.add_argument("--network-default", default="fp32", choices=NETWORK_DEFAULTS,
                    help="the precision of the layers the search does not choose (not INT8-eligible), as "
                         "build --network-default sets it (default fp32; eligible layers that fall back are FP16)")
    sp.add_argument("--quick", action="store_true",
                    help="the quick search: one calibration method (--calibration) and no put-back pass; the full "
                         "search may keep more layers INT8")
    sp.add_argument("--calibration", choices=CALIB_METHODS,
                    help="the quick search's calibration method (default minmax; with --quick only)")
    _gpu_arg(sp)
    _warn_arg(sp)
    _metric_args(sp)
    _trt_args(sp)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m core", description="mixprec: sensitivity-guided mixed precision "
                                 "for ONNX models headed to TensorRT")
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name, fn, help_, model=True, data=True):
        sp = sub.add_parser(name, help=help_)
        if model:
            sp.add_argument("model", help="path to a .onnx file or " + "|".join(f"sample:{n}" for n in SAMPLES))
        if data:
            sp.add_argument("--data", help="calibration data .npz (one array per input, samples along its batch axis: "
                                           "axis 0 for most models; see inspect)")
            sp.add_argument("--eval", help="held-out evaluation data .npz (default: the sample's, or the last "
                                           "quarter of --data)")
            sp.add_argument("--batch", type=int, default=1, help="batch size for dynamic batch dims (default 1)")
            _shape_args(sp)
            sp.add_argument("--no-batch", action="append", metavar="INPUT",
                            help="INPUT has no batch axis (e.g. an audio model's [frames, bins]): it is fed whole, "
                                 "one sample per array along a new leading axis of the .npz (repeatable)")
            sp.add_argument("--branch", action="append", metavar="INPUT=true|false",
                            help="a merged decoder's If branch, fixed on load (default: use_cache_branch=true, "
                                 "the decoder with past; see inspect)")
        if data and name != "export":  # export's --target is the compile target (trt/ort)
            sp.add_argument("--target", dest="deploy_target", default=DEFAULT_TARGET, choices=DEPLOY_TARGETS,
                            help="where the model is deployed: tensorrt (GPU, default) or onnxruntime (CPU); "
                                 "labels latency and sets the search objective")
        sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        sp.set_defaults(func=fn)
        return sp

    add("inspect", cmd_inspect, "model summary and layer inventory")
    _rank_args(add("rank", cmd_rank, "Polygraphy layer-wise FP32-vs-INT8 ranking"))
    _build_args(add("build", cmd_build, "build a policy and measure latency, reformat overhead and quality"))
    sp = add("export", cmd_export, "export a policy as JSON, trtexec/Polygraphy commands or compiled ONNX")
    sp.add_argument("--policy", help="policy JSON (default: the default policy)")
    sp.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    sp.add_argument("--target", default="trt", choices=TARGETS, help="int8 encoding of --format onnx")
    sp.add_argument("--trt-version", default=DEFAULT_TRT_VERSION,
                    help=f"TensorRT that reads --format trtexec / calib-cache (its cache header; default {DEFAULT_TRT_VERSION})")
    sp.add_argument("--tf32", action="store_true", help="let FP32 layers use TF32 (default off: --noTF32)")
    sp.add_argument("--atol", type=float, help="--format polygraphy tolerance (default: measured, see the file)")
    sp.add_argument("--calibration", default="minmax", choices=CALIB_METHODS)
    sp.add_argument("--network-default", default="fp32", choices=NETWORK_DEFAULTS)
    sp.add_argument("--out", required=True)
    sp = add("sensitivity", cmd_sensitivity, "isolated or leave-one-out per-layer INT8 sensitivity")
    sp.add_argument("--mode", default="isolated", choices=MODES)
    sp.add_argument("--calibration", default="minmax", choices=CALIB_METHODS)
    _trial_args(sp)
    _metric_args(sp)
    sp.add_argument("--top", type=int, default=20)
    _search_args(add("search", cmd_search, "search the policy with the most INT8 benefit that meets a quality budget"))
    sp = sub.add_parser("sample", help="write a bundled sample: model.onnx, calib.npz, eval.npz")
    sp.add_argument("name", choices=SAMPLES)
    sp.add_argument("--out", required=True)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_sample)
    sp = sub.add_parser("report", help="read trtexec --exportLayerInfo / --exportProfile JSON")
    sp.add_argument("graph")
    sp.add_argument("profile", nargs="?")
    sp.add_argument("--model", help="the ONNX model (a path or sample:NAME) the engine should be of: says how many "
                                    "of the report's engine layers are its layers")
    sp.add_argument("--log", help="trtexec's output of the same run (trtexec … > trtexec.log), or TREx's device JSON: "
                                  "the GPU it names")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_report)
    _add_module_commands(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with stdout_for_the_document(bool(getattr(args, "json", False))):
            rc = args.func(args)
    except MixprecError as e:
        _print_notes()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a write or read the commands did not wrap: still one line, never a traceback
        _print_notes()
        print(f"error: {_os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - ONNX Runtime refusing inputs where no caller named them: one line too
        if not is_ort_run_error(e):
            raise
        _print_notes()
        print(f"error: {feed_error(e, None, 'running the model')}", file=sys.stderr)
        return 2
    _print_notes()
    return rc or 0
