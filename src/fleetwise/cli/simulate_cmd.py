"""`fleetwise simulate`: replay a workload or trace against a plan's fleet; write summary.json + records.

Two forms:
    fleetwise simulate PLAN (--workload W.yaml | --trace FILE) [--faults F.yaml] --out DIR
    fleetwise simulate --model M --gpu G --replicas N [--tp T] [--policy P] --trace FILE --out DIR
The second builds a one-pool colocated plan (routing: `--policy`, default round-robin); with a
plan file `--policy` replaces the plan's routing. PLAN is any fleet document (`PlanSpec.load`: a
plan YAML, `fleetwise plan --fleet-out`, or `--json`'s `fleet` section); its SLO is the goodput
target unless `--ttft-slo`/`--tpot-slo`/`--e2e-slo` give one. Owns argument handling and printing only; the
simulation is `fleetwise.sim.simulate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fleetwise.cli import progress, trace_columns
from fleetwise.cli.common import (
    add_over_context_arg,
    add_seed_arg,
    console,
    float_flag,
    input_file,
    int_flag,
    rename_flag,
    spec_from_flags,
)
from fleetwise.cli.report_cmd import add_report_flag, check_report_path
from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.routing.registry import policy_names
from fleetwise.sim.results import RECORDS_FORMATS, require_parquet
from fleetwise.sim.runner import MAX_MODEL_LEN_REASON, SimOptions, simulate
from fleetwise.spec.base import load_document
from fleetwise.spec.faults import FaultScenario, check_faults_apply, version_skew_warnings
from fleetwise.spec.limits import MAX_DURATION_S, MAX_REPLICAS, MAX_REQUESTS
from fleetwise.spec.output import check_writable_dir, check_writable_file
from fleetwise.spec.plan import PlanSpec, resolve_pool
from fleetwise.spec.slo import SLOSpec
from fleetwise.spec.workload import TraceArrival
from fleetwise.workload.context import apply_context_limit, plan_context_tokens

QUICK_START_POLICY = "round-robin"
"""Routing of the `--model/--gpu` quick start when no `--policy` is given."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate a fleet plan on a workload or trace; write summary.json and requests.csv",
        description="Discrete-event simulation of a plan (pools, KV link, routing) on a workload or trace, "
                    "optionally under faults. Writes DIR/summary.json and DIR/requests.csv.",
    )
    p.add_argument("plan", nargs="?", type=input_file("plan file"), help="plan file (YAML/JSON); omit for the --model/--gpu quick start")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="W.yaml", type=input_file("workload file"), help="workload spec file")
    src.add_argument("--trace", metavar="FILE", type=input_file("trace file"), help="trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV, ...)")
    p.add_argument("--faults", metavar="F.yaml", type=input_file("fault file"), help="fault scenario file")
    p.add_argument("--policy", default=None, metavar="P",
                   help=f"routing policy preset (known: {', '.join(policy_names())}); replaces the plan's "
                        f"routing; quick start default {QUICK_START_POLICY}")
    add_seed_arg(p, "seed for workload, routing and replay (default 0)")
    p.add_argument("--requests", type=int_flag(1, MAX_REQUESTS), default=None, metavar="N",
                   help="keep only the first N requests (generated lazily: a bigger workload is cut, not built)")
    trace_columns.add_flag(p, "with --trace, or a workload file replaying a trace")
    p.add_argument("--rate", type=float, default=None, metavar="RPS", help="replay the trace at this mean rate")
    stretch = p.add_argument("--arrival-stretch", type=float_flag(positive=True), default=None, metavar="F",
                             help="multiply the trace's inter-arrival times by F (2 replays at half the rate; "
                                  "default 1)")
    rename_flag(p, "--time-scale", stretch)  # --time-scale is modelled seconds per wall second (emulate)
    p.add_argument("--feedback-delay", type=float_flag(0.0, MAX_DURATION_S), default=0.0, metavar="S",
                   help="router view refresh period in seconds (0 = exact per-request views)")
    p.add_argument("--ttft-slo", type=float, default=None, metavar="S", help="TTFT target for goodput")
    p.add_argument("--tpot-slo", type=float, default=None, metavar="S", help="TPOT target for goodput")
    p.add_argument("--e2e-slo", type=float, default=None, metavar="S", help="end-to-end target for goodput")
    add_over_context_arg(p)
    fmt = p.add_argument("--records-format", choices=RECORDS_FORMATS, default="csv",
                         help="format of the per-request records in --out (default csv; parquet needs "
                              "`pip install 'fleetwise[parquet]'`)")
    rename_flag(p, "--records", fmt)  # --records is a records file elsewhere (ledger verify)
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar (same as --quiet)")
    progress.add_quiet_flag(p)
    add_report_flag(p)
    t = p.add_argument_group("trace export (Perfetto / chrome://tracing)")
    t.add_argument("--trace-events", default=None, metavar="FILE",
                   help="write a Chrome trace-event JSON: a track per replica (steps and batch composition), "
                        "per KV link (transfers) and per request (queue, prefill, transfer, decode)")
    ev_req = t.add_argument("--trace-events-requests", default=None, metavar="A:B",
                            help="with --trace-events: requests A to B-1 in arrival order (default 0:1000)")
    ev_win = t.add_argument("--trace-events-window", default=None, metavar="T0:T1",
                            help="with --trace-events: requests arriving between T0 and T1 simulated seconds, "
                                 "and the steps then")
    rename_flag(t, "--trace-requests", ev_req)  # --trace-requests counts workload trace requests (scenarios)
    rename_flag(t, "--trace-window", ev_win)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    q = p.add_argument_group("quick start (no plan file)")
    q.add_argument("--model", help="catalog model name or model file")
    q.add_argument("--gpu", help="catalog accelerator name")
    q.add_argument("--replicas", type=int_flag(1, MAX_REPLICAS), default=1, help="colocated replicas (default 1)")
    q.add_argument("--tp", type=int_flag(1), default=1, help="tensor parallel degree per replica (default 1)")
    p.set_defaults(func=run)


