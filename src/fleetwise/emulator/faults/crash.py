"""`crash`: the server process exits at once (exit code 1), as an engine that dies does; a fault
file's crash restarts the replica's process after `restart_after_s`."""

from __future__ import annotations

from typing import Any

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register
from fleetwise.emulator.faults.replay import LiveAction
from fleetwise.spec import faults as vocab
from fleetwise.spec.plan import PlanSpec


@register
class Crash(FaultKind):
    spec = vocab.ReplicaCrash

    def apply(self, state: FaultState, p: FaultParams, actions: FaultActions) -> int:
        actions.crash()
        return super().apply(state, p, actions)

    def actions(self, fault: Any, plan: PlanSpec) -> list[LiveAction]:
        """The crash at `at_s`, and the process started again `restart_after_s` later (if ever)."""
        out = [LiveAction(fault.at_s, fault.replica, {"kind": self.name}, f"crash {fault.replica}")]
        if fault.restart_after_s is not None:
            out.append(LiveAction(fault.at_s + fault.restart_after_s, fault.replica, None, f"restart {fault.replica}"))
        return out
