"""Load generator for emulated fleets: replays a list of `Request`s against `fleetwise emulate`
replicas over HTTP, as a client would, and measures TTFT and TPOT from the client's side.

Used by `emulator_agreement.py` and `emulator_capacity.py`; also runnable on its own against a
fleet started with `fleetwise emulate --plan ... --endpoints fleet.json`:

    python3 benchmarks/emulator_loadgen.py --endpoints fleet.json --time-scale 5 --requests 200 --rate 2

Prompts: request i gets a text of exactly `prompt_tokens` tokens of the emulator's tokenizer
(`words_text`). Blocks named by the request's `block_hashes` (Mooncake semantics) get words
seeded by the hash id, so equal hash prefixes are equal text prefixes and hit the emulator's
prefix cache as they hit the simulator's; other tokens are seeded by the request id (no sharing).
Output: `max_tokens = output_tokens`, `ignore_eos`, streamed with `include_usage`.

Routing: each request goes to the replica(s) given per request (the agreement benchmark passes
the simulator's own choices, so both sides route identically); PD requests first go to the
prefill replica (`kv_transfer_params.do_remote_decode`, `max_tokens` 1), then the decode one.

Times: the client stamps send, first content chunk and last content chunk with the wall clock
and converts to modelled seconds (x time scale): TTFT = first - send, TPOT = (last - first) /
(tokens - 1). Requests are sent at `t0 + arrival_s / time_scale`.

Client: `LeanClient`, a minimal HTTP/1.1 client on uvloop (keep-alive connections opened ahead,
request bodies prepared as bytes, responses parsed by httptools as they arrive, each chunk
stamped in `data_received`), because every wall millisecond the client spends is `time_scale`
modelled milliseconds of TTFT: 1.45 ms of CPU per streamed request against aiohttp's 3.1
(`emulator_request_cpu.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import httptools
import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.tokens import NUM_WORDS, words_text

MONO_MINUS_PERF = time.monotonic() - time.perf_counter()
"""`time.monotonic()` minus `time.perf_counter()` (the same clock on Linux, so 0 there): puts
the client's perf_counter stamps on the clock the replicas' records are lined up on."""
REQUEST_TIMEOUT_S = 600.0
"""Wall seconds one request may take before it counts as an error."""
PRECONNECT = 32
"""Connections opened to each replica before the replay (more open on demand)."""
T = TypeVar("T")


def prompt_text(req: Request) -> str:
    """A prompt of exactly `req.prompt_tokens` emulator tokens; hashed blocks share text."""
    n, hbt = req.prompt_tokens, req.hash_block_tokens
    words: list[int] = []
    for h in req.block_hashes:
        take = min(hbt, n - len(words))
        if take <= 0:
            break
        words += np.random.default_rng([1, h]).integers(0, NUM_WORDS, take).tolist()
    if len(words) < n:
        words += np.random.default_rng([2, req.request_id]).integers(0, NUM_WORDS, n - len(words)).tolist()
    return words_text(words)


@dataclass
class Result:
    """One request as the client saw it (modelled seconds; NaN when it did not happen)."""

    request_id: int
    ok: bool = False
    error: str = ""
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")
    e2e_s: float = float("nan")
    tokens: int = 0
    chunks: int = 0
    itl_s: list[float] = field(default_factory=list)
    stamps: dict[str, float] = field(default_factory=dict)
    """`time.monotonic()` seconds of the client's stages: `send` (first byte of the first request),
    `prefill_answer` and `decode_send` (PD), `first` (first content chunk), `last`."""


@dataclass
class Target:
    """Where one request goes: a mixed replica, or a prefill and a decode replica."""

    url: str
    prefill_url: str | None = None


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the lean client: the response is parsed by
    httptools (C) as bytes arrive, and `data_received` stamps the moment they arrived, so a
    token's time is when the loop saw its bytes, not when a task got round to reading them."""

    def __init__(self, pool: list[_Conn]) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: _Sink | None = None
        self.now = 0.0
        self.keep_alive = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._lost(f"bad HTTP response: {err}")

    def on_headers_complete(self) -> None:
        if self.sink is not None:
            self.sink.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.feed(body, self.now)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        self.parser = httptools.HttpResponseParser(self)
        if self.keep_alive and self.transport is not None and not self.transport.is_closing():
            self.pool.append(self)
        elif self.transport is not None:
            self.transport.close()
        if sink is not None and not sink.done.done():
            sink.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        self._lost(f"connection lost ({exc})")

    def _lost(self, why: str) -> None:
        sink, self.sink = self.sink, None
        if sink is not None and not sink.done.done():
            sink.done.set_exception(ConnectionError(why))
        if self.transport is not None:
            self.transport.close()


