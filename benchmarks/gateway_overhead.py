"""Overhead of the fleetwise gateway against going direct and against the Rust routers on PyPI.

Same backends (two minimal responders, tests/gateway/responder.py, each in its own process),
same load generator (this process, aiohttp), one router at a time:

- latency: sequential streamed requests on a pooled connection; time to first byte and to the
  last byte, p50/p99; "added" = router minus direct, medians of the same run;
- throughput: a closed loop of C concurrent streams for N requests; requests/s, and the router
  process's CPU seconds per request (utime + stime from /proc, children included).

Peers (`--peers`) run from throwaway venvs outside the repo: `vllm-router` and `sglang-router`
wheels (`pip install vllm-router==V` / `sglang-router==V` into /tmp/peer-...). The machine has two
cores shared with other work: the load generator, the responders and the router compete for
them, so absolute numbers are pessimistic; ratios within one run are the result.

    python benchmarks/gateway_overhead.py [--requests 2000] [--concurrency 32] [--peers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
RESPONDER = ROOT / "tests/gateway/responder.py"
PEER_VENVS = {"vllm-router": Path("/tmp/peer-vllm-router"), "sglang-router": Path("/tmp/peer-sglang-router")}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and its waited-for children (/proc/PID/stat fields 14-17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


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


def stop(proc: subprocess.Popen[bytes]) -> None:
    with_suppress = [ProcessLookupError, PermissionError]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except tuple(with_suppress):
        pass


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


async def throughput(urls: list[str], n: int, conc: int, tokens: int, pid: int | None) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        for i in range(conc):
            await one(s, urls[i % len(urls)], body(tokens, i))
        c0 = cpu_seconds(pid) if pid else 0.0
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
        cpu = (cpu_seconds(pid) - c0) if pid else 0.0
    return {"requests_per_s": n / wall, "router_cpu_us_per_request": cpu / n * 1e6 if pid else 0.0,
            "errors": errors}


def router_cmds(name: str, policy: str, port: int, workers: list[str]) -> list[str]:
    if name == "fleetwise":
        cmd = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--policy", policy, "--port", str(port),
               "--model", "m"]
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
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_overhead.json"))
    a = ap.parse_args()
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
        for name in routers:
            for policy in ("round-robin", "prefix-affinity"):
                port = free_port()
                try:
                    proc = start(router_cmds(name, policy, port, workers), port)
                except (RuntimeError, FileNotFoundError) as err:
                    rows.append({"router": name, "policy": policy, "error": str(err)[:500]})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                try:
                    url = [f"http://127.0.0.1:{port}/v1/completions"]
                    lat = asyncio.run(latency(url, a.latency_requests, a.tokens))
                    thr = asyncio.run(throughput(url, a.requests, a.concurrency, a.tokens, proc.pid))
                finally:
                    stop(proc)
                rows.append({"router": name, "policy": policy, **lat, **thr})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for p in backends:
            stop(p)
    base = rows[0]
    for r in rows[1:]:
        if "error" not in r:
            r["added_ttfb_p50_ms"] = r["ttfb_p50_ms"] - base["ttfb_p50_ms"]
            r["added_e2e_p50_ms"] = r["e2e_p50_ms"] - base["e2e_p50_ms"]
            r["added_e2e_p99_ms"] = r["e2e_p99_ms"] - base["e2e_p99_ms"]
    doc = {"what": "router overhead on streamed completions over loopback, two responder backends",
           "requests": a.requests, "latency_requests": a.latency_requests, "concurrency": a.concurrency,
           "tokens_per_stream": a.tokens, "cpu_count": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
           "note": "2 shared cores: load generator, responders and router compete; compare rows of one run",
           "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
