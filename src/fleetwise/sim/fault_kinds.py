"""The simulated effect of each fault kind, one registered class each (see `fleetwise.sim.faults`).

A new kind: a spec model in `fleetwise.spec.faults` (added to its `FaultSpec` union), and a class
here or in a new module imported by `fleetwise.sim.faults`, decorated `@fault_kind(Model)`, with
`schedule` (push its events through `inj.push`) and `apply` (act through `inj.sim`, a
`FaultTarget`); or, where the simulator cannot model it, `cannot_simulate(Model, why)`. Its live
effect registers in `fleetwise.emulator.faults`. Every action is logged with `inj.note`.
"""

from __future__ import annotations

import math
from typing import Any

from fleetwise.core.feedback import WorkerDown, WorkerUp
from fleetwise.sim.events import FaultEvent
from fleetwise.sim.fault_api import FaultHost, cannot_simulate, fault_kind
from fleetwise.sim.fleet import DOWN, DRAINING, UP, Replica
from fleetwise.spec.faults import (
    DecodeFull,
    DropStreams,
    FailRequests,
    Hang,
    KvLinkFault,
    ReplicaCrash,
    RollingUpgrade,
    Slowdown,
    StaleView,
)

CRASH_REASONS = {"prefill": "prefill_lost", "decode": "decode_lost"}
"""Recovery reason of a request whose replica crashed, by the replica's role (else `replica_crashed`)."""


class Interval:
    """A fault active from `start_s` to `end_s`: `start` and `end` events."""

    def schedule(self, inj: FaultHost, k: int, fault: Any) -> None:
        """Push the start and end of fault `k`."""
        inj.push(fault.start_s, k, "start")
        inj.push(fault.end_s, k, "end")


def restart(inj: FaultHost, rep: Replica, now_s: float, k: int, version: str | None) -> None:
    """`rep` comes back up (empty) at `now_s`, with model `version` when given."""
    if version is not None:
        rep.model_version = version
    rep.state = UP
    rep.stalled = False  # a new process: a hang does not survive the restart
    rep.hangs.clear()
    rep.view_cache = None
    inj.note(now_s, k, "restart", rep.name)
    inj.sim.feedback(WorkerUp(now_s, rep.name, rep.model_version))
    rep.kick(now_s)


@fault_kind(ReplicaCrash)
class Crash:
    """The replica goes down at `at_s` (step discarded, engine aborted, KV ports failed); its
    requests go to recovery with the tokens they had streamed; back after `restart_after_s`."""

    def schedule(self, inj: FaultHost, k: int, fault: ReplicaCrash) -> None:
        """Push the crash of fault `k`."""
        inj.push(fault.at_s, k, "crash", inj.sim.fleet.by_name[fault.replica])

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: ReplicaCrash, ev: FaultEvent) -> None:
        """Crash, or restart, the target replica."""
        rep = inj.reps[ev.target]
        if ev.phase == "restart":
            if rep.state != DOWN or rep.idx in inj.upgrade_of:
                # A rolling upgrade has taken the crashed replica out since: it brings it back, upgraded.
                inj.note(now_s, k, "restart_superseded", rep.name)
                return
            restart(inj, rep, now_s, k, None)
            return
        sim = inj.sim
        if rep.state == DOWN:
            return
        draining = rep.state == DRAINING
        inj.note(now_s, k, "crash", rep.name)
        # Tokens each request had streamed from this replica when it died (passes of a fused step
        # that ended before now count: a client receives every pass).
        elapsed = now_s - rep.step_start_s if rep.busy else None
        streamed = {i: rep.engine.outputs_of(sim.request_id(i), elapsed) for i in rep.inflight}
        rep.state = DOWN
        rep.stop(now_s)
        rep.pending.clear()
        if rep.port >= 0:
            sim.net.fail_port(now_s, rep.port)
        rep.engine.abort_all()
        reason = CRASH_REASONS.get(rep.role, "replica_crashed")
        awaiting: set[int] = set()
        for i in sorted(rep.inflight):
            if i not in rep.inflight:
                continue  # already failed or recovered through a failed transfer
            if rep.role == "decode" and sim.awaiting_kv(i):
                # Still prefilling elsewhere: it stays routed here, and its hand-off sees this
                # replica down (recovery) or, once restarted, up (the KV lands on the new process).
                awaiting.add(i)
                continue
            sim.lost(i, now_s, reason, streamed.get(i, 0))
        rep.inflight.intersection_update(awaiting)
        sim.feedback(WorkerDown(now_s, rep.name, "crash"))
        if draining:
            # Drained by the crash: the upgrade that had it out restarts it with the new version (it
            # waited for this replica to empty; the crash's own restart would bring back the old one).
            inj.note(now_s, k, "restart_superseded", rep.name)
            inj.upgrade_drained(rep, now_s)
            return
        if fault.restart_after_s is not None:
            inj.push(now_s + fault.restart_after_s, k, "restart", rep.idx)