class _Sink:
    """What one response's bytes go to: the whole body (`status`, `body`)."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes, now: float) -> None:
        self.body += data


class _SseSink(_Sink):
    """A streamed response: SSE events parsed as they arrive; stamps the first and the last
    content chunk (perf_counter), counts them and reads the usage."""

    def __init__(self) -> None:
        super().__init__()
        self.first = self.last = 0.0
        self.chunks = self.usage_tokens = 0
        self.finished = False
        self.gaps: list[float] | None = None

    def feed(self, data: bytes, now: float) -> None:
        if self.status != 200:
            self.body += data
            return
        buf = self.body
        buf += data
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = bytes(buf[start:end])
            start = end + 2
            if not event.startswith(b"data: "):
                continue
            if event == b"data: [DONE]":
                self.finished = True
            elif b'"text":""' in event or b'"choices":[]' in event:  # finish-only or usage chunk
                if b'"usage"' in event:
                    self.usage_tokens = json.loads(event[6:])["usage"]["completion_tokens"]
            else:
                if self.chunks == 0:
                    self.first = now
                elif self.gaps is not None:
                    self.gaps.append(now - self.last)
                self.last = now
                self.chunks += 1
        del buf[:start]


class LeanClient:
    """A minimal HTTP/1.1 client for the load generator: keep-alive connections per host,
    requests written as prepared bytes, responses parsed as they arrive (`_Conn`). Per streamed
    chunk it does a find and a few byte comparisons, and no task wakes until the response ends."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, int], list[_Conn]] = {}

    async def _conn(self, host: str, port: int) -> _Conn:
        pool = self._pools.setdefault((host, port), [])
        while pool:
            c = pool.pop()
            if c.transport is not None and not c.transport.is_closing():
                return c
        _, proto = await asyncio.get_running_loop().create_connection(lambda: _Conn(pool), host, port)
        return proto

    async def connect(self, url: str, n: int) -> None:
        """Open `n` idle connections to `url` ahead of the first request."""
        host, port = _host_port(url)
        pool = self._pools.setdefault((host, port), [])
        conns = [await asyncio.get_running_loop().create_connection(lambda: _Conn(pool), host, port)
                 for _ in range(n)]
        pool.extend(p for _, p in conns)

    async def post(self, url: str, path: str, body: bytes, request_id: str, sink: _Sink) -> float:
        """POST `body` (JSON bytes) and feed the response to `sink` until it ends; returns the
        perf_counter time the request was written."""
        host, port = _host_port(url)
        c = await self._conn(host, port)
        c.sink = sink
        assert c.transport is not None
        t = time.perf_counter()
        c.transport.write(b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
                          b"x-request-id: %s\r\ncontent-length: %d\r\n\r\n%s"
                          % (path.encode(), host.encode(), port, request_id.encode(), len(body), body))
        await sink.done
        return t

    def close(self) -> None:
        for pool in self._pools.values():
            for c in list(pool):
                if c.transport is not None:
                    c.transport.close()
        self._pools.clear()


def _host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1].rstrip("/")
    host, _, port = rest.rpartition(":")
    return host, int(port)


