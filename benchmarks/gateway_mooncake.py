"""Routing quality live: a time-scaled slice of the Mooncake conversation trace through the gateway
in front of four `fleetwise emulate` replicas, per policy, beside the same slice in the simulator.

The slice (first `--requests` rows of /work/shared/traces/conversation_trace.jsonl) is scaled
down so two shared cores can emulate it: each 512-token hash block becomes `--block-tokens`
tokens of text (vocabulary words from the emulator's tokenizer, one token per word, the same
text for the same hash id, so equal hash prefixes give equal text prefixes and real prefix-cache
hits); prompt lengths scale by the same factor and output lengths are divided by
`--output-divisor`. Arrivals keep the trace's spacing times `--arrival-scale` (modelled seconds).

For each router (fleetwise's presets, and `sglang-router --policy cache_aware` when its venv
exists): four fresh emulators (empty caches), the router, then every request streamed at its
arrival time; TTFT measured by the client and converted to modelled seconds (x time scale, so
the router's own latency is magnified by the same factor); prefix hit rate and per-replica share
read from the emulators' /metrics. The simulator runs the same requests on the same plan
(examples/plans/colocated-8b.yaml: 4 x Llama-3.1-8B on H100) with the same policy.

By default fleetwise's gateway tokenizes prompts as the emulators do (`--tokenizer fleetwise`)
and follows their KV events (each emulator publishes over ZeroMQ as vLLM does, `--kv-events-config`;
each backend's `kv_events` names its endpoints; `--hash-block-tokens 16`), so its prefix
index holds what the replicas cache; `--no-kv-events` routes on text hashes of its own dispatches.
`--repeat N` replays every live row N times, policies interleaved, to show run-to-run spread.
A policy may carry routing params: `NAME:{"feedback": {"enabled": false}}` (JSON after the colon).

    python benchmarks/gateway_mooncake.py [--requests 300] [--time-scale 10] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from gateway_overhead import PEER_VENVS, free_port, start, stop

from fleetwise.core.request import Request
from fleetwise.core.tokens import NUM_WORDS, words_text
from fleetwise.routing import make_policy
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.base import load_document
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import RoutingSpec

ROOT = Path(__file__).resolve().parents[1]
TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
PLAN = ROOT / "examples/plans/colocated-8b.yaml"
TRACE_BLOCK_TOKENS = 512
"""Tokens per hash id in the Mooncake traces (their README)."""
MODEL, GPU = "llama-3.1-8b", "h100-sxm"
WORD_STRIDE = 7919
"""A prime stride spreading one hash id's words over the vocabulary."""
EMULATOR_BLOCK_TOKENS = 16
"""`fleetwise emulate`'s KV block size (its default): the gateway hashes prompts by it."""


def load_slice(n: int, block_tokens: int, output_divisor: int, arrival_scale: float) -> list[dict[str, Any]]:
    """The first `n` rows, scaled; each with its prompt text and the simulator's Request."""
    rows = []
    scale = TRACE_BLOCK_TOKENS / block_tokens
    with TRACE.open() as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            r = json.loads(line)
            prompt = max(1, math.ceil(r["input_length"] / scale))
            out = max(1, math.ceil(r["output_length"] / output_divisor))
            nblocks = min(len(r["hash_ids"]), prompt // block_tokens)
            words: list[int] = []
            for h in r["hash_ids"][:nblocks]:
                words += [(h * WORD_STRIDE + k * 31) % NUM_WORDS for k in range(block_tokens)]
            words += [(i * 104729 + k * 17 + 1) % NUM_WORDS for k in range(prompt - len(words))]
            arrival = r["timestamp"] / 1000.0 * arrival_scale
            rows.append({"text": words_text(words), "prompt": prompt, "output": out, "arrival_s": arrival,
                         "req": Request(request_id=str(i), arrival_s=arrival, prompt_tokens=prompt,
                                        output_tokens=out, block_hashes=tuple(r["hash_ids"][:nblocks]),
                                        hash_block_tokens=block_tokens)})
    return rows


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))


