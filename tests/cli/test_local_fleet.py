"""`cli.local_fleet`: a fleet's processes stop with their supervisor, even one killed outright
(SIGKILL runs no handler: `fleetwise up` killed so left its replicas and gateway serving)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RESPONDER = Path(__file__).resolve().parents[1] / "gateway" / "responder.py"
GONE_WITHIN_S = 20.0
"""A member of a killed supervisor has exited within this (it gets SIGTERM at once)."""
SUPERVISOR = """
import sys, time
from fleetwise.cli.local_fleet import LocalFleet, Member
port = int(sys.argv[1])
fleet = LocalFleet([Member("r0", [sys.executable, sys.argv[2], "--port", str(port)],
                           f"http://127.0.0.1:{port}/health", {})])
fleet.start(60)
print("member", fleet.members[0].proc.pid, flush=True)
time.sleep(600)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_member_stops_when_its_supervisor_is_killed() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(_free_port()), str(RESPONDER)],
                           stdout=subprocess.PIPE, env=env)
    member = 0
    try:
        for line in sup.stdout or ():  # the member's own lines share the pipe
            if line.startswith(b"member "):
                member = int(line.split()[1])
                break
        assert member > 0 and _alive(member)
        sup.kill()
        sup.wait(10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(member):  # our grandchild: reaped by init (or a subreaper) once it exits
            assert time.monotonic() < deadline, "the member kept running after its supervisor was killed"
            time.sleep(0.1)
    finally:
        if sup.poll() is None:
            sup.kill()
        if member and _alive(member):
            os.kill(member, signal.SIGKILL)
