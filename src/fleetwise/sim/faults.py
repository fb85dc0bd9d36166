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
- stale_view: the router keeps the view it had at the start of the interval.
- rolling_upgrade: one replica of the pool at a time is drained (no new routes; in-flight work
  finishes), goes down for `restart_after_s`, returns with the new model version; then the next.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

from fleetwise.core.feedback import WorkerDown, WorkerUp
from fleetwise.errors import SpecError
from fleetwise.sim.events import FaultEvent, Priority
from fleetwise.sim.fleet import DOWN, DRAINING, UP, Replica
from fleetwise.spec.faults import (
    DecodeFull,
    FaultScenario,
    KvLinkFault,
    ReplicaCrash,
    RollingUpgrade,
    Slowdown,
    StaleView,
)

if TYPE_CHECKING:
    from fleetwise.sim.runner import Simulation


class FaultInjector:
    """Schedules fault events on the simulation's loop and applies them."""

    def __init__(self, sim: Simulation, scenario: FaultScenario | None) -> None:
        self.sim = sim
        self.faults = list(scenario.faults) if scenario else []
        self.log: list[dict[str, Any]] = []
        self._boundaries: list[float] = []  # slowdown start/end times: steps must not straddle them
        self._upgrade: dict[int, list[int]] = {}  # fault -> replicas still to upgrade
        self._check()
        sim.loop.on(FaultEvent, self._on_event)

    def _check(self) -> None:
        fleet = self.sim.fleet
        for k, f in enumerate(self.faults):
            name = getattr(f, "replica", None)
            if name is not None and name not in fleet.by_name:
                raise SpecError(f"faults.{k}.replica={name!r} is not in the plan; replicas are {', '.join(fleet.names)}")
            if isinstance(f, RollingUpgrade) and f.pool not in {p.name for p in self.sim.plan.pools}:
                raise SpecError(f"faults.{k}.pool={f.pool!r} is not a pool of the plan")

    @property
    def next_time_s(self) -> float:
        b = self._boundaries
        now = self.sim.loop.time_s
        while b and b[0] <= now:
            heapq.heappop(b)
        return b[0] if b else math.inf

    def schedule(self) -> None:
        push = self.sim.loop.push
        for k, f in enumerate(self.faults):
            if isinstance(f, ReplicaCrash):
                push(f.at_s, Priority.FAULT, FaultEvent(k, "crash", self._rep(f.replica)))
            elif isinstance(f, RollingUpgrade):
                push(f.start_s, Priority.FAULT, FaultEvent(k, "upgrade_next"))
            else:
                assert isinstance(f, Slowdown | KvLinkFault | DecodeFull | StaleView)
                push(f.start_s, Priority.FAULT, FaultEvent(k, "start"))
                push(f.end_s, Priority.FAULT, FaultEvent(k, "end"))
                if isinstance(f, Slowdown):
                    heapq.heappush(self._boundaries, f.start_s)
                    heapq.heappush(self._boundaries, f.end_s)

    def _rep(self, name: str) -> int:
        return self.sim.fleet.by_name[name]

    def _note(self, now_s: float, k: int, phase: str, target: str = "") -> None:
        self.log.append({"t_s": round(now_s, 9), "fault": k, "kind": self.faults[k].kind, "phase": phase,
                         "target": target})

    def report(self) -> list[dict[str, Any]]:
        return self.log

    # ---- dispatch ----------------------------------------------------------------------------
    def _on_event(self, now_s: float, ev: FaultEvent) -> None:
        f = self.faults[ev.fault]
        if ev.phase == "crash":
            self.crash(self.sim.reps[ev.target], now_s, ev.fault)
        elif ev.phase == "restart":
            self.restart(self.sim.reps[ev.target], now_s, ev.fault, None)
        elif ev.phase == "upgrade_next":
            self._upgrade_next(now_s, ev.fault)
        elif ev.phase == "upgrade_back":
            assert isinstance(f, RollingUpgrade)
            self.restart(self.sim.reps[ev.target], now_s, ev.fault, f.new_model_version)
            self._upgrade_next(now_s, ev.fault)
        elif isinstance(f, Slowdown):
            self._slowdown(f, now_s, ev)
        elif isinstance(f, KvLinkFault):
            self._kv_link(f, now_s, ev)
        elif isinstance(f, DecodeFull):
            self._decode_full(f, now_s, ev)
        elif isinstance(f, StaleView):
            self.sim.view_frozen = ev.phase == "start"
            self._note(now_s, ev.fault, ev.phase)

    # ---- kinds -------------------------------------------------------------------------------
    def crash(self, rep: Replica, now_s: float, k: int) -> None:
        sim = self.sim
        if rep.state == DOWN:
            return
        self._note(now_s, k, "crash", rep.name)
        # Tokens each request had streamed from this replica when it died (passes of a fused step
        # that ended before now count: a client receives every pass).
        elapsed = now_s - rep.step_start_s if rep.busy else None
        streamed = {i: rep.engine.outputs_of(sim.reqs[i].request_id, elapsed) for i in rep.inflight}
        rep.state = DOWN
        sim.fleet.stop(rep, now_s)
        rep.pending.clear()
        if rep.port >= 0:
            sim.net.fail_port(now_s, rep.port)
        rep.engine.abort_all()
        kv_end = sim.rec.kv_end_s
        reason = {"prefill": "prefill_lost", "decode": "decode_lost"}.get(rep.role, "replica_crashed")
        for i in sorted(rep.inflight):
            if i not in rep.inflight:
                continue  # already failed or recovered through a failed transfer
            if rep.role == "decode" and kv_end[i] != kv_end[i]:
                continue  # still prefilling elsewhere: its hand-off sees this replica down
            sim.recovery.lost(i, now_s, reason, streamed.get(i, 0))
        rep.inflight.clear()
        sim.feedback(WorkerDown(now_s, rep.name, "crash"))
        f = self.faults[k]
        if isinstance(f, ReplicaCrash) and f.restart_after_s is not None:
            sim.loop.push(now_s + f.restart_after_s, Priority.FAULT, FaultEvent(k, "restart", rep.idx))

    def restart(self, rep: Replica, now_s: float, k: int, version: str | None) -> None:
        if version is not None:
            rep.model_version = version
        rep.state = UP
        rep.view_cache = None
        self._note(now_s, k, "restart", rep.name)
        self.sim.feedback(WorkerUp(now_s, rep.name, rep.model_version))
        self.sim.fleet.kick(rep, now_s)

    def _slowdown(self, f: Slowdown, now_s: float, ev: FaultEvent) -> None:
        rep = self.sim.reps[self._rep(f.replica)]
        rep.slowdown = rep.slowdown * f.factor if ev.phase == "start" else rep.slowdown / f.factor
        self._note(now_s, ev.fault, ev.phase, rep.name)

    def _kv_link(self, f: KvLinkFault, now_s: float, ev: FaultEvent) -> None:
        sim = self.sim
        if not sim.plan.disaggregated:
            self._note(now_s, ev.fault, ev.phase + " (no KV links in a colocated plan)")
            return
        ports = [sim.reps[self._rep(f.replica)].port] if f.replica else list(range(len(sim.net.ports)))
        sim.net.set_factor(now_s, ports, f.bandwidth_factor if ev.phase == "start" else 1.0)
        self._note(now_s, ev.fault, ev.phase, f.replica or "all")

    def _decode_full(self, f: DecodeFull, now_s: float, ev: FaultEvent) -> None:
        sim = self.sim
        reps = [sim.reps[self._rep(f.replica)]] if f.replica else [r for r in sim.reps if r.role == "decode"]
        for r in reps:
            if ev.phase == "start":
                sim.recovery.refusing.add(r.idx)
            else:
                sim.recovery.refusing.discard(r.idx)
        self._note(now_s, ev.fault, ev.phase, f.replica or "all decode")

    # ---- rolling upgrade -----------------------------------------------------------------------
    def _upgrade_next(self, now_s: float, k: int) -> None:
        f = self.faults[k]
        assert isinstance(f, RollingUpgrade)
        todo = self._upgrade.setdefault(k, [r.idx for r in self.sim.reps if r.pool.name == f.pool])
        if not todo:
            self._note(now_s, k, "done")
            return
        rep = self.sim.reps[todo.pop(0)]
        rep.state = DRAINING
        rep.view_cache = None
        self._note(now_s, k, "drain", rep.name)
        self.sim.feedback(WorkerDown(now_s, rep.name, "draining for upgrade"))
        self.on_replica_progress(rep, now_s)

    def on_replica_progress(self, rep: Replica, now_s: float) -> None:
        """A replica finished or handed off work: a draining one with nothing left goes down."""
        if rep.state != DRAINING or rep.inflight or rep.pending:
            return
        rep.state = DOWN
        self.sim.fleet.stop(rep, now_s)
        rep.engine.abort_all()
        k = next(k for k, f in enumerate(self.faults) if isinstance(f, RollingUpgrade) and f.pool == rep.pool.name)
        f = self.faults[k]
        assert isinstance(f, RollingUpgrade)
        self._note(now_s, k, "down", rep.name)
        self.sim.loop.push(now_s + f.restart_after_s, Priority.FAULT, FaultEvent(k, "upgrade_back", rep.idx))