def quick_plan(model: str, gpu: str, replicas: int, tp: int, policy: str = QUICK_START_POLICY) -> PlanSpec:
    """One colocated pool of `replicas` x (tp GPUs), routed by the preset `policy`."""
    if replicas < 1 or tp < 1:
        raise SpecError(f"--replicas={replicas} and --tp={tp} must be at least 1")
    plan = PlanSpec(name=f"{model}-{gpu}-x{replicas}", routing=policy, pools=[
        {"name": "mixed", "role": "mixed", "replicas": replicas, "accelerator": gpu, "model": model,
         "parallelism": {"tp": tp}},
    ])
    plan.check(where="quick start")
    named, card = resolve_pool(plan.pools[0], "quick start")  # files: the names they hold, not their paths
    return plan.model_copy(update={"name": f"{named.name}-{card.name}-x{replicas}"})


def check_policy(name: str) -> str:
    """`name` if it is a routing preset; else a one-line error listing the known ones."""
    known = policy_names()
    if name not in known:
        raise SpecError(f"--policy={name!r}: unknown routing policy; known: {', '.join(known)}")
    return name


def load_plan(args: argparse.Namespace) -> PlanSpec:
    policy = check_policy(args.policy) if args.policy is not None else None
    if args.plan:
        if args.model or args.gpu:
            raise SpecError("give either a plan file or --model/--gpu (quick start), not both")
        plan = PlanSpec.load(args.plan)
        return plan if policy is None else plan.model_copy(update={"routing": policy})
    if not (args.model and args.gpu):
        raise SpecError("no plan: give PLAN.yaml, or --model M --gpu G [--replicas N] [--tp T] for a quick start")
    return quick_plan(args.model, args.gpu, args.replicas, args.tp, policy or QUICK_START_POLICY)


