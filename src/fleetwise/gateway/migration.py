"""Live decode migration: counting the tokens a stream delivered, and its continuation.

Owns the wire side of decision 3 of docs/failure-domains.md for the gateway:
- `counted_options`: the `stream_options` that make an OpenAI/vLLM server put the usage so far on
  every chunk (vLLM's `continuous_usage_stats`), so the gateway knows exactly how many tokens the
  client has received when a stream breaks;
- `relay_events`: what the client sees of those chunks (the usage it did not ask for removed;
  after a migration, the counts shifted to the whole request's);
- `continuation`: the request that continues a broken stream on another replica: for
  completions the prompt + the text already streamed; for chat the partial assistant message
  appended with vLLM's `continue_final_message: true, add_generation_prompt: false`; `max_tokens`
  the remaining budget. A greedy engine (and the emulator) then produces exactly the tokens the
  uninterrupted stream would have.
"""

from __future__ import annotations

import json
import re
from typing import Any

_EMPTY_CHOICES = re.compile(rb'"choices":\s*\[\s*\]')
_CHUNK_USAGE = re.compile(rb',\s*"usage"\s*:\s*\{(?:[^{}]|\{[^{}]*\})*\}')
"""The `usage` member of a chunk (one level of nesting: prompt_tokens_details)."""


COUNTED_USAGE = {"include_usage": True, "continuous_usage_stats": True}
"""`stream_options` entries asking for usage on every chunk (and at the end)."""


def counted_options(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with `stream_options` asking for usage on every chunk (and at the end)."""
    return {**body, "stream_options": {**(body.get("stream_options") or {}), **COUNTED_USAGE}}


def client_wants_continuous(body: dict[str, Any]) -> bool:
    """The client itself asked for usage on every chunk."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("continuous_usage_stats") is True


def relay_events(out: bytes, keep_usage: bool, base_tokens: int) -> bytes:
    """Whole SSE events as the client should see them: chunk usage removed unless `keep_usage`;
    after a migration (`base_tokens` > 0) every usage counts the whole request (the
    continuation's prompt held `base_tokens` generated tokens)."""
    if b'"usage"' not in out:
        return out
    parts = []
    for e in out.split(b"\n\n"):
        if not e:
            continue
        if b'"usage"' in e:
            if not keep_usage and not _EMPTY_CHOICES.search(e):
                e = _CHUNK_USAGE.sub(b"", e, count=1)
            elif base_tokens and e.startswith(b"data: {"):
                e = b"data: " + _shift_usage(e[6:], base_tokens)
        parts.append(e + b"\n\n")
    return b"".join(parts)


def _shift_usage(doc: bytes, base: int) -> bytes:
    try:
        d = json.loads(doc)
        u = d["usage"]
        u["prompt_tokens"] -= base
        u["completion_tokens"] += base
    except (ValueError, KeyError, TypeError):
        return doc
    return json.dumps(d, separators=(",", ":")).encode()


def streamed_text(events: list[bytes], chat: bool) -> str:
    """The generated text carried by relayed SSE events (choice 0's text or delta content)."""
    out: list[str] = []
    for blob in events:
        for e in blob.split(b"\n\n"):
            if not e.startswith(b"data: {"):
                continue
            try:
                choices = json.loads(e[6:]).get("choices") or []
            except ValueError:
                continue
            for c in choices:
                if not isinstance(c, dict) or c.get("index", 0) != 0:
                    continue
                piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
                if isinstance(piece, str):
                    out.append(piece)
    return "".join(out)


def continuation(body: dict[str, Any], chat: bool, text: str, remaining: int) -> dict[str, Any] | None:
    """The request continuing `body` after `text` was streamed, for `remaining` more tokens;
    None when the prompt cannot be extended as text (a token-id prompt)."""
    body = {k: v for k, v in body.items() if k not in ("max_tokens", "max_completion_tokens")}
    body["max_tokens"] = remaining
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        body["messages"] = [*messages, {"role": "assistant", "content": text}]
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
        return body
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    body["prompt"] = prompt + text
    return body
