"""Emulators as real processes on 127.0.0.1: streaming over TCP, a cut stream, a crash that exits,
client disconnects aborting requests, and `fleetwise emulate --help` documenting every option."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from emu_helpers import TOKEN, sse_events

from fleetwise.cli.emulate_cmd import FLEET_START_TIMEOUT_S
from fleetwise.cli.main import build_parser, main

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def emulator(*args: str, sigint_ignored: bool = False) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`fleetwise emulate` on a free port, healthy; `sigint_ignored`: started as a shell's background job."""
    port = free_port()
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", "llama-3.1-8b",
                             "--gpu", "h100-sxm", "--host", "127.0.0.1", "--port", str(port), "--time-scale", "50",
                             "--admin-token", TOKEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ignore)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "emulator did not start"
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_live_streaming_cut_stream_and_crash():
    with emulator() as (proc, url), httpx.Client(base_url=url, timeout=10.0) as c:
        s = sse_events(c.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 5, "stream": True,
                                                       "stream_options": {"include_usage": True}}).text)
        assert s[-1] == "[DONE]" and s[-2]["usage"]["completion_tokens"] == 5
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 2}).status_code == 401
        assert c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 2},
                      headers=auth).status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            c.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 50, "stream": True})
        c.post("/admin/faults", json={"kind": "clear"}, headers=auth)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        with contextlib.suppress(httpx.HTTPError):
            c.post("/admin/faults", json={"kind": "crash"}, headers=auth)
        assert proc.wait(10) == 1


@pytest.mark.parametrize("sigint_ignored", [False, True])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_emulator_with_exit_0(signum, sigint_ignored):
    # uvicorn raises the signal again once stopped: exit 143 on SIGTERM, 130 on Ctrl-C, unless kept
    with emulator(sigint_ignored=sigint_ignored) as (proc, url):
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=START_TIMEOUT_S)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert b"interrupted" not in err and b"Traceback" not in err


def test_port_0_prints_the_port_the_system_picked():
    # it printed http://127.0.0.1:0, leaving the user no way to reach the replica
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", "llama-3.1-8b",
                             "--gpu", "h100-sxm", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode() if proc.stdout else ""
        port = int(line.rsplit(":", 1)[1])
        assert port > 0, line
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10.0).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0


@pytest.mark.parametrize("flags,needle", [
    (["--port", "65534"], "--port=65534: the plan's replicas take ports 65534..65537, past the last TCP port 65535; "
                          "give --port 65532 or lower"),
    (["--port", "0"], "--port=0: the plan's replicas take consecutive ports from --port"),
    (["--port", "8001", "--kv-events-port", "65530"], "--kv-events-port=65530: the plan's replicas' KV events take "
                                                      "ports 65530..65537"),
], ids=["past-65535", "port-0", "kv-events-past-65535"])
def test_a_fleet_past_the_last_port_or_on_port_0_is_refused_before_it_starts(capsys, flags, needle):
    # a replica past 65535 failed its own flag check ("--port ... got '65536'"); on port 0 the fleet
    # waited its whole start timeout for a health route it could not find
    plan = Path(__file__).resolve().parents[2] / "examples" / "plans" / "colocated-8b.yaml"
    assert main(["emulate", "--plan", str(plan), *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("command", ["emulate", "up"])
def test_a_local_fleet_of_more_replicas_than_the_limit_is_refused_before_it_starts(capsys, tmp_path, command):
    # 500 replicas started 500 emulator processes (about 75 MB each) on the machine
    plan = Path(__file__).resolve().parents[2] / "examples" / "plans" / "colocated-8b.yaml"
    big = tmp_path / "big.yaml"
    big.write_text(plan.read_text().replace("replicas: 4", "replicas: 500"))
    argv = ["emulate", "--plan", str(big), "--port", "8001"] if command == "emulate" else ["up", str(big)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{big}: 500 replicas: a local fleet starts at most 64 emulator processes" in err


def _metric_value(text: str, prefix: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(prefix))
    return float(line.rsplit(" ", 1)[1])


def test_live_client_disconnects_abort_their_requests():
    with emulator() as (proc, url), httpx.Client(base_url=url, timeout=10.0) as c:
        long = {"prompt": "hi there " * 50, "max_tokens": 20000, "ignore_eos": True}  # ~3 s of wall time
        with c.stream("POST", "/v1/completions", json={**long, "stream": True}) as r:
            lines = r.iter_lines()
            assert sum(1 for _, ln in zip(range(6), lines, strict=False) if ln.startswith("data: ")) >= 2
        with pytest.raises(httpx.TimeoutException):  # a non-streaming client that gives up
            c.post("/v1/completions", json=long, timeout=0.3)
        deadline = time.monotonic() + 10
        while True:  # the engine lets go of an aborted request at the next step boundary
            text = c.get("/metrics").text
            got = (_metric_value(text, 'vllm:request_success_total{engine="0",finished_reason="abort"'),
                   _metric_value(text, "vllm:num_requests_running{"), _metric_value(text, "vllm:kv_cache_usage_perc{"))
            if got == (2, 0, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got == (2, 0, 0)  # both aborted, nothing running, their KV freed


def test_live_kv_events_over_zeromq():
    pub_port, replay_port = free_port(), free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub_port}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "topic": ""}
    ctx = zmq.Context()
    try:
        with emulator("--kv-events-config", json.dumps(config)) as (proc, url), \
                httpx.Client(base_url=url, timeout=10.0) as c:
            prompt = "one two three four five six seven eight " * 8
            assert c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2}).status_code == 200
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(config["replay_endpoint"])
            sock.send_multipart([b"", (0).to_bytes(8, "big")])
            frames = []
            while not frames or frames[-1][1] != (-1).to_bytes(8, "big", signed=True):
                assert sock.poll(10_000), "no replay answer"
                frames.append(sock.recv_multipart())
            ts, events = msgpack.unpackb(frames[0][2])
            stored = [e for e in events if e[0] == "BlockStored"]
            assert int.from_bytes(frames[0][1], "big") == 0 and stored and stored[0][4:7] == [16, None, "GPU"]
    finally:
        ctx.destroy(0)


