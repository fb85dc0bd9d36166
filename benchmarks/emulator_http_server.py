"""The emulator's HTTP server, measured on the user's path: the lean server against uvicorn.

Run:  python3 benchmarks/emulator_http_server.py [--requests 200] [--rate 4] [--time-scale 5] [--repeats 2]
                                                  [--out benchmarks/results/emulator_http_server.json]

Starts one emulated replica (Llama-3.1-70B, TP4 on H100 SXM, as `emulator_request_cpu.py`)
served by each server in turn (the lean server as `fleetwise emulate` runs it; uvicorn with its
httptools parser and uvloop on the same app), replays the same Poisson load of streamed requests
(1000-token prompts, 128 output tokens) with `emulator_loadgen.replay`, and reports per server
the replica's CPU per request (user + system, /proc) and the client-measured TTFT and TPOT
(modelled seconds: what a user of the emulated fleet sees; each wall microsecond the server
spends is `time_scale` modelled ones). Servers alternate over `--repeats` rounds so a busy host
weighs on both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from emulator_loadgen import Target, replay, run, summarize  # noqa: E402
from processes import cpu_seconds, free_port, stop, wait_healthy  # noqa: E402

from fleetwise.core.request import Request  # noqa: E402

MODEL, GPU, TP = "llama-3.1-70b", "h100-sxm", 4
PROMPT_TOKENS, OUTPUT_TOKENS = 1000, 128
START_TIMEOUT_S = 60.0
UVICORN = """
import sys, uvicorn
from fleetwise.cli.emulate_cmd import config_from_args, register
import argparse
p = argparse.ArgumentParser(); sub = p.add_subparsers(); register(sub)
args = p.parse_args(sys.argv[1:])
from fleetwise.emulator.app import create_app
cfg = config_from_args(args)
uvicorn.run(create_app(cfg).state.front, host=cfg.host, port=cfg.port, log_level="warning", access_log=False,
            loop="uvloop", http="httptools")
"""
"""uvicorn serving the replica `fleetwise emulate` would build from the same flags."""


def one_run(server: str, args: argparse.Namespace, reqs: list[Request]) -> dict[str, Any]:
    port = free_port()
    flags = ["emulate", "--model", MODEL, "--gpu", GPU, "--tp", str(TP), "--port", str(port),
             "--time-scale", str(args.time_scale)]
    argv = [sys.executable, "-m", "fleetwise.cli.main", *flags] if server == "lean" else \
        [sys.executable, "-c", UVICORN, *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, START_TIMEOUT_S)
        s0 = cpu_seconds(proc.pid)
        results, wall = run(replay(reqs, [Target(url)] * len(reqs), MODEL, args.time_scale))
        s1 = cpu_seconds(proc.pid)
    finally:
        stop(proc)
    summ = summarize(results)
    return {"server": server, "ok": summ["ok"], "wall_s": wall, "server_cpu_per_request_ms": (s1 - s0) / len(reqs) * 1e3,
            "ttft_p50_s": summ["ttft_s"]["p50"], "ttft_p99_s": summ["ttft_s"]["p99"],
            "tpot_p50_s": summ["tpot_s"]["p50"], "load_average": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t = np.cumsum(rng.exponential(1 / args.rate, args.requests))
    reqs = [Request(i, float(t[i]), PROMPT_TOKENS, OUTPUT_TOKENS) for i in range(args.requests)]
    runs = [one_run(server, args, reqs) for _ in range(args.repeats) for server in ("lean", "uvicorn")]
    out: dict[str, Any] = {"requests": args.requests, "rate": args.rate, "time_scale": args.time_scale, "runs": runs}
    for server in ("lean", "uvicorn"):
        mine = [r for r in runs if r["server"] == server]
        out[server] = {k: float(np.median([r[k] for r in mine]))
                       for k in ("server_cpu_per_request_ms", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s")}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
