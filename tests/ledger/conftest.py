"""Fixtures for ledger tests: a throwaway PostgreSQL server (initdb + pg_ctl in a temp dir).

The server listens on 127.0.0.1 on a free port, trusts local connections, and is stopped and
deleted at the end of the session. Debian's `postgresql` package provides the binaries
(`.ci/run` installs it where missing); as root the server runs as `nobody` (initdb refuses
root). Tests that need it skip, naming the reason, only when the binaries are not installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 60
"""pg_ctl waits at most this long for the server to accept connections."""


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """The session's PostgreSQL server: its URL, and `restart` to take it down and up again."""

    url: str
    prefix: list[str]
    pg_ctl: str
    data: str
    root: str
    port: int

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", self.data, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=START_TIMEOUT_S)

    def start(self) -> None:
        self._ctl("-l", str(Path(self.root) / "log"), "-w", "-t", str(START_TIMEOUT_S),
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.root} -F", "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "stop")

    def restart(self, down_s: float) -> None:
        """Stop the server (open connections are cut), stay down `down_s` seconds, start it again."""
        self.stop()
        time.sleep(down_s)
        self.start()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """A fresh PostgreSQL server owned by user `fleetwise` on 127.0.0.1 (one per session)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                    "`apt-get install -y postgresql` (as .ci/run does) to run the shared-ledger tests")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'fleetwise[postgres]')")
    prefix: list[str] = []
    root = tempfile.mkdtemp(prefix="fleetwise-pg-")
    if os.geteuid() == 0:
        user = pwd.getpwnam("nobody")
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "nobody", "--"]
    data, port = str(Path(root) / "data"), _free_port()
    srv = PgServer(f"postgresql://fleetwise@127.0.0.1:{port}/postgres", prefix, pg_ctl, data, root, port)
    try:
        subprocess.run([*prefix, initdb, "-D", data, "-A", "trust", "-U", "fleetwise", "--no-sync", "-E", "UTF8"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=START_TIMEOUT_S)
        srv.start()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {getattr(err, 'stderr', b'')!r}") from err
    try:
        yield srv
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            srv.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PgServer) -> str:
    """URL of the session server's `postgres` database."""
    return postgres_server.url


@pytest.fixture()
def pg_database(postgres_url: str, request: pytest.FixtureRequest) -> str:
    """URL of a new, empty database on the session's server (one per test)."""
    import psycopg

    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each ledger test runs on both backends: an SQLite file and a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("pg_database"))


# The live metering tests drive the gateway through its own test harness and responder.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
