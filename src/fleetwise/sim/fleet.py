"""The fleet: a plan's replicas, each an `EngineDriver` on the simulator's event loop.

An adapter over the shared driver (`fleetwise.engine.driver`): a `Replica` is a driver plus what
only the simulator tracks about it (pool, KV port, the request indices it holds, routed
arrivals still to come, statistics). Building a pool's engines is `fleetwise.engine.pools`;
stepping, cuts, slowdowns and views are the driver's. Does not own request lifecycles, routing
or faults (see `fleetwise.sim.runner` and `fleetwise.sim.faults`); step outputs arrive through
the `on_output(replica, now_s, step_start_s, output)` callback.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import cast

from fleetwise.core.views import WorkerView
from fleetwise.engine.driver import DOWN, DRAINING, UP, EngineDriver, HorizonFn, OutputFn
from fleetwise.engine.pools import PoolBuild, build_pool, engine_config
from fleetwise.engine.records import StepOutput
from fleetwise.perf.kv import kv_transfer_sizer
from fleetwise.perf.roofline import PerfModel
from fleetwise.sim.columns import ReplicaStats
from fleetwise.sim.events import EventLoop
from fleetwise.spec.kv_format import KvCompat, KvFormat, declared_format, kv_compat
from fleetwise.spec.plan import PlanSpec, PoolSpec

__all__ = ["DOWN", "DRAINING", "UP", "Fleet", "Replica", "engine_config"]


class Replica(EngineDriver):
    """One serving replica: its engine driver, plus what the simulator tracks about it."""

    __slots__ = ("idx", "pool", "deployment", "kv_bytes", "stats", "port", "inflight", "pending", "hangs")

    def __init__(self, idx: int, name: str, build: PoolBuild, loop: EventLoop, on_output: OutputFn,
                 horizon: HorizonFn, stats: ReplicaStats, kv_bytes: Callable[[float], float]) -> None:
        pool = build.pool
        super().__init__(build.engine(name), loop, on_output, horizon, build.perf, pool_name=pool.name,
                         accelerator=build.deployment.accelerator.name, model_version=pool.model_version,
                         region=pool.region, kv_capacity_tokens=build.kv_capacity_tokens,
                         kv_format=declared_format(pool.model_version, pool.kv_dtype, pool.engine.block_size,
                                                   pool.parallelism.tp, build.deployment.accelerator))
        self.idx = idx
        self.pool: PoolSpec = pool
        self.deployment = build.deployment
        self.kv_bytes = kv_bytes
        """Bytes of KV a hand-off of n prompt tokens to this replica moves (`perf.kv.kv_transfer_sizer`
        of its deployment, one per pool)."""
        self.stats = stats
        self.port = -1
        self.inflight: set[int] = set()
        """Request indices this replica currently holds (queued, running, or awaiting KV)."""
        self.pending: deque[float] = deque()
        """Arrival times of requests already routed here that have not arrived yet (delayed mode)."""
        self.hangs: set[int] = set()
        """Hang faults (by index) in force: the replica steps again when the last one ends (or at a restart)."""
        if pool.step_time_factor != 1.0:  # a measured correction of the model; slowdown faults multiply it
            self.slowdown = pool.step_time_factor

    def format_now(self) -> KvFormat:
        """The KV format this replica declares, at the model version it serves now."""
        assert self.kv_format is not None
        return self.kv_format.at_version(self.model_version)


class Fleet:
    """Replicas of every pool, in plan order (`<pool>-<i>`), driven on the simulator's loop."""

    def __init__(self, plan: PlanSpec, loop: EventLoop, perf: PerfModel,
                 on_output: Callable[[Replica, float, float, StepOutput], None],
                 horizon: Callable[[Replica, float], tuple[float, float]]) -> None:
        """Build every pool's replicas; their drivers report to `on_output` and ask `horizon`
        (both receive the `Replica`, which is the driver)."""
        self.plan, self.loop = plan, loop
        self.replicas: list[Replica] = []
        self.max_model_len = 0
        """Longest request (prompt + output tokens) every replica that decodes serves: the smallest such pool's."""
        self.max_prefill_len = 0
        """Longest prompt + 1 token (what a prefill instance computes) every prefill replica serves (0: none)."""
        for i, pool in enumerate(plan.pools):
            build = build_pool(pool, perf, f"plan: pools.{i}")
            if pool.role == "prefill":
                self.max_prefill_len = min(self.max_prefill_len or build.max_model_len, build.max_model_len)
            else:
                self.max_model_len = min(self.max_model_len or build.max_model_len, build.max_model_len)
            gpu = build.deployment.accelerator
            price = pool.price_per_gpu_hour_usd if pool.price_per_gpu_hour_usd is not None else gpu.price_per_hour_usd
            kv_bytes = kv_transfer_sizer(build.deployment)
            for j in range(pool.replicas):
                name = f"{pool.name}-{j}"
                stats = ReplicaStats(name, pool.name, pool.role, build.deployment.gpus, price)
                self.replicas.append(Replica(len(self.replicas), name, build, loop, cast(OutputFn, on_output),
                                             cast(HorizonFn, horizon), stats, kv_bytes))
        self.by_name = {r.name: r.idx for r in self.replicas}
        self.names = [r.name for r in self.replicas]
        self._compat: dict[tuple[int, int, str, str], tuple[KvCompat, bool]] = {}
        """`kv_compat` verdicts and their `direct`, by (sender, receiver, their model versions)."""

    def kv_compat(self, src: Replica, dst: Replica) -> tuple[KvCompat, bool]:
        """Whether `dst` can take `src`'s KV now (`kv_compat` of their formats now) and whether it
        moves as is (`KvCompat.direct`); kept per pair and model versions, since a replica's
        declared format changes only with its model version."""
        key = (src.idx, dst.idx, src.model_version, dst.model_version)
        hit = self._compat.get(key)
        if hit is None:
            c = kv_compat(src.format_now(), dst.format_now())
            hit = self._compat[key] = (c, c.direct)
        return hit

    def kick(self, rep: Replica, now_s: float) -> None:
        """Let an idle replica schedule at `now_s`, after everything else due at `now_s`."""
        rep.kick(now_s)

    def cut(self, rep: Replica, now_s: float) -> None:
        """Work reached `rep` at `now_s`: a fused step in flight ends with the pass running now."""
        rep.cut(now_s)

    def stop(self, rep: Replica, now_s: float) -> None:
        """Stop a replica's current step (crash): its end is ignored; busy time counts to now."""
        rep.stop(now_s)

    def worker_view(self, rep: Replica, now_s: float) -> WorkerView:
        """The replica as a router sees it now (cached until the replica changes)."""
        return rep.view(now_s)

    def workers(self, now_s: float) -> tuple[WorkerView, ...]:
        """Every replica's view at `now_s`, in plan order."""
        return tuple([r.view(now_s) for r in self.replicas])
