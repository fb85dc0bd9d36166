"""The OpenAI wire format as the gateway reads it: the fields a router needs, prefix hashes of a
prompt, and the bytes the gateway forwards.

Parsing and validation are the shared parser's (`fleetwise.core.openai_request`, which the
emulator uses too: vLLM's rules and error bodies); this module adds what only a router needs
(the prompt's text for prefix hashes, a token estimate when no tokenizer is configured) and
passes every other field to the backend untouched. Every client mistake is a `ClientError`
with a status, the field and a one-line message, rendered as
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fleetwise.core.openai_request import ApiError, ServerRules, error_body, parse_body
from fleetwise.core.openai_request import parse_request as parse_request_shared
from fleetwise.core.tokens import chat_text

__all__ = [
    "ANSWER_BASE_BYTES", "AnswerBounds", "ClientError", "KV_BLOCK_ID_BYTES", "LOGPROB_BYTES", "MAX_ERROR_BODY_BYTES", "ParsedRequest",
    "STEP_TOKENS", "TOKEN_BYTES", "answer_bounds", "error_body", "parse_json_body", "parse_request",
    "prompt_blocks", "with_stream_options", "with_stream_options_reference",
]

HASH_BYTES = 8
"""Digest size of one chained prefix-block hash (64-bit ids, as vLLM's block hashes)."""


TOKEN_BYTES = 512
"""Most bytes one generated token adds to an answer: a stream chunk's JSON (id, object, created, a
model name of up to 128 bytes, the choice with its finish reason and a usage block: about 350
bytes) and the token's text (at most 32 bytes of vocabulary entry, JSON-escaped as \\uXXXX: 6x)."""
LOGPROB_BYTES = 256
"""Most bytes one logprob alternative adds (its token escaped, its `bytes` list, the logprob)."""
STEP_TOKENS = 256
"""Most tokens one stream event carries for one request: vLLM streams one engine step's delta
(`--stream-interval` 1 by default; speculative decoding adds at most its proposal length)."""
ANSWER_BASE_BYTES = 64 << 10
"""An answer's bytes beside its tokens (headers of the document, usage, `kv_transfer_params`)."""
KV_BLOCK_ID_BYTES = 12
"""Bytes a prefill's answer may add per prompt token: its `kv_transfer_params` list the prompt's
KV blocks, at most one id per token (block size 1; vLLM's default is 16) of 10 digits, a comma and
a space."""
MAX_ERROR_BODY_BYTES = 64 << 10
"""Largest error body a backend may send: vLLM's and SGLang's are one JSON message of a few
hundred bytes; 64 KiB keeps a long validation message whole."""


@dataclass(frozen=True, slots=True)
class AnswerBounds:
    """The most bytes a legitimate answer to one request can take: one stream event, and a whole
    non-streamed body; a backend sending more is at fault."""

    event_bytes: int
    body_bytes: int


def answer_bounds(body: dict[str, Any], prompt_tokens: int, max_tokens: int) -> AnswerBounds:
    """The bounds of the answer to `body` (`max_tokens` generated; `prompt_tokens` echoed back when
    it asks for `echo` or `prompt_logprobs`), each token with the logprobs it asks for; a body may
    also name the prompt's KV blocks (a P/D prefill leg's answer)."""
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    alternatives = (lp + 1 if type(lp) is int else 0) + (1 + (top if type(top) is int else 0) if lp is True else 0)
    plp = body.get("prompt_logprobs")
    echoed = prompt_tokens if body.get("echo") is True or type(plp) is int else 0
    per_token = TOKEN_BYTES + (alternatives + (plp if type(plp) is int else 0)) * LOGPROB_BYTES
    return AnswerBounds(ANSWER_BASE_BYTES + (echoed + min(max_tokens, STEP_TOKENS)) * per_token,
                        ANSWER_BASE_BYTES + (echoed + max_tokens) * per_token + prompt_tokens * KV_BLOCK_ID_BYTES)


ClientError = ApiError
"""A request the client must fix (the shared `core.openai_request.ApiError`, under the name the
gateway's modules use)."""


def parse_json_body(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, or a `ClientError` (413 too large, 400 otherwise): the shared
    parser's `parse_body`."""
    return parse_body(raw, max_bytes)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the router reads of one completion request."""

    body: dict[str, Any]
    model: str
    stream: bool
    chat: bool
    prompt_tokens: int
    """Exact when the prompt is token ids, else estimated from characters (the gateway replaces
    it with the tokenizer's count when one is configured)."""
    max_tokens: int | None
    """As the client asked (None: not set)."""
    prompt_text: str
    """The text prefix hashes are cut from ("" for a token-id prompt)."""
    include_usage: bool
    prompt_ids: list[int] | None = None
    """The prompt's token ids when the client sent ids (hashed as ids, counted exactly)."""


@lru_cache(maxsize=64)
def _rules(known_models: frozenset[str], max_output_tokens: int) -> ServerRules:
    """The gateway's rules (a request may leave out `model` when one model is served)."""
    default = next(iter(known_models)) if len(known_models) == 1 else None
    return ServerRules(models=known_models, default_model=default, max_output_tokens=max_output_tokens)


def parse_request(body: dict[str, Any], chat: bool, known_models: frozenset[str], max_output_tokens: int,
                  chars_per_token: float) -> ParsedRequest:
    """Validate a completion request with the shared parser (`core.openai_request`: vLLM's rules);
    raise `ClientError` on the first mistake. Fields the gateway does not read go to the backend
    untouched."""
    req = parse_request_shared(body, "chat" if chat else "completion", _rules(known_models, max_output_tokens))
    if req.turns is not None:
        text = chat_text(req.turns, req.add_generation_prompt, req.continue_final_message)
    else:
        text = req.prompt_text or ""
    ids = req.prompt_ids
    tokens = len(ids) if ids is not None else max(1, math.ceil(len(text) / chars_per_token))
    return ParsedRequest(body=body, model=req.model, stream=req.stream, chat=chat, prompt_tokens=tokens,
                         max_tokens=req.max_tokens, prompt_text=text, include_usage=req.include_usage,
                         prompt_ids=ids)


def with_stream_options(raw: bytes, body: dict[str, Any], options: dict[str, Any]) -> bytes:
    """The request's bytes with `options` merged into its `stream_options`. When the client sent
    none, they are spliced in before the closing brace, so a long prompt is not encoded again
    (`raw` parsed to the object `body`, so its last non-blank byte is that brace); otherwise the
    body is encoded again (`with_stream_options_reference`, which gives an equal document)."""
    if "stream_options" in body:
        return with_stream_options_reference(body, options)
    end = raw.rstrip()
    sep = b"," if body else b""
    return b"%s%s\"stream_options\":%s}" % (end[:-1], sep, json.dumps(options, separators=(",", ":")).encode())


def with_stream_options_reference(body: dict[str, Any], options: dict[str, Any]) -> bytes:
    """`with_stream_options` by encoding the merged object again (the reference)."""
    return json.dumps({**body, "stream_options": {**(body.get("stream_options") or {}), **options}}).encode()


def prompt_blocks(text: str, block_chars: int) -> tuple[int, ...]:
    """Chained 64-bit hashes of the prompt's full `block_chars`-character blocks (equal hash at
    position i = equal text up to block i). Stable across processes, so several gateways agree."""
    data = text.encode("utf-8", "surrogatepass")
    out = []
    prev = b""
    for i in range(len(data) // block_chars):
        d = hashlib.blake2b(prev + data[i * block_chars:(i + 1) * block_chars], digest_size=HASH_BYTES).digest()
        out.append(int.from_bytes(d, "little") >> 1)
        prev = d
    return tuple(out)
