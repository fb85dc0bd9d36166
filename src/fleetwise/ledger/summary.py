"""Usage read back: billed tokens per tenant and per pool, next to the work actually done.

Billed prompt and cached tokens count against the pool that prefilled the prompt, billed
generated tokens against the pool that decoded them; computed tokens and GPU-seconds come from
the work rows (every attempt, billed or not) of the pool that did the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetwise.ledger.usage import LedgerRow

RECOVERY_KINDS = ("reprefill", "migration")


def _blank_tenant() -> dict[str, Any]:
    return {"requests": 0, "completed": 0, "cancelled": 0, "failed": 0, "attempts": 0, "duplicate_attempts": 0,
            "billed_prompt_tokens": 0, "billed_cached_tokens": 0, "billed_generated_tokens": 0,
            "delivered_tokens": 0, "computed_tokens": 0, "gpu_s": 0.0, "recovery_gpu_s": 0.0}


def _blank_pool() -> dict[str, Any]:
    return {"billed_prompt_tokens": 0, "billed_cached_tokens": 0, "billed_generated_tokens": 0,
            "computed_tokens": 0, "gpu_s": 0.0, "recovery_gpu_s": 0.0}


def summarize(rows: Sequence[LedgerRow], work: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """`{tenants: {T: {...}}, pools: {P: {...}}, total: {...}}` from usage rows and work rows."""
    tenants: dict[str, dict[str, Any]] = {}
    pools: dict[str, dict[str, Any]] = {}
    total = _blank_tenant()
    for r in rows:
        for t in (tenants.setdefault(r.tenant, _blank_tenant()), total):
            t["requests"] += 1
            t[r.status] += 1
            t["attempts"] += r.attempts
            t["duplicate_attempts"] += r.attempts - 1
            t["billed_prompt_tokens"] += r.billed_prompt_tokens
            t["billed_cached_tokens"] += r.billed_cached_tokens
            t["billed_generated_tokens"] += r.billed_generated_tokens
            t["delivered_tokens"] += r.delivered_tokens
        pre = pools.setdefault(r.prefill_pool, _blank_pool())
        pre["billed_prompt_tokens"] += r.billed_prompt_tokens
        pre["billed_cached_tokens"] += r.billed_cached_tokens
        pools.setdefault(r.decode_pool, _blank_pool())["billed_generated_tokens"] += r.billed_generated_tokens
    for tenant, _key, _rid, kind, _reason, pool, _replica, tokens, gpu_s, _at in work:
        recovery = gpu_s if kind in RECOVERY_KINDS else 0.0
        for t in (tenants.setdefault(tenant, _blank_tenant()), total, pools.setdefault(pool, _blank_pool())):
            t["computed_tokens"] += tokens
            t["gpu_s"] += gpu_s
            t["recovery_gpu_s"] += recovery
    for d in (*tenants.values(), *pools.values(), total):
        d["gpu_s"] = round(d["gpu_s"], 9)
        d["recovery_gpu_s"] = round(d["recovery_gpu_s"], 9)
    return {"tenants": dict(sorted(tenants.items())), "pools": dict(sorted(pools.items())), "total": total}