async def _one(client: LeanClient, req: Request, prompt_json: str, target: Target, model: str,
               scale: float, keep_itl: bool) -> Result:
    res = Result(req.request_id)
    rid = f"r{req.request_id}"
    head = '{"model":' + json.dumps(model) + ',"prompt":' + prompt_json
    try:
        if target.prefill_url is not None:
            pre = _Sink()
            t_send = await client.post(target.prefill_url, "/v1/completions", (
                head + ',"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}').encode(), rid, pre)
            res.stamps["send"] = t_send + MONO_MINUS_PERF
            if pre.status != 200:
                res.error = f"prefill HTTP {pre.status}: {bytes(pre.body[:200]).decode(errors='replace')}"
                return res
            ktp = json.loads(pre.body)["kv_transfer_params"]
            res.stamps["prefill_answer"] = res.stamps["send"] + (time.perf_counter() - t_send)
            extra = ',"kv_transfer_params":' + json.dumps(ktp)
        else:
            extra = ""
        body = (head + f',"max_tokens":{req.output_tokens},"ignore_eos":true,"stream":true,'
                '"stream_options":{"include_usage":true}' + extra + "}").encode()
        sink = _SseSink()
        if keep_itl:
            sink.gaps = []
        t0 = client.post(target.url, "/v1/completions", body, rid, sink)
        if target.prefill_url is None:
            t_send = await t0
            res.stamps["send"] = t_send + MONO_MINUS_PERF
        else:
            res.stamps["decode_send"] = time.monotonic()
            await t0
    except (ConnectionError, OSError) as err:
        res.error = f"{type(err).__name__}: {err}"[:200]
        return res
    if sink.status != 200:
        res.error = f"HTTP {sink.status}: {bytes(sink.body[:200]).decode(errors='replace')}"
        return res
    if not sink.finished:
        res.error = "stream ended without [DONE]"
        return res
    send = res.stamps["send"]
    res.stamps["first"] = send + (sink.first - t_send)
    res.stamps["last"] = send + (sink.last - t_send)
    res.chunks, res.tokens = sink.chunks, sink.usage_tokens
    res.ttft_s = (sink.first - t_send) * scale
    res.e2e_s = (sink.last - t_send) * scale
    if sink.gaps is not None:
        res.itl_s = [g * scale for g in sink.gaps]
    if sink.usage_tokens > 1:
        res.tpot_s = (sink.last - sink.first) * scale / (sink.usage_tokens - 1)
    res.ok = True
    return res


