"""`fleetwise gateway --workers N`: N processes on one port (SO_REUSEPORT), each answering
requests on its own (their request ids carry their process id), all stopped by one SIGTERM; one
gateway or several stopped by Ctrl-C or SIGTERM exit 0, also when started as a shell's background
job (SIGINT inherited ignored)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

RESPONDER = Path(__file__).parent / "responder.py"
WALL_S = 60.0
CONNECTIONS = 40
"""Fresh connections sent; the kernel spreads them over the workers by their ports (all on one
worker of two has probability 2^-39)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WALL_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, f"{url} did not start"
            time.sleep(0.2)


@pytest.mark.slow
def test_two_workers_share_the_port_answer_alike_and_stop_together() -> None:
    bport, gport = _free_port(), _free_port()
    backend = subprocess.Popen([sys.executable, str(RESPONDER), "--port", str(bport)], stdout=subprocess.DEVNULL,
                               start_new_session=True)
    gateway = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "gateway", "--workers", "2", "--backend",
                                f"http://127.0.0.1:{bport}", "--model", "m", "--port", str(gport)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _ready(f"http://127.0.0.1:{bport}/health", backend)
        _ready(f"http://127.0.0.1:{gport}/health", gateway)
        prefixes = set()
        for i in range(CONNECTIONS):
            req = urllib.request.Request(f"http://127.0.0.1:{gport}/v1/completions", method="POST",
                                         data=json.dumps({"model": "m", "prompt": f"hi {i}", "max_tokens": 2}).encode(),
                                         headers={"content-type": "application/json", "connection": "close"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["choices"]
                prefixes.add(r.headers["x-request-id"][:8])  # the worker's process id
        assert len(prefixes) == 2
        gateway.send_signal(signal.SIGTERM)
        out, err = gateway.communicate(timeout=30)
        assert gateway.returncode == 0, err.decode()[-2000:]
        assert b"2 workers" in out
        with pytest.raises(OSError):  # nothing listens any more
            socket.create_connection(("127.0.0.1", gport), timeout=1).close()
    finally:
        for p in (gateway, backend):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_gateway_with_exit_0_though_sigint_was_ignored(workers, signum) -> None:
    gport = _free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "gateway", "--workers", str(workers),
                                "--backend", "http://127.0.0.1:9", "--model", "m", "--port", str(gport)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # a background job
    try:
        _ready(f"http://127.0.0.1:{gport}/health", gateway)
        gateway.send_signal(signum)  # to the command's process only, not its group
        _, err = gateway.communicate(timeout=30)
        assert gateway.returncode == 0, err.decode()[-2000:]
        assert b"exited with status" not in err and b"Traceback" not in err
    finally:
        if gateway.poll() is None:
            os.killpg(gateway.pid, signal.SIGKILL)  # the workers too
            gateway.wait()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_port_0_prints_the_port_the_system_picked(workers) -> None:
    # it printed http://127.0.0.1:0 (with --workers too), leaving the user no way to reach the gateway
    gateway = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "gateway", "--backend",
                                "http://127.0.0.1:9", "--model", "m", "--port", "0", "--workers", str(workers)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = gateway.stdout.readline().decode() if gateway.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        port = int(found.group(1))
        assert port > 0, line
        _ready(f"http://127.0.0.1:{port}/health", gateway)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.communicate(timeout=30)
    assert gateway.returncode == 0


@pytest.mark.slow
def test_workers_stop_when_the_gateway_process_is_killed() -> None:
    # SIGKILL runs no handler: the workers kept serving the port with no parent
    gport = _free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "gateway", "--workers", "2",
                                "--backend", "http://127.0.0.1:9", "--model", "m", "--port", str(gport)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _ready(f"http://127.0.0.1:{gport}/health", gateway)
        gateway.kill()
        gateway.wait(10)
        deadline = time.monotonic() + WALL_S
        while True:  # nothing listens once both workers have stopped
            try:
                socket.create_connection(("127.0.0.1", gport), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, "the workers kept serving after the gateway was killed"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gateway.pid, signal.SIGKILL)  # the workers too, if still there
