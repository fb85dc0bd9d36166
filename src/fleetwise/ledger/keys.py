"""Idempotency keys: the client's `Idempotency-Key` header, checked, or one generated per request.

A key is scoped by tenant in the ledger, so two tenants' equal keys never collide.
"""

from __future__ import annotations

import uuid

from fleetwise.errors import SpecError
from fleetwise.spec.failure_domains import IDEMPOTENCY_HEADER

MAX_KEY_CHARS = 255
"""Longest key accepted (Stripe's documented limit for its `Idempotency-Key` header)."""
GENERATED_PREFIX = "fw-"
"""Prefix of keys the gateway generates, so they never look like a client's."""


class IdempotencyKeyError(SpecError):
    """The client's idempotency key is malformed (an HTTP 400 in the gateway)."""


def check_key(value: str) -> str:
    """The client's key, unchanged, or IdempotencyKeyError naming the header, the value and the fix."""
    shown = value if len(value) <= 40 else value[:37] + "..."
    if not value or len(value) > MAX_KEY_CHARS:
        raise IdempotencyKeyError(
            f"header {IDEMPOTENCY_HEADER}={shown!r} must be 1 to {MAX_KEY_CHARS} characters; send "
            f"{'a' if not value else 'a shorter'} key (a UUID is a good choice)")
    if any(not (0x21 <= ord(c) <= 0x7E) for c in value):
        raise IdempotencyKeyError(
            f"header {IDEMPOTENCY_HEADER}={shown!r} must be printable ASCII without spaces; use letters, digits "
            "and -_.:")
    return value


def generate_key() -> str:
    """A fresh key for a request that came without one (random, so never equal to another)."""
    return GENERATED_PREFIX + uuid.uuid4().hex


def idempotency_key(header: str | None) -> str:
    """The key a request is metered under: the client's header when present, else a generated one."""
    return generate_key() if header is None else check_key(header)
