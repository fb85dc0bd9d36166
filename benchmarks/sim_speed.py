"""Simulator speed: requests simulated per wall-clock second.

Run:  python3 benchmarks/sim_speed.py [--requests 1000000] [--replicas 64] [--out benchmarks/results/sim_speed.json]

Workload: Poisson arrivals at `--rate-per-replica` x replicas, prompt/output lengths drawn
lognormally around 1024/256 tokens (clipped), Llama-3.1-8B on H100 SXM, one GPU per replica,
round-robin routing, router view refreshed every `--feedback-delay` seconds (the fast mode of
docs/simulator.md). Writes the wall time, requests/s, events/s and the summary's headline
numbers as JSON. Vidur is not run here (see docs/simulator.md, "Speed").
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from fleetwise.core.request import Request
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec


def make_requests(n: int, rate_rps: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    ins = np.clip(rng.lognormal(np.log(1024), 0.6, n), 16, 8000).astype(int)
    outs = np.clip(rng.lognormal(np.log(256), 0.6, n), 2, 2000).astype(int)
    return [Request(i, float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--rate-per-replica", type=float, default=2.0)
    ap.add_argument("--feedback-delay", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/sim_speed.json")
    a = ap.parse_args()
    reqs = make_requests(a.requests, a.rate_per_replica * a.replicas, a.seed)
    plan = PlanSpec(name="speed", pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                                          "replicas": a.replicas}])
    t0 = time.perf_counter()
    res = simulate(plan, reqs, options=SimOptions(seed=a.seed, feedback_delay_s=a.feedback_delay))
    wall = time.perf_counter() - t0
    s = res.summary
    out = {
        "benchmark": "sim_speed",
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "requests": a.requests,
        "replicas": a.replicas,
        "rate_rps": a.rate_per_replica * a.replicas,
        "feedback_delay_s": a.feedback_delay,
        "wall_s": round(wall, 2),
        "requests_per_wall_s": round(a.requests / wall, 1),
        "events_processed": s["events_processed"],
        "events_per_wall_s": round(s["events_processed"] / wall, 1),
        "simulated_s": s["duration_s"],
        "requests_completed": s["requests_completed"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "tpot_p50_s": s["tpot_s"]["p50"],
        "mean_utilization": round(float(np.mean([r["utilization"] for r in s["per_replica"]])), 3),
        "target": "1,000,000 requests over 64 replicas in under 120 s",
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