async def replay(url: str, rows: list[dict[str, Any]], time_scale: float) -> dict[str, Any]:
    ttft: list[float] = []
    errors = 0
    samples: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as s:
        t0 = time.perf_counter()

        async def one(r: dict[str, Any]) -> None:
            nonlocal errors
            delay = r["arrival_s"] / time_scale - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": MODEL, "prompt": r["text"], "max_tokens": r["output"], "stream": True,
                    "ignore_eos": True}
            ts = time.perf_counter()
            try:
                async with s.post(url + "/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        errors += 1
                        samples.append(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
                        return
                    await resp.content.readany()
                    ttft.append((time.perf_counter() - ts) * time_scale)
                    raw = await resp.read()
                    if b'"error"' in raw:
                        errors += 1
                        at = raw.find(b'{"error"')
                        samples.append(f"error event: {raw[at:at + 200]!r}")
            except aiohttp.ClientError as err:
                errors += 1
                samples.append(f"client: {err!r}"[:200])
        await asyncio.gather(*(one(r) for r in rows))
    return {"ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "answered": len(ttft), "errors": errors,
            "error_samples": sorted(set(samples))[:5]}


async def engine_stats(urls: list[str]) -> dict[str, Any]:
    hits = queries = 0.0
    share = []
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/metrics") as r:
                text = await r.text()
            vals = {ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                    if ln.startswith(("vllm:prefix_cache_", "vllm:e2e_request_latency_seconds_count"))}
            hits += vals.get("vllm:prefix_cache_hits_total", 0.0)
            queries += vals.get("vllm:prefix_cache_queries_total", 0.0)
            share.append(vals.get("vllm:e2e_request_latency_seconds_count", 0.0))
    total = sum(share) or 1.0
    return {"prefix_hit_rate": hits / queries if queries else 0.0, "share": [round(x / total, 3) for x in share]}


def split_policy(spec: str) -> tuple[str, dict[str, Any]]:
    """`NAME` or `NAME:{json params}` -> (preset, params)."""
    name, _, params = spec.partition(":")
    return name, (json.loads(params) if params else {})


def run_live(router: str, policy: str, rows: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    ports = [free_port() for _ in range(4)]
    kv = [{"transport": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}",
           "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", "topic": ""} for _ in ports]
    emus = [start([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", MODEL, "--gpu", GPU,
                   "--time-scale", str(a.time_scale), "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
                   "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                     "endpoint": k["endpoint"],
                                                     "replay_endpoint": k["replay_endpoint"]}),
                   "--port", str(p)], p) for p, k in zip(ports, kv, strict=True)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    port = free_port()
    try:
        if router == "fleetwise":
            name, params = split_policy(policy)
            doc: dict[str, Any] = {"scrape": {"interval_s": a.scrape_interval},
                                   "routing": {"policy": name, "params": params}}
            doc["backends"] = [{"url": u, **({} if a.no_kv_events else {"kv_events": k})}
                               for u, k in zip(urls, kv, strict=True)]
            if not a.no_kv_events:
                doc.update(tokenizer="fleetwise", limits={"hash_block_tokens": EMULATOR_BLOCK_TOKENS})
            cfg = Path(f"/tmp/gateway-mooncake-{port}.json")
            cfg.write_text(json.dumps(doc))
            cmd = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--config", str(cfg), "--port", str(port)]
        else:
            cmd = [str(PEER_VENVS[router] / "bin/python"), "-m", "sglang_router.launch_router", "--worker-urls",
                   *urls, "--policy", policy, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
        proc = start(cmd, port)
        try:
            res = asyncio.run(replay(f"http://127.0.0.1:{port}", rows, a.time_scale))
            res.update(asyncio.run(engine_stats(urls)))
        finally:
            stop(proc)
    finally:
        for e in emus:
            stop(e)
    return {"where": "live", "router": router, "policy": policy,
            "kv_events": router == "fleetwise" and not a.no_kv_events, "load_avg_1m": os.getloadavg()[0], **res}


def run_sim(policy: str, rows: list[dict[str, Any]], view_delay_s: float = 0.0) -> dict[str, Any]:
    """The slice in the simulator; `view_delay_s` > 0 refreshes the router's view that often
    (modelled seconds), as the gateway's scrape interval does live."""
    plan = load_document(PlanSpec, PLAN)
    name, params = split_policy(policy)
    spec = RoutingSpec(policy=name, params=params)
    plan = plan.model_copy(update={"routing": name})
    res = simulate(plan, [r["req"] for r in rows], options=SimOptions(policy=make_policy(spec),
                                                                   feedback_delay_s=view_delay_s))
    s = res.summary
    ttft = s["ttft_s"]
    reps = s["per_replica"]
    done = [r["requests"] for r in reps]
    total = sum(done) or 1
    hit = sum(r["prefix_hit_rate"] * r["requests"] for r in reps) / total
    return {"where": "sim", "view_delay_s": view_delay_s, "router": "fleetwise", "policy": policy,
            "ttft_p50_s": ttft["p50"],
            "ttft_p99_s": ttft["p99"], "prefix_hit_rate": hit, "share": [round(x / total, 3) for x in done],
            "answered": s["requests_completed"], "errors": s["requests_failed"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--block-tokens", type=int, default=32)
    ap.add_argument("--output-divisor", type=int, default=4)
    ap.add_argument("--arrival-scale", type=float, default=0.25)
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--policies", default="fleetwise-default,round-robin")
    ap.add_argument("--scrape-interval", type=float, default=1.0,
                    help="gateway metrics scrape period (wall s); the simulator's view delay matches it")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--live-only", action="store_true")
    ap.add_argument("--no-kv-events", action="store_true", help="gateway without tokenizer and KV events")
    ap.add_argument("--repeat", type=int, default=1, help="live replays per policy (interleaved)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_mooncake.json"))
    a = ap.parse_args()
    load0 = os.getloadavg()
    rows = load_slice(a.requests, a.block_tokens, a.output_divisor, a.arrival_scale)
    out: list[dict[str, Any]] = []
    policies = a.policies.split(";") if ";" in a.policies else a.policies.split(",")
    if not a.live_only:
        for policy in policies:
            for delay in (0.0, a.scrape_interval * a.time_scale):
                out.append(run_sim(policy, rows, delay))
                print(json.dumps(out[-1]), flush=True)
    for rep_i in range(0 if a.sim_only else a.repeat):
        for policy in policies:
            out.append({**run_live("fleetwise", policy, rows, a), "repeat": rep_i})
            print(json.dumps(out[-1]), flush=True)
        if not a.no_peers and (PEER_VENVS["sglang-router"] / "bin/python").exists():
            out.append({**run_live("sglang-router", "cache_aware", rows, a), "repeat": rep_i})
            print(json.dumps(out[-1]), flush=True)
    doc = {"what": "Mooncake conversation slice, 4 emulated Llama-3.1-8B/H100 replicas, live vs simulator",
           "requests": a.requests, "block_tokens": a.block_tokens, "output_divisor": a.output_divisor,
           "arrival_scale": a.arrival_scale, "time_scale": a.time_scale, "cpu_count": os.cpu_count(),
           "scrape_interval_s": a.scrape_interval, "load_avg_at_start": load0,
           "load_avg_at_end": os.getloadavg(), "rows": out}
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
