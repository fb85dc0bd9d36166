"""Cost of one planner simulation outside the simulator's event loop (issue 26, planner half).

Run:  python3 benchmarks/planner_run_cost.py [--requests 50 600] [--runs 20]
                                             [--out benchmarks/results/planner_run_cost.json]
      python3 benchmarks/planner_run_cost.py --plan-ab BASE_SRC HEAD_SRC [--pairs 2] [--out ...]

Every planner simulation (`planner/simulate.py` `simulate_fleet`, `passes`) builds a plan, runs
`sim.runner.simulate` (the event loop, then `sim.results.summarize`) and judges the result
(`_judge`: `steady_goodput`, `_waits`). This times `simulate_fleet` (the uncached reference of
`run_fleet`) and `passes` (a verdict-only run through `early.VerdictWatch`) on one fleet: the
built-in question's model (Llama-3.1-70B, ShareGPT lengths), 3 prefill + 3 decode replicas of
H200 bf16 TP2 at 8 req/s, `--runs` seeds per request count (`passes` simulates a standard run:
`requests_for(8, n)`, at least 480 requests, stopped once its verdict is certain). It reports the process CPU per run
(median) and, from one more pass of the same runs under cProfile, the cumulative seconds per run
of the parts outside the event loop (`summarize`, `_judge` ...) and the call counts of
`ModelSpec.kv_bytes` and `VerdictWatch.observe`. Which build ran (compiled or sources) is
`native` (`fleetwise.core.compiled.native()`).

`--plan-ab` instead times the whole default `fleetwise plan --workers 1` (the built-in question)
with two source trees (each a `src` directory, its extensions built in place, e.g. a commit
exported and built with `setup.py build_ext --inplace`), alternated A B A B (`--pairs`) so both
see the same machine: each run's process CPU (user + system, getrusage of the child), wall time,
the 1-minute load average before and after, the simulations, and whether the plan document's
`plans`, `fleet`, `disaggregation` and `infeasible` equal the first run's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RATE_RPS = 8.0
"""Arrival rate of every run: the 6-replica fleet is busy but keeps up (attainment about 1)."""
PARTS = [("sim/runner.py", "simulate"), ("events.py", "run"), ("sim/results.py", "summarize"),
         ("sim/results.py", "_replica"), ("planner/simulate.py", "_judge"),
         ("planner/simulate.py", "steady_goodput"), ("planner/simulate.py", "_waits"),
         ("planner/simulate.py", "to_plan_spec"), ("spec/model.py", "kv_bytes"),
         ("planner/early.py", "observe"), ("dataclasses.py", "replace")]
"""(file suffix, function) whose cumulative time and calls are reported."""


def setup() -> tuple[Any, Any, Any, dict[str, float]]:
    """(spec, mix, fleet, prices) of the measured runs."""
    from fleetwise.planner.defaults import default_spec
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.simulate import FleetShape, PoolShape
    from fleetwise.planner.workload import build_mix

    spec = default_spec()
    mix = build_mix(spec.workload, 2400)
    lay = Layout("h200-sxm", "bf16", 2)
    fleet = FleetShape((PoolShape("prefill", lay, 3), PoolShape("decode", lay, 3)), 50e9)
    return spec, mix, fleet, {"h200-sxm": 3.5}


def runs(n: int, count: int, verdict_only: bool) -> list[float]:
    """Process CPU seconds of `count` runs of `n` requests (seeds 1..count)."""
    from fleetwise.planner import simulate as sim

    spec, mix, fleet, prices = setup()
    spec = spec.model_copy(update={"search": spec.search.model_copy(update={"sample_requests": n})})
    out = []
    for seed in range(1, count + 1):
        sim._memo.clear()
        t0 = time.process_time()
        if verdict_only:
            sim.passes(spec, mix, fleet, prices, RATE_RPS, seed)
        else:
            sim.simulate_fleet(spec, mix, fleet, prices, RATE_RPS, seed,
                               requests=sim.requests_at(mix, RATE_RPS, n))
        out.append(time.process_time() - t0)
    return out


def parts(prof: cProfile.Profile, count: int) -> dict[str, Any]:
    st = pstats.Stats(prof)
    found: dict[str, Any] = {}
    for (f, _line, name), (_cc, nc, _tt, ct, _c) in st.stats.items():  # type: ignore[attr-defined]
        for suffix, func in PARTS:
            if f.endswith(suffix) and name == func:
                found[f"{suffix}:{func}"] = {"ms_per_run": round(ct / count * 1e3, 3), "calls_per_run": nc / count}
    return found


CLI = "from fleetwise.cli.main import main; main()"
SECTIONS = ("plans", "fleet", "disaggregation", "infeasible")
"""The plan document's sections a speed change must leave identical (`benchmarks/plan_identity.py`)."""


