"""Simulator speed: requests simulated per wall-clock and per CPU second, at several sizes.

Run:  python3 benchmarks/sim_speed.py [--sizes 10000:8,100000:64] [--skip-1m]
                                      [--default-size 1000000:64 | --skip-default] [--only-default]
                                      [--out benchmarks/results/sim_speed.json]

Workload: Poisson arrivals at `--rate-per-replica` x replicas, prompt/output lengths drawn
lognormally around 1024/256 tokens (clipped), Llama-3.1-8B on H100 SXM, one GPU per replica,
round-robin routing, router view refreshed every `--feedback-delay` seconds (the fast mode of
docs/simulator.md). Each size runs `simulate()` once, timed by wall clock (`perf_counter`) and
by this process's CPU time (`process_time`: the steadier figure on a shared machine). Then
the headline run, 1,000,000 requests over 64 replicas (target: under 120 s), unless
`--skip-1m`. Last, the same workload routed by the default policy (`fleetwise-default`: O(workers)
scoring per request) at `--default-size` (1,000,000:64 unless `--skip-default`), stored under
`default_policy`; `--only-default` runs just that one and merges it into an existing `--out`.
All ratios in the output compare figures measured in this one run:
- `cpu_share`: CPU seconds / wall seconds (well below 1: the machine was busy with other work);
- `vs_smallest`: requests/CPU-second relative to the smallest size (how the rate scales);
- `exact_over_fast`: at the smallest size, CPU time of the exact mode (feedback_delay 0, a
  fresh view per arrival) over the fast mode's; with round-robin both give the same results;
- `x_vidur_high`: requests/wall-second over 350, the top of the range Vidur reaches on this
  machine (100-350 requests/s; `benchmarks/vidur_compare.py` measures it on a shared request
  set); the goal is at least 20.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.core.request import Request
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec

VIDUR_HIGH_RPS = 350.0
TARGET_S = 120.0


def make_requests(n: int, rate_rps: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    ins = np.clip(rng.lognormal(np.log(1024), 0.6, n), 16, 8000).astype(int)
    outs = np.clip(rng.lognormal(np.log(256), 0.6, n), 2, 2000).astype(int)
    return [Request(i, float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]


def run_one(n: int, replicas: int, rate_per_replica: float, delay: float, seed: int,
            policy: str = "round-robin") -> dict[str, Any]:
    reqs = make_requests(n, rate_per_replica * replicas, seed)
    plan = PlanSpec(name="speed", pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                                          "replicas": replicas}], routing=policy)
    load0 = os.getloadavg()[0]
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(plan, reqs, options=SimOptions(seed=seed, feedback_delay_s=delay))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s = res.summary
    return {
        "requests": n,
        "replicas": replicas,
        "routing": policy,
        "rate_rps": rate_per_replica * replicas,
        "feedback_delay_s": delay,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_share": round(cpu / wall, 3),
        "requests_per_wall_s": round(n / wall, 1),
        "requests_per_cpu_s": round(n / cpu, 1),
        "events_processed": s["events_processed"],
        "events_per_cpu_s": round(s["events_processed"] / cpu, 1),
        "simulated_s": s["duration_s"],
        "requests_completed": s["requests_completed"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "tpot_p50_s": s["tpot_s"]["p50"],
        "queue_p50_s": s["queue_s"]["p50"],
        "mean_utilization": round(float(np.mean([r["utilization"] for r in s["per_replica"]])), 3),
        "loadavg_1m_before": round(load0, 2),
        "x_vidur_high": round(n / wall / VIDUR_HIGH_RPS, 1),
    }


def run_default(a: argparse.Namespace) -> dict[str, Any]:
    """The workload routed by `fleetwise-default` (scores every worker per request)."""
    n, reps = (int(x) for x in a.default_size.split(":"))
    r = run_one(n, reps, a.rate_per_replica, a.feedback_delay, a.seed, policy="fleetwise-default")
    print(json.dumps(r), flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000:8,100000:64", help="requests:replicas,... run before the 1M run")
    ap.add_argument("--skip-1m", action="store_true", help="skip the 1,000,000-request, 64-replica run")
    ap.add_argument("--rate-per-replica", type=float, default=2.0)
    ap.add_argument("--feedback-delay", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--default-size", default="1000000:64", help="requests:replicas of the default-policy run")
    ap.add_argument("--skip-default", action="store_true", help="skip the default-policy run")
    ap.add_argument("--only-default", action="store_true",
                    help="run only the default-policy run and merge it into an existing --out")
    ap.add_argument("--out", default="benchmarks/results/sim_speed.json")
    a = ap.parse_args()
    if a.only_default:
        out = json.loads(Path(a.out).read_text())
        out["default_policy"] = run_default(a)
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["default_policy"], indent=2))
        return
    sizes = [tuple(int(x) for x in part.split(":")) for part in a.sizes.split(",") if part]
    if not a.skip_1m:
        sizes.append((1_000_000, 64))
    runs = []
    for n, reps in sizes:
        r = run_one(n, reps, a.rate_per_replica, a.feedback_delay, a.seed)
        print(json.dumps(r), flush=True)
        runs.append(r)
    base = runs[0]
    for r in runs:
        r["vs_smallest"] = round(r["requests_per_cpu_s"] / base["requests_per_cpu_s"], 2)
    n0, reps0 = sizes[0]
    exact = run_one(n0, reps0, a.rate_per_replica, 0.0, a.seed)
    out: dict[str, Any] = {
        "benchmark": "sim_speed",
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count()},
        "model": "llama-3.1-8b", "accelerator": "h100-sxm", "routing": "round-robin",
        "runs": runs,
        "exact_mode": exact,
        "exact_over_fast_cpu": round(exact["cpu_s"] / base["cpu_s"], 2),
        "exact_equals_fast": (exact["ttft_p50_s"], exact["tpot_p50_s"]) == (base["ttft_p50_s"], base["tpot_p50_s"]),
        "target": "1,000,000 requests over 64 replicas in under 120 s; >= 20x Vidur's requests/s",
    }
    if not a.skip_default:
        out["default_policy"] = run_default(a)
    big = next((r for r in runs if r["requests"] == 1_000_000 and r["replicas"] == 64), None)
    if big is not None:
        out["target_met_wall"] = big["wall_s"] < TARGET_S
        out["target_met_cpu"] = big["cpu_s"] < TARGET_S
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