async def replay(requests: list[Request], targets: list[Target], model: str, time_scale: float,
                 keep_itl: bool = False) -> tuple[list[Result], float]:
    """Send `requests[i]` to `targets[i]` at its arrival (scaled); returns the results (in input
    order) and the wall seconds the replay took."""
    prompts = [json.dumps(prompt_text(r)) for r in requests]  # built before the clock starts
    gc.collect()
    gc.freeze()  # nothing built so far is garbage: keep full collections short during the replay
    client = LeanClient()
    for url in sorted({u for t in targets for u in (t.url, t.prefill_url) if u is not None}):
        await client.connect(url, PRECONNECT)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.5
        tasks = []
        for req, prompt, target in zip(requests, prompts, targets, strict=True):
            at = t0 + req.arrival_s / time_scale
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(asyncio.wait_for(
                _one(client, req, prompt, target, model, time_scale, keep_itl), REQUEST_TIMEOUT_S)))
        results = []
        for req, task in zip(requests, tasks, strict=True):
            try:
                results.append(await task)
            except TimeoutError:
                results.append(Result(req.request_id, error=f"TimeoutError: over {REQUEST_TIMEOUT_S:g} s"))
        return results, loop.time() - t0
    finally:
        client.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a uvloop loop where uvloop is installed (less CPU per event than asyncio's),
    else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def wakeup_lateness(seconds: float = 2.0, period_s: float = 0.005) -> dict[str, float]:
    """How late a bare asyncio loop in this process wakes for absolute deadlines (wall seconds):
    the machine's own scheduling delay, the floor under any emulator's overrun."""
    loop = asyncio.get_running_loop()
    t = loop.time()
    end = t + seconds
    lates = []
    while t < end:
        t += period_s
        await asyncio.sleep(max(0.0, t - loop.time()))
        lates.append(loop.time() - t)
    return percentiles(lates)


HOP_PROBES, HOP_GAP_S = 200, 0.01
"""`hop_round_trip`: round trips, and the idle wall seconds before each (about a replica's idle gap in a replay)."""


async def hop_round_trip(url: str, n: int = HOP_PROBES, gap_s: float = HOP_GAP_S) -> dict[str, float]:
    """Wall seconds of `n` HTTP round trips (`GET /health` on one keep-alive connection) to an
    idle replica, each after `gap_s` idle: what one client-to-server-and-back costs on this
    machine with no engine work in it, i.e. the floor under every hop of a replay."""
    host, port = _host_port(url)
    reader, writer = await asyncio.open_connection(host, port)
    req = b"GET /health HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (host.encode(), port)
    rtts = []
    try:
        for _ in range(n):
            await asyncio.sleep(gap_s)
            t = time.perf_counter()
            writer.write(req)
            await reader.readuntil(b"\r\n\r\n")  # /health answers with an empty body
            rtts.append(time.perf_counter() - t)
    finally:
        writer.close()
    return percentiles(rtts)


def percentiles(values: list[float]) -> dict[str, float]:
    """{p50, p90, p99, mean} of the finite values (NaN when there are none)."""
    a = np.asarray([v for v in values if v == v], dtype=float)
    if not len(a):
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan")}
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def summarize(results: list[Result]) -> dict[str, Any]:
    """Counts and TTFT/TPOT/E2E percentiles of a replay (modelled seconds)."""
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = r.error.split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {"requests": len(results), "ok": sum(r.ok for r in results), "errors": errors,
            "ttft_s": percentiles([r.ttft_s for r in results]), "tpot_s": percentiles([r.tpot_s for r in results]),
            "e2e_s": percentiles([r.e2e_s for r in results])}


async def fetch_status(urls: list[str], path: str = "/fleetwise/status") -> list[dict[str, Any]]:
    """Each replica's /fleetwise/status (overrun, steps, busy time), or another JSON path."""
    async with aiohttp.ClientSession() as s:
        out = []
        for u in urls:
            async with s.get(u + path) as r:
                out.append(await r.json())
        return out


def _rows_aligned(rec: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """A replica's records by request id, every `*_s` column as a `time.monotonic()` second of
    this machine (None stays None), the clock the client's stamps are on."""
    o, sc, cols = rec["origin_monotonic_s"], rec["time_scale"], rec["columns"]
    out = {}
    for row in rec["rows"]:
        d = dict(zip(cols, row, strict=True))
        out[d["id"]] = {k: (None if v is None else o + v / sc) for k, v in d.items() if k.endswith("_s")}
    return out


EMULATOR_STAGES = {
    "mixed": (("client_to_server", "c.send", "m.arrival_s"), ("queue", "m.arrival_s", "m.scheduled_s"),
              ("prefill", "m.scheduled_s", "m.first_token_s"), ("first_token_overrun", "m.first_token_s",
                                                                 "m.first_token_seen_s"),
              ("server_to_client", "m.first_token_seen_s", "c.first")),
    "pd": (("client_to_prefill", "c.send", "p.arrival_s"), ("queue", "p.arrival_s", "p.scheduled_s"),
           ("prefill", "p.scheduled_s", "p.first_token_s"), ("prefill_overrun", "p.first_token_s", "p.finish_seen_s"),
           ("prefill_answer_to_client", "p.finish_seen_s", "c.prefill_answer"),
           ("client_to_decode", "c.prefill_answer", "d.arrival_s"), ("decode_to_pull", "d.arrival_s", "d.kv_pull_start_s"),
           ("kv_pull", "d.kv_pull_start_s", "d.kv_pull_end_s"), ("kv_to_first_token", "d.kv_pull_end_s", "d.first_token_s"),
           ("first_token_overrun", "d.first_token_s", "d.first_token_seen_s"),
           ("server_to_client", "d.first_token_seen_s", "c.first")),
}
"""Stages of a request's way to its first token, each (name, from, to): `c.` = the client's
stamps, `m.`/`p.`/`d.` = the mixed, prefill or decode replica's record."""


def stage_timeline(results: list[Result], by_role: dict[str, list[dict[str, Any]]], scale: float) -> dict[str, Any]:
    """Per-stage medians and means (modelled seconds) of every request's way to its first token,
    from the client's stamps and the replicas' records lined up on this machine's monotonic
    clock (not Unix time: the VM's wall clock is stepped and slewed during a run)."""
    kind = "pd" if "prefill" in by_role else "mixed"
    rows = {r: {k: v for rec in recs for k, v in _rows_aligned(rec).items()} for r, recs in by_role.items()}
    stages = EMULATOR_STAGES[kind]
    vals: dict[str, list[float]] = {name: [] for name, _, _ in stages}
    for res in results:
        rid = f"r{res.request_id}"
        src: dict[str, dict[str, float | None]] = {"c": dict(res.stamps)}
        for role, key in (("mixed", "m"), ("prefill", "p"), ("decode", "d")):
            if role in rows:
                src[key] = rows[role].get(rid, {})
        for name, a, b in stages:
            ta = src[a[0]].get(a[2:])
            tb = src[b[0]].get(b[2:])
            if ta is not None and tb is not None:
                vals[name].append((tb - ta) * scale)
    return {name: {"p50": float(np.median(v)), "mean": float(np.mean(v)), "p99": float(np.percentile(v, 99))}
            for name, v in vals.items() if v}


def server_side(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per request id, the emulators' own modelled times: {ttft_s, ttft_engine_s, tpot_s}. A
    request seen by two replicas (PD) starts at its arrival on the first one (by wall time) and
    ends on the other; replicas' clocks are lined up through their `origin_monotonic_s`. `ttft_s` is
    that span, the client's hop between the two replicas included; `ttft_engine_s` sums each
    replica's own leg (arrival to first token: the prefill, then the KV transfer and the first
    decode pass), the span without the hop, which is where the simulator, having no proxy,
    measures TTFT. For a colocated request the two are equal."""
    seen: dict[str, list[tuple[float, float | None, float, int]]] = {}
    for rec in records:
        o, scale = rec["origin_monotonic_s"], rec["time_scale"]
        cols = rec["columns"]
        ia, ir, iff, ifi, io = (cols.index(c) for c in ("arrival_s", "id", "first_token_s", "finish_s",
                                                         "output_tokens"))
        for row in rec["rows"]:
            rid, arr, first, fin, out = row[ir], row[ia], row[iff], row[ifi], row[io]
            seen.setdefault(rid, []).append((o + arr / scale, None if first is None else o + first / scale,
                                             o + fin / scale, out))
    scale = records[0]["time_scale"] if records else 1.0
    res: dict[str, dict[str, float]] = {}
    for rid, parts in seen.items():
        parts.sort()
        arrival = parts[0][0]
        _, first, fin, out = max(parts, key=lambda p: p[3])  # the replica that generated the output
        if first is None:
            continue
        if any(p[1] is None for p in parts):
            continue
        legs = sum(p[1] - p[0] for p in parts if p[1] is not None)
        res[rid] = {"ttft_s": (first - arrival) * scale, "ttft_engine_s": legs * scale,
                    "tpot_s": (fin - first) * scale / (out - 1) if out > 1 else float("nan")}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", required=True, help="JSON written by `fleetwise emulate --plan --endpoints`")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1.0, help="Poisson rate, modelled requests/s")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    eps = json.loads(open(args.endpoints).read())
    mixed = [e["url"] for e in eps if e["role"] == "mixed"]
    pre = [e["url"] for e in eps if e["role"] == "prefill"]
    dec = [e["url"] for e in eps if e["role"] == "decode"]
    rng = np.random.default_rng(args.seed)
    t = np.cumsum(rng.exponential(1 / args.rate, args.requests))
    reqs = [Request(i, float(t[i]), args.prompt_tokens, args.output_tokens) for i in range(args.requests)]
    targets = ([Target(mixed[i % len(mixed)]) for i in range(len(reqs))] if mixed else
               [Target(dec[i % len(dec)], pre[i % len(pre)]) for i in range(len(reqs))])
    results, wall = run(replay(reqs, targets, args.model, args.time_scale))
    print(json.dumps({"wall_s": wall, **summarize(results)}, indent=2))


if __name__ == "__main__":
    main()
