"""vLLM's disaggregation protocol between a prefill and a decode emulator, and KV events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from emu_helpers import asgi_post, cfg, metric, run, serve, sse_events

from fleetwise.core.tokens import block_hashes, encode, words_text
from fleetwise.emulator.generation import text_of
from fleetwise.emulator.kv_events import KvEventsConfig
from fleetwise.errors import SpecError
from fleetwise.perf.kv import kv_transfer_s
from fleetwise.spec.hardware import LinkSpec

PROMPT = words_text(list(range(300)))


def test_prefill_to_decode_hand_off():
    async def go():
        async with serve(cfg(role="prefill", port=9101)) as (papp, pc):
            async with serve(cfg(role="decode", port=9102),
                             kv_post=asgi_post({"http://127.0.0.1:9101": papp})) as (dapp, dc):
                r = await pc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                                           "kv_transfer_params": {"do_remote_decode": True}})
                assert r.status_code == 200, r.text
                ktp = r.json()["kv_transfer_params"]
                assert ktp["do_remote_prefill"] is True and ktp["remote_port"] == 9101
                assert ktp["remote_engine_id"] == papp.state.replica.cfg.engine_id
                assert len(ktp["remote_block_ids"]) == -(-300 // 16)
                assert r.json()["usage"]["completion_tokens"] == 1
                prep = papp.state.replica
                assert len(prep.leases.held) == 1 and prep.engine.pool.num_used > 0  # KV held under the lease
                d = await dc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 20,
                                                           "kv_transfer_params": ktp})
                assert d.status_code == 200, d.text
                body = d.json()
                assert body["choices"][0]["text"] == text_of(encode(PROMPT), 0, 20)
                assert body["usage"] == {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320,
                                         "prompt_tokens_details": None}
                assert len(prep.leases.held) == 0 and prep.engine.pool.num_used == 0  # released after the pull
                drep = dapp.state.replica
                assert drep.engine.stats.prompt_tokens_admitted == 300  # no prefill on the decode side
                text = (await dc.get("/metrics")).text
                want = kv_transfer_s(300, prep.deployment, drep.deployment,
                                     LinkSpec(bandwidth_bytes_per_s=drep.cfg.kv_link.bytes_per_s,
                                              latency_s=drep.cfg.kv_link.latency_s))
                assert metric(text, "fleetwise:kv_transfer_seconds_sum") == pytest.approx(want, rel=1e-12)
                # TTFT on the decode side includes the pull (vLLM's proxy flow)
                assert metric(text, "vllm:time_to_first_token_seconds_sum") > want
                # The lease is gone: pulling again fails cleanly.
                again = await dc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2,
                                                               "kv_transfer_params": ktp})
                assert again.status_code == 404 and "no KV lease" in again.json()["error"]["message"]
    run(go())


def test_unpulled_kv_is_freed_when_the_lease_expires():
    async def go():
        async with serve(cfg(role="prefill", kv_lease_s=60.0)) as (app, c):  # 0.6 s of wall time
            r = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                                      "kv_transfer_params": {"do_remote_decode": True}})
            assert r.status_code == 200
            rep = app.state.replica
            assert rep.engine.pool.num_used > 0
            await asyncio.sleep(1.2)  # 120 modelled seconds > the 60 s lease
            assert rep.engine.pool.num_used == 0 and not rep.leases.held
    run(go())


KV_EVENTS = KvEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*",
                           replay_endpoint="tcp://127.0.0.1:*", topic="kv")
"""vLLM's `--kv-events-config` on free 127.0.0.1 ports."""


