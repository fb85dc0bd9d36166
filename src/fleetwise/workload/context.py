"""Requests against the model's context: reject, truncate or skip what does not fit.

One rule for every path that replays requests (`simulate`, `scenarios`, the planner's trace
lengths): a request needs at least one prompt and one output token, and its prompt plus output
must fit the model's context (the smallest over a plan's pools). `OVER_CONTEXT_POLICIES` says
what happens to one that does not; the counts go in the run's summary.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.spec.context import OVER_CONTEXT_POLICIES, fit_to_context, request_tokens_problem
from fleetwise.spec.plan import PlanSpec, resolve_pool

__all__ = ["OVER_CONTEXT_POLICIES", "apply_context_limit", "limit_lengths", "plan_context_tokens"]


def plan_context_tokens(plan: PlanSpec) -> int:
    """The smallest context window over the plan's models, tokens (every replica must fit a request)."""
    return min(resolve_pool(pool, f"pools.{i}")[0].max_context_tokens for i, pool in enumerate(plan.pools))


def limit_lengths(prompt: np.ndarray, output: np.ndarray, max_context_tokens: int, policy: str, where: str,
                  fix: str = "pass --over-context truncate|skip", ids: list[str] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """(kept rows, their prompt, their output, counts) of requests given as length arrays, per
    `policy` (see `OVER_CONTEXT_POLICIES`): `reject` raises SpecError naming the first request
    that does not fit (its id, or its row) and `fix`; `truncate` cuts prompts then outputs to fit
    (`fit_to_context`) and skips empty requests; `skip` drops every request that does not fit.
    Counts: {max_context_tokens, truncated, skipped}."""
    if policy not in OVER_CONTEXT_POLICIES:
        raise SpecError(f"over_context: {policy!r} is not one of {', '.join(OVER_CONTEXT_POLICIES)}")
    p = np.asarray(prompt, dtype=np.int64)
    o = np.asarray(output, dtype=np.int64)
    empty = (p < 1) | (o < 1)
    bad = empty | (p + o > max_context_tokens)
    counts = {"max_context_tokens": int(max_context_tokens), "truncated": 0, "skipped": 0}
    keep = np.ones(len(p), dtype=bool)
    if not bad.any():
        return keep, p, o, counts
    idx = np.flatnonzero(bad)
    if policy == "reject":
        i = int(idx[0])
        name = ids[i] if ids is not None else str(i)
        problem = request_tokens_problem(int(p[i]), int(o[i]), max_context_tokens)
        raise SpecError(f"{where}: request {name} (of {len(idx):,} such): {problem}; fix the workload or {fix}")
    drop = bad if policy == "skip" else empty
    keep = ~drop
    if policy == "truncate":
        p, o = p.copy(), o.copy()
        for i in np.flatnonzero(bad & ~empty).tolist():
            p[i], o[i] = fit_to_context(int(p[i]), int(o[i]), max_context_tokens)
        counts["truncated"] = int((bad & ~empty).sum())
    counts["skipped"] = int(drop.sum())
    return keep, p[keep], o[keep], counts


def apply_context_limit(requests: list[Request], max_context_tokens: int, policy: str, where: str,
                        fix: str = "pass --over-context truncate|skip") -> tuple[list[Request], dict[str, int]]:
    """Requests that fit the model's context, per `policy` (`limit_lengths`), and the counts; a
    truncated request keeps the block hashes of its shortened prompt."""
    prompt = np.fromiter((r.prompt_tokens for r in requests), dtype=np.int64, count=len(requests))
    output = np.fromiter((r.output_tokens for r in requests), dtype=np.int64, count=len(requests))
    keep, p, o, counts = limit_lengths(prompt, output, max_context_tokens, policy, where, fix,
                                       [str(r.request_id) for r in requests] if policy == "reject" else None)
    if not counts["truncated"] and not counts["skipped"]:
        return requests, counts
    out = []
    for r, pt, ot in zip((r for r, k in zip(requests, keep.tolist(), strict=True) if k), p.tolist(), o.tolist(),
                         strict=True):
        if pt != r.prompt_tokens or ot != r.output_tokens:
            r = replace(r, prompt_tokens=pt, output_tokens=ot, block_hashes=r.block_hashes[: -(-pt // r.hash_block_tokens)])
        out.append(r)
    return out, counts
