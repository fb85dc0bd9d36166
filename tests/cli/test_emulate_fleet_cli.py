"""`emulate --plan`: a replica whose port another server holds fails the command loudly before any
replica starts, and `--endpoints` lists only replicas that are serving."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleetwise.cli.emulate_cmd import serving
from fleetwise.cli.main import main

PLAN = """\
name: pd
pools:
  - {name: prefill, role: prefill, replicas: 1, accelerator: h100-sxm, model: llama-3.1-8b}
  - {name: decode, role: decode, replicas: 1, accelerator: h100-sxm, model: llama-3.1-8b}
kv_link: {gbps: 100}
routing: round-robin
"""


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_port_held_by_another_server_is_refused_before_any_replica_starts(tmp_path, capsys):
    plan = tmp_path / "pd.yaml"
    plan.write_text(PLAN)
    for _ in range(50):  # another server on the decode replica's port, answering every /health with 200
        other = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
        port = other.server_address[1] - 1
        if port > 1024 and _free(port):
            break
        other.server_close()
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        rc = main(["emulate", "--plan", str(plan), "--port", str(port), "--endpoints", str(tmp_path / "ep.json")])
    finally:
        other.shutdown()
        other.server_close()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert f"replica decode-0 (--port {port} + 1): cannot listen on 127.0.0.1:{port + 1}" in err
    assert "pick a free --port" in err
    assert not (tmp_path / "ep.json").exists()


class _Proc:
    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def test_endpoints_list_only_replicas_still_running():
    eps = [{"name": f"r{i}", "role": "mixed", "url": f"http://127.0.0.1:{8000 + i}"} for i in range(3)]
    assert [e["name"] for e in serving(eps, [_Proc(None), _Proc(1), _Proc(None)])] == ["r0", "r2"]
    assert serving(eps, [_Proc(0), _Proc(1), _Proc(-9)]) == []


def test_kv_events_port_gives_each_replica_vllms_config_and_the_endpoints_file_its_feed(tmp_path):
    import json

    from fleetwise.cli.emulate_cmd import fleet_commands, kv_events_of
    from fleetwise.cli.main import build_parser
    from fleetwise.gateway.config import GatewayConfig, fleet_backends
    from fleetwise.spec.plan import PlanSpec

    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    args = build_parser().parse_args(["emulate", "--plan", str(path), "--port", "8001", "--kv-events-port", "5600"])
    plan = PlanSpec.load(str(path))
    configs = [json.loads(argv[argv.index("--kv-events-config") + 1]) for _, _, argv in fleet_commands(args, plan)]
    assert configs == [{"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{p}",
                        "replay_endpoint": f"tcp://127.0.0.1:{p + 1}", "topic": ""} for p in (5600, 5602)]
    backends = fleet_backends(plan, lambda pool, i: f"http://127.0.0.1:{8001 + i}", lambda n: kv_events_of(args, n))
    cfg = GatewayConfig.model_validate({"backends": backends, "tokenizer": "fleetwise"})
    assert [(b.kv_events.endpoint, b.kv_events.replay_endpoint) for b in cfg.backends if b.kv_events] == \
        [("tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601"), ("tcp://127.0.0.1:5602", "tcp://127.0.0.1:5603")]
    plain = build_parser().parse_args(["emulate", "--plan", str(path), "--port", "8001"])
    assert all("--kv-events-config" not in argv for _, _, argv in fleet_commands(plain, plan))
    assert kv_events_of(plain, 0) is None


class _Member:
    def __init__(self, name: str) -> None:
        self.name, self.proc = name, _Proc(None)


class _Fleet:
    """A `LocalFleet` stand-in: a crash body makes the replica exit, a restart brings it back."""

    def __init__(self, names: list[str]) -> None:
        self.members = [_Member(n) for n in names]

    def member(self, name: str) -> _Member:
        return next(m for m in self.members if m.name == name)

    def restart(self, name: str) -> None:
        self.member(name).proc = _Proc(None)


def _fake_replay(monkeypatch, fleet: _Fleet) -> list[tuple[str, dict]]:
    """Patch the fault replay: its admin POSTs are recorded as (replica, body), a crash ends the
    member's process, and each look at the clock is half a modelled second later (time scale
    1000), however loaded the host."""
    from fleetwise.cli import fault_replay

    sent: list[tuple[str, dict]] = []

    def post(url: str, token: str, body: dict) -> str:
        name = url.rsplit("/", 1)[1]
        sent.append((name, body))
        if body["kind"] == "crash":
            fleet.member(name).proc = _Proc(1)
        return "200"

    class Clock:
        t = 0.0

        @classmethod
        def monotonic(cls) -> float:
            cls.t += 0.0005
            return cls.t

    monkeypatch.setattr(fault_replay, "post_fault", post)
    monkeypatch.setattr(fault_replay, "SUPERVISE_POLL_S", 0.0)
    monkeypatch.setattr(fault_replay, "time", Clock)
    return sent


def test_faults_replay_on_the_plans_replicas_and_a_crashed_one_restarts(tmp_path, monkeypatch, capsys):
    import json

    from fleetwise.cli import emulate_cmd
    from fleetwise.cli.fault_replay import FaultReplay
    from fleetwise.emulator.faults.replay import LiveAction

    fleet = _Fleet(["prefill-0", "decode-0"])
    sent = _fake_replay(monkeypatch, fleet)
    acts = [LiveAction(0.0, "decode-0", {"kind": "hang", "duration_s": 1.0}, "decode-0: hang"),
            LiveAction(0.0, "decode-0", {"kind": "crash"}, "crash decode-0"),
            LiveAction(0.0, "prefill-0", {"kind": "crash"}, "crash prefill-0"),
            LiveAction(1.0, "decode-0", None, "restart decode-0"),
            LiveAction(2.0, "decode-0", {"kind": "crash"}, "crash decode-0")]
    eps = [{"name": m.name, "url": f"http://h/{m.name}"} for m in fleet.members]
    urls = {e["name"]: e["url"] for e in eps}
    emulate_cmd._watch(eps, fleet, str(tmp_path / "ep.json"), FaultReplay(acts, fleet, urls, "t", 1000.0, "emulate"))
    assert [b["kind"] for _, b in sent] == ["hang", "crash", "crash", "crash"]
    out, err = capsys.readouterr()
    assert "fleetwise emulate: t=1 modelled s: restart decode-0 (serving)" in out
    assert err.count("replica decode-0 exited with status 1") == 2  # before and after its restart
    assert json.loads((tmp_path / "ep.json").read_text()) == []


def test_faults_without_a_plan_or_that_a_live_fleet_cannot_replay_are_refused_before_anything_starts(tmp_path, capsys):
    faults = tmp_path / "f.yaml"
    faults.write_text("faults: [{kind: stale_view, start_s: 1, end_s: 2}]\n")
    plan = tmp_path / "pd.yaml"
    plan.write_text(PLAN)
    assert main(["emulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--faults", str(faults)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("give --plan PLAN.yaml, or inject faults into this replica through POST "
                                             "/admin/faults")
    assert main(["emulate", "--plan", str(plan), "--port", "1", "--faults", str(faults)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "faults.0 (stale_view): a live fleet cannot replay it" in err


def test_a_restarted_replica_gets_the_interval_faults_still_in_force_but_not_a_hang(tmp_path, monkeypatch, capsys):
    from fleetwise.cli import emulate_cmd
    from fleetwise.cli.fault_replay import FaultReplay
    from fleetwise.emulator.faults.replay import LiveAction

    fleet = _Fleet(["mixed-0", "mixed-1"])
    sent = _fake_replay(monkeypatch, fleet)
    acts = [LiveAction(0.0, "mixed-0", {"kind": "slowdown", "factor": 3.0, "duration_s": 10.0}, "slowdown"),
            LiveAction(0.0, "mixed-0", {"kind": "hang", "duration_s": 10.0}, "hang"),
            LiveAction(0.0, "mixed-1", {"kind": "fail_requests", "status": 503, "duration_s": 10.0}, "refuse"),
            LiveAction(1.0, "mixed-0", {"kind": "crash"}, "crash mixed-0"),
            LiveAction(2.0, "mixed-0", {"kind": "fail_requests", "status": 503, "duration_s": 1.0}, "refuse"),
            LiveAction(4.0, "mixed-0", None, "restart mixed-0"),
            LiveAction(5.0, "mixed-0", {"kind": "crash"}, "crash mixed-0"),
            LiveAction(5.0, "mixed-1", {"kind": "crash"}, "crash mixed-1")]
    eps = [{"name": m.name, "url": f"http://h/{m.name}"} for m in fleet.members]
    urls = {e["name"]: e["url"] for e in eps}
    emulate_cmd._watch(eps, fleet, str(tmp_path / "ep.json"), FaultReplay(acts, fleet, urls, "t", 1000.0, "emulate"))
    assert sent[5] == ("mixed-0", {"kind": "slowdown", "factor": 3.0, "duration_s": 6.0})
    assert [(n, b["kind"]) for n, b in sent] == [("mixed-0", "slowdown"), ("mixed-0", "hang"), ("mixed-1", "fail_requests"),
                                                 ("mixed-0", "crash"), ("mixed-0", "fail_requests"),
                                                 ("mixed-0", "slowdown"), ("mixed-0", "crash"), ("mixed-1", "crash")]
    out, _ = capsys.readouterr()
    assert "fleetwise emulate: t=4 modelled s: mixed-0: slowdown again after its restart, for 6 modelled s (200)" in out
