"""Client disconnects abort requests; `ignore_eos` and `max_tokens` as vLLM reads them; concurrent
KV pulls share the port as the simulator's network does; arrivals never join an earlier step."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest
from emu_helpers import asgi_post, cfg, metric, run, serve, until

from fleetwise.core.tokens import words_text
from fleetwise.emulator.app import KvPost, create_app
from fleetwise.emulator.kv_link import KvPort
from fleetwise.emulator.protocol import parse_request
from fleetwise.engine.clock import ORDER_ARRIVAL
from fleetwise.perf.kv import kv_shards, kv_transfer_bytes
from fleetwise.sim.events import EventLoop
from fleetwise.sim.network import KvNetwork
from fleetwise.spec.plan import KvLinkSpec
from fleetwise.spec.workload import FixedLength

PROMPT = words_text(list(range(300)))


async def _call_then_disconnect(app: Any, body: dict[str, Any], after_chunks: int,
                                gone: asyncio.Event | None = None) -> list[dict[str, Any]]:
    """Drive one POST /v1/completions at the ASGI level; the client goes away (`http.disconnect`)
    once `after_chunks` body chunks have arrived (0: at once), or when `gone` is set."""
    sent: list[dict[str, Any]] = []
    gone = gone or asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)
        if msg["type"] == "http.response.body" and msg.get("body"):
            if sum(1 for m in sent if m["type"] == "http.response.body" and m.get("body")) >= after_chunks:
                gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    if after_chunks == 0:
        gone.set()
    elif after_chunks < 0:
        after_chunks = 1 << 30
    await app(scope, receive, send)
    return sent


def test_a_stream_whose_client_disconnects_is_aborted_and_frees_its_kv():
    async def go():
        app = create_app(cfg(time_scale=20.0))
        async with app.router.lifespan_context(app):
            rep = app.state.replica
            body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True}
            sent = await asyncio.wait_for(_call_then_disconnect(app, body, after_chunks=3), 30)
            chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
            # cut short: 2,000 tokens would take ~20 s of wall time (51 chunks were seen at load 7 on 2 cores)
            assert len(chunks) < 500
            # the abort lands at a step boundary
            await until(lambda: rep.engine.num_running == 0 and rep.engine.num_waiting == 0, "the stream aborted")
            assert rep.engine.pool.num_used == 0  # KV freed (prompt blocks stay as evictable cache)
            assert not rep._live
            assert re.search(r'finished_reason="abort"[^}]*} 1\.0', rep.metrics.render().decode())
    run(go())


def test_a_non_streaming_request_whose_client_disconnects_is_aborted():
    async def go():
        app = create_app(cfg(time_scale=20.0))
        async with app.router.lifespan_context(app):
            rep = app.state.replica
            body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
            t0 = time.monotonic()
            sent = await asyncio.wait_for(_call_then_disconnect(app, body, after_chunks=0), 30)
            assert time.monotonic() - t0 < 5.0  # did not run the 2,000 tokens
            assert sent[0]["status"] == 499
            await until(lambda: rep.engine.num_running == 0 and rep.engine.pool.num_used == 0 and not rep._live,
                        "the request aborted and its KV freed")
            assert re.search(r'finished_reason="abort"[^}]*} 1\.0', rep.metrics.render().decode())
    run(go())


async def _get(app: Any, path: str) -> str:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://emulator") as c:
        return (await c.get(path)).text


def test_a_decode_request_whose_client_disconnects_during_its_kv_pull_is_dropped():
    async def go():
        async with serve(cfg(role="prefill", port=9121)) as (papp, pc):
            dapp = create_app(cfg(role="decode", port=9122, kv_link=KvLinkSpec(gbps=0.02, latency_s=0.0)),
                              kv_post=asgi_post({"http://127.0.0.1:9121": papp}))
            async with dapp.router.lifespan_context(dapp):
                drep = dapp.state.replica
                prompt = words_text(list(range(2000)))  # about 100 modelled seconds on the slow link
                r = await pc.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                           "kv_transfer_params": {"do_remote_decode": True}})
                body = {"prompt": prompt, "max_tokens": 500, "ignore_eos": True, "stream": True,
                        "kv_transfer_params": r.json()["kv_transfer_params"]}
                await asyncio.sleep(0)
                gone = asyncio.Event()
                pulling = asyncio.create_task(_call_then_disconnect(dapp, body, -1, gone))
                await until(lambda: drep.kv_port is not None and drep.kv_port.active > 0, "the KV pull started")
                assert drep.kv_port is not None and drep.kv_port.active == 1  # the KV is on its way
                gone.set()  # the client goes away while the pull is in flight (1 s of wall time)
                port = drep.kv_port
                await until(lambda: port.active == 0, "the pull cancelled")  # not run to its end (1 s of wall)
                assert not drep._live and drep.engine.num_waiting == 0
                await asyncio.wait_for(pulling, 30)
                assert metric((await _get(dapp, "/metrics")), "fleetwise:kv_transfer_seconds_count") == 0
                assert drep.engine.num_running == 0 and drep.engine.pool.num_used == 0 and not drep._live
                assert not papp.state.replica.leases.held  # the lease was pulled, the prefill side freed it
    run(go())


# ---- ignore_eos and max_tokens ------------------------------------------------------------------
EOS_AT = 7
"""The seeded length model's EOS for every prompt in these tests (a fixed length)."""


