"""The OpenAI/vLLM wire format: request parsing with 4xx errors, and response/stream bodies.

Owns what a client may send to `/v1/completions` and `/v1/chat/completions` (prompt or messages,
`max_tokens` / `max_completion_tokens`, `stream`, `stream_options.include_usage` and
`.continuous_usage_stats` (usage on every chunk, as vLLM), `ignore_eos`, `n`, `kv_transfer_params`,
and for chat vLLM's `add_generation_prompt` / `continue_final_message`, which continue a partial
assistant message) and the JSON the server returns (OpenAI-style error bodies, full
responses, SSE chunks). It does not run anything: `fleetwise.emulator.server` does.

Errors follow vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}` with
400 (`BadRequestError`) for bad input and 404 (`NotFoundError`) for an unknown model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from fleetwise.core.tokens import NUM_SPECIAL, NUM_WORDS, VOCAB_SIZE, chat_text, decode_token, encode
from fleetwise.errors import SpecError
from fleetwise.spec.inputs import MAX_BODY_BYTES, parse_json_fast, quote

Kind = Literal["completion", "chat"]

_ID_OF_WORD = {decode_token(i)[1:]: i for i in range(NUM_SPECIAL, NUM_SPECIAL + NUM_WORDS)}
"""Vocabulary word (without its leading space) -> token id."""


def tokenize(text: str) -> list[int]:
    """Token ids of a prompt, equal to `fleetwise.core.tokens.encode(text)` (the reference),
    with a fast path for text made only of vocabulary words each after one space (what load
    generators and continued streams send): one split and a dict lookup per word, about half
    the reference's CPU for a 1000-token prompt (87 vs 167 us). Any other text (another
    whitespace, two spaces, a word outside the vocabulary) takes the reference."""
    if text[:1] == " ":
        ids = list(map(_ID_OF_WORD.get, islice(text.split(" "), 1, None)))
        if None not in ids:
            return ids  # type: ignore[return-value]
    return encode(text)


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with an OpenAI-style error body."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             409: "ConflictError", 413: "BadRequestError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        """The JSON error body (vLLM's `ErrorResponse`)."""
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "APIError"),
                          "param": self.param, "code": self.status}}


@dataclass(slots=True)
class GenRequest:
    """One parsed generation request (either endpoint), with its prompt tokenized."""

    kind: Kind
    model: str
    prompt_ids: list[int]
    max_tokens: int | None
    """The client's limit (`max_tokens` or `max_completion_tokens`), or None."""
    stream: bool
    include_usage: bool
    ignore_eos: bool
    kv_transfer_params: dict[str, Any] | None
    continuous_usage: bool = False
    """`stream_options.continuous_usage_stats`: every chunk carries the usage so far."""


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body (the project's bounded parser), or ApiError(400/413)."""
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body is {len(raw)} bytes, over the {MAX_BODY_BYTES}-byte limit; "
                            "send a shorter prompt")
    try:
        body = parse_json_fast(raw, "request body")
    except SpecError as err:
        raise ApiError(400, f"{err}; send one JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{name}={quote(v)} must be true or false", name)
    return v


def _max_tokens(body: dict[str, Any]) -> int | None:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name}={quote(v)} must be an integer >= 1", name)
    if v < 1:
        raise ApiError(400, f"{name}={v} must be at least 1", name)
    return v