@fault_kind(Slowdown)
class SlowdownKind(Interval):
    """Every step of the replica takes `factor` times longer during the interval."""

    def schedule(self, inj: FaultHost, k: int, fault: Slowdown) -> None:
        """Push start and end; steps must not straddle either."""
        super().schedule(inj, k, fault)
        inj.boundary(fault.start_s)
        inj.boundary(fault.end_s)

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: Slowdown, ev: FaultEvent) -> None:
        """Scale the replica's step time by `factor` (start) or back (end)."""
        rep = inj.rep(fault.replica)
        rep.slowdown = rep.slowdown * fault.factor if ev.phase == "start" else rep.slowdown / fault.factor
        inj.note(now_s, k, ev.phase, rep.name)


@fault_kind(KvLinkFault)
class KvLinkKind(Interval):
    """The KV port bandwidth of one replica (or all) is scaled; factor 0 fails transfers."""

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: KvLinkFault, ev: FaultEvent) -> None:
        """Scale the ports' bandwidth (start) or restore it (end): each port keeps the product of
        the factors of the kv_link faults in force on it, so overlapping faults compose."""
        sim = inj.sim
        if not sim.plan.disaggregated:
            inj.note(now_s, k, ev.phase + " (no KV links in a colocated plan)")
            return
        ports = [inj.rep(fault.replica).port] if fault.replica else list(range(len(sim.net.ports)))
        by_factor: dict[float, list[int]] = {}
        for p in ports:
            active = inj.kv_links.setdefault(p, {})
            if ev.phase == "start":
                active[k] = fault.bandwidth_factor
            else:
                active.pop(k, None)
            by_factor.setdefault(math.prod(active.values()), []).append(p)
        for factor, group in by_factor.items():
            sim.net.set_factor(now_s, group, factor)
        inj.note(now_s, k, ev.phase, fault.replica or "all")


@fault_kind(DecodeFull)
class DecodeFullKind(Interval):
    """Decode replicas refuse new KV during the interval (decode admission fails)."""

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: DecodeFull, ev: FaultEvent) -> None:
        """Start or stop refusing KV on the replica (or every decode replica)."""
        reps = [inj.rep(fault.replica)] if fault.replica else [r for r in inj.reps if r.role == "decode"]
        for r in reps:
            inj.sim.refuse(r.idx, ev.phase == "start")
        inj.note(now_s, k, ev.phase, fault.replica or "all decode")


@fault_kind(FailRequests)
class FailRequestsKind(Interval):
    """The replica (or every replica) refuses new requests during the interval (a refused one goes
    to recovery as `replica_refused`; a refused hand-off to a decode replica as `decode_pool_full`)."""

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: FailRequests, ev: FaultEvent) -> None:
        """Start or stop refusing on the replica (or every replica)."""
        for r in [inj.rep(fault.replica)] if fault.replica else inj.reps:
            inj.sim.refuse(r.idx, ev.phase == "start")
        inj.note(now_s, k, ev.phase, fault.replica or "all")