async def _replay(ctx: zmq.asyncio.Context, endpoint: str, start: int) -> list[tuple[int, Any]]:
    """What the replay socket answers a request from `start`: (seq, decoded batch) each."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    await sock.send_multipart([b"", start.to_bytes(8, "big")])
    out: list[tuple[int, Any]] = []
    while True:
        assert await sock.poll(10_000), "the replay socket did not answer"
        empty, seq_b, payload = await sock.recv_multipart()
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            assert (empty, payload) == (b"", b"")
            sock.close(0)
            return out
        out.append((seq, msgpack.unpackb(payload)))


def test_kv_events_report_stored_and_evicted_blocks():
    async def go():
        ctx = zmq.asyncio.Context()
        # A small cache (about 7k tokens) so eviction happens.
        async with serve(cfg(gpu_memory_utilization=0.25, kv_events=KV_EVENTS)) as (app, c):
            rep = app.state.replica
            pub = rep.events
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"kv")
            sub.connect(pub.endpoint)
            assert await _replay(ctx, pub.replay_endpoint, 0) == []  # nothing cached, nothing sent
            ids = encode(PROMPT)
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            got = await _replay(ctx, pub.replay_endpoint, 0)
            assert [seq for seq, _ in got] == list(range(len(got))) and got
            stored = [e for _, (ts, events) in got for e in events if e[0] == "BlockStored"]
            hashes = [h for e in stored for h in e[1]]
            assert hashes == list(block_hashes(ids, 16))  # every full prompt block, in order
            assert stored[0][2] is None and stored[0][4:7] == [16, None, "GPU"]
            assert [t for e in stored for t in e[3]] == ids[:len(hashes) * 16]
            # Evict by filling the cache with other prompts; BlockRemoved names our blocks.
            cap = rep.engine.pool.capacity * 16
            other = words_text([7] * 3000)
            removed: set[int] = set()
            for i in range(cap // 3000 + 2):
                await c.post("/v1/completions", json={"prompt": f"{i} {other}", "max_tokens": 1})
                got = await _replay(ctx, pub.replay_endpoint, len(got) and got[-1][0] + 1)
                removed.update(h for _, (ts, events) in got for e in events if e[0] == "BlockRemoved" for h in e[1])
                if removed & set(hashes):
                    break
            assert removed & set(hashes)
            # The live socket carries the same batches under the same sequence numbers.
            buffered = dict(await _replay(ctx, pub.replay_endpoint, 0))
            topic, seq_b, payload = await asyncio.wait_for(sub.recv_multipart(), 10)
            assert topic == b"kv" and msgpack.unpackb(payload) == buffered[int.from_bytes(seq_b, "big")]
            assert sorted(buffered) == list(range(pub.seq + 1))
        ctx.destroy(0)
    run(go(), timeout_s=120)


def test_the_publisher_follows_vllms_switches():
    on = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*"}
    assert [KvEventsConfig.model_validate(doc).publishes for doc in (
        on, {**on, "publisher": "zmq"}, {**on, "publisher": "null"}, {"publisher": "zmq"}, {})] == \
        [True, True, False, False, False]


def test_kv_events_are_off_without_the_config():
    async def go():
        async with serve(cfg()) as (app, c):
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            pub = app.state.replica.events
            assert (pub.active, pub.endpoint, pub.seq) == (False, None, -1)
    run(go())


def test_a_taken_kv_events_port_is_one_clear_line():
    async def go():
        ctx = zmq.asyncio.Context()
        taken = ctx.socket(zmq.PUB)
        taken.bind("tcp://127.0.0.1:*")
        where = taken.getsockopt_string(zmq.LAST_ENDPOINT)
        with pytest.raises(SpecError, match="--kv-events-config: cannot bind endpoint tcp://127.0.0.1:"):
            async with serve(cfg(kv_events=KV_EVENTS.model_copy(update={"endpoint": where}))):
                pass
        ctx.destroy(0)
    run(go())


def _slow(post, delay_s: float, shared: bool | None):
    """A `KvPost` that answers `delay_s` wall seconds late (a slow message, not a slow transfer),
    saying the prefill's egress was shared with another decode replica when `shared` is True."""
    async def slow(url, body):
        status, data = await post(url, body)
        await asyncio.sleep(delay_s)
        if shared is not None and isinstance(data, dict):
            data["egress_shared"] = shared
        return status, data
    return slow


