"""Factories and a tiny virtual-time driver for the engine tests (vLLM's `create_scheduler`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwise.core.request import Request
from fleetwise.engine.api import Engine, EngineConfig, Step, StepOutput
from fleetwise.engine.sequence import DECODE, PREFILL, cdiv
from fleetwise.perf.types import BatchShape


def affine_time(shape: BatchShape) -> float:
    """Step seconds: fixed + per new token + per KV position read (affine, like roofline decode)."""
    return 1e-3 + 3.7e-6 * shape.new_tokens + 1.3e-8 * shape.kv_read_tokens + 2.1e-5 * shape.num_seqs


def convex_time(shape: BatchShape) -> float:
    """Not affine in the KV read: max of a compute and a memory term (a roofline kink)."""
    return 1e-3 + max(4e-6 * shape.new_tokens, 2.5e-8 * shape.kv_read_tokens)


def make_request(rid: int = 0, prompt: int = 100, output: int = 10, hashes: tuple[int, ...] = (),
                 hash_block_tokens: int = 512, arrival_s: float = 0.0) -> Request:
    return Request(rid, arrival_s, prompt, output, hashes, hash_block_tokens)


def make_engine(role: str = "mixed", num_blocks: int = 1000, step_time: Callable[[BatchShape], float] = affine_time,
                **config: object) -> Engine:
    return Engine("e0", role, EngineConfig(**config), num_blocks, step_time)  # type: ignore[arg-type]


@dataclass
class Trace:
    """What a driver saw: per-request times and the steps."""

    first_token_s: dict[int, float] = field(default_factory=dict)
    finish_s: dict[int, float] = field(default_factory=dict)
    handoff_s: dict[int, float] = field(default_factory=dict)
    scheduled_s: dict[int, float] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    outputs: list[StepOutput] = field(default_factory=list)
    tokens: int = 0
    preempted: int = 0
    admission_order: list[int] = field(default_factory=list)


def drive(engine: Engine, arrivals: list[Request], use_horizon: bool = True,
          check: Callable[[Engine], None] | None = None, max_steps: int = 200_000,
          release_after_s: float | None = None, horizon: str = "hard") -> Trace:
    """Run `engine` in virtual time until idle; requests enter at their `arrival_s`.

    `horizon` says how the next arrival bounds a fused step: `hard` (the step ends before it),
    `soft` (the pass it falls in is the step's last) or `cut` (the step is formed without it,
    then `Engine.cut` shortens it, as when work arrives unannounced).
    """
    todo = sorted(arrivals, key=lambda r: (r.arrival_s, r.request_id))
    tr, t, i, seen = Trace(), 0.0, 0, set()
    pending_release: list[tuple[float, int]] = []
    for _ in range(max_steps):
        while i < len(todo) and todo[i].arrival_s <= t:
            (engine.add_transferred if engine.role == "decode" else engine.add_request)(todo[i])
            i += 1
        for when, rid in [p for p in pending_release if p[0] <= t]:
            engine.release(rid)
            pending_release.remove((when, rid))
        events = [todo[i].arrival_s] if i < len(todo) else []
        events += [w for w, _ in pending_release]
        nxt = min(events) - t if (events and use_horizon) else math.inf
        if horizon == "hard":
            step = engine.schedule(nxt)
        elif horizon == "soft":
            step = engine.schedule(soft_horizon_s=nxt)
        else:
            step = engine.schedule()
        if step is None:
            if not events:
                return tr
            t = max(t, min(events))
            continue
        for rid in engine._running:  # noqa: SLF001 - observe admission order
            if rid not in seen:
                seen.add(rid)
                tr.admission_order.append(rid)
        duration = step.duration_s
        if horizon == "cut" and nxt < math.inf:
            cut = engine.cut(nxt)
            if cut is not None:
                assert cut < duration
                duration = cut
                step = Step(cut, engine._inflight.passes, step.shape, step.num_seqs,  # noqa: SLF001
                            step.prefill_tokens, step.decode_tokens)
        tr.steps.append(step)
        out = engine.complete()
        for rid, dt in out.first_tokens:
            tr.first_token_s[rid] = t + dt
        for rid, dt in out.scheduled:
            tr.scheduled_s[rid] = t + dt
        t += duration
        for rid in out.finished:
            assert rid not in tr.finish_s, f"request {rid} finished twice"
            tr.finish_s[rid] = t
        for rid in out.handoffs:
            tr.handoff_s[rid] = t
            pending_release.append((t + (release_after_s or 0.0), rid))
        tr.tokens += out.tokens_generated
        tr.preempted += len(out.preempted)
        tr.outputs.append(out)
        if check:
            check(engine)
    raise AssertionError("engine did not drain")


def check_engine(engine: Engine) -> None:
    """Invariants between steps: pool accounting, per-request block coverage, ref counts."""
    pool, bs, g = engine.pool, engine.config.block_size, engine._passes  # noqa: SLF001
    pool.check()
    private = 0
    refs: dict[int, int] = {}
    holders = list(engine._running.values()) + list(engine._awaiting_release.values())  # noqa: SLF001
    for st in holders:
        if st.phase == DECODE:
            computed = st.a + g
            own = cdiv(computed, bs) - st.shared
        else:
            computed, own = st.computed, st.private
            assert st.phase != PREFILL or st.computed < st.target
        assert own >= 0
        assert st.shared + own >= cdiv(computed, bs), "blocks must cover computed tokens"
        assert st.shared == sum(st.uses)
        private += own
        for e in st.entries:
            if e is not None:
                refs[id(e)] = refs.get(id(e), 0) + 1
                assert e.num_blocks > 0
    assert private == pool.num_private
    for e in pool._cached.values():  # noqa: SLF001
        assert e.ref_count == refs.get(id(e), 0)
    assert engine.num_running <= engine.config.max_num_seqs
