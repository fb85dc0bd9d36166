"""The OpenAI wire format as the gateway reads it: bounded body parsing, the fields a router
needs, and OpenAI-style error bodies.

A request body is parsed once (size and nesting bounded, UTF-8 strict), its routing fields are
checked (`model`, `prompt`/`messages`, `max_tokens`, `stream`), and everything else is passed to
the backend untouched. Every client mistake becomes a `ClientError` with a status, the field and
a one-line message, rendered as `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from fleetwise.spec.inputs import MAX_NESTING_DEPTH, json_depth

__all__ = [
    "MAX_NESTING_DEPTH", "ClientError", "ParsedRequest", "error_body", "parse_request", "prompt_blocks",
    "with_stream_options", "with_stream_options_reference",
]

HASH_BYTES = 8
"""Digest size of one chained prefix-block hash (64-bit ids, as vLLM's block hashes)."""


class ClientError(Exception):
    """A request the client must fix: HTTP `status`, OpenAI error `type`, offending `param`."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.retry_after_s = retry_after_s


def error_body(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> bytes:
    """An OpenAI-style error document."""
    return json.dumps({"error": {"message": message, "type": type_, "param": param,
                                 "code": code if code is not None else status}}).encode()


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, or a `ClientError` (413 too large, 400 otherwise). The limits
    are the project's (`spec.inputs`); admin bodies go through `spec.inputs.parse_json` itself."""
    if len(raw) > max_bytes:
        raise ClientError(413, f"request body is {len(raw)} bytes; the limit is {max_bytes}", code="body_too_large")
    if not raw.strip():
        raise ClientError(400, "request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
        # at most MAX_NESTING_DEPTH brackets in all (every real request) cannot nest deeper
        if raw.count(b"[") + raw.count(b"{") > MAX_NESTING_DEPTH and \
                json_depth(text, MAX_NESTING_DEPTH) > MAX_NESTING_DEPTH:
            raise ClientError(400, f"request body nests deeper than {MAX_NESTING_DEPTH} levels")
        doc = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError as err:
        raise ClientError(400, f"request body is not UTF-8 (byte {err.start})") from None
    except (ValueError, RecursionError) as err:
        raise ClientError(400, f"request body is not valid JSON: {str(err).splitlines()[0][:120]}") from None
    if not isinstance(doc, dict):
        raise ClientError(400, f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


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


def _int_field(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise ClientError(400, f"{name}: expected an integer, got {_q(v)}", param=name)
    if isinstance(v, float) and not math.isfinite(v):
        raise ClientError(400, f"{name}: expected a finite integer, got {_q(v)}", param=name)
    iv = int(v)
    if iv < lo or iv > hi:
        raise ClientError(400, f"{name}: {iv} is out of range; use {lo}..{hi}", param=name)
    return iv


def _q(v: Any) -> str:
    s = repr(v) if not isinstance(v, dict | list) else f"{type(v).__name__} of {len(v)}"
    return s if len(s) <= 60 else s[:57] + "..."


def _prompt_text(prompt: Any) -> tuple[str, list[int] | None]:
    """(text to hash, the token ids when the prompt is token ids)."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, str) for x in prompt):
            return "\x00".join(prompt), None
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return "", prompt
        if all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
               for x in prompt):
            return "", [t for x in prompt for t in x]
    raise ClientError(400, f"prompt: expected a string, a list of strings or token ids, got {_q(prompt)}",
                      param="prompt")


def _messages_text(msgs: Any) -> str:
    if not isinstance(msgs, list) or not msgs:
        raise ClientError(400, f"messages: expected a non-empty list of messages, got {_q(msgs)}", param="messages")
    parts = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ClientError(400, f"messages[{i}]: expected an object with a string `role`, got {_q(m)}",
                              param="messages")
        c = m.get("content")
        if isinstance(c, str):
            parts.append(f"{m['role']}\x00{c}")
        elif isinstance(c, list):
            texts = [p.get("text") for p in c if isinstance(p, dict)]
            if len(texts) != len(c):
                raise ClientError(400, f"messages[{i}].content: parts must be objects", param="messages")
            parts.append(m["role"] + "\x00" + "".join(t for t in texts if isinstance(t, str)))
        elif c is None:
            parts.append(m["role"] + "\x00")
        else:
            raise ClientError(400, f"messages[{i}].content: expected a string or a list of parts, got {_q(c)}",
                              param="messages")
    return "\x01".join(parts)


def parse_request(body: dict[str, Any], chat: bool, known_models: frozenset[str], max_output_tokens: int,
                  chars_per_token: float) -> ParsedRequest:
    """Check the routing fields of a completion request; raise `ClientError` on the first mistake."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ClientError(400, f"model: expected a model name (string), got {_q(model)}", param="model")
    if known_models and model not in known_models:
        raise ClientError(404, f"model {_q(model)} does not exist; served: {', '.join(sorted(known_models))}",
                          param="model", code="model_not_found")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ClientError(400, f"stream: expected true or false, got {_q(stream)}", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ClientError(400, f"stream_options: expected an object, got {_q(opts)}", param="stream_options")
    mt = _int_field(body, "max_tokens", 1, max_output_tokens)
    mct = _int_field(body, "max_completion_tokens", 1, max_output_tokens)
    n = _int_field(body, "n", 1, 1)
    del n
    if chat:
        text, ids = _messages_text(body.get("messages")), None
    else:
        if "prompt" not in body:
            raise ClientError(400, "prompt: missing; send the text to complete", param="prompt")
        text, ids = _prompt_text(body["prompt"])
    tokens = len(ids) if ids is not None else max(1, math.ceil(len(text) / chars_per_token))
    return ParsedRequest(body=body, model=model, stream=bool(stream), chat=chat, prompt_tokens=tokens,
                         max_tokens=mct if mct is not None else mt, prompt_text=text,
                         include_usage=bool((opts or {}).get("include_usage")), prompt_ids=ids)


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