def _chat_prompt(messages: Any, add_generation_prompt: bool = True, continue_final: bool = False) -> str:
    """The prompt text of validated `messages` (`fleetwise.core.tokens.chat_text`: the template
    a router tokenizing chat prompts applies too)."""
    if continue_final and add_generation_prompt:
        raise ApiError(400, "continue_final_message=true needs add_generation_prompt=false", "continue_final_message")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, f"messages={quote(messages)} must be a non-empty list of {{role, content}}", "messages")
    turns: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}]={quote(m)} needs a string `role`", "messages")
        content = m.get("content", "")
        if isinstance(content, list):
            texts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content: only text parts are supported, got {quote(p)}",
                                   "messages")
                texts.append(p["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content={quote(content)} must be a string or text parts",
                           "messages")
        turns.append((m["role"], content))
    if continue_final and messages[-1].get("role") != "assistant":
        raise ApiError(400, "continue_final_message=true needs the last message to have role assistant",
                       "messages")
    return chat_text(turns, add_generation_prompt, continue_final)


def _completion_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = next((t for t in prompt if not 0 <= t < VOCAB_SIZE), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {quote(bad)} is outside the vocabulary [0, {VOCAB_SIZE})", "prompt")
        return list(prompt)
    raise ApiError(400, f"prompt={quote(prompt)} must be a string, a list of token ids, or a list with "
                        "one of those (one prompt per request)", "prompt")


def parse_request(kind: Kind, body: dict[str, Any], served_model: str) -> GenRequest:
    """Validate and tokenize a request body for `kind`; ApiError(400/404) for bad input."""
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if model != served_model:
        raise ApiError(404, f"The model `{quote(model)}` does not exist; this server serves `{served_model}`",
                       "model")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError(400, f"n={quote(n)}: only n=1 is supported", "n")
    if kind == "chat":
        ids = tokenize(_chat_prompt(body.get("messages"), _bool(body, "add_generation_prompt", True),
                                  _bool(body, "continue_final_message")))
    else:
        if "prompt" not in body:
            raise ApiError(400, "prompt is missing; send a string prompt", "prompt")
        ids = _completion_prompt(body["prompt"])
    if not ids:
        raise ApiError(400, "the prompt is empty; send at least one token", "prompt")
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = continuous = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise ApiError(400, f"stream_options={quote(opts)} must be an object", "stream_options")
        if not stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
        include_usage = _bool(opts, "include_usage")
        continuous = _bool(opts, "continuous_usage_stats")
    ktp = body.get("kv_transfer_params")
    if ktp is not None and not isinstance(ktp, dict):
        raise ApiError(400, f"kv_transfer_params={quote(ktp)} must be an object", "kv_transfer_params")
    return GenRequest(kind, served_model, ids, _max_tokens(body), stream, include_usage,
                      _bool(body, "ignore_eos"), ktp, continuous)


# ---- responses ------------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """OpenAI `usage` object."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None}


def full_response(req: GenRequest, rid: str, created: int, text: str, finish_reason: str,
                  completion_tokens: int, kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The non-streaming response body of either endpoint."""
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text,
                                                          "tool_calls": []},
                                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice],
            "usage": usage(len(req.prompt_ids), completion_tokens), "kv_transfer_params": kv_transfer_params}


class ChunkWriter:
    """SSE `data:` lines of one streamed response (completion or chat chunk objects)."""

    def __init__(self, req: GenRequest, rid: str, created: int) -> None:
        self.req, self.chat = req, req.kind == "chat"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        # Everything before the choices is the same in every chunk: encode it once.
        self._head = ('data: {"id":' + json.dumps(rid) + ',"object":"' + obj + '","created":' + str(created)
                      + ',"model":' + json.dumps(req.model) + ',"choices":[')
        self._role_sent = False

    def delta(self, text: str, finish_reason: str | None = None, tokens_so_far: int | None = None) -> bytes:
        """One chunk carrying `text` (and the finish reason on the last one); with
        `continuous_usage_stats`, the usage after `tokens_so_far` generated tokens."""
        fr = json.dumps(finish_reason)
        if self.chat:
            if not self._role_sent:
                self._role_sent = True
                d = '{"role":"assistant","content":' + json.dumps(text) + "}"
            else:
                d = '{"content":' + json.dumps(text) + "}"
            choice = '{"index":0,"delta":' + d + ',"logprobs":null,"finish_reason":' + fr + "}"
        else:
            choice = '{"index":0,"text":' + json.dumps(text) + ',"logprobs":null,"finish_reason":' + fr + "}"
        if self.req.continuous_usage and tokens_so_far is not None:
            u = json.dumps(usage(len(self.req.prompt_ids), tokens_so_far))
            return (self._head + choice + '],"usage":' + u + "}\n\n").encode()
        return (self._head + choice + "]}\n\n").encode()

    def usage_chunk(self, completion_tokens: int) -> bytes:
        """The final chunk with empty choices and `usage` (stream_options.include_usage)."""
        u = json.dumps(usage(len(self.req.prompt_ids), completion_tokens))
        return (self._head + '],"usage":' + u + "}\n\n").encode()

    @staticmethod
    def error(err: ApiError) -> bytes:
        return ("data: " + json.dumps(err.body()) + "\n\n").encode()

    DONE = b"data: [DONE]\n\n"
