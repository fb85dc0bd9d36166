"""The OpenAI completion/chat request as fleetwise's live servers read it: one parser for the
gateway and the emulator, with vLLM's rules and error bodies.

Owns: the request body's JSON (bounded, UTF-8, no duplicate keys: `spec.inputs.parse_json`),
the validation of every field vLLM's OpenAI server types (`model`, `prompt` / `messages`,
`max_tokens` / `max_completion_tokens`, `stream`, `stream_options`, `n`, `best_of`,
`temperature` in [0, 2], `top_p` in (0, 1], `top_k`, `min_p`, the penalties, `seed`, `stop`,
`logprobs`, `top_logprobs`, `logit_bias`, `ignore_eos`, vLLM's chat flags
`add_generation_prompt` / `continue_final_message`, `kv_transfer_params`), the one function that
turns chat messages into `(role, text)` turns (`chat_turns`; `core.tokens.chat_text` is the
template over them), the error type `ApiError` and its OpenAI-style body
`{"error": {"message", "type", "param", "code"}}` (vLLM's `ErrorResponse`: the type is vLLM's
exception name for the status, the code the status), and the response id prefixes.

Rules (vLLM's, `vllm/entrypoints/openai/protocol.py` and `SamplingParams`): fields it does not
know are accepted and passed on (vLLM's models allow extra fields); a known field of the wrong
type or out of range is a 400 naming it; a field the server cannot honour (`ServerRules.
unsupported`, `n` above one) is a 400 naming it, never dropped or rewritten. Both servers return
one choice per request (`MAX_CHOICES`): the gateway meters and migrates one stream, the emulator
runs one sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from fleetwise.errors import SpecError, quote
from fleetwise.spec.inputs import parse_json
from fleetwise.spec.limits import MAX_BODY_BYTES

__all__ = [
    "COMPLETION_ID_PREFIX", "CHAT_ID_PREFIX", "MAX_CHOICES", "MAX_LOGPROBS", "MAX_TOKEN_ID", "ApiError",
    "Kind", "OpenAIRequest", "ServerRules", "chat_turns", "error_body", "parse_body", "parse_request",
    "response_id",
]

Kind = Literal["completion", "chat"]

COMPLETION_ID_PREFIX = "cmpl-"
"""vLLM's id prefix of a completion response (`cmpl-{request id}`)."""
CHAT_ID_PREFIX = "chatcmpl-"
"""vLLM's id prefix of a chat completion response (`chatcmpl-{request id}`)."""
MAX_CHOICES = 1
"""Choices per request either server returns (`n`, a batch of prompts)."""
MAX_LOGPROBS = 20
"""Largest `logprobs` / `top_logprobs` (vLLM's default `max_logprobs`)."""
MAX_TOKEN_ID = 1 << 32
"""Token ids are below this (the block hasher packs them as unsigned 32-bit), unless a
server's vocabulary says less (`ServerRules.vocab_size`)."""
INT64 = (-(1 << 63), (1 << 63) - 1)
"""Range of `seed` (vLLM stores it as a 64-bit integer)."""
INT32_MAX = (1 << 31) - 1
"""Upper bound of counts with no natural limit (`top_k`, `best_of`, `max_tokens` unbounded)."""

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 409: "ConflictError", 413: "BadRequestError", 422: "UnprocessableEntityError",
               429: "RateLimitError", 500: "InternalServerError", 502: "BadGatewayError",
               503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
"""OpenAI error `type` by HTTP status: the names of vLLM's (and the OpenAI client's) exceptions."""


class ApiError(Exception):
    """A request refused with HTTP `status` and an OpenAI-style error body; `param` names the
    field, `type_` defaults to vLLM's name for the status, `code` to the status."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None,
                 code: str | int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = type_ or ERROR_TYPES.get(status, "APIError")
        self.code = code if code is not None else status
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        """The JSON error document (vLLM's `ErrorResponse`)."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(status: int, message: str, type_: str | None = None, param: str | None = None,
               code: str | int | None = None) -> bytes:
    """An OpenAI-style error document, encoded."""
    return json.dumps(ApiError(status, message, param, type_, code).body(), allow_nan=False).encode()


