"""The PD failure points live: emulator processes (2 prefill + 2 decode) behind the gateway,
faults injected through the emulators' /admin/faults while requests are in flight, and every
client-visible stream compared token by token with the fault-free stream of the same prompt.

The emulators' text is a deterministic function of the prompt (one vocabulary word per token),
so any replica (and any retry) produces the same stream; the ledger rows are matched to the
requests' ids and keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.gateway.server import listening_socket, uvicorn_server
from fleetwise.ledger import open_ledger

MODEL, GPU = "llama-3.1-8b", "h100-sxm"
TOKEN = "live-admin-token"
TIME_SCALE = 20.0
"""Modelled seconds per wall second (prefill and decode steps of a few ms)."""
START_TIMEOUT_S = 40.0
SCENARIO_TIMEOUT_S = 90.0
PROMPT = "the quick brown fox jumps over the lazy dog " * 24
MAX_TOKENS = 24
FAST = {"interval_s": 0.05, "timeout_s": 0.5, "health_interval_s": 0.05, "health_failures": 1,
        "watch_interval_s": 0.05}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Emu:
    name: str
    role: str
    port: int
    extra: tuple[str, ...]
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", MODEL, "--gpu", GPU, "--role",
             self.role, "--port", str(self.port), "--time-scale", str(TIME_SCALE), "--admin-token", TOKEN,
             *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


async def _wait_up(s: aiohttp.ClientSession, e: Emu) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        assert e.proc is not None and e.proc.poll() is None, f"{e.name} exited with {e.proc and e.proc.returncode}"
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with s.get(e.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{e.name} did not start")


@dataclass
class Live:
    emus: dict[str, Emu]
    gw: Gateway
    url: str
    client: aiohttp.ClientSession
    db: str

    async def fault(self, name: str, body: dict[str, Any]) -> None:
        """Inject a fault through the emulator's admin API (a crash answers by dying)."""
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with self.client.post(self.emus[name].url + "/admin/faults", json=body,
                                        headers={"authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status in (200, 202), await r.text()

    async def stream(self, key: str, prompt: str = PROMPT) -> dict[str, Any]:
        """One streamed completion; its texts, error event (if any) and request id."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
        async with self.client.post(self.url + "/v1/completions", json=body, headers={"Idempotency-Key": key}) as r:
            raw = (await r.read()).decode()
            rid = r.headers.get("X-Request-ID", "")
            status = r.status
        events = [b[6:] for b in raw.split("\n\n") if b.startswith("data: ")]
        texts, error, content_events = [], None, 0
        for e in events:
            if e == "[DONE]":
                continue
            doc = json.loads(e)
            if "error" in doc:
                error = doc["error"]
            else:
                texts += [c["text"] for c in doc["choices"] if c.get("text")]
                content_events += 1
        # Generated text is vocabulary words, one token each with its leading space: the tokens.
        tokens = "".join(texts).split()
        return {"status": status, "texts": tokens, "error": error, "request_id": rid, "done": events[-1:] == ["[DONE]"],
                "events": content_events}

    def rows(self) -> dict[str, Any]:
        with open_ledger(self.db, create=False) as led:
            return {r.idempotency_key: r for r in led.rows()}

    def work(self, key: str) -> list[tuple[str, str, str]]:
        with open_ledger(self.db, create=False) as led:
            return [(w[3], w[4], w[6]) for w in led.work() if w[1] == key]


class Emulators:
    """The emulator processes of this module, shared by its tests: a test asks for the flags it
    needs (`ensure`); a process is (re)started only when it died or its flags differ."""

    def __init__(self) -> None:
        self.emus: dict[str, Emu] = {}

    async def ensure(self, extra: dict[str, tuple[str, ...]]) -> dict[str, Emu]:
        starting = []
        for name, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")):
            e = self.emus.get(name)
            want = extra.get(name, ())
            if e is None or e.proc is None or e.proc.poll() is not None or e.extra != want:
                if e is not None:
                    e.stop()
                e = self.emus[name] = Emu(name, role, free_port(), want)
                e.start()
                starting.append(e)
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(_wait_up(s, e) for e in starting))
            for e in self.emus.values():  # faults left by an earlier test
                async with s.post(e.url + "/admin/faults", json={"kind": "clear"},
                                  headers={"authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status in (200, 202), await r.text()
        return self.emus

    def stop(self) -> None:
        for e in self.emus.values():
            e.stop()


@pytest.fixture(scope="module")
def emulators():
    pool = Emulators()
    try:
        yield pool
    finally:
        pool.stop()


@contextlib.asynccontextmanager
async def live(tmp_path: Any, pool: Emulators, extra: dict[str, tuple[str, ...]] | None = None,
               **gw_cfg: Any) -> AsyncIterator[Live]:
    emus = await pool.ensure(extra or {})
    db = str(tmp_path / "ledger.db")
    server = task = None
    try:
        async with aiohttp.ClientSession() as client:
            doc = {"backends": [{"url": e.url, "name": e.name, "role": e.role} for e in emus.values()],
                   "routing": {"policy": "round-robin"}, "scrape": FAST, "ledger": db,
                   "timeouts": {"first_byte_s": 10.0, "idle_s": 10.0}, **gw_cfg}
            gw = Gateway(GatewayConfig.model_validate(doc))
            sock = listening_socket("127.0.0.1", 0)
            server = uvicorn_server(gw)
            task = asyncio.create_task(server.serve(sockets=[sock]))
            end = time.monotonic() + 10
            while not server.started:
                assert not task.done() and time.monotonic() < end, "gateway did not start"
                await asyncio.sleep(0.01)
            yield Live(emus, gw, f"http://127.0.0.1:{sock.getsockname()[1]}", client, db)
    finally:
        if server is not None and task is not None:
            server.should_exit = True
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, SCENARIO_TIMEOUT_S))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, emulators) -> list[str]:
    """The fault-free stream of PROMPT (one request through the same kind of fleet)."""
    out: list[list[str]] = []

    async def scenario() -> None:
        async with live(tmp_path_factory.mktemp("ref"), emulators) as f:
            a = await f.stream("ref-a")
            b = await f.stream("ref-b")  # the other pair (round-robin): the same text
            assert a["done"] and b["done"] and a["texts"] == b["texts"] and len(a["texts"]) == MAX_TOKENS
            out.append(a["texts"])
    run(scenario())
    return out[0]


async def _nothing() -> None:
    """No fault during the requests (it was injected before them)."""


async def _pair(f: Live, fault: Any, delay_s: float) -> list[dict[str, Any]]:
    """Two concurrent requests (round-robin puts one on each pair) with `fault` after `delay_s`."""
    tasks = [asyncio.create_task(f.stream(k)) for k in ("k0", "k1")]
    await asyncio.sleep(delay_s)
    await fault()
    return list(await asyncio.gather(*tasks))


def _same_and_metered(f: Live, got: list[dict[str, Any]], reference: list[str]) -> None:
    assert [g["texts"] for g in got] == [reference, reference]
    assert all(g["done"] and g["error"] is None and g["status"] == 200 for g in got)
    rows = f.rows()
    assert sorted(rows) == ["k0", "k1"]
    assert {rows[k].request_id for k in rows} == {g["request_id"] for g in got}
    assert [(r.status, r.delivered_tokens, r.attempts) for r in rows.values()] == [("completed", MAX_TOKENS, 1)] * 2


def test_prefill_replica_lost_before_hand_off(tmp_path, reference, emulators) -> None:
    async def scenario() -> None:
        async with live(tmp_path, emulators) as f:
            await f.fault("p0", {"kind": "hang"})  # the prefill on p0 never finishes ...
            got = await _pair(f, lambda: f.fault("p0", {"kind": "crash"}), 0.3)  # ... and p0 dies
            _same_and_metered(f, got, reference)
            redone = [f.work(k) for k in ("k0", "k1") if any(w[0] == "reprefill" for w in f.work(k))]
            assert len(redone) == 1 and redone[0][0] == ("prefill", "first", "p0")
            assert redone[0][1][0] == "reprefill" and redone[0][1][2] == "p1"
    run(scenario())


def test_decode_pool_full_fails_admission_and_the_request_is_prefilled_again(tmp_path, reference, emulators) -> None:
    async def scenario() -> None:
        async with live(tmp_path, emulators) as f:
            await f.fault("d0", {"kind": "fail_requests", "status": 503})
            got = await _pair(f, _nothing, 0.0)
            _same_and_metered(f, got, reference)
            causes = [w for k in ("k0", "k1") for w in f.work(k) if w[0] == "reprefill"]
            assert len(causes) == 1 and causes[0][1] == "5xx"
    run(scenario())


def test_lease_expiry_on_the_prefill_side_is_a_failed_hand_off_then_prefilled_again(tmp_path, reference, emulators) -> None:
    async def scenario() -> None:
        async with live(tmp_path, emulators, extra={"p0": ("--kv-lease", "0.000001")}) as f:
            got = await _pair(f, _nothing, 0.0)
            _same_and_metered(f, got, reference)
            causes = [w for k in ("k0", "k1") for w in f.work(k) if w[0] == "reprefill"]
            assert causes and all(c[1] == "handoff" for c in causes)
    run(scenario())


def test_a_lost_hand_off_is_not_prefilled_again_when_max_reprefills_is_zero(tmp_path, reference, emulators) -> None:
    expired = ("--kv-lease", "0.000001")  # every prefill replica's KV is gone before the decode pulls it
    async def scenario() -> None:
        async with live(tmp_path, emulators, extra={"p0": expired, "p1": expired},
                        failure_domains={"max_reprefills": 0}, retries={"max_retries": 4}) as f:
            got = await f.stream("k0")
            assert got["status"] == 502 and got["texts"] == []
            for _ in range(500):  # a request without an answer is metered just after its error response
                if "k0" in f.rows():
                    break
                await asyncio.sleep(0.01)
            assert [w[0] for w in f.work("k0")] == ["prefill"]  # no re-prefill on the other pair
            assert f.rows()["k0"].status == "failed"
    run(scenario())


def test_kv_transfer_broken_mid_way_is_prefilled_again(tmp_path, reference, emulators) -> None:
    slow = ("--kv-link-gbps", "0.02")  # the decode side pulls the KV for about a modelled minute
    async def scenario() -> None:
        async with live(tmp_path, emulators, extra={"d0": slow, "d1": slow}) as f:
            got = await _pair(f, lambda: f.fault("p0", {"kind": "crash"}), 0.5)  # p0's KV source dies mid-pull
            _same_and_metered(f, got, reference)
            causes = [w for k in ("k0", "k1") for w in f.work(k) if w[0] == "reprefill"]
            assert len(causes) == 1 and causes[0][1] == "handoff"  # the decode's KV pull failed
    run(scenario())


def test_decode_replica_lost_mid_stream_ends_cleanly_with_the_tokens_streamed(tmp_path, reference, emulators) -> None:
    async def scenario() -> None:
        async with live(tmp_path, emulators, failure_domains={"on_decode_failure": "fail"}) as f:
            await f.fault("d0", {"kind": "drop_streams", "after_tokens": 7})
            got = await _pair(f, _nothing, 0.0)
            cut = [g for g in got if g["error"] is not None]
            whole = [g for g in got if g["error"] is None]
            assert len(cut) == 1 and len(whole) == 1 and whole[0]["texts"] == reference
            assert cut[0]["texts"] == reference[:7] and cut[0]["done"]  # a prefix, then an error event, [DONE]
            assert cut[0]["error"]["type"] == "upstream_error"
            rows = f.rows()
            bad = next(r for r in rows.values() if r.request_id == cut[0]["request_id"])
            # Without a usage block the gateway counts the content events the client received.
            assert (bad.status, bad.delivered_tokens, bad.billed_generated_tokens) == ("failed", cut[0]["events"], 0)
    run(scenario())


def test_decode_replica_lost_mid_stream_migrates_and_the_client_gets_the_fault_free_stream(tmp_path, reference,
                                                                                          emulators) -> None:
    async def scenario() -> None:
        async with live(tmp_path, emulators) as f:  # default decisions: migrate, at most once
            await f.fault("d0", {"kind": "drop_streams", "after_tokens": 7})
            got = await _pair(f, _nothing, 0.0)
            assert [g["texts"] for g in got] == [reference, reference]  # token by token, none lost or doubled
            assert all(g["done"] and g["error"] is None and g["status"] == 200 for g in got)
            rows = f.rows()
            assert sorted(rows) == ["k0", "k1"]
            assert [(r.status, r.delivered_tokens, r.billed_generated_tokens, r.attempts) for r in rows.values()] \
                == [("completed", MAX_TOKENS, MAX_TOKENS, 1)] * 2  # one row each, billed once
            prompt = rows["k0"].prompt_tokens
            assert rows["k1"].prompt_tokens == prompt  # the continuation's longer prompt is not billed
            moved = [k for k in ("k0", "k1") if any(w[0] == "migration" for w in f.work(k))]
            assert len(moved) == 1
            work = f.work(moved[0])
            assert [w[:2] for w in work] == [("prefill", "first"), ("migration", "disconnect"), ("decode", "disconnect")]
            assert work[2][2] == "d1"  # prompt + 7 tokens prefilled again, decoded on the other decode replica
            with open_ledger(f.db, create=False) as led:
                tokens = {w[3]: w[7] for w in led.work() if w[1] == moved[0]}
            assert (tokens["migration"], tokens["decode"]) == (prompt + 7, MAX_TOKENS)  # the engine's prompt count
            assert f.gw.telemetry.migrations._value.get() == 1
    run(scenario())


def test_a_broken_chat_stream_migrates_with_continue_final_message(tmp_path, emulators) -> None:
    async def chat(f: Live, key: str) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
                "stream": True, "ignore_eos": True}
        async with f.client.post(f.url + "/v1/chat/completions", json=body, headers={"Idempotency-Key": key}) as r:
            raw = (await r.read()).decode()
        docs = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
        assert all("error" not in d for d in docs) and raw.endswith("data: [DONE]\n\n")
        return "".join(c["delta"].get("content") or "" for d in docs for c in d["choices"])

    async def scenario() -> None:
        async with live(tmp_path, emulators) as f:
            want = await chat(f, "ref")
            await f.fault("d0", {"kind": "drop_streams", "after_tokens": 5})
            got = await asyncio.gather(chat(f, "c0"), chat(f, "c1"))  # one broken after 5 tokens, continued
            assert got == [want, want] and len(want.split()) == MAX_TOKENS
            rows = f.rows()
            assert [(rows[k].status, rows[k].delivered_tokens, rows[k].billed_generated_tokens) for k in ("c0", "c1")] \
                == [("completed", MAX_TOKENS, MAX_TOKENS)] * 2
            assert sum(w[0] == "migration" for k in ("c0", "c1") for w in f.work(k)) == 1
    run(scenario())
