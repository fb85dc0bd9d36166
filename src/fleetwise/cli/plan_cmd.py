"""`fleetwise plan [SPEC.yaml] [-o PLAN.json] [--json] [--top K] [--workers N] [--profile P] [--ray ADDRESS]`.

Owns argument parsing and output of the planner (`fleetwise.planner.api.plan`): the readable
report on stdout, the JSON document to a file (`-o`; `--json` prints it instead of the report), and
`--write-schema` to refresh docs/schema/planning-spec.schema.json, and `--report FILE.html`. With no SPEC it answers the
built-in question (Llama-3.1-70B chat on H100 vs H200). An infeasible question prints its
explanation (and writes the JSON) and exits 1; a bad spec is one line and exit 2. On a terminal
a progress bar shows the share of the search done and the time left (`--quiet` hides it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fleetwise.cli import progress, trace_columns
from fleetwise.cli.common import console, input_file, int_flag
from fleetwise.cli.report_cmd import add_report_flag, check_report_path
from fleetwise.errors import SpecError
from fleetwise.spec.catalog import resolve_gpu, resolve_model
from fleetwise.spec.context import request_tokens_problem
from fleetwise.spec.output import check_writable_file, strict_json_dumps, write_json
from fleetwise.spec.planning import PlanningSpec
from fleetwise.spec.workload import IndependentLengths, PresetLengths, longest_tokens

MAX_TOP = 1_000
"""Most plans `--top` may ask to report (a search rarely finds more than a few dozen)."""
MAX_WORKERS = 1_024
"""Most worker processes `--workers` may start."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="plan a deployment: ranked, explained, simulated fleets for a model, hardware, traffic and SLOs",
        description="Enumerate layouts that fit, estimate latency floors, measure effective goodput in the "
                    "simulator, size replicas with headroom, compare colocated and PD plans, rank by cost.",
    )
    p.add_argument("spec", nargs="?", default=None, type=input_file("planning spec"), help="SPEC.yaml (default: the built-in 70B chat question)")
    p.add_argument("-o", "--output", metavar="PLAN.json", default=None,
                   help="also write the plan document (JSON) to this file")
    p.add_argument("--json", dest="json_out", nargs="?", const="-", metavar="OUT", default=None,
                   help="print the plan document (JSON) instead of the report (the older `--json FILE` still "
                        "writes FILE: spell it -o FILE)")
    p.add_argument("--fleet-out", metavar="FLEET.json", default=None,
                   help="write the chosen plan's fleet document alone (what simulate, emulate --plan, gateway "
                        "--plan, up and deploy read; the --json document carries it as `fleet`)")
    p.add_argument("--top", type=int_flag(1, MAX_TOP), default=None, metavar="K",
                   help="plans to report (default: spec.search.top_k)")
    p.add_argument("--workers", type=int_flag(1, MAX_WORKERS), default=None, metavar="N",
                   help="worker processes for simulations (default: CPU count)")
    p.add_argument("--profile", default=None, metavar="PROFILE.json", type=input_file("perf profile"),
                   help="perf profile (`fleetwise calibrate`) pricing the estimate and the simulations; "
                        "overrides the spec's `profile`")
    p.add_argument("--measured", default=None, metavar="MEASURED.json", type=input_file("measured service file"),
                   help="size from service rates measured on a running fleet (`fleetwise calibrate --from-metrics`): "
                        "its step-time factor per accelerator applies to every simulation; the report says per "
                        "plan which numbers are measured and which modelled")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run simulations on a Ray cluster (fleetwise[ray])")
    p.add_argument("--write-schema", nargs="?", const="docs/schema/planning-spec.schema.json", default=None,
                   metavar="PATH", help="write the SPEC.yaml JSON Schema and exit")
    trace_columns.add_flag(p, "when the spec's workload replays a trace")
    add_report_flag(p)
    progress.add_quiet_flag(p)
    p.set_defaults(func=run)


