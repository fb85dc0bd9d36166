"""`fleetwise scenarios`: run routing policies against round-robin on the acceptance scenarios.

    fleetwise scenarios [--policy P ...] [--seeds N] [--scenario NAME ...] [--trace FILE]
                        [--small] [--jobs J] --out DIR

Writes DIR/scenarios.json (every seed's figures, statistics, verdicts; format in
docs/scenarios.md) and DIR/scenarios.md, prints a rich table and the pass-rule verdicts. Exit
code 0 when every verdict passes, 1 when one fails (`--no-fail` keeps 0). Owns argument handling,
the process pool and printing; the runs are `fleetwise.sim.scenarios`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.table import Table

from fleetwise.cli import progress, trace_columns
from fleetwise.cli.common import add_over_context_arg, console, float_flag, input_dir, input_file, int_flag
from fleetwise.cli.report_cmd import add_report_flag, check_report_path
from fleetwise.errors import SpecError, UnknownNameError
from fleetwise.routing.registry import DEFAULT_POLICY, policy_names
from fleetwise.sim import scenarios as sc
from fleetwise.spec.limits import MAX_RATE_RPS, MAX_REQUESTS, MAX_SEEDS
from fleetwise.spec.output import check_writable_dir, strict_json_dumps

MAX_JOBS = 1_024
"""Most worker processes `--jobs` may start."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "scenarios", help="acceptance scenarios: routing policies vs round-robin over seeds, with the pass rule",
        description="Run each scenario of examples/scenarios (plan + workload + faults) against every requested "
                    "policy and round-robin over N seeds; write DIR/scenarios.json and DIR/scenarios.md, print a "
                    "table and the pass-rule verdicts.",
    )
    p.add_argument("--policy", action="append", default=None, metavar="P",
                   help=f"policy preset to test (repeatable; default {DEFAULT_POLICY}; known: "
                        f"{', '.join(policy_names())}); round-robin always runs as the baseline")
    p.add_argument("--seeds", type=int_flag(1, MAX_SEEDS), default=5, metavar="N", help="seeds per scenario and policy (default 5)")
    p.add_argument("--scenario", action="append", default=None, metavar="NAME",
                   help=f"run only this scenario (repeatable; known: {', '.join(sc.SCENARIO_NAMES)})")
    p.add_argument("--trace", metavar="FILE", type=input_file("trace file"),
                   help="replace each selected scenario's workload by this trace (Azure CSV, Mooncake JSONL, "
                        "BurstGPT CSV, length statistics); seed k replays the k-th window")
    p.add_argument("--trace-rate", type=float_flag(positive=True, maximum=MAX_RATE_RPS), default=None, metavar="RPS",
                   help="with --trace: rescale arrivals to this mean rate (needed for length statistics)")
    p.add_argument("--trace-load", choices=sc.TRACE_LOADS, default="recorded",
                   help="with --trace: time each window as recorded (or at --trace-rate), or 'scenario': scale "
                        "each window to the scenario's own offered load (prompt + output tokens/s), so windows "
                        "of very different load are compared at the load the scenario was sized for")
    p.add_argument("--trace-requests", type=int_flag(1, MAX_REQUESTS), default=None, metavar="N",
                   help="with --trace: requests per seed window (default: the file split evenly over the seeds)")
    trace_columns.add_flag(p, "with --trace")
    add_over_context_arg(p)
    p.add_argument("--small", action="store_true", help="use each scenario's small: overrides (fast check)")
    p.add_argument("--dir", default=None, metavar="DIR", type=input_dir, help="scenario folder (default examples/scenarios)")
    p.add_argument("--jobs", type=int_flag(1, MAX_JOBS), default=1, metavar="J", help="parallel worker processes (default 1)")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when a verdict fails")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_report_flag(p)
    progress.add_quiet_flag(p)
    p.set_defaults(func=run)


def _mapper(jobs: int) -> Callable[[Callable[[Any], Any], Sequence[Any]], Iterable[Any]] | None:
    if jobs <= 1:
        return None

    def run_pool(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterable[Any]:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(fn, items))

    return run_pool


def run(args: argparse.Namespace) -> int:
    check_report_path(args.report)
    check_writable_dir(args.out, "--out")
    for name in args.policy or []:
        if name not in policy_names():
            raise UnknownNameError("routing policy", name, policy_names())
    if args.trace is None and (args.trace_rate is not None or args.trace_requests is not None
                               or args.trace_columns is not None or args.trace_load != "recorded"):
        raise SpecError("--trace-rate/--trace-requests/--trace-columns/--trace-load apply only with --trace FILE")
    con = console()
    scenarios = sc.load_scenarios(args.scenario, args.dir, small=args.small, trace=args.trace,
                                  trace_rate_rps=args.trace_rate, trace_requests=args.trace_requests,
                                  trace_columns=trace_columns.parse(args.trace_columns), seeds=args.seeds,
                                  over_context=args.over_context, trace_load=args.trace_load)
    for s in scenarios:
        for note in s.notes:
            con.print(f"note: {note}")
    pols = sc.with_baseline(args.policy)
    total = sum(len(pols) + len(s.spec.variants) for s in scenarios) * args.seeds
    done = [0]
    with progress.progress(f"{total} simulations", total, args.quiet) as update:

        def on_done(job: sc.Job, rec: dict[str, Any]) -> None:
            done[0] += 1
            update(done[0])

        doc = sc.run_scenarios(scenarios, pols, args.seeds, _mapper(args.jobs), small=args.small, on_done=on_done)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenarios.json").write_text(dumps(doc), encoding="utf-8")
    (out / "scenarios.md").write_text(sc.render_markdown(doc), encoding="utf-8")
    print_table(doc)
    for v in doc["verdicts"]:
        con.print(v)
    con.print(f"wrote {out / 'scenarios.json'} and {out / 'scenarios.md'}")
    if args.report:
        from fleetwise.cli.report_cmd import write_document

        write_document(doc, args.report, args.open, args.quiet)
    return 0 if doc["passed"] or args.no_fail else 1


_NUMBER_LIST = re.compile(r"\[\s*(-?[0-9][0-9.e+-]*(?:,\s*-?[0-9][0-9.e+-]*)*)\s*\]")


def dumps(doc: dict[str, Any]) -> str:
    """Indented JSON with lists of numbers (queue series) kept on one line."""
    text = strict_json_dumps(doc, indent=1)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def print_table(doc: dict[str, Any]) -> None:
    """The summary table on stdout (means ± 95% CI half-widths, paired deltas vs round-robin)."""
    t = Table(title=f"scenarios: {doc['default_policy']} vs {doc['baseline_policy']}, {len(doc['seeds'])} seeds "
                    "(mean ± 95% CI half-width; d = policy - round-robin, paired)")
    t.add_column("scenario")
    t.add_column("policy")
    for c in sc.TABLE_COLUMNS:
        t.add_column(c, justify="right")
    last = None
    for r in sc.table_rows(doc):
        t.add_row(r.scenario if r.scenario != last else "", r.policy, *(r.cells[c] for c in sc.TABLE_COLUMNS))
        last = r.scenario
    console().print(t)
