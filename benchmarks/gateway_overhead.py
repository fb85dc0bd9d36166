"""Overhead of the fleetwise gateway against going direct and against the Rust routers on PyPI.

Same backends (two minimal responders, tests/gateway/responder.py, each in its own process),
same load generator (this process, aiohttp), one router at a time:

- latency: sequential streamed requests on a pooled connection; time to first byte and to the
  last byte, p50/p99. Each router's requests alternate one by one with requests straight to the
  backends (its own pooled client), so both see the same host load: "added" = router minus
  direct of the same interleaved run (quantile differences, and the median of the per-pair
  differences);
- throughput: a closed loop of C concurrent streams for N requests; requests/s, and the router
  process's CPU seconds per request (utime + stime from /proc, children included).

Peers (`--peers`) run from throwaway venvs outside the repo: `vllm-router` and `sglang-router`
wheels (`pip install vllm-router==V` / `sglang-router==V` into /tmp/peer-...). The machine has two
cores shared with other work: the load generator, the responders and the router compete for
them, so absolute numbers are pessimistic; ratios within one run are the result.

    python benchmarks/gateway_overhead.py [--requests 2000] [--concurrency 32] [--peers]
    python benchmarks/gateway_overhead.py --workers 1,2 --policies prefix-affinity \
        --out benchmarks/results/gateway_workers.json     # fleetwise gateway --workers N, per N

With `--workers`, each fleetwise row runs `fleetwise gateway --workers N` (N processes on one
port) and its CPU is the whole process tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from processes import cpu_seconds, free_port, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESPONDER = ROOT / "tests/gateway/responder.py"
PEER_VENVS = {"vllm-router": Path("/tmp/peer-vllm-router"), "sglang-router": Path("/tmp/peer-sglang-router")}
TOKENIZER = "fleetwise"
"""fleetwise's prefix-aware row tokenizes prompts (exact lengths, token-id block hashes), as a
prefix-aware router with the model's tokenizer would."""


def start(cmd: list[str], port: int, env: dict[str, str] | None = None, wait_path: str = "/health",
          timeout_s: float = 60) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    end = time.time() + timeout_s
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(f"GET {wait_path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{cmd} did not become ready on port {port}")




def body(tokens: int, i: int) -> bytes:
    return json.dumps({"model": "m", "prompt": f"user {i % 64} says: " + "hello " * 40, "max_tokens": tokens,
                       "stream": True}).encode()


