"""The admit stage of a request's path: what is checked before a tenant's slot is taken, and the
token-id check against the model's vocabulary.

A request's prompt + `max_tokens` is checked against the model's context (the smallest
`max_model_len` the live backends report) before anything is sent, so a P/D request is never
prefilled for a decode side that must refuse it (the prefill would hold its KV for nothing).
A token-id prompt is checked id by id: an id outside the vocabulary is the client's mistake (a
400 naming the position and the value), never the gateway's (it used to reach the block hasher
as a 500 and leak the tenant's concurrency slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from fleetwise.errors import FleetwiseError
from fleetwise.gateway.openai import ClientError
from fleetwise.gateway.prompt_tokens import PromptTokenizer
from fleetwise.spec.catalog import get_model

__all__ = ["TOKEN_ID_LIMIT", "check_context", "check_token_ids", "vocabulary"]

TOKEN_ID_LIMIT = 1 << 32
"""Ids beyond every vocabulary: block hashes pack ids as unsigned 32-bit (`core.tokens.block_digests`)."""


@lru_cache(maxsize=256)
def _catalog_vocab(model: str) -> int | None:
    try:
        return int(get_model(model).vocab_size)
    except FleetwiseError:
        return None


def vocabulary(configured: int | None, tokenizer: PromptTokenizer | None, model: str) -> int:
    """Token ids a prompt for `model` may hold are in [0, this): the configured size, else the
    tokenizer's, else the catalog model's, else `TOKEN_ID_LIMIT`."""
    if configured is not None:
        return configured
    if tokenizer is not None:
        return tokenizer.vocab_size
    return _catalog_vocab(model) or TOKEN_ID_LIMIT


def check_token_ids(ids: Sequence[int], vocab: int) -> None:
    """Raise a 400 naming the first id outside [0, vocab)."""
    if not ids or (min(ids) >= 0 and max(ids) < vocab):
        return
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise ClientError(400, f"prompt[{i}]: token id {t} is outside the model's vocabulary [0, {vocab}); "
                                   "send ids from the model's tokenizer", param="prompt", code="invalid_token_id")


def check_context(prompt_tokens: int, max_tokens: int, context: int | None) -> None:
    """Raise a 400 naming `max_tokens` when prompt + max_tokens exceeds `context` (None: unknown).
    `prompt_tokens` is 0 when only estimated (a wrong estimate must not refuse a valid request)."""
    if context is not None and prompt_tokens + max_tokens > context:
        raise ClientError(400, f"max_tokens: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                               f"model's context of {context} tokens; lower max_tokens or shorten the prompt",
                          param="max_tokens", code="context_length_exceeded")
