"""What a simulator fault kind is, what it acts through, and where kinds register.

Owns `FaultTarget` (the narrow view of the simulation a fault may act on; the runner satisfies
it), `FaultHost` (the injector's calls a kind uses; `faults.FaultInjector` satisfies it),
`FaultKind` and the registry (`fault_kind`, `cannot_simulate`, `FAULT_KINDS`). Imports neither the injector nor
the kinds, so `fault_kinds` and `faults` both depend on it downward. Does not schedule anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from fleetwise.core.feedback import Feedback
from fleetwise.registry import Registry
from fleetwise.sim.events import EventLoop, FaultEvent
from fleetwise.sim.fleet import Fleet, Replica
from fleetwise.sim.network import KvNetwork
from fleetwise.spec.faults import CannotModel
from fleetwise.spec.plan import PlanSpec


class FaultTarget(Protocol):
    """What a fault may act on: the simulation's loop, fleet, network and plan, and four calls."""

    loop: EventLoop
    fleet: Fleet
    net: KvNetwork
    plan: PlanSpec

    def feedback(self, fb: Feedback) -> None:
        """Report a worker event (down, up) to the routing policy."""
        ...

    def request_id(self, i: int) -> str:
        """The id of request index `i`."""
        ...

    def awaiting_kv(self, i: int) -> bool:
        """Request `i` was routed to a decode replica whose KV has not landed yet."""
        ...

    def lost(self, i: int, now_s: float, reason: str, streamed: int) -> None:
        """Request `i` lost its replica at `now_s` after `streamed` output tokens: recover or fail it."""
        ...

    def refuse(self, replica: int, refusing: bool) -> None:
        """Replica index `replica` starts (True) or stops refusing new requests (a decode replica: new KV)."""
        ...

    def freeze_view(self, frozen: bool, now_s: float) -> None:
        """One more stall keeps the router's current fleet view (True; the fleet at `now_s` when it
        has none yet), or one fewer (False): it refreshes again when none is left."""
        ...


class FaultHost(Protocol):
    """What a fault kind acts through: the injector's simulation, replicas, faults and calls."""

    sim: FaultTarget
    reps: list[Replica]
    faults: list[Any]
    upgrade: dict[int, list[int]]
    """Rolling upgrade fault -> replica indices still to upgrade."""
    upgrade_out: dict[int, int]
    """Rolling upgrade fault -> replicas of its current batch not back yet."""
    upgrade_of: dict[int, int]
    """Replica index -> the rolling upgrade fault that has it out (draining or down)."""
    kv_links: dict[int, dict[int, float]]
    """KV port -> {kv_link fault in force: its bandwidth factor} (overlapping faults compose)."""

    def push(self, t_s: float, k: int, phase: str, target: int = -1) -> None:
        """Schedule phase `phase` of fault `k` at `t_s` (on replica index `target`)."""
        ...

    def boundary(self, t_s: float) -> None:
        """Steps must not straddle `t_s` (a step-time change)."""
        ...

    def rep(self, name: str) -> Replica:
        """The replica named `name`."""
        ...

    def note(self, now_s: float, k: int, phase: str, target: str = "") -> None:
        """Log what fault `k` did at `now_s`."""
        ...

    def on_replica_progress(self, rep: Replica, now_s: float) -> None:
        """A replica finished or handed off work (a draining one with nothing left goes down)."""
        ...

    def upgrade_drained(self, rep: Replica, now_s: float) -> None:
        """The rolling upgrade that has `rep` out takes it down (drained, or crashed while draining)."""
        ...


class FaultKind(Protocol):
    """One kind of fault: when its events happen, and what each does."""

    def schedule(self, inj: FaultHost, k: int, fault: Any) -> None:
        """Push the events of fault `k` (its spec `fault`) on the loop."""
        ...

    def apply(self, inj: FaultHost, now_s: float, k: int, fault: Any, ev: FaultEvent) -> None:
        """Apply event `ev` of fault `k` at `now_s`."""
        ...


FAULT_KINDS: Registry[type, FaultKind | CannotModel] = Registry("simulated fault kind")
"""Fault spec model -> its simulated effect (`fault_kind`) or why the simulator cannot model it (`cannot_simulate`)."""
K = TypeVar("K")


def fault_kind(spec_model: type) -> Callable[[type[K]], type[K]]:
    """Class decorator registering the simulated effect of `spec_model` (a model of `spec.faults`)."""
    def register(cls: type[K]) -> type[K]:
        FAULT_KINDS.add(spec_model, cls())  # type: ignore[arg-type]
        return cls
    return register


def cannot_simulate(spec_model: type, why: str) -> None:
    """Register that the simulator cannot model `spec_model`, and why (a fault file using it is refused)."""
    FAULT_KINDS.add(spec_model, CannotModel(why))
