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
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.tokens import NUM_WORDS, words_text

REQUEST_TIMEOUT_S = 600.0
"""Wall seconds one request may take before it counts as an error."""


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


@dataclass
class Target:
    """Where one request goes: a mixed replica, or a prefill and a decode replica."""

    url: str
    prefill_url: str | None = None


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], res: Result,
                  t_send: float, scale: float, keep_itl: bool) -> None:
    t_first = t_last = 0.0
    n_chunks = 0
    usage_tokens = 0
    async with session.post(url + "/v1/completions", json=body, headers={"x-request-id": f"r{res.request_id}"}) as r:
        if r.status != 200:
            res.error = f"HTTP {r.status}: {(await r.text())[:200]}"
            return
        done = False
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            if b'"text":""' in data or b'"choices":[]' in data:  # finish-only or usage chunk
                if b'"usage"' in data:
                    usage_tokens = json.loads(data)["usage"]["completion_tokens"]
                continue
            if n_chunks == 0:
                t_first = now
            elif keep_itl:
                res.itl_s.append((now - t_last) * scale)
            t_last = now
            n_chunks += 1
        if not done:
            res.error = "stream ended without [DONE]"
            return
    res.chunks, res.tokens = n_chunks, usage_tokens
    res.ttft_s = (t_first - t_send) * scale
    res.e2e_s = (t_last - t_send) * scale
    if usage_tokens > 1:
        res.tpot_s = (t_last - t_first) * scale / (usage_tokens - 1)
    res.ok = True


async def _one(session: aiohttp.ClientSession, req: Request, text: str, target: Target, model: str,
               scale: float, t_send: float, keep_itl: bool) -> Result:
    res = Result(req.request_id)
    body: dict[str, Any] = {"model": model, "prompt": text, "max_tokens": req.output_tokens, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}
    try:
        if target.prefill_url is not None:
            async with session.post(target.prefill_url + "/v1/completions", json={
                    "model": model, "prompt": text, "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True}},
                    headers={"x-request-id": f"r{req.request_id}"}) as r:
                if r.status != 200:
                    res.error = f"prefill HTTP {r.status}: {(await r.text())[:200]}"
                    return res
                body["kv_transfer_params"] = (await r.json())["kv_transfer_params"]
        await _stream(session, target.url, body, res, t_send, scale, keep_itl)
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        res.error = f"{type(err).__name__}: {err}"[:200]
    return res


async def replay(requests: list[Request], targets: list[Target], model: str, time_scale: float,
                 keep_itl: bool = False) -> tuple[list[Result], float]:
    """Send `requests[i]` to `targets[i]` at its arrival (scaled); returns the results (in input
    order) and the wall seconds the replay took."""
    texts = [prompt_text(r) for r in requests]  # built before the clock starts
    gc.collect()
    gc.freeze()  # nothing built so far is garbage: keep full collections short during the replay
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.5
        tasks = []
        for req, text, target in zip(requests, texts, targets, strict=True):
            at = t0 + req.arrival_s / time_scale
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, req, text, target, model, time_scale,
                                                  time.perf_counter(), keep_itl)))
        results = list(await asyncio.gather(*tasks))
        return results, loop.time() - t0


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


def pd_breakdown(prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, float]:
    """Medians (modelled seconds) of a PD request's legs from both replicas' records: the prefill
    as modelled, the prefill's answer to the decode replica's intake (the client's hop), and
    the decode intake to the first token (KV pull, its wait, the first decode pass)."""
    legs: list[tuple[float, float, float]] = []
    d_rows = {r[0]: r for r in decode["rows"]}
    sp, sd = prefill["time_scale"], decode["time_scale"]
    for r in prefill["rows"]:
        q = d_rows.get(r[0])
        if q is None or r[2] is None or q[2] is None:
            continue
        pa, pf = prefill["origin_unix_s"] + r[1] / sp, prefill["origin_unix_s"] + r[2] / sp
        da, df = decode["origin_unix_s"] + q[1] / sd, decode["origin_unix_s"] + q[2] / sd
        legs.append(((pf - pa) * sp, (da - pf) * sp, (df - da) * sp))
    if not legs:
        return {}
    return {name: float(np.median([x[i] for x in legs])) for i, name in
            enumerate(("prefill_s", "prefill_answer_to_decode_intake_s", "decode_intake_to_first_token_s"))}


def server_side(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per request id, the emulators' own modelled times: {ttft_s, tpot_s}. A request seen by two
    replicas (PD) starts at its arrival on the first one (by wall time) and ends on the other;
    replicas' clocks are lined up through their `origin_unix_s`."""
    seen: dict[str, list[tuple[float, float | None, float, int]]] = {}
    for rec in records:
        o, scale = rec["origin_unix_s"], rec["time_scale"]
        for row in rec["rows"]:
            rid, arr, first, fin, _, out, _ = row
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
        res[rid] = {"ttft_s": (first - arrival) * scale,
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
    results, wall = asyncio.run(replay(reqs, targets, args.model, args.time_scale))
    print(json.dumps({"wall_s": wall, **summarize(results)}, indent=2))


if __name__ == "__main__":
    main()
