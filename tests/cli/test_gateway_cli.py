"""`fleetwise gateway` says what it serves once it has read its backends, not before."""

from __future__ import annotations

from fleetwise.cli.gateway_cmd import build_config, started_line
from fleetwise.cli.main import build_parser
from fleetwise.gateway import Gateway
from fleetwise.gateway.server import listening_socket, uvicorn_server


def test_start_line_comes_after_the_backends_file_is_read(tmp_path):
    f = tmp_path / "backends.yaml"
    f.write_text("backends:\n  - {url: 'http://127.0.0.1:9', role: prefill, name: p0}\n"
                 "  - {url: 'http://127.0.0.1:10', role: decode, name: d0}\n"
                 "  - {url: 'http://127.0.0.1:11', role: decode, name: d1}\n")
    args = build_parser().parse_args(["gateway", "--backends-file", str(f), "--port", "0"])
    gw = Gateway(build_config(args))
    before = started_line(gw)
    assert "0 backend(s): none yet" in before  # what a message printed at construction would have said
    lines: list[str] = []
    server = uvicorn_server(gw, "warning", on_ready=lambda: (lines.append(started_line(gw)),
                                                             setattr(server, "should_exit", True)))
    server.run(sockets=[listening_socket("127.0.0.1", 0)])
    assert lines == [f"fleetwise gateway on http://127.0.0.1:0 -> 3 backend(s): 2 decode, 1 prefill "
                     f"(watching {f}), policy fleetwise-default"]