def load_requests(args: argparse.Namespace) -> list[Request]:
    if args.workload:
        from fleetwise.spec.workload import WorkloadSpec
        from fleetwise.workload.generate import generate

        if args.rate is not None or args.arrival_stretch is not None:
            raise SpecError("--rate/--arrival-stretch apply only with --trace; set the rate in the workload file")
        spec = load_document(WorkloadSpec, args.workload)
        columns = trace_columns.parse(args.trace_columns)
        if columns is not None:
            arrival = trace_columns.apply(spec.arrival, columns, args.workload)
            spec = spec.model_copy(update={"arrival": arrival})
        if args.requests and (spec.num_requests is None or spec.num_requests > args.requests):
            spec = spec.model_copy(update={"num_requests": args.requests})  # generate only what is kept
        reqs = generate(spec, seed=args.seed)
        return reqs[: args.requests] if args.requests else reqs
    from fleetwise.workload.traces import load_trace

    arrival = spec_from_flags(TraceArrival, {"path": ("--trace", args.trace), "rate_rps": ("--rate", args.rate),
                                             "time_scale": ("--arrival-stretch", args.arrival_stretch),
                                             "max_requests": ("--requests", args.requests)})
    columns = trace_columns.parse(args.trace_columns)
    notes: list[str] = []
    reqs = load_trace(arrival.path, time_scale=arrival.time_scale, rate_rps=arrival.rate_rps,
                      max_requests=arrival.max_requests, seed=args.seed, columns=columns, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return reqs


def run(args: argparse.Namespace) -> int:
    slo = spec_from_flags(SLOSpec, {"ttft_max_s": ("--ttft-slo", args.ttft_slo),
                                    "tpot_max_s": ("--tpot-slo", args.tpot_slo),
                                    "e2e_max_s": ("--e2e-slo", args.e2e_slo)})
    check_writable_dir(args.out, "--out")
    if args.records_format == "parquet":
        require_parquet("--records-format parquet")
    check_report_path(args.report)
    if args.trace_events and Path(args.trace_events).resolve().parent != Path(args.out).resolve():
        check_writable_file(args.trace_events, "--trace-events")  # inside --out: made with it
    plan = load_plan(args)
    if plan.slo is not None and slo == SLOSpec():  # a fleet document's targets, unless flags give some
        slo = SLOSpec(ttft_max_s=plan.slo.ttft_s, tpot_max_s=plan.slo.tpot_s)
    faults = FaultScenario.load(args.faults) if args.faults else None
    if faults is not None:
        check_faults_apply(faults, plan, args.faults)
        for line in version_skew_warnings(faults, plan, args.faults):
            print(f"warning: {line}", file=sys.stderr)
    reqs = load_requests(args)
    if not reqs:
        raise SpecError("the workload produced no requests; check num_requests/duration_s or the trace file")
    reqs, over_context = apply_context_limit(reqs, plan_context_tokens(plan), args.over_context,
                                             args.workload or args.trace)
    if not reqs:
        raise SpecError(f"--over-context={args.over_context}: every request was skipped; none fits the model's "
                        f"context of {over_context['max_context_tokens']:,} tokens")
    window = recorder = None
    if args.trace_events or args.trace_events_requests or args.trace_events_window:
        if not args.trace_events:
            raise SpecError("--trace-events-requests/--trace-events-window bound the trace export; add --trace-events FILE")
        from fleetwise.report.perfetto import Window

        window = Window.parse(args.trace_events_requests, args.trace_events_window)
        recorder = window.recorder(sorted(r.arrival_s for r in reqs))
    quiet = args.quiet or args.no_progress
    with progress.progress("simulating", 1.0, quiet) as update:
        opts = SimOptions(seed=args.seed, slo=slo, feedback_delay_s=args.feedback_delay, recorder=recorder,
                          on_progress=(lambda now, last: update(min(now / last, 1.0)))
                          if progress.wanted(quiet) else None)  # no callback: the event loop's fast path
        res = simulate(plan, reqs, faults, opts)
    rejected = res.summary["failure_reasons"].get(MAX_MODEL_LEN_REASON, 0)
    res.summary["over_context"] = {"policy": args.over_context, **over_context, "rejected_max_model_len": rejected}
    paths = res.write(Path(args.out), args.records_format)
    _print(res.summary, paths)
    if recorder is not None and window is not None:
        from fleetwise.report.perfetto import write_trace

        trace = write_trace(res, recorder, window, args.trace_events)
        print(f"trace: {trace} (open in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    if args.report:
        from fleetwise.cli.report_cmd import write

        write(Path(args.out), args.report, args.open, quiet)
    return 0


def _print(s: dict[str, Any], paths: dict[str, str]) -> None:
    c = console(markup=True)
    head = f"[bold]{s['plan']}[/]: {s['requests_completed']}/{s['requests_total']} completed, {s['requests_failed']} failed"
    if not s["requests_completed"]:  # the summary's statistics of no requests are zeros, not measurements
        reasons = ", ".join(f"{k}: {v}" for k, v in s["failure_reasons"].items())
        c.print(head)
        c.print(f"  no request completed ({reasons}): no latency, throughput or cost figures")
        c.print(f"  wrote {paths['summary']} and {paths['records']}")
        return
    c.print(f"{head} in {s['duration_s']:.1f} s simulated ({s['sim_wall_s']:.2f} s wall)")
    if s["failure_reasons"].get(MAX_MODEL_LEN_REASON):
        c.print(f"  {s['failure_reasons'][MAX_MODEL_LEN_REASON]} rejected on arrival: longer than a replica's "
                "max_model_len (its KV cache or engine.max_model_len); see requests.csv's failure column")
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        m = s[k]
        if m["p50"] is None:  # TPOT of one-token outputs only: undefined
            c.print(f"  {k[:-2]:5s} n/a (every completed output is 1 token)")
            continue
        c.print(f"  {k[:-2]:5s} p50 {m['p50'] * 1e3:9.1f} ms   p90 {m['p90'] * 1e3:9.1f} ms   p99 {m['p99'] * 1e3:9.1f} ms")
    t = s["throughput"]
    c.print(f"  throughput {t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:.0f} tok/s; "
            f"goodput {s['goodput_rps']:.2f} req/s (SLO attainment {s['slo_attainment']:.1%}); "
            f"${s['cost']['usd_per_1m_output_tokens']:.3f} per 1M output tokens")
    c.print(f"  wrote {paths['summary']} and {paths['records']}")