@fault_kind(Hang)
class HangKind(Interval):
    """The replica stops stepping at the end of the step in flight (it still takes requests, and
    the router still sees it healthy) and steps again at the end of the interval."""

    def schedule(self, inj: FaultHost, k: int, fault: Hang) -> None:
        """Push start and end; a fused step must not straddle the start."""
        super().schedule(inj, k, fault)
        inj.boundary(fault.start_s)

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: Hang, ev: FaultEvent) -> None:
        """Stall the replica's steps (start) or let it step again (the end of the last one in force:
        overlapping hangs nest)."""
        rep = inj.rep(fault.replica)
        if ev.phase == "start":
            rep.hangs.add(k)
        else:
            rep.hangs.discard(k)
        rep.stalled = bool(rep.hangs)
        if not rep.stalled:
            rep.kick(now_s)
        inj.note(now_s, k, ev.phase, rep.name)


cannot_simulate(DropStreams, "the simulator has no client connections to cut; a cut stream is a transport "
                             "failure only the gateway's relay sees")


@fault_kind(StaleView)
class StaleViewKind(Interval):
    """The router keeps the view it had at the start of the interval."""

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: StaleView, ev: FaultEvent) -> None:
        """Freeze (start) or thaw (end) the router's view."""
        inj.sim.freeze_view(ev.phase == "start", now_s)
        inj.note(now_s, k, ev.phase)


def upgrade_order(reps: list[Replica], fault: RollingUpgrade) -> list[int]:
    """Replica indices in upgrade order: `pool`'s in plan order; with `matched_with`, the two
    pools' replicas interleaved, the next from the pool with the smaller upgraded fraction
    (ties to `pool`), so each version keeps replicas of both pools until the last turns."""
    a = [r.idx for r in reps if r.pool.name == fault.pool]
    if fault.matched_with is None:
        return a
    b = [r.idx for r in reps if r.pool.name == fault.matched_with]
    out: list[int] = []
    i = j = 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and i * len(b) <= j * len(a)):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


@fault_kind(RollingUpgrade)
class RollingUpgradeKind:
    """`batch` replicas of the pool at a time drain, go down for `restart_after_s`, and return
    with the new model version; once the whole batch is back, the next (`upgrade_order`)."""

    def schedule(self, inj: FaultHost, k: int, fault: RollingUpgrade) -> None:
        """Push the first batch's turn."""
        inj.push(fault.start_s, k, "upgrade_next")

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: RollingUpgrade, ev: FaultEvent) -> None:
        """Drain the next batch, or bring an upgraded replica back and, with its batch back, go on."""
        if ev.phase == "upgrade_back":
            restart(inj, inj.reps[ev.target], now_s, k, fault.new_model_version)
            del inj.upgrade_of[ev.target]
            inj.upgrade_out[k] -= 1
            if inj.upgrade_out[k] > 0:
                return
        todo = inj.upgrade.setdefault(k, upgrade_order(inj.reps, fault))
        batch: list[Replica] = []
        while todo and len(batch) < fault.batch:
            i = todo.pop(0)
            if i not in inj.upgrade_of:  # another upgrade of the pool has it out: that one brings it back
                batch.append(inj.reps[i])
        if not batch:
            inj.note(now_s, k, "done")
            return
        inj.upgrade_out[k] = len(batch)
        for rep in batch:
            inj.upgrade_of[rep.idx] = k
            rep.state = DRAINING
            rep.view_cache = None
            inj.note(now_s, k, "drain", rep.name)
            inj.sim.feedback(WorkerDown(now_s, rep.name, "draining for upgrade"))
        for rep in batch:
            inj.on_replica_progress(rep, now_s)

    def drained(self, inj: FaultHost, rep: Replica, now_s: float, k: int, fault: RollingUpgrade) -> None:
        """A draining replica has nothing left (or crashed): it goes down and comes back upgraded later."""
        rep.state = DOWN
        rep.stop(now_s)
        rep.engine.abort_all()
        inj.note(now_s, k, "down", rep.name)
        inj.push(now_s + fault.restart_after_s, k, "upgrade_back", rep.idx)
