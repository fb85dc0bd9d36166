"""Applies a `FaultScenario` to a running simulation: crashes, slowdowns, KV link faults,
stale router views, rolling upgrades.

Owns when each fault starts and ends and what it changes on the fleet; the failure-domain
decisions (`fleetwise.sim.recovery`) own what happens to the affected requests (prefill again,
migrate, or fail), so no request is ever silently lost: each one either completes or carries a
failure reason.

- crash: the replica goes down (its step is discarded, its engine aborted, its KV ports fail
  their transfers); its requests go to recovery (`prefill_lost`, `decode_lost`, or
  `replica_crashed` for a colocated replica) with the tokens they had streamed; it comes back
  empty after `restart_after_s`.
- slowdown: the replica's step time is multiplied by `factor` during the interval.
- kv_link: the port bandwidth of one replica (or all) is scaled; factor 0 fails transfers.
- decode_full: decode replicas refuse new KV during the interval (decode admission fails).
- fail_requests: a replica (or every replica) refuses new requests during the interval: a request
  dispatched to it goes to recovery (`replica_refused`), a hand-off to a refusing decode replica
  fails decode admission as `decode_full`'s does.
- hang: the replica stops stepping at the end of the step in flight and steps again at the end of
  the interval; it still takes requests and the router still sees it healthy, as a live hang's
  health probe passes.
- drop_streams: refused by name (see `fault_kinds`): the simulator has no client connections.
- stale_view: the router keeps the view it had at the start of the interval.
- rolling_upgrade: `batch` replicas of the pool at a time (default one) are drained (no new routes;
  in-flight work finishes), go down for `restart_after_s`, return with the new model version; once
  the whole batch is back, the next.
  With `matched_with`, a second pool's replicas take turns with the first's, the next from the
  pool with the smaller upgraded fraction (matched slices of a P/D fleet).

Each kind is a registered plugin (`fault_api.fault_kind`, the built-ins in `fleetwise.sim.fault_kinds`):
it schedules its events and applies them through the injector (`fault_api.FaultHost`). Faults act on
the simulation only through `fault_api.FaultTarget`, a narrow protocol the runner satisfies, so this
module never imports the runner.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.sim import fault_kinds  # noqa: F401  (registers the built-in kinds)
from fleetwise.sim.events import FaultEvent, Priority
from fleetwise.sim.fault_api import FAULT_KINDS, FaultKind, FaultTarget
from fleetwise.sim.fleet import DRAINING, Replica
from fleetwise.spec.faults import CannotModel, FaultScenario, RollingUpgrade


class FaultInjector:
    """Schedules fault events on the simulation's loop and applies them through their kinds."""

    def __init__(self, sim: FaultTarget, scenario: FaultScenario | None) -> None:
        self.sim = sim
        self.reps: list[Replica] = sim.fleet.replicas
        self.faults = list(scenario.faults) if scenario else []
        self.log: list[dict[str, Any]] = []
        self._boundaries: list[float] = []  # slowdown start/end times: steps must not straddle them
        self.upgrade: dict[int, list[int]] = {}
        """Rolling upgrade fault -> replica indices still to upgrade."""
        self.upgrade_out: dict[int, int] = {}
        """Rolling upgrade fault -> replicas of its current batch not back yet."""
        self.upgrade_of: dict[int, int] = {}
        """Replica index -> the rolling upgrade fault that has it out (draining or down)."""
        self.kv_links: dict[int, dict[int, float]] = {}
        """KV port -> {kv_link fault in force: its bandwidth factor} (overlapping faults compose)."""
        self._check()
        sim.loop.on(FaultEvent, self._on_event)

    def _check(self) -> None:
        fleet = self.sim.fleet
        for k, f in enumerate(self.faults):
            kind = FAULT_KINDS.get(type(f))
            if kind is None:
                raise SpecError(f"faults.{k}: kind {f.kind!r} has no simulator implementation")
            if isinstance(kind, CannotModel):
                raise SpecError(f"faults.{k} ({f.kind}): the simulator cannot model it: {kind.why}; remove it, or "
                                "rehearse it on an emulated fleet (`fleetwise up PLAN --faults`)")
            name = getattr(f, "replica", None)
            if name is not None and name not in fleet.by_name:
                raise SpecError(f"faults.{k}.replica={name!r} is not in the plan; replicas are {', '.join(fleet.names)}")
            pools = {p.name for p in self.sim.plan.pools}
            if isinstance(f, RollingUpgrade) and f.pool not in pools:
                raise SpecError(f"faults.{k}.pool={f.pool!r} is not a pool of the plan")
            if isinstance(f, RollingUpgrade) and f.matched_with is not None and f.matched_with not in pools:
                raise SpecError(f"faults.{k}.matched_with={f.matched_with!r} is not a pool of the plan")

    @property
    def next_time_s(self) -> float:
        """The next step-time boundary (a slowdown starting or ending); inf when none is left."""
        b = self._boundaries
        now = self.sim.loop.time_s
        while b and b[0] <= now:
            heapq.heappop(b)
        return b[0] if b else math.inf

    def boundary(self, t_s: float) -> None:
        """Steps must not straddle `t_s` (a step-time change)."""
        heapq.heappush(self._boundaries, t_s)

    def push(self, t_s: float, k: int, phase: str, target: int = -1) -> None:
        """Schedule phase `phase` of fault `k` at `t_s` (on replica index `target`)."""
        self.sim.loop.push(t_s, Priority.FAULT, FaultEvent(k, phase, target))

    def schedule(self) -> None:
        """Push every fault's events."""
        for k, f in enumerate(self.faults):
            self._kind(f).schedule(self, k, f)

    def rep(self, name: str) -> Replica:
        """The replica named `name`."""
        return self.reps[self.sim.fleet.by_name[name]]

    def note(self, now_s: float, k: int, phase: str, target: str = "") -> None:
        """Log what fault `k` did at `now_s` (the summary's `faults` list)."""
        self.log.append({"t_s": round(now_s, 9), "fault": k, "kind": self.faults[k].kind, "phase": phase,
                         "target": target})

    def report(self) -> list[dict[str, Any]]:
        """The log of every fault phase applied, in time order."""
        return self.log

    def _on_event(self, now_s: float, ev: FaultEvent) -> None:
        f = self.faults[ev.fault]
        self._kind(f).apply(self, now_s, ev.fault, f, ev)

    @staticmethod
    def _kind(f: Any) -> FaultKind:
        kind = FAULT_KINDS[type(f)]
        assert not isinstance(kind, CannotModel)  # refused by `_check`
        return kind

    def on_replica_progress(self, rep: Replica, now_s: float) -> None:
        """A replica finished or handed off work: a draining one with nothing left goes down."""
        if rep.state != DRAINING or rep.inflight or rep.pending:
            return
        self.upgrade_drained(rep, now_s)

    def upgrade_drained(self, rep: Replica, now_s: float) -> None:
        """The rolling upgrade that has `rep` out takes it down (drained, or crashed while draining)."""
        k = self.upgrade_of[rep.idx]  # only a rolling upgrade drains a replica
        self._kind(self.faults[k]).drained(self, rep, now_s, k, self.faults[k])  # type: ignore[attr-defined]

