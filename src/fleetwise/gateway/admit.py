"""The admit stage of a request's path (`AdmitStage.handle`): body, tenant, limits, pins and checks,
then the tenant's slot, held in one `async with` while the later stages run; the token-id check
against the model's vocabulary and the context check.

A request's prompt + `max_tokens` is checked against the model's context (the smallest
`max_model_len` the live backends that decode report) before anything is sent, so a P/D request is
never prefilled for a decode side that must refuse it (the prefill would hold its KV for nothing);
a counted prompt + 1 against the prefill backends' smallest.
A token-id prompt is checked id by id: an id outside the vocabulary is the client's mistake (a
400 naming the position and the value), never the gateway's (it used to reach the block hasher
as a 500 and leak the tenant's concurrency slot).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from fleetwise.core.tokens import block_hashes
from fleetwise.core.views import RouteRequest
from fleetwise.errors import FleetwiseError
from fleetwise.gateway.call import (
    IDEMPOTENCY_HEADER,
    REGION_HEADER,
    VERSION_HEADER,
    Call,
    Receive,
    Send,
    header,
    pinned,
    read_body,
)
from fleetwise.gateway.config import TenantSpec
from fleetwise.gateway.dispatch import DispatchStage
from fleetwise.gateway.idempotency import Recorder, fingerprint, key_error
from fleetwise.gateway.limits import TenantLimiter
from fleetwise.gateway.migration import (
    client_wants_continuous,
)
from fleetwise.gateway.openai import (
    ClientError,
    answer_bounds,
    parse_json_body,
    parse_request,
    prompt_blocks,
)
from fleetwise.gateway.prompt_tokens import PromptTokenizer, request_ids
from fleetwise.ledger import IdempotencyKeyError, idempotency_key
from fleetwise.ledger.meter import Meter
from fleetwise.spec.catalog import get_model
from fleetwise.spec.context import leg_tokens

__all__ = ["TOKEN_ID_LIMIT", "AdmitStage", "check_context", "check_prefill_context", "check_token_ids", "vocabulary"]

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


def check_prefill_context(prompt_tokens: int, context: int | None, param: str) -> None:
    """Raise a 400 naming `param` when the prompt + the one token a P/D prefill leg computes exceeds
    the prefill backends' `context` (None: no prefill backend reports one)."""
    if context is not None and leg_tokens(prompt_tokens, 0, True) > context:
        raise ClientError(400, f"{param}: the prompt ({prompt_tokens} tokens) + 1 exceeds the prefill backends' "
                               f"context of {context} tokens; shorten the prompt", param=param,
                          code="context_length_exceeded")