@pytest.mark.parametrize(("extra", "tokens", "reason"), [
    ({"max_tokens": 20}, EOS_AT, "stop"),  # max_tokens is a cap: the model stops at its EOS first
    ({"max_tokens": 5}, 5, "length"),  # the cap comes first
    ({"max_tokens": EOS_AT}, EOS_AT, "length"),  # both at once: vLLM checks the cap first
    ({"max_tokens": 20, "ignore_eos": True}, 20, "length"),  # runs to max_tokens
    ({}, EOS_AT, "stop"),  # no cap: the EOS
    ({"ignore_eos": True}, 64 - 40, "length"),  # no cap, no EOS: to the context limit
])
def test_max_tokens_is_a_cap_and_ignore_eos_runs_to_it(extra, tokens, reason):
    async def go():
        async with serve(cfg(output_lengths=FixedLength(tokens=EOS_AT), max_model_len=64)) as (_, c):
            r = await c.post("/v1/completions", json={"prompt": words_text(list(range(40))), **extra})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == tokens
            assert r.json()["choices"][0]["finish_reason"] == reason
            s = await c.post("/v1/completions", json={"prompt": words_text(list(range(40))), "stream": True,
                                                      "stream_options": {"include_usage": True}, **extra})
            events = [json.loads(b[6:]) for b in s.text.split("\n\n") if b.startswith("data: {")]
            assert events[-1]["usage"]["completion_tokens"] == tokens
            assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == reason
    run(go())


# ---- KV pulls share the port ------------------------------------------------------------------------
def test_concurrent_pulls_land_when_the_simulators_network_delivers():
    """Pulls from two sources into one decode port, starting at various times, land exactly when
    the simulator's processor-shared network delivers the same transfers (bit for bit)."""
    bw_src, bw_dst, lat = 4e9, 6e9, 2e-5
    starts = [(0.0, "p0", 3e8), (0.01, "p0", 1e8), (0.02, "p1", 2e8), (0.021, "p0", 5e7), (0.2, "p1", 1e8)]
    loop = EventLoop()
    ing = KvPort(loop, bw_dst, lat)
    got: dict[int, float] = {}

    def start(now: float, a: tuple[int, str, float]) -> None:
        ing.start(now, a[1], bw_src, a[2], lambda t, _s, _sh: got.__setitem__(a[0], t))

    for k, (t, src, nbytes) in enumerate(starts):
        loop.call_at(t, ORDER_ARRIVAL, start, (k, src, nbytes))
    loop.run()
    ref_loop = EventLoop()
    want: dict[int, float] = {}
    net = KvNetwork(ref_loop, lat, lambda now, tag, rec: want.__setitem__(tag, now))
    ports = {"p0": net.add_port("p0", bw_src), "p1": net.add_port("p1", bw_src), "d": net.add_port("d", bw_dst)}
    for k, (t, src, nbytes) in enumerate(starts):
        ref_loop.call_at(t, ORDER_ARRIVAL, lambda now, a: net.start(now, a[0], ports[a[1]], ports["d"], a[2]), (k, src, nbytes))
    ref_loop.run()
    assert got == want  # one model (`perf.kv_share`): the same landing times to the last bit
    assert sorted(got) == list(range(len(starts)))
    alone = 3e8 / min(bw_src, bw_dst) + lat
    assert got[0] > alone * 1.2  # shared, not priced alone


