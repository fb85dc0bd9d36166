"""The vLLM surface in-process: completions and chat, streaming or not, usage, lengths, models,
health, metrics names, prefix-cache hits."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from emu_helpers import TEST_TIME_SCALE, cfg, metric, run, serve, sse_events

from fleetwise.core.tokens import digest, encode, words_text
from fleetwise.emulator.generation import OutputLengthModel, text_of
from fleetwise.emulator.running import RECORD_COLUMNS

PROMPT = "Tell me about the emulator."


def test_completion_text_usage_and_streaming_agree():
    async def go():
        async with serve() as (app, c):
            r = await c.post("/v1/completions", json={"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": 12})
            assert r.status_code == 200
            body = r.json()
            ids = encode(PROMPT)
            assert body["object"] == "text_completion"
            assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 12,
                                     "total_tokens": len(ids) + 12, "prompt_tokens_details": None}
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["choices"][0]["text"] == text_of(ids, 0, 12)
            s = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "stream": True,
                                                      "stream_options": {"include_usage": True}})
            assert s.headers["content-type"].startswith("text/event-stream")
            events = sse_events(s.text)
            assert events[-1] == "[DONE]"
            usage = events[-2]
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
            chunks = events[:-2]
            assert "".join(e["choices"][0]["text"] for e in chunks) == body["choices"][0]["text"]
            assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "length"
            assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
            # Without include_usage there is no usage chunk.
            s2 = sse_events((await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3,
                                                                   "stream": True})).text)
            assert all("usage" not in e for e in s2[:-1]) and s2[-1] == "[DONE]"
    run(go())


def test_chat_streaming_and_max_completion_tokens():
    async def go():
        async with serve() as (app, c):
            msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text",
                                                                                             "text": "hi"}]}]
            r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_completion_tokens": 5})
            body = r.json()
            assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 5
            msg = body["choices"][0]["message"]
            assert msg["role"] == "assistant" and len(encode(msg["content"])) == 5
            s = sse_events((await c.post("/v1/chat/completions", json={
                "messages": msgs, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}})).text)
            chunks = [e for e in s[:-1] if e["choices"]]
            assert chunks[0]["object"] == "chat.completion.chunk"
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert "".join(e["choices"][0]["delta"]["content"] for e in chunks) == msg["content"]
            assert s[-2]["usage"]["prompt_tokens"] == body["usage"]["prompt_tokens"]
    run(go())


def test_without_max_tokens_the_length_model_decides_and_finish_is_stop():
    async def go():
        async with serve(cfg(seed=3)) as (app, c):
            r = (await c.post("/v1/completions", json={"prompt": PROMPT})).json()
            want = OutputLengthModel(app.state.replica.cfg.output_lengths, 3).draw(digest(encode(PROMPT)))
            assert r["usage"]["completion_tokens"] == want
            assert r["choices"][0]["finish_reason"] == "stop"
    run(go())


def test_models_health_version_and_metric_names():
    async def go():
        async with serve() as (app, c):
            m = (await c.get("/v1/models")).json()
            assert m["data"][0]["id"] == "llama-3.1-8b" and m["data"][0]["max_model_len"] == 131072
            assert (await c.get("/health")).status_code == 200
            assert "version" in (await c.get("/version")).json()
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
            text = (await c.get("/metrics")).text
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                         "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                         "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
                         "vllm:generation_tokens_total", "vllm:request_success_total",
                         "fleetwise:step_deadline_overrun_seconds_bucket", "process_start_time_seconds"):
                assert name in text, name
            assert metric(text, "vllm:generation_tokens_total") == 4
            assert metric(text, "vllm:prompt_tokens_total") == len(encode(PROMPT))
            assert metric(text, "vllm:inter_token_latency_seconds_count") == 3
            assert metric(text, "fleetwise:time_scale") == TEST_TIME_SCALE
    run(go())


def test_prefix_cache_hits_rise_for_a_repeated_long_prompt():
    async def go():
        async with serve() as (app, c):
            prompt = words_text(list(range(2000)))  # 2000 tokens: 125 full blocks of 16
            hits = []
            for _ in range(3):
                r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
                assert r.status_code == 200
                hits.append(metric((await c.get("/metrics")).text, "vllm:prefix_cache_hits_total"))
            # First request: no hit; then every full block but the one holding the last prompt
            # token (it is recomputed, as vLLM does) is served from the cache.
            assert hits == [0, 1984, 2 * 1984]
            assert metric((await c.get("/metrics")).text, "vllm:prefix_cache_queries_total") == 3 * 2000
    run(go())


def test_modelled_time_is_the_engine_step_time():
    async def go():
        async with serve() as (app, c):
            rep = app.state.replica
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8})
            steps, busy = rep.status.steps, rep.status.busy_s
            assert steps == 8  # one prefill step (first token) + 7 decode passes, nothing fused
            text = (await c.get("/metrics")).text
            e2e = metric(text, "vllm:e2e_request_latency_seconds_sum")
            ttft = metric(text, "vllm:time_to_first_token_seconds_sum")
            # Alone on the replica, its latency is its steps plus the wait for the loop to wake.
            assert busy <= e2e <= busy + 0.05 * TEST_TIME_SCALE
            assert ttft < e2e
    run(go())


def test_request_records_carry_the_client_id_and_modelled_times():
    async def go():
        async with serve() as (app, c):
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}, headers={"x-request-id": "r-7"})
            rec = (await c.get("/fleetwise/requests")).json()
            row = dict(zip(rec["columns"], rec["rows"][0], strict=True))
            assert row["id"] == "r-7" and row["output_tokens"] == 5 and row["finish_reason"] == "length"
            assert row["prompt_tokens"] == len(encode(PROMPT))
            assert row["arrival_s"] < row["first_token_s"] < row["finish_s"]
            text = (await c.get("/metrics")).text
            assert metric(text, "vllm:e2e_request_latency_seconds_sum") == row["finish_s"] - row["arrival_s"]
            assert rec["time_scale"] == TEST_TIME_SCALE and rec["origin_unix_s"] > 0 and 0 < rec["origin_monotonic_s"] <= time.monotonic()
    run(go())


def test_the_arrival_is_stamped_on_entry_before_the_body_is_read():
    """The request reaches the replica when its ASGI call starts, before Starlette's routing and
    the body: a body that takes 0.05 s of wall time (5 modelled s at the tests' time scale) to
    arrive is the emulation's time, so the recorded arrival is before it and the steps run from
    there."""
    body_wall_s = 0.05

    async def main() -> None:
        async with serve() as (app, c):
            replica = app.state.replica
            sent: list[dict[str, Any]] = []
            first = True
            t_call: list[float] = []

            async def receive() -> dict[str, Any]:
                nonlocal first
                if first:
                    first = False
                    t_call.append(replica.now_s())
                    await asyncio.sleep(body_wall_s)
                    return {"type": "http.request", "more_body": False,
                            "body": json.dumps({"prompt": "hi there", "max_tokens": 2}).encode()}
                await asyncio.get_running_loop().create_future()  # the client stays
                return {"type": "http.disconnect"}

            async def send(msg: dict[str, Any]) -> None:
                sent.append(msg)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                     "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
                     "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
            before = replica.now_s()
            await app(scope, receive, send)
            assert sent[0]["status"] == 200
            row = dict(zip(RECORD_COLUMNS, replica.records[-1], strict=True))
            assert before <= row["arrival_s"] <= t_call[0] <= row["arrival_s"] + body_wall_s * TEST_TIME_SCALE
            # The body's wall time is not the modelled server's: steps run from the arrival.
            assert row["first_token_s"] - row["arrival_s"] < body_wall_s * TEST_TIME_SCALE

    run(main())


def test_the_handlers_run_alone_without_a_server_or_routing():
    import json as _json

    from fleetwise.emulator.app import ReplicaApi

    async def go():
        api = ReplicaApi(cfg(), None, lambda: None, None)
        messages = [{"type": "http.request", "body": b'{"prompt": "hi", "temperature": 9}', "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        r = await api.generate({"type": "http", "headers": []}, receive, "completion")
        assert r.status_code == 400 and _json.loads(r.body)["error"]["param"] == "temperature"
        r = await api.models(None)  # type: ignore[arg-type]
        assert _json.loads(r.body)["data"][0]["id"] == "llama-3.1-8b"
        assert set(api.hot()) == {"/v1/completions", "/v1/chat/completions", "/fleetwise/kv/pull"}
    run(go())