class AdmitStage(DispatchStage):
    """Admitting one completion request and running it through the later stages."""

    def _tenant(self, scope: dict[str, Any]) -> TenantLimiter:
        auth = header(scope, b"authorization")
        key = auth[7:].strip() if auth and auth[:7].lower() == "bearer " else None
        lim = self.tenant_of_key.get(key) if key is not None else None
        if lim is not None:
            return lim
        if key is not None and self.cfg.unknown_keys == "reject":
            raise ClientError(401, "API key is not known; send `Authorization: Bearer <key>` with a key listed "
                                   "under tenants[].api_keys", type_="authentication_error", code="invalid_api_key")
        if self.cfg.require_api_key:
            raise ClientError(401, "missing or unknown API key; send `Authorization: Bearer <key>`",
                              type_="authentication_error", code="invalid_api_key")
        return self.default_limiter

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send, chat: bool) -> None:
        """One completion request, from the first body byte to the last relayed chunk."""
        arrival = self.now()
        endpoint = "chat" if chat else "completions"
        try:
            raw = await read_body(scope, receive, self.cfg.limits.max_body_bytes)
            lim = self._tenant(scope)
            body = parse_json_body(raw, self.cfg.limits.max_body_bytes)
            lm = self.cfg.limits
            pr = parse_request(body, chat, self.known_models(), lm.max_output_tokens, lm.chars_per_token)
            spec: TenantSpec = lim.spec
            version = pinned(spec.name, "model_version", spec.model_version, header(scope, VERSION_HEADER),
                              VERSION_HEADER)
            region = pinned(spec.name, "region", spec.region, header(scope, REGION_HEADER), REGION_HEADER)
            self._check_labels(version, region)
            max_out = pr.max_tokens or lm.default_max_tokens
            ids = pr.prompt_ids if self.tokenizer is None else self._tokenize(body, chat)
            if pr.prompt_ids is not None and ids is not None:
                check_token_ids(ids, vocabulary(lm.vocab_size, self.tokenizer, pr.model))
            prompt_tokens = pr.prompt_tokens if ids is None else max(len(ids), 1)
            if pr.max_tokens is not None:  # before any prefill: a decode side would refuse it
                check_context(prompt_tokens if ids is not None else 0, pr.max_tokens, self._context(pr.model, False))
            if ids is not None:  # a P/D prefill leg computes the prompt and one token
                check_prefill_context(prompt_tokens, self._context(pr.model, True), "messages" if chat else "prompt")
            key = idempotency_key(header(scope, IDEMPOTENCY_HEADER)) if self.ledger is not None else ""
            admission = lim.admit(prompt_tokens + max_out, arrival)
        except ClientError as err:
            await self._send_error(send, endpoint, err.status, err.message, err.type, err.param, err.code,
                                   err.retry_after_s)
            return
        except IdempotencyKeyError as err:
            await self._send_error(send, endpoint, 400, str(err), "invalid_request_error", "Idempotency-Key",
                                   "invalid_idempotency_key", None)
            return
        async with admission:  # released on every way out, exactly once
            client_key = key if self.ledger is not None and header(scope, IDEMPOTENCY_HEADER) is not None else None
            rec: Recorder | None = None
            if client_key is not None:
                if await self._idempotent_answer(send, endpoint, spec.name, client_key, raw):
                    return
                send = rec = Recorder(send)
            rid = f"{self._id_prefix}{next(self._ids):024x}"
            hashes: tuple[int, ...] = ()
            if self.wants_hashes:
                hashes = prompt_blocks(pr.prompt_text, self.block_bytes) if ids is None else \
                    block_hashes(ids, lm.hash_block_tokens)
            rr = RouteRequest(request_id=rid, prompt_tokens=prompt_tokens, max_output_tokens=max_out,
                              block_hashes=hashes, tenant=spec.name, model_version=version, region=region,
                              arrival_s=arrival, hash_block_tokens=lm.hash_block_tokens)
            call = Call(rid, endpoint, scope["path"], arrival, raw, body, pr.stream, pr.include_usage, rr,
                         receive=receive)
            # Without max_tokens an engine generates up to its context (vLLM's default): bound by that.
            call.bounds = answer_bounds(body, prompt_tokens, pr.max_tokens or self._context(pr.model, False)
                                        or lm.max_output_tokens)
            if pr.stream and self.cfg.failure_domains.may_migrate(0):
                call.track, call.keep_chunk_usage = True, client_wants_continuous(body)
            if self.ledger is not None:
                call.meter = Meter(self.ledger, key, rid, spec.name, pr.model, time.time(), prompt_tokens)
            await self._run(call, send, receive, rec, spec.name, client_key)

    async def _run(self, call: Call, send: Send, receive: Receive, rec: Recorder | None, tenant: str,
                   client_key: str | None) -> None:
        """Route, dispatch and relay an admitted request; then settle its idempotency key and its
        usage record (every ending without an answer is a `failed` record)."""
        try:
            await self._route_and_send(call, send, receive)
        finally:
            if rec is not None and client_key is not None:  # before any await: the client may retry at once
                done = rec.status == 200 and call.meter is not None and call.meter.status == "completed"
                self.idempotency.finish(tenant, client_key, rec.status, rec.content_type, rec.body, done)
            if call.meter is not None and not call.meter.ended:
                await asyncio.shield(call.meter.end("failed", "no_answer", time.time()))

    async def _idempotent_answer(self, send: Send, endpoint: str, tenant: str, key: str, raw: bytes) -> bool:
        """Answer a reused `Idempotency-Key` here (the stored answer, 409 or 422) and return True, or
        claim the key for this request and return False (see `gateway.idempotency`)."""
        try:
            stored = self.idempotency.begin(tenant, key, fingerprint(raw), self.now())
            if stored is None and await self._ledger_completed(tenant, key):
                self.idempotency.finish(tenant, key, 0, b"", b"", False)
                raise key_error(409, f"Idempotency-Key {key!r} already completed and its answer is no longer kept; "
                                     "send a new key for a new request", "idempotency_key_consumed")
        except ClientError as err:
            await self._send_error(send, endpoint, err.status, err.message, err.type, err.param, err.code, None)
            return True
        if stored is None:
            return False
        await send({"type": "http.response.start", "status": stored.status, "headers": [
            (b"content-type", stored.content_type), (b"content-length", str(len(stored.body)).encode()),
            (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": stored.body})
        self.telemetry.answered(endpoint, stored.status)
        return True

    async def _ledger_completed(self, tenant: str, key: str) -> bool:
        """The ledger holds a completed row for `(tenant, key)`; False when it cannot say in time (an
        unreachable ledger: the request runs, and the ledger still bills the key once)."""
        assert self.ledger is not None
        return bool(await self.ledger.completed(tenant, key))

    def _context(self, model: str, prefill: bool) -> int | None:
        """The smallest context length (tokens) the live prefill backends (`prefill`), or the live
        backends that decode, report for `model` (None: none reports one)."""
        live = self.backends.live
        lens = [c[model] for name, c in self.contexts.items()
                if model in c and name in live and (live[name].spec.role == "prefill") == prefill]
        return min(lens) if lens else None

    def _tokenize(self, body: dict[str, Any], chat: bool) -> list[int]:
        """The prompt's token ids by the configured tokenizer; a prompt it cannot encode is a 400."""
        assert self.tokenizer is not None
        try:
            return request_ids(self.tokenizer, body, chat)
        except (ValueError, TypeError, UnicodeError) as err:  # e.g. a lone surrogate from a JSON escape
            raise ClientError(400, f"{'messages' if chat else 'prompt'}: cannot be tokenized ({err})",
                              param="messages" if chat else "prompt") from None

    def _check_labels(self, version: str | None, region: str | None) -> None:
        bs = [b.spec for b in self.backends.live.values()]
        if version is not None and bs and not any(s.model_version == version for s in bs):
            known = sorted({s.model_version for s in bs})
            raise ClientError(400, f"model version {version!r} is not served; versions: {', '.join(known)}",
                              param="x-fleetwise-model-version")
        if region is not None and bs and not any(s.region == region for s in bs):
            known = sorted({s.region for s in bs})
            raise ClientError(400, f"region {region!r} has no backend; regions: {', '.join(known)}",
                              param="x-fleetwise-region")
