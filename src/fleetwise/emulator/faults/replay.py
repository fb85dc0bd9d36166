"""A fault file as timed actions on a live emulated fleet: each fault kind's live effect.

One fault vocabulary (`fleetwise.spec.faults`): the file `fleetwise simulate --faults` reads
(modelled seconds from the start) is replayed against a running fleet by `fleetwise up --faults`
and `fleetwise emulate --plan --faults`. Every spec kind registers here once (`LIVE`): a converter
to `LiveAction`s (a `POST /admin/faults` body sent to a replica at a modelled time, or a restart of
the replica's process; the admin kinds register theirs through `faults.register`), or the reason
a live fleet cannot model it (`CannotModel`), which refuses the file by name before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.registry import Registry
from fleetwise.spec.faults import CannotModel, FaultScenario, RollingUpgrade, StaleView
from fleetwise.spec.plan import PlanSpec


@dataclass(frozen=True)
class LiveAction:
    """At modelled time `at_s`, send `body` to replica `replica`'s /admin/faults, or (body None)
    start the replica's process again."""

    at_s: float
    replica: str
    body: dict[str, Any] | None
    what: str
    """One line for the operator (what happens, to whom)."""


Converter = Callable[[Any, PlanSpec], list[LiveAction]]
LIVE: Registry[type, Converter | CannotModel] = Registry("live fault effect")
"""Spec fault model -> its live effect (a converter to timed actions) or why a live fleet cannot model it."""


def live_effect(kind: type) -> Callable[[Converter], Converter]:
    """Register the converter of one spec fault kind (once)."""
    return LIVE.register(kind)


def replica_names(plan: PlanSpec, role: str | None = None) -> list[str]:
    """Every replica of `plan` as `<pool>-<index>` in plan order (only `role`'s pools when given)."""
    return [f"{p.name}-{i}" for p in plan.pools if role is None or p.role == role for i in range(p.replicas)]


def interval_actions(fault: Any, plan: PlanSpec, body: dict[str, Any], what: str,
                     role: str | None = None) -> list[LiveAction]:
    """`body` (an admin fault body) sent at `fault.start_s` to its replica (or every replica of
    `role`, or of the plan), cleared by the replica itself after `end_s - start_s` modelled seconds."""
    span = fault.end_s - fault.start_s
    names = [fault.replica] if fault.replica else replica_names(plan, role)
    return [LiveAction(fault.start_s, n, {**body, "duration_s": span}, f"{n}: {what} for {span:g} modelled s")
            for n in names]


LIVE.add(StaleView, CannotModel("the router's view is the gateway's, and faults are injected into replicas"))
LIVE.add(RollingUpgrade, CannotModel(
    "a live fleet restarts a replica only with the model version it was started with"))


def live_actions(scenario: FaultScenario, plan: PlanSpec, where: str) -> list[LiveAction]:
    """Every fault of `scenario` as live actions in time order; SpecError naming a fault whose kind
    a live fleet cannot replay, and why."""
    out: list[LiveAction] = []
    for k, f in enumerate(scenario.faults):
        conv = LIVE.get(type(f))
        if not callable(conv):
            why = conv.why if conv is not None else "no live effect is registered"
            raise SpecError(f"{where}: faults.{k} ({f.kind}): a live fleet cannot replay it: {why}; remove it, "
                            "or run the scenario in the simulator (`fleetwise simulate PLAN --faults`)")
        try:
            out.extend(conv(f, plan))
        except SpecError as err:  # these parameters of the kind cannot be replayed (the reason)
            raise SpecError(f"{where}: faults.{k} ({f.kind}): {err}") from None
    return sorted(out, key=lambda a: a.at_s)
