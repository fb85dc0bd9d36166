"""`PushStream` (chunks written by the step end that produced them) against the non-streaming
answer of the same request (the emulator's text is a function of the context): the same text,
finish reason and usage, token for token."""

from __future__ import annotations

import re
from typing import Any

import pytest
from emu_helpers import TOKEN, cfg, run, serve, sse_events

from fleetwise.emulator.streams import StreamDropped

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": "the quick brown fox " * 30, "max_tokens": 9, "ignore_eos": True, "stream": True}),
    ("/v1/completions", {"prompt": "usage please", "max_tokens": 5, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 6,
                              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "stops on its own", "max_tokens": 40, "stream": True}),
]


def fold(body: str) -> dict[str, Any]:
    """A stream's content, invariant to how tokens were grouped into chunks: the text, the role,
    the finish reason of the last content chunk, each chunk's running usage, the final usage, [DONE]."""
    events = sse_events(re.sub(r'"created":\d+', '"created":0', body))
    text, role, finish, running, final = "", None, None, [], None
    for e in events:
        if e == "[DONE]":
            continue
        if not e["choices"]:
            final = e["usage"]
            continue
        ch = e["choices"][0]
        delta = ch.get("delta")
        if delta is not None:
            role = delta.get("role", role)
            text += delta.get("content", "")
        else:
            text += ch["text"]
        finish = ch["finish_reason"] or finish
        if "usage" in e:
            running.append(e["usage"]["completion_tokens"])
    return {"text": text, "role": role, "finish": finish, "running_last": running[-1:], "final": final,
            "done": events[-1] == "[DONE]", "ids": {e["id"] for e in events if e != "[DONE]"}}


def streams(stream: bool) -> list[dict[str, Any]]:
    """Each request's answer, streamed (folded) or not (its text, finish reason and usage)."""
    async def go() -> list[dict[str, Any]]:
        out = []
        async with serve(cfg(time_scale=1.0)) as (_, c):
            for k, (path, body) in enumerate(REQUESTS):
                if not stream:
                    body = {key: v for key, v in body.items() if key not in ("stream", "stream_options")}
                r = await c.post(path, json=body, headers={"x-request-id": f"req-{k}"})
                assert r.status_code == 200 and r.headers["x-request-id"] == f"req-{k}"
                if stream:
                    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
                    assert "content-length" not in r.headers
                    out.append(fold(r.text))
                    continue
                doc = r.json()
                ch = doc["choices"][0]
                out.append({"text": ch["message"]["content"] if "message" in ch else ch["text"],
                            "finish": ch["finish_reason"], "tokens": doc["usage"]["completion_tokens"],
                            "ids": {doc["id"]}})
        return out
    return run(go())


def test_pushed_streams_carry_what_the_whole_answer_carries():
    pushed, whole = streams(True), streams(False)
    for p, w, (_, body) in zip(pushed, whole, REQUESTS, strict=True):
        assert (p["text"], p["finish"], p["ids"]) == (w["text"], w["finish"], w["ids"])
        if body.get("stream_options", {}).get("include_usage"):
            assert p["final"]["completion_tokens"] == w["tokens"]
    assert [p["ids"] for p in pushed] == [{("chatcmpl-" if "chat" in path else "cmpl-") + f"req-{k}"}
                                            for k, (path, _) in enumerate(REQUESTS)]
    assert len(pushed[0]["text"]) > 0 and pushed[0]["finish"] == "length"
    assert pushed[1]["final"]["completion_tokens"] == 5 and pushed[1]["running_last"] == [5]
    assert pushed[2]["role"] == "assistant" and pushed[2]["final"]["completion_tokens"] == 6


def test_a_dropped_stream_is_cut_after_its_tokens():
    async def go() -> None:
        async with serve(cfg(time_scale=20.0)) as (_, c):
            await c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 3}, headers={"Authorization": f"Bearer {TOKEN}"})
            with pytest.raises(StreamDropped):
                await c.post("/v1/completions", json={"prompt": "cut me", "max_tokens": 8, "stream": True})
    run(go())
