"""Process helpers shared by the live benchmarks: a free loopback port, a process's CPU seconds
(Linux /proc) and stopping a process group started with `start_new_session=True`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second of /proc/PID/stat's time fields."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of `pid` in seconds (/proc/PID/stat fields 14-15), plus its waited-for
    children's (fields 16-17) when `children`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / CLK_TCK


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of `proc`, SIGKILL after 10 s; quiet if it is already gone."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except (ProcessLookupError, PermissionError):
        pass


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll `url`/health until it answers; fail when `proc` exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{url} did not start") from None
            time.sleep(0.2)
