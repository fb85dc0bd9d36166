"""Hostile requests against a running gateway: every answer is a 4xx with an OpenAI-style error
body (or a complete 200 for a request that happens to be valid); never a 5xx, a hang or a
dropped connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from gw_harness import Fleet, running_fleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REQUEST_TIMEOUT_S = 10.0
"""A hostile request answered later than this counts as a hang."""


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[asyncio.AbstractEventLoop, Fleet]]:
    loop = asyncio.new_event_loop()
    ctx = running_fleet(1, limits={"max_body_bytes": 64 * 1024, "max_output_tokens": 4096})
    f = loop.run_until_complete(ctx.__aenter__())
    try:
        yield loop, f
    finally:
        loop.run_until_complete(ctx.__aexit__(None, None, None))
        loop.close()


def check(fleet: tuple[asyncio.AbstractEventLoop, Fleet], path: str, data: bytes, must_fail: bool) -> None:
    loop, f = fleet

    async def go() -> tuple[int, bytes, str]:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with f.client.post(f.url + path, data=data, headers={"content-type": "application/json"},
                                 timeout=timeout) as r:
            return r.status, await r.read(), r.headers.get("content-type", "")

    status, raw, ctype = loop.run_until_complete(go())
    assert status < 500, (status, data[:80], raw[:200])
    if status >= 400 or must_fail:
        assert 400 <= status < 500, (status, data[:80])
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"] and "type" in err and "code" in err
    elif "event-stream" in ctype:
        assert raw.endswith(b"data: [DONE]\n\n")
    else:
        assert json.loads(raw)["choices"]


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**40), 10**40),
                    st.floats(allow_nan=False), st.text(max_size=20))
anything = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=12)
bad_max_tokens = st.one_of(st.integers(max_value=0), st.integers(min_value=4097, max_value=10**40),
                           st.floats(allow_nan=False).filter(lambda x: not float(x).is_integer()),
                           st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(body=st.dictionaries(st.sampled_from(["model", "prompt", "messages", "max_tokens", "stream", "n",
                                             "stream_options", "temperature", "top_p", "stop", "logprobs",
                                             "top_logprobs", "seed", "best_of", "logit_bias", "user",
                                             "continue_final_message", "add_generation_prompt"]),
                            anything, max_size=6),
       chat=st.booleans())
def test_random_fields_never_5xx(fleet: Any, body: dict[str, Any], chat: bool) -> None:
    check(fleet, "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode(), False)


@SETTINGS
@given(mt=bad_max_tokens, stream=st.booleans())
def test_bad_max_tokens_is_400(fleet: Any, mt: Any, stream: bool) -> None:
    check(fleet, "/v1/completions", json.dumps({"model": "m", "prompt": "x", "max_tokens": mt,
                                                "stream": stream}).encode(), True)


@pytest.mark.parametrize(("field", "value"), [("temperature", -5), ("top_p", 7), ("stop", 123),
                                             ("logprobs", "abc"), ("n", True), ("max_tokens", 8.0)])
def test_the_issues_bad_fields_are_400s_naming_them(fleet: Any, field: str, value: Any) -> None:
    loop, f = fleet
    status, doc, _ = loop.run_until_complete(f.post("/v1/completions", {"model": "m", "prompt": "x", field: value}))
    assert status == 400 and doc["error"]["param"] == field and field in doc["error"]["message"]
    status, doc, _ = loop.run_until_complete(f.post("/v1/completions", {
        "model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}))
    assert status == 400 and doc["error"]["param"] == "stream_options"


@SETTINGS
@given(model=st.text(max_size=30).filter(lambda m: m != "m"))
def test_unknown_model_is_4xx(fleet: Any, model: str) -> None:
    check(fleet, "/v1/completions", json.dumps({"model": model, "prompt": "x"}).encode(), True)


@SETTINGS
@given(raw=st.one_of(
    st.binary(max_size=200),
    st.integers(min_value=65, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=65, max_value=50_000).map(lambda n: b'{"model":"m","prompt":' + b"[" * n + b"1" + b"]" * n
                                                     + b"}"),
    st.binary(min_size=1, max_size=8).map(lambda b: b'{"model":"m","prompt":"' + b"\xff" + b + b'"}'),
    st.integers(min_value=64 * 1024 + 1, max_value=200_000).map(lambda n: b'{"prompt":"' + b"a" * n + b'"}'),
))
def test_hostile_bytes_are_4xx(fleet: Any, raw: bytes) -> None:
    must_fail = True
    try:
        doc = json.loads(raw)
        must_fail = not isinstance(doc, dict) or doc.get("model") != "m"
    except (ValueError, RecursionError):
        pass
    check(fleet, "/v1/completions", raw, must_fail)
