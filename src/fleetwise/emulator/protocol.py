"""The emulator's side of the OpenAI/vLLM wire format: what it honours of a request, and the
bodies it answers with (full responses, SSE chunks, errors).

Requests are parsed and validated by the shared parser (`fleetwise.core.openai_request`, the
gateway's too: vLLM's rules and error bodies); this module says what the emulator honours
(`EMULATOR_RULES`: one served model, its vocabulary, text-only chat content, and the fields it
refuses because its synthetic text cannot honour them: stop strings, logprobs, echo, tools,
structured output...) and tokenizes the prompt (`fleetwise.core.tokens`). Sampling numbers
(`temperature`, `top_p`, penalties, `seed`) are checked and accepted: they choose which tokens
a model samples, and the emulator's tokens are synthetic, so there is nothing they would change.
Responses carry vLLM's ids (`cmpl-` / `chatcmpl-` then the request id) and their own `created`.
It does not run anything: `fleetwise.emulator.app` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fleetwise.core.openai_request import ApiError, Kind, ServerRules, response_id
from fleetwise.core.openai_request import parse_request as parse_shared
from fleetwise.core.tokens import VOCAB_SIZE, chat_text, encode

__all__ = ["EMULATOR_UNSUPPORTED", "ApiError", "ChunkWriter", "GenRequest", "Kind", "full_response", "parse_request",
           "usage"]

EMULATOR_UNSUPPORTED = frozenset({
    "stop", "stop_token_ids", "logprobs", "top_logprobs", "prompt_logprobs", "echo", "best_of", "suffix",
    "logit_bias", "tools", "functions", "response_format", "min_tokens", "use_beam_search", "bad_words",
    "allowed_token_ids", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
})
"""Fields whose effect the emulator cannot produce (its text is synthetic, one sequence per
request): asking for one is a 400 naming it."""


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


@lru_cache(maxsize=16)
def server_rules(served_model: str) -> ServerRules:
    """What an emulator serving `served_model` honours."""
    return ServerRules(models=frozenset({served_model}), default_model=served_model, vocab_size=VOCAB_SIZE,
                       unsupported=EMULATOR_UNSUPPORTED, text_parts_only=True)


def parse_request(kind: Kind, body: dict[str, Any], served_model: str) -> GenRequest:
    """Validate (the shared parser) and tokenize a request body for `kind` to an emulator
    serving `served_model`; ApiError(400/404) naming the field."""
    r = parse_shared(body, kind, server_rules(served_model))
    if r.turns is not None:
        ids = encode(chat_text(r.turns, r.add_generation_prompt, r.continue_final_message))
    elif r.prompt_ids is not None:
        ids = list(r.prompt_ids)
    else:
        ids = encode(r.prompt_text or "")
    if not ids:
        raise ApiError(400, "the prompt is empty; send at least one token", "prompt")
    return GenRequest(kind, r.model, ids, r.max_tokens, r.stream, r.include_usage, r.ignore_eos,
                      r.kv_transfer_params, r.continuous_usage)


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
    return {"id": response_id(req.kind, rid), "object": obj, "created": created, "model": req.model, "choices": [choice],
            "usage": usage(len(req.prompt_ids), completion_tokens), "kv_transfer_params": kv_transfer_params}


class ChunkWriter:
    """SSE `data:` lines of one streamed response (completion or chat chunk objects)."""

    def __init__(self, req: GenRequest, rid: str, created: int) -> None:
        self.req, self.chat = req, req.kind == "chat"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        # Everything before the choices is the same in every chunk: encode it once.
        self._head = ('data: {"id":' + json.dumps(response_id(req.kind, rid)) + ',"object":"' + obj + '","created":' + str(created)
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
