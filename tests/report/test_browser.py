"""A real headless browser loads every report and the live fleet page with no console message and
writes a screenshot. Chromium comes from Debian (`.ci/run` installs it where missing); without it
these tests skip and say why."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleetwise.report.browser import find_browser, load
from fleetwise.report.dashboard import render_dashboard

from .test_dashboard import fleet_state

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def browser() -> str:
    exe = find_browser()
    if exe is None:
        pytest.skip("chromium is not installed and could not be (`apt-get install -y chromium`, done by .ci/run)")
    return exe


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a rendered page, not a blank stub


@pytest.mark.parametrize("kind", ["sim_run", "scenario_run", "plan_run"])
def test_report_loads_cleanly_in_chromium(kind, browser, request, tmp_path):
    html = request.getfixturevalue(kind) / "report.html"
    shot = tmp_path / f"{kind}.png"
    got = load(html.resolve().as_uri(), screenshot=shot, browser=browser)
    assert got.console == [] and got.returncode == 0
    check_png(shot)


class _Fleet(BaseHTTPRequestHandler):
    polls = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == f"/dashboard?token={TOKEN}":
            self._send(200, "text/html", render_dashboard(fleet_state(0)).encode())
        elif self.path == "/admin/fleet" and self.headers.get("Authorization") == f"Bearer {TOKEN}":
            type(self).polls += 1
            self._send(200, "application/json", json.dumps(fleet_state(type(self).polls)).encode())
        else:
            self._send(401, "application/json", b'{"error": "token"}')

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_live_page_polls_with_the_token_and_updates(browser, tmp_path):
    _Fleet.polls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fleet)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/dashboard?token={TOKEN}"
        got = load(url, dump_dom=True, wait_ms=3500, browser=browser)
        assert got.console == [] and got.returncode == 0
        polls = _Fleet.polls
        assert polls >= 2  # every second, with the bearer token from the page's query
        assert f"gateway time {float(polls)} s" in got.dom or f"gateway time {polls} s" in got.dom
        assert got.dom.count("<tr data-backend=") == 2 and "live, every 1 s" in got.dom
        shot = tmp_path / "dashboard.png"
        assert load(url, screenshot=shot, wait_ms=1500, browser=browser).console == []
        check_png(shot)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
