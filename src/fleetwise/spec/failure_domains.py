"""`FailureDomainSpec`: the four decisions a prefill/decode fleet makes in advance about failures.

Owns the declared choices (see docs/failure-domains.md); the simulator and the gateway enforce
them, the ledger applies the billing rule. Times in seconds, counts per request.

1. Ownership after prefill, before hand-off: the router owns the request; the prefill replica
   holds the KV under a lease of `kv_lease_s` that the decode side ends by acknowledging it
   has the KV. A lease that expires, or a decode admission that fails, frees the KV (counted as
   orphaned KV bytes x seconds) and sends the request to (2).
2. Re-prefill: allowed while nothing has streamed to the client, at most `max_reprefills` times
   per request; every attempt is recorded with its reason and GPU time.
3. Decode failure: `on_decode_failure: migrate` prefills prompt + tokens already generated on
   another decode replica and continues the same stream (at most `max_migrations` times);
   `fail` ends the stream with a clean error event.
4. Metering: one usage record per idempotency key, written when the request ends; work done by
   re-prefills, migrations and duplicate client retries is recorded, never billed twice.
   `bill_failed` says what a request that ends in a server-side error is billed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleetwise.spec.base import Spec

DEFAULT_KV_LEASE_S = 30.0
"""Default lease on prefill KV awaiting the decode ack. vLLM's NIXL connector keeps a finished
prefill's blocks for `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` = 480 s by default (a leak backstop, not
a client-facing bound); a client waiting on its first token should not wait that long, so the
lease here is the bound after which the router stops waiting and prefills again."""

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""Request header carrying the client's idempotency key (the IETF httpapi draft's name, as used
by Stripe's and other public APIs)."""


class FailureDomainSpec(Spec):
    """What a PD fleet does when a prefill replica, a KV link or a decode replica fails."""

    kv_lease_s: float = Field(default=DEFAULT_KV_LEASE_S, gt=0)
    """Seconds a prefill replica holds a request's KV after prefill, waiting for the decode ack;
    on expiry the KV is freed and the request is prefilled again (if allowed) or fails."""
    max_reprefills: int = Field(default=2, ge=0)
    """Re-prefill attempts per request (lost prefill replica, failed KV transfer, expired lease,
    decode pool full), only while nothing has streamed to the client; 0 = fail at once."""
    on_decode_failure: Literal["migrate", "fail"] = "migrate"
    """A decode replica lost mid-stream: `migrate` = prefill prompt + generated tokens on another
    decode replica and continue the stream; `fail` = end the stream with an error event."""
    max_migrations: int = Field(default=1, ge=0)
    """Migrations per request before it fails."""
    bill_failed: Literal["nothing", "delivered"] = "nothing"
    """A request that ends in a server-side error: bill nothing, or its prompt and the tokens
    delivered before the error. Completed requests and client cancellations always bill
    prompt + delivered tokens."""

    def may_reprefill(self, attempts: int, streamed_tokens: int) -> bool:
        """True when one more re-prefill is allowed after `attempts` and `streamed_tokens` sent."""
        return streamed_tokens == 0 and attempts < self.max_reprefills

    def may_migrate(self, migrations: int) -> bool:
        """True when a stream broken by a decode failure may move to another replica."""
        return self.on_decode_failure == "migrate" and migrations < self.max_migrations


NO_RECOVERY = FailureDomainSpec(max_reprefills=0, on_decode_failure="fail", max_migrations=0)
"""Every failure ends the request (the behaviour with recovery switched off)."""
