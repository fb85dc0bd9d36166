"""A fault file replayed on a live emulated fleet, for `fleetwise up` and `fleetwise emulate --plan`.

Owns loading the file for a live fleet (validated once: the file, the plan's replicas and pools,
each kind's live effect; `emulator.faults.replay.live_actions`) and sending each action on time:
a `POST /admin/faults` body to the replica, or the restart of a crashed replica's process.
Times are modelled seconds from the start of the replay, so at `--time-scale X` an action at
`at_s` happens `at_s / X` wall seconds in.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from fleetwise.spec.output import strict_json_dumps

SUPERVISE_POLL_S = 0.2
"""Wall seconds between two looks at a supervised fleet (faults due, processes exited)."""
POST_TIMEOUT_S = 5.0
"""Wall seconds an admin fault request may take (a replica answers at once; a crash closes the connection)."""


def live_fault_actions(path: str, plan: Any) -> list[Any]:
    """The fault file at `path` as timed live actions on `plan`'s fleet; SpecError naming the field,
    or the fault a live fleet cannot replay and why."""
    from fleetwise.emulator.faults.replay import live_actions
    from fleetwise.spec.faults import FaultScenario, check_faults_apply

    scenario = FaultScenario.load(path)
    check_faults_apply(scenario, plan, path)
    return live_actions(scenario, plan, path)


def post_fault(url: str, token: str, body: dict[str, Any]) -> str:
    """Send one admin fault body to the replica at `url`; its HTTP status, or what the connection did."""
    req = urllib.request.Request(url + "/admin/faults", data=strict_json_dumps(body, indent=None).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=POST_TIMEOUT_S) as r:
            return f"{r.status}"
    except OSError as err:  # a crash takes the connection with it
        return f"sent ({type(err).__name__})"


class FaultReplay:
    """Sends the actions that are due, in time order, to a running `LocalFleet` of replicas."""

    def __init__(self, actions: list[Any], fleet: Any, urls: dict[str, str], token: str, time_scale: float,
                 command: str) -> None:
        self.pending = list(actions)
        self.fleet, self.urls, self.token, self.time_scale, self.command = fleet, urls, token, time_scale, command
        self.t0 = time.monotonic()
        self.sent: list[Any] = []
        """Interval actions already due (their bodies carry `duration_s`), to resume after a restart."""

    def tick(self) -> list[str]:
        """Send every action due by now (printing one line each); the replicas restarted."""
        modelled = (time.monotonic() - self.t0) * self.time_scale
        restarted = []
        while self.pending and self.pending[0].at_s <= modelled:
            a = self.pending.pop(0)
            if a.body is None:
                self.fleet.restart(a.replica)
                restarted.append(a.replica)
                status = "serving"
            else:
                status = post_fault(self.urls[a.replica], self.token, a.body)
                if "duration_s" in a.body:
                    self.sent.append(a)
            print(f"fleetwise {self.command}: t={a.at_s:g} modelled s: {a.what} ({status})", flush=True)
            if a.body is None:
                self._resume(a.replica, a.at_s)
        return restarted

    def _resume(self, replica: str, now_s: float) -> None:
        """Send a restarted `replica` the interval faults still in force at `now_s`, for what is
        left of them: a new process starts without them, as the simulator's replica keeps them
        across a restart (all but a hang, which a restart ends there too)."""
        for a in self.sent:
            end = a.at_s + a.body["duration_s"]
            if a.replica == replica and a.body.get("kind") != "hang" and a.at_s <= now_s < end:
                status = post_fault(self.urls[replica], self.token, {**a.body, "duration_s": end - now_s})
                print(f"fleetwise {self.command}: t={now_s:g} modelled s: {replica}: {a.body['kind']} again after "
                      f"its restart, for {end - now_s:g} modelled s ({status})", flush=True)

    @property
    def restarts_pending(self) -> bool:
        """A crashed replica is still to be started again."""
        return any(a.body is None for a in self.pending)
