"""Processes of a local fleet: start each, wait for its health route, restart one, stop them all.

Shared by `emulate --plan` (the emulated replicas) and `up` (the replicas plus the gateway).
A process is named; its health URL must answer 200 before the fleet counts as started.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.live.process import stop_with_parent

FLEET_START_TIMEOUT_S = 60.0
"""Wall seconds a fleet's processes get to answer their health route before the command gives up."""
STOP_WAIT_S = 10.0
"""Wall seconds a stopped process gets to exit after SIGTERM before it is killed."""
HEALTH_POLL_S = 0.2


def stop_on_signals() -> None:
    """Make SIGINT (Ctrl-C) and SIGTERM raise KeyboardInterrupt in this process, so a supervisor
    stops its fleet on either. SIGINT is set explicitly: a process started in the background by a
    shell without job control inherits SIGINT ignored, and Python then leaves it ignored."""
    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


@dataclass
class Member:
    """One process of the fleet: its name, command, environment and health URL."""

    name: str
    argv: list[str]
    health_url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None


def _spawn(m: Member) -> subprocess.Popen[bytes]:
    """Start `m`'s process, stopped (SIGTERM) if this supervisor dies without stopping it."""
    return subprocess.Popen(m.argv, env=m.env, preexec_fn=functools.partial(stop_with_parent, os.getpid()))


@dataclass
class LocalFleet:
    """Named processes started together and stopped together."""

    members: list[Member] = field(default_factory=list)
    what: str = "--plan"
    """How errors name the fleet's source (the flag that described it)."""

    def start(self, timeout_s: float = FLEET_START_TIMEOUT_S) -> None:
        """Start every member not running and wait until each answers its health URL."""
        for m in self.members:
            if m.proc is None or m.proc.poll() is not None:
                m.proc = _spawn(m)
        deadline = time.monotonic() + timeout_s
        for m in self.members:
            self._wait_healthy(m, deadline)

    def restart(self, name: str, timeout_s: float = FLEET_START_TIMEOUT_S) -> None:
        """Start member `name` again (after it exited) and wait for its health."""
        m = self.member(name)
        if m.proc is not None and m.proc.poll() is None:
            return
        m.proc = _spawn(m)
        self._wait_healthy(m, time.monotonic() + timeout_s)

    def member(self, name: str) -> Member:
        """The member called `name`."""
        return next(m for m in self.members if m.name == name)

    def exited(self) -> list[Member]:
        """Members whose process has ended."""
        return [m for m in self.members if m.proc is not None and m.proc.poll() is not None]

    def stop(self) -> None:
        """SIGTERM every running member, then kill what has not exited after STOP_WAIT_S."""
        running = [m.proc for m in self.members if m.proc is not None and m.proc.poll() is None]
        for p in running:
            p.terminate()  # the servers shut down gracefully on SIGTERM
        for p in running:
            try:
                p.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _wait_healthy(self, m: Member, deadline: float) -> None:
        assert m.proc is not None
        while True:
            if m.proc.poll() is not None:
                raise SpecError(f"{self.what}: {m.name} exited with status {m.proc.returncode} at start "
                                "(see its message above)")
            try:
                with urllib.request.urlopen(m.health_url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SpecError(f"{self.what}: {m.name} did not answer {m.health_url} within "
                                f"{FLEET_START_TIMEOUT_S:g} s")
            time.sleep(HEALTH_POLL_S)