async def one(session: aiohttp.ClientSession, url: str, payload: bytes) -> tuple[float, float]:
    t0 = time.perf_counter()
    async with session.post(url, data=payload, headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
        first = await r.content.readany()
        t1 = time.perf_counter()
        rest = await r.read()
        if not (first + rest).endswith(b"data: [DONE]\n\n"):
            raise RuntimeError("stream did not end with [DONE]")
    return t1 - t0, time.perf_counter() - t0


async def latency(urls: list[str], n: int, tokens: int) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as s:
        for i in range(20):
            await one(s, urls[i % len(urls)], body(tokens, i))
        ttfb, e2e = [], []
        for i in range(n):
            a, b = await one(s, urls[i % len(urls)], body(tokens, i))
            ttfb.append(a)
            e2e.append(b)
    q = statistics.quantiles
    return {"ttfb_p50_ms": statistics.median(ttfb) * 1e3, "ttfb_p99_ms": q(ttfb, n=100)[98] * 1e3,
            "e2e_p50_ms": statistics.median(e2e) * 1e3, "e2e_p99_ms": q(e2e, n=100)[98] * 1e3}


async def paired_latency(direct_urls: list[str], url: str, n: int, tokens: int) -> dict[str, float]:
    """Sequential requests alternating router / direct (pooled clients each), so both see the
    same host load: quantiles of each, their differences and the median per-pair difference."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as via, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as direct:
        for i in range(20):
            await one(via, url, body(tokens, i))
            await one(direct, direct_urls[i % len(direct_urls)], body(tokens, i))
        t_via, t_dir, e_via, e_dir = [], [], [], []
        for i in range(n):
            a, b = await one(via, url, body(tokens, i))
            c, d = await one(direct, direct_urls[i % len(direct_urls)], body(tokens, i))
            t_via.append(a)
            e_via.append(b)
            t_dir.append(c)
            e_dir.append(d)
    q = statistics.quantiles
    med = statistics.median
    out = {"ttfb_p50_ms": med(t_via) * 1e3, "ttfb_p99_ms": q(t_via, n=100)[98] * 1e3,
           "e2e_p50_ms": med(e_via) * 1e3, "e2e_p99_ms": q(e_via, n=100)[98] * 1e3,
           "direct_ttfb_p50_ms": med(t_dir) * 1e3, "direct_ttfb_p99_ms": q(t_dir, n=100)[98] * 1e3,
           "direct_e2e_p50_ms": med(e_dir) * 1e3, "direct_e2e_p99_ms": q(e_dir, n=100)[98] * 1e3,
           "paired_added_ttfb_p50_ms": med([a - c for a, c in zip(t_via, t_dir, strict=True)]) * 1e3}
    out["added_ttfb_p50_ms"] = out["ttfb_p50_ms"] - out["direct_ttfb_p50_ms"]
    out["added_ttfb_p99_ms"] = out["ttfb_p99_ms"] - out["direct_ttfb_p99_ms"]
    out["added_e2e_p50_ms"] = out["e2e_p50_ms"] - out["direct_e2e_p50_ms"]
    out["added_e2e_p99_ms"] = out["e2e_p99_ms"] - out["direct_e2e_p99_ms"]
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and of its live descendants (a gateway's workers), plus the children
    it has waited for."""
    total = cpu_seconds(pid, children=True)
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(tree_cpu_seconds(int(k)) for k in kids)


async def throughput(urls: list[str], n: int, conc: int, tokens: int, pid: int | None) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        for i in range(conc):
            await one(s, urls[i % len(urls)], body(tokens, i))
        c0 = tree_cpu_seconds(pid) if pid else 0.0
        t0 = time.perf_counter()
        it = iter(range(n))
        errors = 0

        async def worker() -> None:
            nonlocal errors
            for i in it:
                try:
                    await one(s, urls[i % len(urls)], body(tokens, i))
                except (RuntimeError, aiohttp.ClientError):
                    errors += 1
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
        cpu = (tree_cpu_seconds(pid) - c0) if pid else 0.0
    return {"requests_per_s": n / wall, "router_cpu_us_per_request": cpu / n * 1e6 if pid else 0.0,
            "errors": errors}


def router_cmds(name: str, policy: str, port: int, workers: list[str], processes: int = 1) -> list[str]:
    if name == "fleetwise":
        cmd = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--policy", policy, "--port", str(port),
               "--served-model-name", "m", "--workers", str(processes)]
        if policy == "prefix-affinity":
            cmd += ["--tokenizer", TOKENIZER]
        for w in workers:
            cmd += ["--backend", w]
        return cmd
    peer_policy = {"round-robin": "round_robin", "prefix-affinity": "cache_aware"}[policy]
    venv = PEER_VENVS[name]
    if name == "sglang-router":
        return [str(venv / "bin/python"), "-m", "sglang_router.launch_router", "--worker-urls", *workers,
                "--policy", peer_policy, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
    return [str(venv / "bin/vllm-router"), "--worker-urls", *workers, "--policy", peer_policy,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--latency-requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--peers", action="store_true", help="also run vllm-router and sglang-router")
    ap.add_argument("--routers", default="", help="comma list overriding which routers run")
    ap.add_argument("--policies", default="round-robin,prefix-affinity", help="comma list of policies")
    ap.add_argument("--workers", default="1", help="comma list of fleetwise gateway worker counts")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_overhead.json"))
    a = ap.parse_args()
    load0 = os.getloadavg()
    ports = [free_port() for _ in range(2)]
    backends = [start([sys.executable, str(RESPONDER), "--port", str(p)], p) for p in ports]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    routers = ["fleetwise"] + ([n for n in PEER_VENVS if (PEER_VENVS[n] / "bin/python").exists()] if a.peers else [])
    if a.routers:
        routers = a.routers.split(",")
    rows: list[dict[str, Any]] = []
    try:
        direct_urls = [w + "/v1/completions" for w in workers]
        lat = asyncio.run(latency(direct_urls, a.latency_requests, a.tokens))
        thr = asyncio.run(throughput(direct_urls, a.requests, a.concurrency, a.tokens, None))
        rows.append({"router": "direct", "policy": "client round-robin", **lat, **thr})
        print(json.dumps(rows[-1]), flush=True)
        runs = [(name, policy, n) for name in routers for policy in a.policies.split(",")
                for n in ([int(w) for w in a.workers.split(",")] if name == "fleetwise" else [1])]
        for name, policy, processes in runs:
            port = free_port()
            try:
                proc = start(router_cmds(name, policy, port, workers, processes), port)
            except (RuntimeError, FileNotFoundError) as err:
                rows.append({"router": name, "policy": policy, "workers": processes, "error": str(err)[:500]})
                print(json.dumps(rows[-1]), flush=True)
                continue
            try:
                url = [f"http://127.0.0.1:{port}/v1/completions"]
                lat = asyncio.run(paired_latency(direct_urls, url[0], a.latency_requests, a.tokens))
                thr = asyncio.run(throughput(url, a.requests, a.concurrency, a.tokens, proc.pid))
            finally:
                stop(proc)
            rows.append({"router": name, "policy": policy, "workers": processes, **lat, **thr})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for p in backends:
            stop(p)
    doc = {"what": "router overhead on streamed completions over loopback, two responder backends",
           "requests": a.requests, "latency_requests": a.latency_requests, "concurrency": a.concurrency,
           "tokens_per_stream": a.tokens, "cpu_count": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
           "note": "2 shared cores: load generator, responders and router compete; added = router minus "
                   "direct of the same interleaved run",
           "load_avg_at_start": load0,
           "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
