"""Per-tenant admission: API keys to tenants, and request-rate, token-rate and concurrency limits.

Rates are token buckets (depth `burst_s` seconds of the rate); a request over a limit gets 429
with `Retry-After` = the seconds until the bucket holds enough. Times are the gateway clock's
seconds, passed in (no clock read here), so the limits are testable without sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetwise.gateway.config import TenantSpec
from fleetwise.gateway.openai import ClientError

__all__ = ["Admission", "TenantLimiter", "TokenBucket"]


class TokenBucket:
    """`rate` units per second, at most `rate * burst_s` banked; starts full."""

    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.depth = max(rate * burst_s, 1.0)
        self.level = self.depth
        self.at_s: float | None = None

    def take(self, amount: float, now_s: float) -> float:
        """Take `amount` and return 0, or take nothing and return the seconds to wait."""
        if self.at_s is not None:
            self.level = min(self.depth, self.level + (now_s - self.at_s) * self.rate)
        self.at_s = now_s
        amount = min(amount, self.depth)  # one request larger than the bucket waits for a full one
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


@dataclass(slots=True)
class Admission:
    """A granted request, held for as long as it runs: `async with limiter.admit(...):` releases it
    on every way out (answer, client error, upstream failure, disconnect, a bug), exactly once."""

    limiter: TenantLimiter
    released: bool = False

    def release(self) -> None:
        """Give the tenant's concurrency slot back (a second call does nothing)."""
        if not self.released:
            self.released = True
            self.limiter.active -= 1

    async def __aenter__(self) -> Admission:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class TenantLimiter:
    """One tenant's limits and counters."""

    def __init__(self, spec: TenantSpec) -> None:
        self.spec = spec
        self.requests = TokenBucket(spec.requests_per_s, spec.burst_s) if spec.requests_per_s > 0 else None
        self.tokens = TokenBucket(spec.tokens_per_s, spec.burst_s) if spec.tokens_per_s > 0 else None
        self.active = 0
        self.admitted = 0
        self.refused = 0

    def admit(self, tokens: int, now_s: float) -> Admission:
        """Admit one request costing `tokens` (prompt + max output), or raise 429."""
        sp = self.spec
        if sp.max_concurrency and self.active >= sp.max_concurrency:
            self._refuse(f"tenant {sp.name!r} has {self.active} requests in flight; the limit is "
                         f"{sp.max_concurrency}", 1.0)
        if self.requests is not None:
            wait = self.requests.take(1.0, now_s)
            if wait:
                self._refuse(f"tenant {sp.name!r} is over {sp.requests_per_s:g} requests/s", wait)
        if self.tokens is not None:
            wait = self.tokens.take(float(tokens), now_s)
            if wait:
                self._refuse(f"tenant {sp.name!r} is over {sp.tokens_per_s:g} tokens/s "
                             f"(this request counts {tokens})", wait)
        self.active += 1
        self.admitted += 1
        return Admission(self)

    def _refuse(self, msg: str, wait_s: float) -> None:
        self.refused += 1
        raise ClientError(429, f"{msg}; retry later", type_="rate_limit_exceeded", code="rate_limit_exceeded",
                          retry_after_s=max(1.0, math.ceil(wait_s)))
