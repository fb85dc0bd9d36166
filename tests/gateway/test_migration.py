"""The continuation of a broken stream and what the client sees of per-chunk usage."""

from __future__ import annotations

import json

from fleetwise.core.tokens import encode
from fleetwise.emulator.protocol import parse_request
from fleetwise.gateway.migration import continuation, counted_options, relay_events, streamed_text

CHUNK = b'data: {"id":"c","choices":[{"index":0,"text":" ba be","finish_reason":null}],' \
        b'"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"prompt_tokens_details":null}}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3}}\n\n'


def test_counted_options_keep_the_clients_stream_options() -> None:
    body = counted_options({"stream": True, "stream_options": {"include_usage": False}})
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_chunk_usage_is_removed_unless_asked_and_shifted_after_a_migration() -> None:
    stripped = relay_events(CHUNK + USAGE, keep_usage=False, base_tokens=0)
    docs = [json.loads(e[6:]) for e in stripped.split(b"\n\n") if e]
    assert "usage" not in docs[0] and docs[0]["choices"][0]["text"] == " ba be" and docs[1]["usage"]["completion_tokens"] == 3
    shifted = [json.loads(e[6:]) for e in relay_events(CHUNK + USAGE, True, 4).split(b"\n\n") if e]
    assert [(d["usage"]["prompt_tokens"], d["usage"]["completion_tokens"]) for d in shifted] == [(5, 6), (5, 7)]
    assert streamed_text([CHUNK, USAGE], chat=False) == " ba be"


def test_continuations_extend_the_prompt_or_the_assistant_message() -> None:
    c = continuation({"prompt": ["hello there"], "max_completion_tokens": 10}, False, " ba be", 8)
    assert c == {"prompt": "hello there ba be", "max_tokens": 8}
    assert continuation({"prompt": [1, 2, 3], "max_tokens": 10}, False, " ba", 9) is None  # token ids: no text
    msgs = [{"role": "user", "content": "hi"}]
    chat = continuation({"messages": msgs, "max_tokens": 10}, True, " ba be", 8)
    assert chat is not None and chat["messages"][-1] == {"role": "assistant", "content": " ba be"}
    # The emulator renders it as the original prompt + the streamed text: the same context.
    cont = parse_request("chat", chat, "m").prompt_ids
    first = parse_request("chat", {"messages": msgs}, "m").prompt_ids
    assert cont == first + encode(" ba be")