def _recording(post: KvPost, answers: dict[str, dict[str, Any]]) -> KvPost:
    """`post`, keeping each KV pull's answer by its remote_request_id."""
    async def rec(url: str, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = await post(url, body)
        if status == 200:
            answers[data["remote_request_id"]] = data
        return status, data
    return rec


async def _prefill(pc: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
    r = await pc.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                               "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 200
    return r.json()["kv_transfer_params"]


async def _rows(c: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    rec = (await c.get("/fleetwise/requests")).json()
    return {r[0]: dict(zip(rec["columns"], r, strict=True)) for r in rec["rows"]}


def test_two_decode_requests_pulling_at_once_share_the_link():
    async def go():
        answers: dict[str, dict[str, Any]] = {}
        link = KvLinkSpec(gbps=1.0, latency_s=0.0)  # one link spec for the fleet, as a plan has
        async with serve(cfg(role="prefill", port=9111, kv_link=link)) as (papp, pc):
            async with serve(cfg(role="decode", port=9112, time_scale=10.0, kv_link=link),
                             kv_post=_recording(asgi_post({"http://127.0.0.1:9111": papp}), answers)) as (dapp, dc):
                prompts = [words_text(list(range(i, i + 2000))) for i in (0, 5000)]
                ktps = [await _prefill(pc, p) for p in prompts]
                drep = dapp.state.replica
                alone_one = 2000 * drep.deployment.model.kv_bytes_per_token("bf16") / drep.kv_port.bandwidth_bytes_per_s
                rs = await asyncio.gather(*[dc.post("/v1/completions", json={"prompt": p, "max_tokens": 2,
                                                                             "kv_transfer_params": k},
                                                    headers={"x-request-id": f"pull{i}"})
                                            for i, (p, k) in enumerate(zip(prompts, ktps, strict=True))])
                assert all(r.status_code == 200 for r in rs)
                rows = await _rows(dc)
                delta = abs(rows["pull1"]["kv_pull_start_s"] - rows["pull0"]["kv_pull_start_s"])
                assert 0.0 <= delta < alone_one  # the two overlap
                # Equal pulls started d apart share the port from then on: each takes
                # 2 x alone - d (one at a time, each would take `alone`). Both ends price it so,
                # each with the starts it saw on its own clock; the pull lands at the later end.
                pulled = [answers[k["remote_request_id"]] for k in ktps]
                delta_egress = abs(pulled[1]["transfer_start_s"] - pulled[0]["transfer_start_s"])
                total = 0.0
                for i, egress in enumerate(pulled):
                    r = rows[f"pull{i}"]
                    assert egress["transfer_s"] == pytest.approx(max(2 * alone_one - delta_egress, alone_one), rel=1e-6)
                    took = r["kv_pull_end_s"] - r["kv_pull_start_s"]
                    assert took == pytest.approx(max(2 * alone_one - delta, egress["transfer_s"]), rel=1e-6)
                    total += took
                assert metric((await dc.get("/metrics")).text, "fleetwise:kv_transfer_seconds_sum") == \
                    pytest.approx(total, rel=1e-6)
    run(go(), 120)


def test_one_prefill_feeding_two_decode_replicas_lands_when_the_simulators_network_delivers():
    """Fan-out: one prefill replica's egress port carries pulls to two decode replicas at once.
    Each pull lands when the simulator's network (egress and ingress ports shared) delivers the
    same transfers started at the same times, not at the faster price of the decode port alone."""
    link = KvLinkSpec(gbps=1.0, latency_s=1e-3)
    sizes = {"d1": 2000, "d2": 1200}

    async def go():
        answers: dict[str, dict[str, Any]] = {}
        async with serve(cfg(role="prefill", port=9131, time_scale=10.0, kv_link=link)) as (papp, pc):
            post = _recording(asgi_post({"http://127.0.0.1:9131": papp}), answers)
            async with serve(cfg(role="decode", port=9132, time_scale=10.0, kv_link=link), kv_post=post) as (d1, c1), \
                    serve(cfg(role="decode", port=9133, time_scale=10.0, kv_link=link), kv_post=post) as (d2, c2):
                prompts = {d: words_text(list(range(7000 * i, 7000 * i + n))) for i, (d, n) in enumerate(sizes.items())}
                ktps = {d: await _prefill(pc, p) for d, p in prompts.items()}
                clients = {"d1": c1, "d2": c2}
                rs = await asyncio.gather(*[clients[d].post("/v1/completions", headers={"x-request-id": f"fan-{d}"},
                                                            json={"prompt": prompts[d], "max_tokens": 2,
                                                                  "kv_transfer_params": ktps[d]})
                                            for d in sizes])
                assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
                rows = {d: (await _rows(clients[d]))[f"fan-{d}"] for d in sizes}
                reps = {"p": papp.state.replica, "d1": d1.state.replica, "d2": d2.state.replica}
        return {d: answers[ktps[d]["remote_request_id"]] for d in sizes}, rows, reps

    got, rows, reps = run(go(), 120)
    # The simulator's network, the same ports, the same transfers started when the egress port saw them.
    ref_loop = EventLoop()
    want: dict[int, float] = {}
    net = KvNetwork(ref_loop, link.latency_s, lambda now, tag, rec: want.__setitem__(tag, now))
    ports = {k: net.add_port(k, link.bytes_per_s * kv_shards(r.deployment)) for k, r in reps.items()}
    for k, d in enumerate(sizes):
        nbytes = kv_transfer_bytes(sizes[d], reps["p"].deployment)
        ref_loop.call_at(got[d]["transfer_start_s"], ORDER_ARRIVAL,
                         lambda now, a: net.start(now, a[0], ports["p"], ports[a[1]], a[2]), (k, d, nbytes))
    ref_loop.run()
    for k, d in enumerate(sizes):
        sim_s = want[k] - got[d]["transfer_start_s"]
        assert got[d]["transfer_s"] == pytest.approx(sim_s, rel=1e-9)  # priced on the egress as the sim does
        took = rows[d]["kv_pull_end_s"] - rows[d]["kv_pull_start_s"]
        assert took == pytest.approx(sim_s, rel=1e-9)  # and the decode replica lands it then
        alone = net.alone_s(ports["p"], ports[d], kv_transfer_bytes(sizes[d], reps["p"].deployment))
        assert took > 1.3 * alone  # the two shared the prefill's port (alone: one decode port's price)
    assert abs(got["d1"]["transfer_start_s"] - got["d2"]["transfer_start_s"]) < 0.2  # they overlapped


# ---- arrivals and step boundaries -------------------------------------------------------------------
def test_a_request_reaching_a_late_process_never_joins_a_step_that_started_before_it():
    async def go():
        async with serve(cfg(time_scale=10.0)) as (app, c):
            rep = app.state.replica
            first = asyncio.create_task(c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 200,
                                                                       "ignore_eos": True}))
            await asyncio.sleep(0.05)
            time.sleep(0.1)  # the process is late: several step deadlines pass while it is blocked
            # ... and the request is handled before the overdue step ends are (no await between)
            req = parse_request("completion", {"prompt": words_text(list(range(400, 700))), "max_tokens": 2,
                                               "ignore_eos": True}, rep.cfg.name)
            live = await rep.submit(req, "late")
            while not live.done:
                await live.wait()
            await first
            rec = (await c.get("/fleetwise/requests")).json()
            row = next(dict(zip(rec["columns"], r, strict=True)) for r in rec["rows"] if r[0] == "late")
            assert row["scheduled_s"] >= row["arrival_s"]
            assert rep.status.overrun_max_s > 0.0
    run(go())
