"""A gateway SIGKILLed in the middle of a load run, then restarted on the same ledger: exactly
one record per request that completed, none for the others, and a client retry with the same
key billed once. The gateway and its backends run as real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from fleetwise.cli.main import main as cli_main
from fleetwise.ledger import open_ledger

RESPONDER = Path(__file__).resolve().parents[1] / "gateway" / "responder.py"
START_TIMEOUT_S = 30.0
TOKEN_DELAY_MS = 10
N = 40
KILL_AFTER_COMPLETED = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_up(url: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            assert proc.poll() is None, f"{url}: process exited with {proc.returncode}"
            try:
                async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not come up in {START_TIMEOUT_S} s")


def start_gateway(port: int, backends: list[str], db: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--port", str(port), "--ledger", db,
            "--policy", "round-robin", "--model", "m"]
    for b in backends:
        args += ["--backend", b]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one(session: aiohttp.ClientSession, url: str, key: str, max_tokens: int, log: list[dict]) -> dict:
    """Stream one request; returns what the client saw (completed = [DONE] received)."""
    seen = {"idempotency_key": key, "request_id": "", "status": "failed", "delivered_tokens": 0,
            "max_tokens": max_tokens}
    body = {"model": "m", "prompt": f"request {key} " * 8, "max_tokens": max_tokens, "stream": True}
    data = b""
    try:
        async with session.post(url + "/v1/completions", json=body, headers={"Idempotency-Key": key}) as r:
            seen["request_id"] = r.headers.get("X-Request-ID", "")
            seen["http_status"] = r.status
            while True:
                chunk = await r.content.readany()
                if not chunk:
                    break
                data += chunk
    except (aiohttp.ClientError, OSError):
        pass
    events = [b for b in data.decode().split("\n\n") if b.startswith("data: ")]
    seen["delivered_tokens"] = sum(1 for e in events if e != "data: [DONE]")
    if events and events[-1] == "data: [DONE]":
        seen["status"] = "completed"
    if seen.get("http_status") != 409:  # a refused reuse of a completed key is no attempt: nothing to verify
        log.append(seen)
    return seen


def test_sigkill_mid_load_then_restart_bills_each_completed_request_exactly_once(tmp_path):
    db = str(tmp_path / "ledger.db")
    procs: list[subprocess.Popen] = []

    async def scenario() -> None:
        backends = []
        for _ in range(2):
            port = free_port()
            p = subprocess.Popen([sys.executable, str(RESPONDER), "--port", str(port), "--token-delay-ms",
                                  str(TOKEN_DELAY_MS)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            backends.append(f"http://127.0.0.1:{port}")
        for b, p in zip(backends, procs, strict=True):
            await wait_up(b, p)
        gport = free_port()
        url = f"http://127.0.0.1:{gport}"
        gw = start_gateway(gport, backends, db)
        procs.append(gw)
        await wait_up(url, gw)
        log: list[dict] = []
        lengths = {f"k{i}": 5 + (i * 7) % 60 for i in range(N)}
        async with aiohttp.ClientSession() as s:
            tasks = [asyncio.create_task(one(s, url, k, n, log)) for k, n in lengths.items()]
            while sum(1 for x in log if x["status"] == "completed") < KILL_AFTER_COMPLETED:
                await asyncio.sleep(0.005)
            os.kill(gw.pid, signal.SIGKILL)
            first = {x["idempotency_key"]: x for x in await asyncio.wait_for(asyncio.gather(*tasks), 30)}
        gw.wait(timeout=10)
        done = {k for k, x in first.items() if x["status"] == "completed"}
        cut = set(lengths) - done
        assert len(done) >= KILL_AFTER_COMPLETED and cut, "the kill must land in the middle of the run"
        with open_ledger(db, create=False) as led:
            rows = {r.idempotency_key: r for r in led.rows()}
        # Every completed request has its row, written by the attempt the client saw.
        assert done <= set(rows)
        assert all(rows[k].request_id == first[k]["request_id"] and rows[k].status == "completed"
                   and rows[k].delivered_tokens == lengths[k] for k in done)
        # Any other row can only be a request whose every token reached the client and whose usage
        # was committed just before its [DONE] (the documented window); none for the others.
        for k in set(rows) - done:
            assert rows[k].status == "completed" and first[k]["delivered_tokens"] == lengths[k] == \
                rows[k].delivered_tokens, k
        # Restart on the same ledger; the clients retry the interrupted requests with their keys,
        # and one client retries a completed one.
        gw2 = start_gateway(gport, backends, db)
        procs.append(gw2)
        await wait_up(url, gw2)
        again = sorted(cut) + [sorted(done)[0]]
        async with aiohttp.ClientSession() as s:
            second = {x["idempotency_key"]: x for x in await asyncio.wait_for(asyncio.gather(
                *(one(s, url, k, lengths[k], log) for k in again)), 30)}
        # A key the ledger already holds completed is never run again (no unbilled service): the
        # restarted gateway has not kept its answer, so it says so with a 409; the others run.
        assert all(x["status"] == "completed" for k, x in second.items() if k not in rows)
        assert all(x["http_status"] == 409 for k, x in second.items() if k in rows)
        with open_ledger(db, create=False) as led:
            final = {r.idempotency_key: r for r in led.rows()}
            total = led.summary()["total"]
        assert set(final) == set(lengths)  # one row per key, every key billed
        assert total["billed_generated_tokens"] == sum(lengths.values())
        for k in again:
            expect = first[k]["request_id"] if k in rows else second[k]["request_id"]
            assert final[k].request_id == expect and final[k].attempts == 1
        records = tmp_path / "client.jsonl"
        records.write_text("".join(json.dumps(x) + "\n" for x in log))
        assert cli_main(["ledger", "verify", "--ledger", db, "--records", str(records)]) == 0

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