def response_id(kind: Kind, request_id: str) -> str:
    """The response's `id`: vLLM's prefix for the endpoint, then the request id."""
    return (CHAT_ID_PREFIX if kind == "chat" else COMPLETION_ID_PREFIX) + request_id


# ---- the body ------------------------------------------------------------------------------------

def parse_body(raw: bytes, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The JSON object of a request body, or ApiError (413 over `max_bytes`, 400 otherwise)."""
    if len(raw) > max_bytes:
        raise ApiError(413, f"request body is {len(raw)} bytes, over the {max_bytes}-byte limit; send a shorter "
                            "prompt")
    if not raw.strip():
        raise ApiError(400, "request body is empty; send one JSON object")
    try:
        body = parse_json(raw, "request body", max_bytes)
    except SpecError as err:
        raise ApiError(400, f"{err}; send one JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


@dataclass(frozen=True, slots=True)
class ServerRules:
    """What one server accepts beyond the shared validation."""

    models: frozenset[str] = frozenset()
    """Model names served (empty: any name, the backends decide)."""
    default_model: str | None = None
    """The model a request without `model` gets (vLLM: the first served name); None: required."""
    max_output_tokens: int = INT32_MAX
    """Largest `max_tokens` / `max_completion_tokens`."""
    vocab_size: int = MAX_TOKEN_ID
    """Token ids of a prompt must be below this."""
    unsupported: frozenset[str] = frozenset()
    """Fields this server cannot honour: asking for one (any value but its neutral one) is a 400."""
    text_parts_only: bool = False
    """Chat content parts other than text (images, audio) are a 400 (the server reads text only)."""


@dataclass(slots=True)
class OpenAIRequest:
    """One validated completion or chat request."""

    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    """`stream_options.include_usage`: a last chunk with the usage."""
    continuous_usage: bool
    """`stream_options.continuous_usage_stats`: every chunk carries the usage so far (vLLM)."""
    max_tokens: int | None
    """The client's limit (`max_completion_tokens`, else `max_tokens`), or None."""
    prompt_text: str | None
    """A completion's text prompt (None for token ids or chat)."""
    prompt_ids: list[int] | None
    """A completion's token-id prompt."""
    turns: tuple[tuple[str, str], ...] | None
    """A chat request's `(role, text)` turns (`chat_turns`)."""
    add_generation_prompt: bool
    continue_final_message: bool
    ignore_eos: bool
    kv_transfer_params: dict[str, Any] | None


# ---- typed fields ----------------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{name}={quote(v)} must be true or false", name)
    return v


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise ApiError(400, f"{name}={quote(v)} must be an integer in [{lo}, {hi}]", name)
    if not lo <= v <= hi:
        raise ApiError(400, f"{name}={v} is out of range; use an integer in [{lo}, {hi}]", name)
    return int(v)


NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, True), "top_p": (0.0, 1.0, False), "min_p": (0.0, 1.0, True),
    "presence_penalty": (-2.0, 2.0, True), "frequency_penalty": (-2.0, 2.0, True),
    "repetition_penalty": (0.0, 2.0, False), "length_penalty": (-2.0, 2.0, True)}
"""Sampling numbers: (low, high, low included); the high end is included. OpenAI's ranges for
temperature and the penalties, vLLM's for top_p (0 excluded), min_p and repetition_penalty
(above 0; 2 is vLLM's documented practical ceiling)."""
INT_RANGES: dict[str, tuple[int, int]] = {
    "n": (1, INT32_MAX), "best_of": (1, INT32_MAX), "seed": INT64, "top_k": (-1, INT32_MAX),
    "min_tokens": (0, INT32_MAX), "top_logprobs": (0, MAX_LOGPROBS), "prompt_logprobs": (-1, MAX_LOGPROBS)}
"""Sampling integers: [low, high] (vLLM's `SamplingParams` checks; -1 disables top_k / asks every
prompt logprob)."""
BOOL_FIELDS = frozenset({"stream", "echo", "ignore_eos", "add_generation_prompt", "continue_final_message",
                         "skip_special_tokens", "include_stop_str_in_output", "use_beam_search"})
"""Fields that are true or false (or null)."""