def check_planning_context(spec: PlanningSpec, where: str) -> None:
    """SpecError when the model or a card is unknown (naming the field), or when the workload's longest
    prompt plus longest output exceed the model's context."""
    try:
        ctx = resolve_model(spec.model).max_context_tokens
    except SpecError as err:
        raise SpecError(f"{where}: model: {err}") from None
    for i, acc in enumerate(spec.accelerators):
        try:
            resolve_gpu(acc.name)
        except SpecError as err:
            raise SpecError(f"{where}: accelerators.{i}.name: {err}") from None
    lengths = spec.workload.lengths
    preset = lengths.name if isinstance(lengths, PresetLengths) else None
    if isinstance(lengths, PresetLengths):
        lengths = lengths.resolve()
    if not isinstance(lengths, IndependentLengths):
        return
    prompt, output = longest_tokens(lengths.input), longest_tokens(lengths.output)
    if prompt is None or output is None:
        return
    problem = request_tokens_problem(prompt, output, ctx)
    if problem and preset:
        raise SpecError(f"{where}: workload: {preset} preset: {problem}; presets have no cap: use "
                        "independent lengths")
    if problem:
        raise SpecError(f"{where}: workload: the longest request's {problem} of {spec.model}; cap "
                        "workload.lengths.input/output (max_tokens) to fit")


def run(args: argparse.Namespace) -> int:
    from fleetwise.planner.api import plan
    from fleetwise.planner.defaults import default_spec
    from fleetwise.planner.report import to_json
    from fleetwise.planner.state import PlanOptions
    from fleetwise.report.plan_text import render
    from fleetwise.spec.planning import load_planning_spec, write_planning_schema

    if args.write_schema:
        check_writable_file(args.write_schema, "--write-schema", make_folders=True)
        print(write_planning_schema(args.write_schema))
        return 0
    if args.json_out not in (None, "-"):  # the older spelling of -o FILE
        print(f"fleetwise plan: --json FILE is deprecated, use -o {args.json_out} (same meaning)", file=sys.stderr)
        args.output, args.json_out = args.output or args.json_out, None
    if args.output:
        check_writable_file(args.output, "--output")
    if args.fleet_out:
        check_writable_file(args.fleet_out, "--fleet-out")
    check_report_path(args.report)
    spec = load_planning_spec(args.spec) if args.spec else default_spec()
    columns = trace_columns.parse(args.trace_columns)
    if columns is not None:
        arrival = trace_columns.apply(spec.workload.arrival, columns, f"{args.spec or 'the built-in question'}: workload")
        spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"arrival": arrival})})
    check_planning_context(spec, args.spec or "the built-in question")
    if args.profile:
        from fleetwise.perf.profile import Profile

        Profile.load(args.profile)  # a bad file is one line naming it, before any work
        spec = spec.model_copy(update={"profile": args.profile})
    if args.measured:
        from fleetwise.planner.measured import load_measured
        from fleetwise.spec.base import read_document

        spec = spec.model_copy(update={"measured_service": load_measured(read_document(args.measured), args.measured,
                                                                              resolve_model(spec.model).name,
                                                                              [a.name for a in spec.accelerators])})
    workers = args.workers if args.workers is not None else max(1, os.cpu_count() or 1)
    quiet = args.quiet or args.json_out == "-"
    with progress.progress("planning", 1.0, quiet) as update:
        search = plan(spec, PlanOptions(workers=workers, top_k=args.top, ray_address=args.ray,
                                        progress=update if progress.wanted(quiet) else None))
    doc = to_json(search)
    if args.json_out == "-":
        print(strict_json_dumps(doc))
    else:
        render(doc, console(markup=True))
    if args.output:
        write_json(args.output, doc)
    if args.fleet_out and doc["fleet"] is not None:
        write_json(args.fleet_out, doc["fleet"])
    if args.report:
        from fleetwise.cli.report_cmd import write_document

        write_document(doc, args.report, args.open, args.quiet)
    return 1 if search.infeasible else 0
