"""A simulator fault scenario as timed actions on a live emulated fleet.

One fault vocabulary: the fault file `fleetwise simulate --faults` reads (`spec.faults`,
modelled seconds from the start) is replayed against a running fleet by `fleetwise up --faults`.
Each spec kind with a live counterpart registers one converter here, mapping it to `LiveAction`s:
a `POST /admin/faults` body sent to a replica at a modelled time, or a restart of the replica's
process. A kind without one is refused by name before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.registry import Registry
from fleetwise.spec.faults import DecodeFull, FaultScenario, ReplicaCrash, Slowdown
from fleetwise.spec.plan import PlanSpec

LIVE_KINDS = ("crash", "slowdown", "decode_full")
"""Spec fault kinds a live fleet replays."""


@dataclass(frozen=True)
class LiveAction:
    """At modelled time `at_s`, send `body` to replica `replica`'s /admin/faults, or (body None)
    start the replica's process again."""

    at_s: float
    replica: str
    body: dict[str, Any] | None
    what: str
    """One line for the operator (what happens, to whom)."""


Converter = Callable[[Any, "PlanSpec"], list[LiveAction]]
CONVERTERS: Registry[type, Converter] = Registry("live fault converter")


def converts(kind: type) -> Callable[[Converter], Converter]:
    """Register the converter of one spec fault kind (once)."""
    return CONVERTERS.register(kind)


@converts(ReplicaCrash)
def _crash(f: ReplicaCrash, plan: PlanSpec) -> list[LiveAction]:
    out = [LiveAction(f.at_s, f.replica, {"kind": "crash"}, f"crash {f.replica}")]
    if f.restart_after_s is not None:
        out.append(LiveAction(f.at_s + f.restart_after_s, f.replica, None, f"restart {f.replica}"))
    return out


@converts(Slowdown)
def _slowdown(f: Slowdown, plan: PlanSpec) -> list[LiveAction]:
    body = {"kind": "slowdown", "factor": f.factor, "duration_s": f.end_s - f.start_s}
    return [LiveAction(f.start_s, f.replica, body, f"slow {f.replica} down x{f.factor:g} for "
                                                    f"{f.end_s - f.start_s:g} modelled s")]


@converts(DecodeFull)
def _decode_full(f: DecodeFull, plan: PlanSpec) -> list[LiveAction]:
    """A full decode replica refuses the hand-off: it answers new requests 503 for the interval,
    so the prefill side frees the KV and the request is prefilled again, as in the simulator."""
    names = [f.replica] if f.replica else [f"{p.name}-{i}" for p in plan.pools if p.role == "decode"
                                           for i in range(p.replicas)]
    body = {"kind": "fail_requests", "status": 503, "duration_s": f.end_s - f.start_s}
    return [LiveAction(f.start_s, n, body, f"{n} refuses new KV (decode full) for {f.end_s - f.start_s:g} "
                                           "modelled s") for n in names]


def live_actions(scenario: FaultScenario, plan: PlanSpec, where: str) -> list[LiveAction]:
    """Every fault of `scenario` as live actions in time order; SpecError naming a fault whose kind
    a live fleet cannot replay."""
    out: list[LiveAction] = []
    for k, f in enumerate(scenario.faults):
        conv = CONVERTERS.get(type(f))
        if conv is None:
            raise SpecError(f"{where}: faults.{k} ({f.kind}): a live fleet replays {', '.join(LIVE_KINDS)} only; "
                            f"remove it, or run the scenario in the simulator (`fleetwise simulate PLAN --faults`)")
        out.extend(conv(f, plan))
    return sorted(out, key=lambda a: a.at_s)
