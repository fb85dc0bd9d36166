"""A real headless browser loads every report and the live fleet page with no console message and
writes a screenshot. Chromium comes from Debian (`.ci/run` installs it where missing); without it
these tests skip and say why."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.gateway.server import listening_socket, uvicorn_server
from fleetwise.report.browser import find_browser, load
from fleetwise.report.dashboard import render_dashboard

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


def test_live_page_of_a_running_gateway_polls_with_the_token_and_updates(browser, tmp_path):
    gw = Gateway(GatewayConfig(backends=[{"url": "http://127.0.0.1:9", "name": "b0"},
                                         {"url": "http://127.0.0.1:10", "name": "b1"}]),
                 admin_token=TOKEN, dashboard=render_dashboard)
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn_server(gw)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # bounded wait for the server to start
            if server.started:
                break
            time.sleep(0.05)
        assert server.started
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/dashboard?token={TOKEN}"
        got = load(url, dump_dom=True, wait_ms=3500, browser=browser)
        assert got.console == [] and got.returncode == 0
        assert got.dom.count("<tr data-backend=") == 2 and "live, every 1 s" in got.dom
        first = json.loads(re.search(r'id="fleet-state">(.*?)</script>', got.dom, re.S).group(1))["now_s"]
        shown = float(re.search(r"gateway time ([0-9.]+) s", got.dom).group(1))
        assert shown > first  # the page polled /admin/fleet (with the bearer token) and re-rendered
        shot = tmp_path / "dashboard.png"
        assert load(url, screenshot=shot, wait_ms=1500, browser=browser).console == []
        check_png(shot)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