def plan_once(src: str, out: Path) -> dict[str, Any]:
    """One `fleetwise plan -o OUT --quiet --workers 1` with `src` first on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": src}
    env.pop("FLEETWISE_PURE_PYTHON", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    subprocess.run([sys.executable, "-c", CLI, "plan", "-o", str(out), "--quiet", "--workers", "1"],
                   env=env, check=False, capture_output=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc = json.loads(out.read_text())
    native = subprocess.run([sys.executable, "-c", "from fleetwise.core.compiled import native; print(native())"],
                            env=env, capture_output=True, text=True).stdout.strip()
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "load_avg_1m_before": round(load0, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2), "native": native == "True",
            "simulations": (doc.get("search") or {}).get("simulations"),
            "sections": json.dumps({k: doc.get(k) for k in SECTIONS}, sort_keys=True)}


def plan_ab(base: str, head: str, pairs: int) -> dict[str, Any]:
    """A B A B ... runs of the default plan; every plan's sections compared with the first."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(pairs):
            for side, src in (("A", base), ("B", head)):
                r = plan_once(src, Path(tmp) / f"{side}{k}.json")
                runs.append({"side": side, "src": src, **r})
                print(side, r["cpu_s"], "s CPU", r["wall_s"], "s wall, load", r["load_avg_1m_before"], flush=True)
    same = all(r["sections"] == runs[0]["sections"] for r in runs)
    for r in runs:
        del r["sections"]
    return {"benchmark": "planner_run_cost --plan-ab", "command": "fleetwise plan -o OUT --quiet --workers 1",
            "plans_identical": same, "runs": runs,
            "cpu_s": {side: [r["cpu_s"] for r in runs if r["side"] == side] for side in ("A", "B")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[50, 600])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plan-ab", nargs=2, metavar=("BASE_SRC", "HEAD_SRC"), default=None)
    ap.add_argument("--pairs", type=int, default=2)
    a = ap.parse_args()
    if a.plan_ab:
        ab = plan_ab(*a.plan_ab, a.pairs)
        if a.out:
            a.out.write_text(json.dumps(ab, indent=1) + "\n")
        print(json.dumps(ab["cpu_s"]), "plans identical:", ab["plans_identical"])
        return
    from fleetwise.core.compiled import native

    rows = []
    runs(50, 2, False)  # imports and first-call costs out of the figures
    for n in a.requests:
        for verdict_only in (False, True):
            cpu = runs(n, a.runs, verdict_only)
            prof = cProfile.Profile()
            prof.enable()
            runs(n, a.runs, verdict_only)
            prof.disable()
            from fleetwise.planner.simulate import requests_for

            simulated = requests_for(RATE_RPS, n) if verdict_only else n  # a standard run's count
            rows.append({"requests": simulated, "call": "passes" if verdict_only else "simulate_fleet", "runs": a.runs,
                         "cpu_ms_per_run_median": round(statistics.median(cpu) * 1e3, 2),
                         "cpu_ms_per_run_min": round(min(cpu) * 1e3, 2),
                         "profiled_ms_per_run": parts(prof, a.runs)})
            print(json.dumps(rows[-1]["requests"]), rows[-1]["call"], rows[-1]["cpu_ms_per_run_median"], "ms")
    doc = {"benchmark": "planner_run_cost", "native": native(), "rate_rps": RATE_RPS,
           "load_avg_1m": round(os.getloadavg()[0], 2), "rows": rows}
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
