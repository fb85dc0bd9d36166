"""Which HTTP client the gateway uses upstream: CPU seconds per streamed request, measured.

Candidates: httpx, aiohttp, and the gateway's own `fleetwise.gateway.upstream.HttpPool`
(keep-alive HTTP/1.1 on httptools), which the gateway uses for completions.

Starts the minimal responder (tests/gateway/responder.py) in a subprocess on 127.0.0.1 and, in
this process, streams the same requests through each candidate client on pooled connections,
reading every chunk as a proxy would. Reports process CPU seconds per request (this process
only: the responder's CPU is not counted) and wall time, alternating clients over several rounds
so machine contention hits both alike. Writes benchmarks/results/gateway_client_choice.json.

    python benchmarks/gateway_client_choice.py [--requests 1000] [--concurrency 16] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
from processes import free_port  # noqa: E402

from fleetwise.gateway.upstream import HttpPool

ROOT = Path(__file__).resolve().parents[1]


def body(tokens: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": tokens, "stream": True}).encode()


async def run_httpx(url: str, n: int, conc: int, payload: bytes) -> int:
    chunks = 0
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        sem = asyncio.Semaphore(conc)

        async def one() -> None:
            nonlocal chunks
            async with sem, client.stream("POST", url, content=payload,
                                          headers={"content-type": "application/json"}) as r:
                async for _ in r.aiter_raw():
                    chunks += 1
        await asyncio.gather(*(one() for _ in range(n)))
    return chunks


async def run_aiohttp(url: str, n: int, conc: int, payload: bytes) -> int:
    chunks = 0
    conn = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as client:
        sem = asyncio.Semaphore(conc)

        async def one() -> None:
            nonlocal chunks
            async with sem, client.post(url, data=payload, headers={"content-type": "application/json"}) as r:
                async for _ in r.content.iter_any():
                    chunks += 1
        await asyncio.gather(*(one() for _ in range(n)))
    return chunks


async def run_pool(url: str, n: int, conc: int, payload: bytes) -> int:
    chunks = 0
    pool = HttpPool(CONNECT_S, READ_S)
    sem = asyncio.Semaphore(conc)

    async def one() -> None:
        nonlocal chunks
        async with sem, pool.post(url, payload, {"content-type": "application/json"}) as r:
            while await r.content.readany():
                chunks += 1
    await asyncio.gather(*(one() for _ in range(n)))
    pool.close()
    return chunks


CONNECT_S, READ_S = 5.0, 30.0
"""The pool's connect and per-read timeouts (httpx's `timeout=30` above)."""
CLIENTS = {"httpx": run_httpx, "aiohttp": run_aiohttp, "fleetwise-pool": run_pool}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_client_choice.json"))
    a = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/gateway/responder.py"), "--port", str(port)],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        url = f"http://127.0.0.1:{port}/v1/completions"
        payload = body(a.tokens)
        res: dict[str, dict[str, list[float]]] = {k: {"cpu_s_per_req": [], "wall_s": []} for k in CLIENTS}
        for _ in range(a.rounds):
            for name, fn in CLIENTS.items():
                c0, w0 = time.process_time(), time.perf_counter()
                asyncio.run(fn(url, a.requests, a.concurrency, payload))
                res[name]["cpu_s_per_req"].append((time.process_time() - c0) / a.requests)
                res[name]["wall_s"].append(time.perf_counter() - w0)
    finally:
        proc.terminate()
        proc.wait()
    summary = {k: {"cpu_us_per_req_median": statistics.median(v["cpu_s_per_req"]) * 1e6,
                   "cpu_us_per_req_rounds": [x * 1e6 for x in v["cpu_s_per_req"]],
                   "wall_s_rounds": v["wall_s"]} for k, v in res.items()}
    ratio = summary["httpx"]["cpu_us_per_req_median"] / summary["aiohttp"]["cpu_us_per_req_median"]
    doc = {"what": "client-side CPU per streamed request over loopback (responder in another process)",
           "requests": a.requests, "concurrency": a.concurrency, "tokens_per_stream": a.tokens,
           "rounds": a.rounds, "cpu_count": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
           "versions": {"httpx": httpx.__version__, "aiohttp": aiohttp.__version__},
           "clients": summary, "httpx_over_aiohttp_cpu": ratio,
           "aiohttp_over_pool_cpu": summary["aiohttp"]["cpu_us_per_req_median"]
           / summary["fleetwise-pool"]["cpu_us_per_req_median"]}
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
