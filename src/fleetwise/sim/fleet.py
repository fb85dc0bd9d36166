"""The fleet: replicas built from a plan's pools, each an `Engine` driven in virtual time.

Owns building replicas (memory fit, bound perf model, KV ports), stepping engines (schedule ->
StepEnd -> complete), and the worker views a router reads. Does not own request lifecycles,
routing or faults (see `fleetwise.sim.runner` and `fleetwise.sim.faults`); it reports step
outputs through the `on_output(replica, now_s, step_start_s, output)` callback.

Step time of a replica = the bound perf model's `step_time_s(shape)` times its `slowdown`
(1.0, or a fault's factor; setting `Replica.slowdown` rebinds the engine's step-time
functions). A crash bumps the replica's `epoch` so the StepEnd of the step it was running is
ignored; so does `cut` (work reached a replica in the middle of a fused step:
the step now ends with the pass running, and a new StepEnd is pushed).

Horizons (`HorizonFn` -> `(hard_s, soft_s)`, seconds from now): a fused step never crosses the
hard one and may run the pass that straddles the soft one (see `Engine.schedule`). Views of a
replica in a fused step show the state single passes would have at that time
(`Engine.snapshot(now, elapsed)`), cached until the next pass boundary, as between single passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwise.core.views import WorkerView
from fleetwise.engine.api import Engine, EngineConfig, Step, StepOutput
from fleetwise.errors import SpecError
from fleetwise.perf.memory import FitOptions, kv_capacity_tokens
from fleetwise.perf.roofline import BoundPerf, PerfModel
from fleetwise.perf.types import BatchShape, Deployment, pool_deployment
from fleetwise.sim.events import EventLoop, Kick, Priority, StepEnd
from fleetwise.sim.results import ReplicaStats
from fleetwise.spec.plan import PlanSpec, PoolSpec, resolve_pool

UP, DRAINING, DOWN = 0, 1, 2


@dataclass(slots=True)
class Replica:
    """One serving replica and what the simulator tracks about it."""

    idx: int
    name: str
    pool: PoolSpec
    role: str
    engine: Engine
    deployment: Deployment
    kv_capacity_tokens: int
    kv_bytes_per_token: float
    stats: ReplicaStats
    model_version: str
    perf: BoundPerf | None = None
    """The bound perf model the engine's step times come from (see `slowdown`)."""
    _slowdown: float = 1.0
    state: int = UP
    epoch: int = 0
    busy: bool = False
    kick_pending: bool = False
    step_start_s: float = 0.0
    step_dur_s: float = 0.0
    step_passes: int = 1
    """Passes of the step in flight (> 1: fused)."""
    step: Step | None = None
    """The step in flight (its batch composition; read by a step recorder)."""
    view_pass: int = 0
    """Passes of the fused step in flight that had ended when `view` was taken."""
    port: int = -1
    inflight: set[int] = field(default_factory=set)
    """Request indices this replica currently holds (queued, running, or awaiting KV)."""
    pending: deque[float] = field(default_factory=deque)
    """Arrival times of requests already routed here that have not arrived yet (delayed mode)."""
    view: WorkerView | None = None

    @property
    def available(self) -> bool:
        return self.state == UP

    @property
    def slowdown(self) -> float:
        """Factor on every step time (1.0, or a fault's); setting it rebinds the engine's step-time
        functions, so an unslowed replica calls the perf model directly."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self._slowdown = factor
        if self.perf is not None:
            self.engine.step_time, self.engine.decode_time = _step_time_fns(self.perf, factor)


OutputFn = Callable[[Replica, float, float, StepOutput], None]
HorizonFn = Callable[[Replica, float], tuple[float, float]]


def engine_config(pool: PoolSpec) -> EngineConfig:
    k = pool.engine
    return EngineConfig(
        max_num_batched_tokens=k.max_num_batched_tokens, max_num_seqs=k.max_num_seqs, block_size=k.block_size,
        enable_prefix_caching=k.enable_prefix_caching, enable_chunked_prefill=k.enable_chunked_prefill,
        max_bundle_steps=k.max_bundle_steps,
    )


class Fleet:
    """Replicas of every pool, in plan order (`<pool>-<i>`); drives their engine steps."""

    def __init__(self, plan: PlanSpec, loop: EventLoop, perf: PerfModel, on_output: OutputFn,
                 horizon: HorizonFn) -> None:
        self.plan, self.loop, self.on_output, self.horizon = plan, loop, on_output, horizon
        self.replicas: list[Replica] = []
        for i, pool in enumerate(plan.pools):
            self._build_pool(pool, perf, f"plan: pools.{i}")
        self.by_name = {r.name: r.idx for r in self.replicas}
        self.names = [r.name for r in self.replicas]
        loop.on(StepEnd, self._on_step_end)
        loop.on(Kick, self._on_kick)

    # ---- building --------------------------------------------------------------------------
    def _build_pool(self, pool: PoolSpec, perf: PerfModel, where: str) -> None:
        model, gpu = resolve_pool(pool, where)
        try:
            pool.parallelism.check(model, gpu)
        except SpecError as err:
            raise SpecError(f"{where} ({pool.name}): {err}") from None
        dep = pool_deployment(model, gpu, pool)
        k = pool.engine
        opts = FitOptions(max_num_batched_tokens=k.max_num_batched_tokens, max_num_seqs=k.max_num_seqs,
                          gpu_memory_utilization=pool.gpu_memory_utilization)
        cap = kv_capacity_tokens(dep, opts)
        if cap < k.block_size:
            raise SpecError(
                f"{where} ({pool.name}): fit failed: {model.name} on {pool.parallelism.gpus} x {gpu.name} "
                f"(tp={pool.parallelism.tp}, pp={pool.parallelism.pp}, {pool.weight_dtype} weights) leaves no "
                f"room for KV cache; raise tp/pp or use smaller dtypes (see `fleetwise fit {model.name} {gpu.name}`)"
            )
        bound = perf.bind(dep)
        cfg = engine_config(pool)
        price = pool.price_per_gpu_hour_usd if pool.price_per_gpu_hour_usd is not None else gpu.price_per_hour_usd
        for j in range(pool.replicas):
            idx = len(self.replicas)
            name = f"{pool.name}-{j}"
            step_time, decode_time = _step_time_fns(bound, 1.0)
            engine = Engine(name, pool.role, cfg, cap // cfg.block_size, step_time, decode_time)
            stats = ReplicaStats(name, pool.name, pool.role, dep.gpus, price)
            rep = Replica(idx, name, pool, pool.role, engine, dep, cap, model.kv_bytes_per_token(pool.kv_dtype),
                          stats, pool.model_version, bound)
            self.replicas.append(rep)

    # ---- stepping --------------------------------------------------------------------------
    def kick(self, rep: Replica, now_s: float) -> None:
        """Let an idle replica schedule at `now_s`, after everything else due at `now_s`."""
        rep.view = None
        if not rep.busy and not rep.kick_pending and rep.state != DOWN:
            rep.kick_pending = True
            self.loop.push(now_s, Priority.KICK, Kick(rep.idx))

    def _on_kick(self, now_s: float, ev: Kick) -> None:
        rep = self.replicas[ev.engine]
        rep.kick_pending = False
        self._schedule(rep, now_s)

    def _schedule(self, rep: Replica, now_s: float) -> None:
        if rep.busy or rep.state == DOWN:
            return
        hard, soft = self.horizon(rep, now_s)
        step = rep.engine.schedule(hard if hard > 0.0 else 0.0, soft if soft > 0.0 else 0.0)
        if step is None:
            return
        rep.busy = True
        rep.step_start_s = now_s
        rep.step_dur_s = step.duration_s
        rep.step_passes = step.num_passes
        rep.step = step
        self.loop.push(now_s + step.duration_s, Priority.STEP_END, StepEnd(rep.idx, rep.epoch))

    def cut(self, rep: Replica, now_s: float) -> None:
        """Work reached `rep` at `now_s`: a fused step in flight ends with the pass running now."""
        if not rep.busy or rep.step_passes <= 1:
            return
        dur = rep.engine.cut(now_s - rep.step_start_s)
        if dur is None:
            return
        rep.epoch += 1
        rep.step_dur_s = dur
        self.loop.push(rep.step_start_s + dur, Priority.STEP_END, StepEnd(rep.idx, rep.epoch))

    def _on_step_end(self, now_s: float, ev: StepEnd) -> None:
        rep = self.replicas[ev.engine]
        if ev.epoch != rep.epoch:
            return
        out = rep.engine.complete()
        rep.busy = False
        rep.view = None
        rep.stats.busy_s += rep.step_dur_s
        rep.stats.preemptions += len(out.preempted)
        self.on_output(rep, now_s, rep.step_start_s, out)
        self._schedule(rep, now_s)

    def stop(self, rep: Replica, now_s: float) -> None:
        """Stop a replica's current step (crash): its StepEnd is ignored; busy time counts to now."""
        if rep.busy:
            rep.stats.busy_s += now_s - rep.step_start_s
        rep.busy = False
        rep.epoch += 1
        rep.view = None

    # ---- views -----------------------------------------------------------------------------
    def worker_view(self, rep: Replica, now_s: float) -> WorkerView:
        """The replica as a router sees it now (cached until the replica changes)."""
        v = rep.view
        elapsed = j = None
        if rep.busy and rep.step_passes > 1:
            elapsed = now_s - rep.step_start_s
            j = rep.engine.passes_done(elapsed)
            if v is not None and rep.view_pass == j:
                return v
            rep.view_pass = j
            v = None
        elif v is None:
            rep.view_pass = 0
        if v is None:
            waiting, running, queued, decode_left, usage = rep.engine.load(elapsed, j)
            v = WorkerView(
                rep.name, rep.role, rep.pool.name, rep.deployment.accelerator.name,  # type: ignore[arg-type]
                rep.model_version, rep.pool.region, rep.state == UP, waiting, running, queued, decode_left, usage,
                rep.kv_capacity_tokens, rep.pool.engine.block_size, now_s,
            )
            rep.view = v
        return v

    def workers(self, now_s: float) -> tuple[WorkerView, ...]:
        view = self.worker_view
        return tuple([view(r, now_s) for r in self.replicas])


def _step_time_fns(bound: BoundPerf, factor: float) -> tuple[Callable[[BatchShape], float],
                                                              Callable[[int, int, int], float]]:
    """Step time of a replica slowed by `factor`: the perf model's (its own methods at 1.0),
    times `factor`; and the same for decode-only passes (`BoundPerf.decode_time_s`)."""
    base, base_decode = bound.step_time_s, bound.decode_time_s
    if factor == 1.0:
        return base, base_decode

    def step_time(shape: BatchShape) -> float:
        return base(shape) * factor

    def decode_time(n: int, kv: int, longest: int) -> float:
        return base_decode(n, kv, longest) * factor

    return step_time, decode_time
