"""Capacity of one emulator process: how many concurrent streams (and requests/s, tokens/s) it
keeps on its deadlines.

Run:  python3 benchmarks/emulator_capacity.py [--streams 4,8,16,32,64,128] [--window 20]
                                              [--model llama-3.1-8b --gpu h100-sxm --time-scale 1]
                                              [--out benchmarks/results/emulator_capacity.json]

One `fleetwise emulate` process (mixed role) on 127.0.0.1; for each level N, N closed-loop
clients (one process, aiohttp) each send a streamed request (prompt `--prompt-tokens`, output
`--output-tokens`, ignore_eos) as soon as their previous one ends, for `--window` wall seconds.
Measured per level: completed requests/s and streamed tokens/s (wall), the emulator's CPU
share (from /proc), its step deadline overrun (mean, and p99 from the
`fleetwise:step_deadline_overrun_seconds` histogram; modelled seconds), its mean modelled step
time, and client-measured TPOT against the emulator's own (`GET /fleetwise/requests`).

The machine has 2 cores shared with other work: before each level, a bare asyncio loop in the
load generator measures how late this machine wakes a process for a deadline (`baseline`, wall
seconds), the floor under any overrun. A level is kept ("on deadline") when the emulator's mean
overrun exceeds that floor (x time scale) by less than half the mean step time, the client's
p50 TPOT is within 10 % of the server's, and nothing failed. `sustained` is the largest such
level. The load generator runs on the same cores: figures are a lower bound for a dedicated core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from emulator_loadgen import percentiles, prompt_text, wakeup_lateness  # noqa: E402
from processes import (  # noqa: E402
    cpu_seconds,
    free_port,
    wait_healthy,  # noqa: E402
)

from fleetwise.core.request import Request  # noqa: E402

START_TIMEOUT_S = 120.0
ON_DEADLINE_OVERRUN_SHARE = 0.5
"""A level is on deadline while the mean overrun beyond the machine's own wake-up lateness stays
under half a step (tokens still come out pass by pass, a pass late at most) ..."""
ON_DEADLINE_TPOT_TOL = 0.10
"""... and the client's p50 TPOT is within 10 % of the server's."""


def histogram_p99(text: str, name: str) -> float:
    """p99 upper bound from a Prometheus histogram's cumulative buckets."""
    buckets = [(float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2)))
               for m in re.finditer(rf'^{re.escape(name)}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} ([0-9.e+-]+)$', text, re.M)]
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    total = buckets[-1][1]
    return next(le for le, c in buckets if c >= 0.99 * total)


async def level(url: str, n: int, window_s: float, prompt: str, out_tokens: int, scale: float) -> dict[str, Any]:
    stop = time.perf_counter() + window_s
    ttfts: list[float] = []
    tpots: list[float] = []
    tokens = 0
    done = 0
    errors = 0

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        nonlocal tokens, done, errors
        i = 0
        while time.perf_counter() < stop:
            i += 1
            body = {"prompt": prompt, "max_tokens": out_tokens, "ignore_eos": True, "stream": True}
            t0 = time.perf_counter()
            first = last = 0.0
            chunks = 0
            try:
                async with session.post(url + "/v1/completions", json=body,
                                        headers={"x-request-id": f"c{n}-{k}-{i}"}) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            now = time.perf_counter()
                            if chunks == 0:
                                first = now
                            last = now
                            chunks += 1
            except (aiohttp.ClientError, OSError, TimeoutError):
                errors += 1
                continue
            tokens += out_tokens
            done += 1
            ttfts.append((first - t0) * scale)
            if out_tokens > 1:
                tpots.append((last - first) * scale / (out_tokens - 1))

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(k, session) for k in range(n)))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "requests": done, "errors": errors, "requests_per_s": done / wall,
            "tokens_per_s": tokens / wall, "client_ttft_s": percentiles(ttfts), "client_tpot_s": percentiles(tpots)}


async def scrape(url: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/fleetwise/status") as r:
            status = await r.json()
        async with s.get(url + "/metrics") as r:
            metrics = await r.text()
        async with s.get(url + "/fleetwise/requests") as r:
            recs = await r.json()
    return status, metrics, recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="4,8,16,32,64,128")
    ap.add_argument("--window", type=float, default=20.0, help="wall seconds per level")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "emulator_capacity.json"))
    args = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", args.model,
                             "--gpu", args.gpu, "--tp", str(args.tp), "--port", str(port),
                             "--time-scale", str(args.time_scale)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    levels: list[dict[str, Any]] = []
    try:
        wait_healthy(url, proc, START_TIMEOUT_S)
        prompt = prompt_text(Request(0, 0.0, args.prompt_tokens, args.output_tokens))
        prev_status, _, _ = asyncio.run(scrape(url))
        prev_text = ""
        for n in (int(x) for x in args.streams.split(",")):
            load0 = os.getloadavg()[0]
            base = asyncio.run(wakeup_lateness())
            c0 = cpu_seconds(proc.pid)
            res = asyncio.run(level(url, n, args.window, prompt, args.output_tokens, args.time_scale))
            cpu = cpu_seconds(proc.pid) - c0
            status, metrics, recs = asyncio.run(scrape(url))
            steps = status["steps"] - prev_status["steps"]
            overrun_mean = ((status["overrun_mean_s"] * status["steps"] - prev_status["overrun_mean_s"]
                             * prev_status["steps"]) / steps) if steps else 0.0
            step_mean = (status["busy_s"] - prev_status["busy_s"]) / steps if steps else 0.0
            prev_status = status
            rows = [dict(zip(recs["columns"], r, strict=True)) for r in recs["rows"]
                    if str(r[0]).startswith(f"c{n}-")]
            srv_tpot = percentiles([(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in rows
                                    if r["output_tokens"] > 1])
            p99 = histogram_p99(metrics, "fleetwise:step_deadline_overrun_seconds")
            tpot_ratio = res["client_tpot_s"]["p50"] / srv_tpot["p50"] if srv_tpot["p50"] else float("nan")
            floor = base["mean"] * args.time_scale
            on = (overrun_mean - floor < ON_DEADLINE_OVERRUN_SHARE * step_mean
                  and abs(tpot_ratio - 1) <= ON_DEADLINE_TPOT_TOL and res["errors"] == 0)
            row = {"streams": n, **res, "emulator_cpu_share": cpu / res["wall_s"], "steps": steps,
                   "step_mean_s": step_mean, "overrun_mean_s": overrun_mean,
                   "overrun_p99_cumulative_s": p99, "server_tpot_s": srv_tpot, "client_over_server_tpot": tpot_ratio,
                   "on_deadline": on, "load_average": load0,
                   "baseline_wakeup_lateness_wall_s": base}
            levels.append(row)
            prev_text = metrics
            print(json.dumps({**{k: row[k] for k in ("streams", "requests_per_s", "tokens_per_s", "emulator_cpu_share",
                                                     "step_mean_s", "overrun_mean_s", "client_over_server_tpot",
                                                     "on_deadline", "load_average")},
                              "baseline_mean_s": base["mean"]}), flush=True)
        del prev_text
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    kept = [lv for lv in levels if lv["on_deadline"]]
    best = max(kept, key=lambda lv: lv["streams"]) if kept else None
    out = {"model": args.model, "gpu": args.gpu, "tp": args.tp, "time_scale": args.time_scale,
           "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens, "window_s": args.window,
           "cpus": os.cpu_count(), "levels": levels,
           "sustained": None if best is None else {k: best[k] for k in ("streams", "requests_per_s", "tokens_per_s",
                                                                         "emulator_cpu_share")}}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
