"""Engine speed probe (a script, not a test: pytest does not collect it; never asserts times).

    python3 tests/engine/engine_bench.py [num_requests]

Drives one mixed engine in virtual time with a Mooncake-like load (long prompts, shared
prefixes, Poisson arrivals near saturation) and prints steps/s, passes/s and requests/s per CPU second (process time: stable on a shared machine).
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from fleetwise.core.request import Request
from fleetwise.engine.api import Engine, EngineConfig
from fleetwise.perf.types import BatchShape


def step_time(shape: BatchShape) -> float:
    """70B-on-H200-like affine cost: weights + per-token GEMM + KV reads + attention."""
    return 0.011 + 6e-5 * shape.new_tokens + 1.6e-7 * shape.kv_read_tokens + 1e-11 * shape.attn_pairs


def workload(n: int, rate: float, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    prompts = np.clip(rng.lognormal(7.3, 0.9, n), 16, 30000).astype(int)
    outputs = np.clip(rng.lognormal(5.0, 0.8, n), 1, 2000).astype(int)
    groups = rng.integers(0, 50, n)
    reqs = []
    for i in range(n):
        nh = -(-int(prompts[i]) // 512)
        shared = min(nh, 4)
        hashes = tuple(int(groups[i]) * 1000 + j for j in range(shared)) + tuple(
            10**7 + i * 100 + j for j in range(nh - shared))
        reqs.append(Request(str(i), float(t[i]), int(prompts[i]), int(outputs[i]), hashes))
    return reqs


def run(reqs: list[Request], bundle: int) -> tuple[int, int, float, float]:
    eng = Engine("b", "mixed", EngineConfig(max_bundle_steps=bundle), 60_000, step_time)
    clock, i, steps, passes, done = 0.0, 0, 0, 0, 0
    wall = time.process_time()
    while True:
        while i < len(reqs) and reqs[i].arrival_s <= clock:
            eng.add_request(reqs[i])
            i += 1
        horizon = reqs[i].arrival_s - clock if i < len(reqs) else math.inf
        step = eng.schedule(horizon)
        if step is None:
            if i == len(reqs):
                break
            clock = reqs[i].arrival_s
            continue
        clock += step.duration_s
        out = eng.complete()
        steps += 1
        passes += step.num_passes
        done += len(out.finished)
    return steps, passes, time.process_time() - wall, clock


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    reqs = workload(n, rate=2.0)
    for bundle in (64, 1):
        steps, passes, wall, sim = run(reqs, bundle)
        print(f"bundle={bundle:3d}: {n} requests, {steps} steps ({passes} passes) in {wall:.2f}s CPU: "
              f"{steps / wall:,.0f} steps/s, {passes / wall:,.0f} passes/s, {n / wall:,.0f} req/s "
              f"(simulated {sim:,.0f}s)")


if __name__ == "__main__":
    main()