def _number(body: dict[str, Any], name: str, lo: float, hi: float, lo_in: bool) -> None:
    v = body.get(name)
    if v is None:
        return
    low = "[" if lo_in else "("
    if not _is_number(v):
        raise ApiError(400, f"{name}={quote(v)} must be a number in {low}{lo:g}, {hi:g}]", name)
    if v > hi or v < lo or (v == lo and not lo_in):
        raise ApiError(400, f"{name}={v!r} is out of range; use a number in {low}{lo:g}, {hi:g}]", name)


def _string_list(body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is None or isinstance(v, str):
        return
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ApiError(400, f"{name}={quote(v)} must be a string or a list of strings", name)


def _logprobs(body: dict[str, Any], kind: Kind) -> None:
    if kind == "completion":
        _int(body, "logprobs", 0, MAX_LOGPROBS)
        return
    wants = _bool(body, "logprobs")
    if body.get("top_logprobs") is not None and not wants:
        raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")


def _logit_bias(body: dict[str, Any]) -> None:
    v = body.get("logit_bias")
    if v is None:
        return
    if not isinstance(v, dict) or not all(_is_number(b) and -100 <= b <= 100 for b in v.values()):
        raise ApiError(400, f"logit_bias={quote(v)} must map token ids to numbers in [-100, 100]", "logit_bias")


def _asked(name: str, v: Any) -> bool:
    """Whether `v` asks for what field `name` offers (not its neutral value)."""
    if v is None or v is False or (isinstance(v, (str, list, dict)) and not v):
        return False
    return not ((name == "best_of" and v == 1) or (name == "min_tokens" and v == 0))


def _check_sampling(body: dict[str, Any], kind: Kind, rules: ServerRules) -> None:
    present = body.keys()
    for name in present & NUMBER_RANGES.keys():  # only the fields sent: most requests send few
        lo, hi, lo_in = NUMBER_RANGES[name]
        _number(body, name, lo, hi, lo_in)
    for name in present & INT_RANGES.keys():
        ilo, ihi = INT_RANGES[name]
        _int(body, name, ilo, ihi)
    for name in present & BOOL_FIELDS:
        _bool(body, name)
    if present & OTHER_FIELDS:
        _check_others(body, kind)
    for name in present & rules.unsupported:
        if _asked(name, body[name]):
            raise ApiError(400, f"{name}={quote(body[name])}: this server does not support {name}; "
                                "remove the field", name)


OTHER_FIELDS = frozenset({"stop", "stop_token_ids", "user", "logprobs", "top_logprobs", "logit_bias", "n", "best_of"})
"""Fields `_check_others` reads."""


def _check_others(body: dict[str, Any], kind: Kind) -> None:
    _string_list(body, "stop")
    ids = body.get("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(_is_int(t) for t in ids)):
        raise ApiError(400, f"stop_token_ids={quote(ids)} must be a list of token ids", "stop_token_ids")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, f"user={quote(user)} must be a string", "user")
    _logprobs(body, kind)
    _logit_bias(body)
    n = body.get("n")
    if n is not None and n > MAX_CHOICES:
        raise ApiError(400, f"n={n}: this server returns {MAX_CHOICES} choice per request; send n=1 or omit it", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of < (n or 1):
        raise ApiError(400, f"best_of={best_of} must be at least n={n}", "best_of")


def _stream(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats)."""
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False, False
    if not isinstance(opts, dict):
        raise ApiError(400, f"stream_options={quote(opts)} must be an object", "stream_options")
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options")
    try:
        return stream, _bool(opts, "include_usage"), _bool(opts, "continuous_usage_stats")
    except ApiError as err:
        raise ApiError(400, f"stream_options.{err.message}", "stream_options") from None


def _max_tokens(body: dict[str, Any], hi: int) -> int | None:
    mct = _int(body, "max_completion_tokens", 1, hi)
    mt = _int(body, "max_tokens", 1, hi)
    return mct if mct is not None else mt


def _model(body: dict[str, Any], rules: ServerRules) -> str:
    model = body.get("model")
    if model is None:
        if rules.default_model is None:
            raise ApiError(400, "model is missing; send the name of a served model", "model")
        return rules.default_model
    if not isinstance(model, str) or not model:
        raise ApiError(400, f"model={quote(model)} must be the name of a served model", "model")
    if rules.models and model not in rules.models:
        raise ApiError(404, f"The model `{quote(model)}` does not exist; served: {', '.join(sorted(rules.models))}",
                       "model")
    return model


# ---- prompts ---------------------------------------------------------------------------------------

def _token_ids(prompt: list[Any], vocab_size: int) -> list[int] | None:
    """The list as token ids, None when it is not a list of integers; ApiError when one is
    outside the vocabulary."""
    for t in prompt:
        if not _is_int(t):
            return None
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {quote(bad)} is outside the vocabulary [0, {vocab_size})", "prompt")
    return prompt


def completion_prompt(prompt: Any, vocab_size: int) -> tuple[str | None, list[int] | None]:
    """(text, token ids) of a completion's `prompt`: a string, token ids, or a list of one of those."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt is empty; send at least one token", "prompt")
        return prompt, None
    if isinstance(prompt, list) and prompt:
        ids = _token_ids(prompt, vocab_size)
        if ids is not None:
            return None, ids
        if all(isinstance(p, (str, list)) for p in prompt):
            raise ApiError(400, f"prompt: a batch of {len(prompt)} prompts; send one prompt per request", "prompt")
    raise ApiError(400, f"prompt={quote(prompt)} must be a non-empty string, a list of token ids, or a list with "
                        "one of those", "prompt")


def _content_text(i: int, content: Any, text_only: bool) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{i}].content={quote(content)} must be a string or a list of parts", "messages")
    texts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if not isinstance(kind, str):
            raise ApiError(400, f"messages[{i}].content[{j}]={quote(p)} must be an object with a string `type`",
                           "messages")
        if kind == "text":
            if not isinstance(p.get("text"), str):
                raise ApiError(400, f"messages[{i}].content[{j}].text must be a string", "messages")
            texts.append(p["text"])
        elif text_only:
            raise ApiError(400, f"messages[{i}].content[{j}].type={quote(kind)}: this server reads text parts "
                                "only; send type \"text\"", "messages")
    return "".join(texts)


def chat_turns(messages: Any, text_only: bool = False) -> tuple[tuple[str, str], ...]:
    """`(role, text)` of each chat message (text parts joined; other parts skipped, or a 400 when
    `text_only`); ApiError(400) naming the message at fault."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, f"messages={quote(messages)} must be a non-empty list of {{role, content}}", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise ApiError(400, f"messages[{i}]={quote(m)} needs a non-empty string `role`", "messages")
        turns.append((m["role"], _content_text(i, m.get("content"), text_only)))
    return tuple(turns)


def _chat_flags(body: dict[str, Any], turns: tuple[tuple[str, str], ...]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message), as vLLM checks them."""
    cont = _bool(body, "continue_final_message")
    add = _bool(body, "add_generation_prompt", not cont)
    if cont and add:
        raise ApiError(400, "continue_final_message=true needs add_generation_prompt=false", "continue_final_message")
    if cont and turns[-1][0] != "assistant":
        raise ApiError(400, "continue_final_message=true needs the last message to have role assistant", "messages")
    return add, cont


def parse_request(body: dict[str, Any], kind: Kind, rules: ServerRules) -> OpenAIRequest:
    """Validate a completion or chat body for a server with `rules`; ApiError (400/404) on the
    first mistake, naming the field."""
    model = _model(body, rules)
    _check_sampling(body, kind, rules)
    stream, include_usage, continuous = _stream(body)
    max_tokens = _max_tokens(body, rules.max_output_tokens)
    text: str | None = None
    ids: list[int] | None = None
    turns: tuple[tuple[str, str], ...] | None = None
    add = cont = False
    if kind == "chat":
        turns = chat_turns(body.get("messages"), rules.text_parts_only)
        add, cont = _chat_flags(body, turns)
    elif "prompt" not in body:
        raise ApiError(400, "prompt is missing; send the text to complete", "prompt")
    else:
        text, ids = completion_prompt(body["prompt"], rules.vocab_size)
    ktp = body.get("kv_transfer_params")
    if ktp is not None and not isinstance(ktp, dict):
        raise ApiError(400, f"kv_transfer_params={quote(ktp)} must be an object", "kv_transfer_params")
    return OpenAIRequest(kind, body, model, stream, include_usage, continuous, max_tokens, text, ids, turns,
                         add, cont, _bool(body, "ignore_eos"), ktp)

