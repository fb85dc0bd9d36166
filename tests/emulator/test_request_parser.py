"""The one request parser (`fleetwise.core.openai_request`), which the gateway and the emulator
share: vLLM's rules, a 400 naming the field for what a server cannot honour, and for any JSON
body either a valid request or an `ApiError` with an OpenAI-style body, never another exception
(the emulator served in-process here; the gateway's side is tests/gateway/test_fuzz.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from emu_helpers import cfg, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwise.core.openai_request import (
    ApiError,
    ServerRules,
    chat_turns,
    error_body,
    parse_body,
    parse_request,
    response_id,
)
from fleetwise.core.tokens import VOCAB_SIZE, chat_text
from fleetwise.emulator.app import create_app
from fleetwise.emulator.protocol import EMULATOR_UNSUPPORTED
from fleetwise.emulator.protocol import parse_request as emulator_parse

GATEWAY = ServerRules(models=frozenset({"m"}), default_model="m", max_output_tokens=4096)
EMULATOR = ServerRules(models=frozenset({"m"}), default_model="m", vocab_size=VOCAB_SIZE,
                       unsupported=EMULATOR_UNSUPPORTED, text_parts_only=True)
OK = {"model": "m", "prompt": "hello there", "max_tokens": 3}

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n",
          "best_of", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "logprobs",
          "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "ignore_eos", "add_generation_prompt", "continue_final_message", "kv_transfer_params", "user",
          "echo", "min_tokens", "suffix", "tools", "x-unknown"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=12))
anything = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", 3, ""]),
                                 "content": st.one_of(st.text(max_size=10), anything)})
bodies = st.dictionaries(st.sampled_from(FIELDS), anything, max_size=8) | st.builds(
    lambda base, msgs, extra: {**base, "messages": msgs, **extra}, st.just({"model": "m"}),
    st.lists(message, max_size=3), st.dictionaries(st.sampled_from(FIELDS[3:]), anything, max_size=4))
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(body=bodies, chat=st.booleans(), emulator=st.booleans())
def test_any_body_is_a_request_or_a_4xx_api_error(body: dict[str, Any], chat: bool, emulator: bool) -> None:
    try:
        req = parse_request(body, "chat" if chat else "completion", EMULATOR if emulator else GATEWAY)
    except ApiError as err:
        assert 400 <= err.status < 500 and err.message
        doc = json.loads(error_body(err.status, err.message, err.type, err.param, err.code))
        assert set(doc["error"]) == {"message", "type", "param", "code"}
        assert err.param is None or err.param.split(".")[0] in FIELDS or err.param == "messages"
        return
    assert req.model == "m" and (req.turns is not None) == chat
    assert req.max_tokens is None or 1 <= req.max_tokens <= 4096 or emulator


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -5), ("temperature", 2.5), ("temperature", "hot"), ("top_p", 7), ("top_p", 0),
    ("stop", 123), ("stop", ["a", 1]), ("logprobs", "abc"), ("logprobs", 21), ("n", True), ("n", 2),
    ("n", 0), ("max_tokens", 8.0), ("max_tokens", 0), ("max_tokens", True), ("seed", 1 << 64),
    ("top_k", -2), ("presence_penalty", 3), ("stream", "yes"), ("logit_bias", {"5": 500}),
    ("user", 5), ("best_of", 0), ("stop_token_ids", "x"), ("kv_transfer_params", [1]),
])
def test_the_issues_values_are_400s_naming_the_field_on_both_servers(field: str, value: Any) -> None:
    for rules in (GATEWAY, EMULATOR):
        with pytest.raises(ApiError) as e:
            parse_request({**OK, field: value}, "completion", rules)
        assert e.value.status == 400 and e.value.param == field, (field, value, e.value.message)
        assert field in e.value.message


def test_stream_options_are_typed_and_need_a_stream() -> None:
    for opts in ({"include_usage": "yes"}, {"continuous_usage_stats": 1}, [1]):
        with pytest.raises(ApiError) as e:
            parse_request({**OK, "stream": True, "stream_options": opts}, "completion", GATEWAY)
        assert e.value.param == "stream_options"
    with pytest.raises(ApiError, match="only allowed with stream=true"):
        parse_request({**OK, "stream_options": {"include_usage": True}}, "completion", GATEWAY)
    r = parse_request({**OK, "stream": True, "stream_options": {"include_usage": True,
                                                                 "continuous_usage_stats": False}}, "completion", GATEWAY)
    assert (r.stream, r.include_usage, r.continuous_usage) == (True, True, False)


def test_what_the_emulator_cannot_honour_is_a_400_there_and_passed_on_by_the_gateway() -> None:
    for field, value in (("stop", "\n"), ("logprobs", 2), ("echo", True), ("best_of", 2), ("min_tokens", 3),
                         ("tools", [{"type": "function"}]), ("suffix", "x")):
        with pytest.raises(ApiError) as e:
            parse_request({**OK, field: value}, "completion", EMULATOR)
        assert e.value.status == 400 and e.value.param == field and "does not support" in e.value.message
        assert parse_request({**OK, field: value}, "completion", GATEWAY).body[field] == value
    for field, value in (("stop", []), ("stop", None), ("echo", False), ("best_of", 1), ("min_tokens", 0),
                         ("temperature", 0.7), ("top_p", 1), ("seed", 3), ("x-unknown", {"a": 1})):
        parse_request({**OK, field: value}, "completion", EMULATOR)  # neutral values and sampling knobs pass


def test_prompts_one_per_request_token_ids_in_the_vocabulary() -> None:
    assert parse_request({**OK, "prompt": ["one"]}, "completion", GATEWAY).prompt_text == "one"
    assert parse_request({**OK, "prompt": [[5, 6]]}, "completion", GATEWAY).prompt_ids == [5, 6]
    for prompt in (["a", "b"], [[1], [2]], [-1], [1 << 32], "", [], [True], 5):
        with pytest.raises(ApiError) as e:
            parse_request({**OK, "prompt": prompt}, "completion", GATEWAY)
        assert e.value.status == 400 and e.value.param == "prompt"
    with pytest.raises(ApiError, match="outside the vocabulary"):
        parse_request({**OK, "prompt": [VOCAB_SIZE]}, "completion", EMULATOR)


def test_chat_messages_become_turns_once_for_both() -> None:
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "image_url", "image_url": {}},
                                         {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": None}]
    assert chat_turns(msgs) == (("system", "be brief"), ("user", "hi there"), ("assistant", ""))
    with pytest.raises(ApiError, match=r"messages\[1\].content\[1\].type"):
        chat_turns(msgs, text_only=True)
    body = {"model": "m", "messages": msgs[:2] + [{"role": "assistant", "content": "Sure"}],
            "add_generation_prompt": False, "continue_final_message": True}
    r = parse_request(body, "chat", GATEWAY)
    assert (r.add_generation_prompt, r.continue_final_message) == (False, True)
    with pytest.raises(ApiError, match="needs add_generation_prompt=false"):
        parse_request({**body, "add_generation_prompt": True}, "chat", GATEWAY)
    emu = emulator_parse("chat", {"messages": [{"role": "user", "content": "hi there"}]}, "m")
    from fleetwise.core.tokens import encode
    assert emu.prompt_ids == encode(chat_text([("user", "hi there")]))


def test_bodies_duplicate_keys_and_ids() -> None:
    assert parse_body(b'{"prompt": "x"}') == {"prompt": "x"}
    for raw, status in ((b'{"prompt": "x", "prompt": "y"}', 400), (b"", 400), (b"[1]", 400), (b"x" * 11, 413),
                        (b'{"a": NaN}', 400), (b"\xff", 400)):
        with pytest.raises(ApiError) as e:
            parse_body(raw, 10 if status == 413 else 1000)
        assert e.value.status == status
    assert response_id("completion", "r1") == "cmpl-r1" and response_id("chat", "r1") == "chatcmpl-r1"
    assert ApiError(404, "x").body() == {"error": {"message": "x", "type": "NotFoundError", "param": None,
                                                   "code": 404}}


class _Emulator:
    """One emulator app on an event loop of its own, for a hypothesis test to post to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = create_app(cfg(served_model_name="m", max_model_len=4096))
        self.ctx = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self.ctx.__aenter__())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://emulator")

    def post(self, path: str, raw: bytes) -> httpx.Response:
        return self.loop.run_until_complete(asyncio.wait_for(
            self.client.post(path, content=raw, headers={"content-type": "application/json"}), 30.0))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.ctx.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def emulator() -> Any:
    e = _Emulator()
    yield e
    e.close()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, chat=st.booleans())
def test_the_emulator_answers_any_json_body_with_a_result_or_an_openai_4xx(emulator: _Emulator,
                                                                           body: dict[str, Any], chat: bool) -> None:
    if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
        body["max_tokens"] = min(body["max_tokens"], 8)  # bound the test's run time, not its coverage
    body.pop("max_completion_tokens", None)
    r = emulator.post("/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode())
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code
        assert "Traceback" not in err["message"]
    elif "event-stream" in r.headers.get("content-type", ""):
        assert r.text.endswith("data: [DONE]\n\n")
    else:
        doc = r.json()
        assert doc["id"].startswith("chatcmpl-" if chat else "cmpl-") and doc["choices"]
        assert isinstance(doc["created"], int)


def test_created_is_stamped_per_response() -> None:
    async def go() -> None:
        app = create_app(cfg())
        async with app.router.lifespan_context(app):
            app.state.replica.created -= 1000  # the server started long ago
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as c:
                r = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
                assert r.json()["created"] >= app.state.replica.created + 999
    run(go())