def test_bad_option_exits_2_with_one_line():
    r = subprocess.run([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", "llama-3.1-8b",
                        "--gpu", "h100-sxm", "--time-scale", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--time-scale" in r.stderr and "'0'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", "llama-3.1-8bb",
                        "--gpu", "h100-sxm"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown model" in r.stderr and "Traceback" not in r.stderr


def test_help_documents_every_option():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    emulate = sub.choices["emulate"]  # type: ignore[union-attr]
    text = emulate.format_help()
    for action in emulate._actions:
        for flag in action.option_strings:
            assert flag in text
        if action.dest != "help":
            assert action.help, action.dest


PD_PLAN = """
name: pd-small
pools:
  - {name: prefill, role: prefill, replicas: 1, accelerator: h100-sxm, model: llama-3.1-8b}
  - {name: decode, role: decode, replicas: 1, accelerator: h100-sxm, model: llama-3.1-8b}
kv_link: {gbps: 100}
routing: round-robin
"""


def free_port_pair() -> int:
    """A port p such that p and p + 1 are both free now (a plan's replicas take consecutive ports)."""
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = int(a.getsockname()[1])
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


PD_FLEET_WAIT_S = FLEET_START_TIMEOUT_S + START_TIMEOUT_S
"""Wall seconds the test waits for the fleet: longer than the fleet's own start limit (after
which it exits with its message), plus the interpreter's start-up on a contended host."""
PD_KV_LEASE_S = 36000.0
"""Modelled seconds: 720 s of wall time at time scale 50, so a prefill answer's lease outlives
any stall of a contended host between the answer and the decode request (the default, 480
modelled s, is under 10 s of wall time at that scale)."""
PD_HTTP_TIMEOUT_S = 60.0
"""Per-request wall limit: generous, since replicas may run at idle priority on a busy host."""


def _wait_json(path: Path, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> Any:
    """The JSON in `path` once it is complete (the fleet writes it while the test polls)."""
    while True:
        assert proc.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, "fleet did not start:\n" + log.read_text(errors="replace")
        if path.exists():
            with contextlib.suppress(ValueError):
                return json.loads(path.read_text())
        time.sleep(0.1)


def test_a_pd_fleet_from_a_plan_hands_off_over_tcp(tmp_path):
    plan = tmp_path / "pd.yaml"
    plan.write_text(PD_PLAN)
    endpoints = tmp_path / "endpoints.json"
    log = tmp_path / "fleet.log"
    port = free_port_pair()
    with log.open("wb") as out:  # a file, not a pipe nobody drains (the replicas log to it too)
        proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--plan", str(plan),
                                 "--port", str(port), "--time-scale", "50", "--endpoints", str(endpoints),
                                 "--kv-lease", str(PD_KV_LEASE_S), "--admin-token", TOKEN],
                                stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as a background job starts
    try:
        eps = {e["name"]: e for e in _wait_json(endpoints, proc, log, time.monotonic() + PD_FLEET_WAIT_S)}
        assert eps["prefill-0"]["role"] == "prefill" and eps["decode-0"]["url"] == f"http://127.0.0.1:{port + 1}"
        prompt = "a long enough prompt " * 40
        with httpx.Client(timeout=PD_HTTP_TIMEOUT_S) as c:
            p = c.post(eps["prefill-0"]["url"] + "/v1/completions", json={
                "prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}).json()
            ktp = p["kv_transfer_params"]
            assert ktp["remote_host"] == "127.0.0.1" and ktp["remote_port"] == port
            s = sse_events(c.post(eps["decode-0"]["url"] + "/v1/completions", json={
                "prompt": prompt, "max_tokens": 6, "stream": True, "kv_transfer_params": ktp}).text)
            assert s[-1] == "[DONE]" and s[-2]["choices"][0]["finish_reason"] == "length"
            assert c.get(eps["prefill-0"]["url"] + "/fleetwise/status").json()["leases"] == 0
            auth = {"Authorization": f"Bearer {TOKEN}"}  # the token reached the children
            assert c.get(eps["decode-0"]["url"] + "/admin/faults", headers=auth).status_code == 200
            # A crashed replica leaves the rest of the fleet serving.
            with contextlib.suppress(httpx.HTTPError):
                c.post(eps["decode-0"]["url"] + "/admin/faults", json={"kind": "crash"}, headers=auth)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:  # until the crash has taken the decode replica's port away
                try:
                    c.get(eps["decode-0"]["url"] + "/health", timeout=1.0)
                except httpx.HTTPError:
                    break
                assert time.monotonic() < deadline, "the crashed replica still answers"
                time.sleep(0.1)
            time.sleep(1.0)  # the fleet polls its children every 0.5 s: it has seen the exit
            assert proc.poll() is None, log.read_text(errors="replace")
            assert c.get(eps["prefill-0"]["url"] + "/health").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, though started with it ignored
        try:  # the fleet gives each replica 10 s to stop before it kills it
            assert proc.wait(PD_FLEET_WAIT_S) == 0, log.read_text(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()
