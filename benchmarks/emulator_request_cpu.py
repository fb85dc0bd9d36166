"""CPU per request on both sides of the HTTP hop: one emulated replica and the load generator.

Run:  python3 benchmarks/emulator_request_cpu.py [--requests 300] [--rate 2] [--time-scale 5]
                                                 [--out benchmarks/results/emulator_request_cpu.json]

Starts one `fleetwise emulate` replica (Llama-3.1-70B, TP4 on H100 SXM, the agreement
benchmark's), replays `--requests` streamed requests (1000-token prompts, 128 output tokens,
Poisson at `--rate` modelled requests/s) with `emulator_loadgen.replay`, and reports the CPU
seconds each process spent per request (user + system, /proc), and per streamed token. CPU
seconds, not wall time, so a busy host does not change the figure much.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from emulator_loadgen import Target, replay, run, summarize  # noqa: E402
from processes import cpu_seconds, free_port, stop, wait_healthy  # noqa: E402

from fleetwise.core.request import Request  # noqa: E402

MODEL, GPU, TP = "llama-3.1-70b", "h100-sxm", 4
PROMPT_TOKENS, OUTPUT_TOKENS = 1000, 128
"""The agreement benchmark's median prompt; a typical output."""
START_TIMEOUT_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", MODEL, "--gpu", GPU,
                             "--tp", str(TP), "--port", str(port), "--time-scale", str(args.time_scale)],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, START_TIMEOUT_S)
        rng = np.random.default_rng(args.seed)
        t = np.cumsum(rng.exponential(1 / args.rate, args.requests))
        reqs = [Request(i, float(t[i]), PROMPT_TOKENS, OUTPUT_TOKENS) for i in range(args.requests)]
        s0, c0 = cpu_seconds(proc.pid), os.times()
        results, wall = run(replay(reqs, [Target(url)] * len(reqs), MODEL, args.time_scale))
        s1, c1 = cpu_seconds(proc.pid), os.times()
    finally:
        stop(proc)
    summ = summarize(results)
    n, tokens = len(reqs), sum(r.tokens for r in results)
    client = (c1.user - c0.user) + (c1.system - c0.system)
    out = {"requests": n, "ok": summ["ok"], "tokens": tokens, "wall_s": wall, "time_scale": args.time_scale,
           "server_cpu_s": s1 - s0, "client_cpu_s": client,
           "server_cpu_per_request_ms": (s1 - s0) / n * 1e3, "client_cpu_per_request_ms": client / n * 1e3,
           "server_cpu_per_token_us": (s1 - s0) / tokens * 1e6, "client_cpu_per_token_us": client / tokens * 1e6,
           "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
