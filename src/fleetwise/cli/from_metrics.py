"""`fleetwise calibrate --from-metrics SOURCE... --plan FLEET -o MEASURED.json`: service rates from a running fleet.

Each SOURCE is one replica's metrics, `NAME=` in front naming the replica (`mixed-0=http://...`),
else the replicas of the fleet document in plan order: a /metrics URL (scraped twice,
`--interval` seconds apart, and differenced), a saved text-format dump (totals over `--interval`
seconds), or two dumps `BEFORE,AFTER` taken `--interval` seconds apart. `--time-scale` converts
wall seconds to the engine's seconds for an emulated fleet (default: each emulated replica's own,
from its page; a value that disagrees with the page is refused). The fit is `fleetwise.planner.measured`.
"""

from __future__ import annotations

import argparse
import http.client
import math
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetwise.cli.common import float_flag, input_file
from fleetwise.errors import SpecError, quote
from fleetwise.spec.limits import MAX_DURATION_S
from fleetwise.spec.output import check_writable_file, write_json

MAX_METRICS_BYTES = 16 << 20
"""Largest metrics page or dump read (a vLLM server's page is tens of kB)."""


def add_flags(c: Any) -> None:
    """The `--from-metrics` flags of `fleetwise calibrate`."""
    c.add_argument("--from-metrics", nargs="+", metavar="SOURCE", default=None,
                   help="fit measured service rates instead: one replica's /metrics URL or saved dump(s) per "
                        "SOURCE ([NAME=]URL|FILE|BEFORE,AFTER), vLLM or SGLang metric names; needs --plan")
    c.add_argument("--plan", metavar="FLEET", default=None, type=input_file("plan file"), help="with --from-metrics: the fleet document the "
                   "replicas run (`fleetwise plan --fleet-out`)")
    c.add_argument("--interval", type=float_flag(positive=True, maximum=MAX_DURATION_S), default=None, metavar="S",
                   help="with --from-metrics: seconds between the two scrapes of a URL (default 60), or seconds "
                        "a dump (or a BEFORE,AFTER pair) covers")
    c.add_argument("--time-scale", type=float_flag(positive=True), default=None, metavar="X",
                   help="with --from-metrics: engine seconds per wall second (an emulated fleet's --time-scale; "
                        "default: the page's own fleetwise:time_scale, else 1)")


def _read(src: str) -> str:
    if src.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(src, timeout=10.0) as r:
                return str(r.read(MAX_METRICS_BYTES).decode("utf-8", "replace"))
        except (OSError, http.client.HTTPException) as err:  # refused, timed out, HTTP error, not HTTP at all
            why = f"{type(err).__name__}: {quote(str(err), 80)}" if isinstance(err, http.client.HTTPException) else err
            raise SpecError(f"--from-metrics {src}: cannot scrape it ({why}); check the URL, or leave a "
                            "replica that is down out and name the others (NAME=SOURCE)") from None
    path = Path(src)
    if not path.is_file():
        raise SpecError(f"--from-metrics {src}: no such file or URL; give a /metrics URL or a saved dump")
    return path.read_text(encoding="utf-8", errors="replace")[:MAX_METRICS_BYTES]


def _named(args: argparse.Namespace, plan: Any) -> list[tuple[str, str]]:
    names = [f"{p.name}-{i}" for p in plan.pools for i in range(p.replicas)]
    out = []
    for k, src in enumerate(args.from_metrics):
        name, sep, rest = src.partition("=")
        if sep and not name.startswith(("http", "/", ".")) and "://" not in name:
            if name not in names:
                raise SpecError(f"--from-metrics {src}: {name!r} is not a replica of {args.plan}; known: "
                                f"{', '.join(names)}")
            out.append((name, rest))
        elif k < len(names):
            out.append((names[k], src))
        else:
            raise SpecError(f"--from-metrics: {len(args.from_metrics)} sources for {len(names)} replicas; name "
                            "each (NAME=SOURCE) or give one per replica")
    return out


def collect(args: argparse.Namespace, plan: Any) -> dict[str, list[Any]]:
    """Each pool's replica metrics over the measured span, in engine seconds."""
    from fleetwise.planner.metrics_page import growth, parse_page

    named = _named(args, plan)
    urls = [(n, s) for n, s in named if s.startswith(("http://", "https://"))]
    interval = args.interval if args.interval is not None else (60.0 if urls else None)
    if interval is None:
        raise SpecError("--from-metrics with saved dumps needs --interval S: the seconds the dumps cover")
    first = {n: parse_page(_read(s), s) for n, s in urls}
    if urls:
        time.sleep(interval)
    by_pool: dict[str, list[Any]] = {}
    for name, src in named:
        if name in first:
            ms = parse_page(_read(src), src)
            ms = growth(ms, first[name], _span(args.time_scale, interval, ms))
        elif "," in src:
            a, b = src.split(",", 1)
            ms = parse_page(_read(b), b)
            ms = growth(ms, parse_page(_read(a), a), _span(args.time_scale, interval, ms))
        else:
            ms = parse_page(_read(src), src)
            span = _span(args.time_scale, interval, ms)
            for m in ms:
                m.span_s = span
        by_pool.setdefault(name.rpartition("-")[0], []).extend(ms)
    return by_pool


def _span(time_scale: float | None, interval: float, page: list[Any]) -> float:
    """Engine seconds that `interval` wall seconds are on a replica's `page`: --time-scale's, else
    the emulated replica's own (`TIME_SCALE_METRIC`), else 1; SpecError when the two disagree."""
    from fleetwise.spec.engine_metrics import TIME_SCALE_METRIC

    own = page[0].time_scale
    if time_scale is not None and own is not None and not math.isclose(time_scale, own, rel_tol=1e-9):
        raise SpecError(f"{page[0].source}: the replica's {TIME_SCALE_METRIC} {own:g} is not --time-scale "
                        f"{time_scale:g}; pass --time-scale {own:g}, or leave it out to use the page's")
    return interval * (time_scale or own or 1.0)


def run(args: argparse.Namespace) -> int:
    from fleetwise.planner.measured import fit_document
    from fleetwise.spec.plan import PlanSpec

    if args.plan is None:
        raise SpecError("--from-metrics needs --plan FLEET: the fleet document the measured replicas run")
    check_writable_file(args.output, "--output")
    plan = PlanSpec.load(args.plan)
    doc = fit_document(plan, collect(args, plan))
    write_json(args.output, doc)
    for p in doc["pools"]:
        lo, hi = p["ci95"]
        rates = [f"prefill {p['prefill_tokens_per_s']:,.0f} tok/s"] if p["role"] != "decode" else []
        rates += [f"decode {p['decode_tokens_per_s']:,.1f} tok/s per request"] if p["role"] != "prefill" else []
        print(f"{p['pool']}: {p['replicas_measured']} replica(s), {p['requests']:g} requests: {', '.join(rates)}; "
              f"step time x{p['step_time_factor']:.3f} of the model (95% CI {lo:.3f}-{hi:.3f})")
    print(f"wrote {args.output}")
    return 0
