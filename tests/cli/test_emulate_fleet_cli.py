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