@pytest.mark.parametrize(("answer_delay_s", "hold_max_s", "shared", "holds", "late", "speculated"), [
    (0.02, 1.0, True, 2, 0, 0),    # a shared egress: the clock waits for each answer
    (0.1, 0.01, True, 2, 2, 0),    # ... at most hold_max_s, then runs on
    (0.02, 1.0, None, 1, 0, 1),    # an exclusive egress: after the first answer, no wait at all
])
def test_a_pull_reaches_the_decode_engine_at_its_modelled_landing_however_late_its_answer(
        monkeypatch, answer_delay_s, hold_max_s, shared, holds, late, speculated):
    from fleetwise.emulator import kv_pull as kv_pull_mod

    monkeypatch.setattr(kv_pull_mod, "KV_PULL_HOLD_MAX_S", hold_max_s)

    async def pd(pc, dc, rid, max_tokens, stream=False):
        r = await pc.post("/v1/completions", json={"prompt": PROMPT + " " + rid, "max_tokens": 1,
                                                   "kv_transfer_params": {"do_remote_decode": True}})
        return await dc.post("/v1/completions", json={"prompt": PROMPT + " " + rid, "max_tokens": max_tokens,
                                                      "ignore_eos": True, "stream": stream,
                                                      "kv_transfer_params": r.json()["kv_transfer_params"]},
                             headers={"x-request-id": rid})

    async def go():
        async with serve(cfg(role="prefill", port=9111)) as (papp, pc):
            post = _slow(asgi_post({"http://127.0.0.1:9111": papp}), answer_delay_s, shared)
            async with serve(cfg(role="decode", port=9112), kv_post=post) as (dapp, dc):
                drep = dapp.state.replica
                busy = asyncio.create_task(pd(pc, dc, "busy", 60000))  # decode steps run all along (about 8 wall s)
                for _ in range(5000):
                    if drep.engine.num_running:
                        break
                    await asyncio.sleep(0.002)
                d = await pd(pc, dc, "held", 3, stream=True)
                assert d.status_code == 200, d.text
                events = sse_events(d.text)
                assert "".join(e["choices"][0]["text"] for e in events[:-1]) == \
                    text_of(encode(PROMPT + " held"), 0, 3)
                assert drep.engine.num_running == 1  # the busy one was stepping meanwhile
                busy.cancel()
                rec = (await dc.get("/fleetwise/requests")).json()
                rows = {r[0]: dict(zip(rec["columns"], r, strict=True)) for r in rec["rows"]}
                status = (await dc.get("/fleetwise/status")).json()
                return rows["held"], status, papp.state.replica, drep

    row, status, prep, drep = run(go())
    want = kv_transfer_s(len(encode(PROMPT + " held")), prep.deployment, drep.deployment,
                         LinkSpec(bandwidth_bytes_per_s=drep.cfg.kv_link.bytes_per_s,
                                  latency_s=drep.cfg.kv_link.latency_s))
    took = row["kv_pull_end_s"] - row["kv_pull_start_s"]
    assert (status["pull_holds"], status["pull_late"], status["pull_speculated"]) == (holds, late, speculated)
    assert status["pull_early"] == 0
    if late:  # the clock ran on (decode steps) and the request reached the engine when the answer came
        assert took > 1.0 > 100 * want
    else:  # it reached the engine at the modelled landing, the answer's delay (2 modelled s) unseen
        assert took == pytest.approx(want, rel=1e-9)
    assert not drep.clock.held


