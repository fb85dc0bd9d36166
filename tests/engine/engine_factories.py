"""Factories for the engine tests (vLLM's `create_scheduler`) and `drive`, the shared engine driver on a virtual clock."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwise.core.request import Request
from fleetwise.engine.api import Engine, EngineConfig, Step, StepOutput
from fleetwise.engine.clock import ORDER_STEP_END
from fleetwise.engine.driver import EngineDriver
from fleetwise.engine.sequence import DECODE, PREFILL, cdiv
from fleetwise.perf.types import BatchShape
from fleetwise.sim.events import EventLoop, Priority

ORDER_ARRIVAL = int(Priority.ARRIVAL)
"""Arrivals at a time join before the kick that lets the engine schedule then."""


def affine_time(shape: BatchShape) -> float:
    """Step seconds: fixed + per new token + per KV position read (affine, like roofline decode)."""
    return 1e-3 + 3.7e-6 * shape.new_tokens + 1.3e-8 * shape.kv_read_tokens + 2.1e-5 * shape.num_seqs


def convex_time(shape: BatchShape) -> float:
    """Not affine in the KV read: max of a compute and a memory term (a roofline kink)."""
    return 1e-3 + max(4e-6 * shape.new_tokens, 2.5e-8 * shape.kv_read_tokens)


def make_request(rid: int | str = 0, prompt: int = 100, output: int = 10, hashes: tuple[int, ...] = (),
                 hash_block_tokens: int = 512, arrival_s: float = 0.0) -> Request:
    return Request(str(rid), arrival_s, prompt, output, hashes, hash_block_tokens)


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


def drive(engine: Engine, arrivals: list[Request], check: Callable[[Engine], None] | None = None,
          max_steps: int = 200_000, release_after_s: float | None = None, horizon: str = "hard") -> Trace:
    """Run `engine` on the shared `EngineDriver` in virtual time (the simulator's event loop as
    its clock) until idle; requests enter at their `arrival_s`.

    `horizon` says how the next arrival bounds a fused step: `hard` (the step ends before it),
    `soft` (the pass it falls in is the step's last) or `cut` (the step is formed without it,
    then `EngineDriver.cut` shortens it, as when work arrives unannounced). A prefill engine's
    hand-offs are released `release_after_s` later (at once when None or 0).
    """
    todo = sorted(arrivals, key=lambda r: (r.arrival_s, int(r.request_id)))  # numbered ids (make_request)
    tr = Trace()
    loop = EventLoop()
    nxt = [0]  # index of the next arrival not yet added
    passes_seen = [0]

    def next_event_s(now_s: float) -> float:
        return todo[nxt[0]].arrival_s - now_s if nxt[0] < len(todo) else math.inf

    def bound(drv: EngineDriver, now_s: float) -> tuple[float, float]:
        if horizon == "hard":
            return next_event_s(now_s), math.inf
        if horizon == "soft":
            return math.inf, next_event_s(now_s)
        return math.inf, math.inf

    def release(now_s: float, rid: str) -> None:
        engine.release(rid)
        drv.kick(now_s)

    def on_output(d: EngineDriver, now_s: float, start_s: float, out: StepOutput) -> None:
        step = d.step
        assert step is not None
        passes = engine.stats.passes - passes_seen[0]
        passes_seen[0] = engine.stats.passes
        if passes != step.num_passes:  # cut short: record the step as it ran
            step = Step(now_s - start_s, passes, step.shape, step.num_seqs, step.prefill_tokens,
                        step.num_seqs * passes if not step.prefill_tokens else step.decode_tokens)
        tr.steps.append(step)
        if len(tr.steps) > max_steps:
            raise AssertionError("engine did not drain")
        for rid, dt in out.first_tokens:
            tr.first_token_s[rid] = start_s + dt
        for rid, dt in out.scheduled:
            tr.scheduled_s[rid] = start_s + dt
            tr.admission_order.append(rid)
        for rid in out.finished:
            assert rid not in tr.finish_s, f"request {rid} finished twice"
            tr.finish_s[rid] = now_s
        for rid in out.handoffs:
            tr.handoff_s[rid] = now_s
            if release_after_s:
                loop.call_at(now_s + release_after_s, ORDER_STEP_END, release, rid)
            else:
                engine.release(rid)
        tr.tokens += out.tokens_generated
        tr.preempted += len(out.preempted)
        tr.outputs.append(out)
        if check:
            check(engine)

    drv = EngineDriver(engine, loop, on_output, bound)

    def arrive(now_s: float, req: Request) -> None:
        nxt[0] += 1
        (engine.add_transferred if engine.role == "decode" else engine.add_request)(req)
        if horizon == "cut":
            drv.cut(now_s)
        drv.kick(now_s)

    for r in todo:
        loop.call_at(r.arrival_s, ORDER_ARRIVAL, arrive, r)
    loop.run()
    assert not engine.has_work and not drv.busy, "engine did not drain"
    return tr


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