def test_a_pull_in_the_engine_ahead_of_its_answer_streams_nothing_when_the_answer_is_a_refusal():
    calls: list[int] = []

    def refuse_second(post):
        async def wrapped(url, body):
            calls.append(1)
            status, data = await post(url, body)
            await asyncio.sleep(0.02)  # the pull lands on the decode port, and the engine runs it, meanwhile
            if len(calls) == 2:
                return 404, {"error": {"message": "no KV lease (refused for the test)"}}
            return status, data
        return wrapped

    async def go():
        async with serve(cfg(role="prefill", port=9121)) as (papp, pc):
            async with serve(cfg(role="decode", port=9122),
                             kv_post=refuse_second(asgi_post({"http://127.0.0.1:9121": papp}))) as (dapp, dc):
                out = []
                for rid in ("first", "second"):
                    r = await pc.post("/v1/completions", json={"prompt": PROMPT + " " + rid, "max_tokens": 1,
                                                               "kv_transfer_params": {"do_remote_decode": True}})
                    out.append(await dc.post("/v1/completions", json={
                        "prompt": PROMPT + " " + rid, "max_tokens": 400, "ignore_eos": True, "stream": True,
                        "kv_transfer_params": r.json()["kv_transfer_params"]}))
                drep = dapp.state.replica
                for _ in range(200):  # the refused one leaves the engine at the end of the step in flight
                    if not drep.engine.busy:
                        break
                    await asyncio.sleep(0.005)
                return out, (await dc.get("/fleetwise/status")).json(), drep

    (first, second), status, drep = run(go())
    assert status["pull_speculated"] == 1  # the second one ran in the engine before its answer
    assert sse_events(first.text)[-1] == "[DONE]"
    events = sse_events(second.text)
    assert events[0]["error"]["code"] == 404 and "no KV lease" in events[0]["error"]["message"]
    assert events[1:] == ["[DONE]"]  # not one token reached the client
    assert drep.engine.num_running == 0 and drep.engine.pool.num_used == 0


def test_a_prefill_answer_is_written_inside_the_step_end_before_the_next_step_is_scheduled():
    """A short request finishes its prefill in the first step beside a long one's first chunk;
    its answer reaches the socket while that step end runs: the driver is between steps, the
    long prompt's next chunk not yet scheduled."""
    async def ask(app: Any, prompt: str, seen: list[tuple[bool, int]]) -> list[dict[str, Any]]:
        body = json.dumps({"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 9131)}
        msgs: list[dict[str, Any]] = []
        replica = app.state.replica
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body.encode(), "more_body": False}
            await asyncio.get_running_loop().create_future()  # the client stays
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.body":
                seen.append((replica.driver.busy, replica.status.steps))
            msgs.append(msg)

        await app(scope, receive, send)
        return msgs

    async def main() -> None:
        async with serve(cfg(role="prefill", port=9131)) as (app, _):
            seen: list[tuple[bool, int]] = []
            long_prompt = " ".join(f"w{i}" for i in range(12000))
            short, long = await asyncio.gather(ask(app, "a short prompt " * 4, seen), ask(app, long_prompt, seen))
            assert short[0]["status"] == long[0]["status"] == 200
            assert json.loads(short[1]["body"])["kv_transfer_params"]["do_remote_prefill"] is True
            # The short one's answer: at the end of step 1, the driver idle (not yet scheduled the
            # long prompt's second chunk); the long one's: at the end of a later step.
            assert seen[0] == (False, 1)
            assert seen[1][1] > 1

    run(main())


def test_a_hand_off_between_pools_on_different_cards_and_layouts():
    """Prefill on one B200 and decode on two H200s, fp8 weights: each side takes the other's
    layout as the pull names it for the KV shards, not by fitting the other's weights on its own card
    (every request used to fail: a 70B at bf16 does not fit one H200)."""
    async def go():
        pre = cfg(role="prefill", port=9121, model="llama-3.1-70b", gpu="b200", weight_dtype="fp8")
        dec = cfg(role="decode", port=9122, model="llama-3.1-70b", gpu="h200-sxm", tp=2, weight_dtype="fp8")
        async with serve(pre) as (papp, pc):
            async with serve(dec, kv_post=asgi_post({"http://127.0.0.1:9121": papp})) as (dapp, dc):
                r = await pc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                                           "kv_transfer_params": {"do_remote_decode": True}})
                assert r.status_code == 200, r.text
                d = await dc.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8,
                                                           "kv_transfer_params": r.json()["kv_transfer_params"]})
                assert d.status_code == 200, d.text
                assert d.json()["usage"]["completion_tokens"] == 8
    run(go())
