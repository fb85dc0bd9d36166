"""The live fleet page renderer: self-contained, shows the state it is given, safe with hostile names."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess

import httpx
import pytest

from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.report.dashboard import CHART_JS, CHART_SERIES, HISTORY_S, render_dashboard


def fleet_state(n: int = 0) -> dict:
    """A fleet document shaped like the gateway's GET /admin/fleet (two backends)."""
    def backend(name: str, q: int) -> dict:
        return {"name": name, "url": f"http://127.0.0.1:80{q}", "role": "mixed", "pool": "h200",
                "model_version": "v1", "region": "default", "accelerator": "h200-sxm", "weight": 1.0,
                "healthy": True, "breaker": "closed", "available": True, "in_flight": q + n, "queued": q,
                "running": 4 + n, "kv_usage": 0.25 * (q + 1), "prefix_hit_rate": 0.5, "engine_ttft_mean_s": 0.1,
                "engine_itl_mean_s": 0.02, "observed_ttft_s": 0.12, "observed_tpot_s": 0.021, "scrape_age_s": 0.4,
                "scrape_errors": 0, "selected": 10 + n, "faults": 0,
                "recent": [{"request_id": f"r{n}", "at_s": float(n), "kind": "score", "reason": "least-cost",
                            "score": 0.125}]}
    return {"now_s": float(n), "policy": "fleetwise-default", "safe_mode": {"active": False},
            "decisions": 20 + n, "by_reason": {"least-cost": 20 + n}, "slowness": {}, "models": ["m"],
            "backends": [backend("b-0", 0), backend("b-1", 1)], "draining": [], "tenants": {}}


def embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="fleet-state">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_page_embeds_the_state_and_polls_every_second_without_external_assets():
    page = render_dashboard(fleet_state(3), poll_path="/admin/fleet")
    assert embedded(page) == fleet_state(3)
    assert 'var POLL = "/admin/fleet", INTERVAL_MS = 1000;' in page
    assert not re.search(r"""\b(?:src|href)\s*=|<link\b|@import|url\(""", page)


def test_hostile_names_cannot_leave_the_data_element():
    state = fleet_state()
    state["backends"][0]["name"] = "</script><script>alert(1)</script><!--"
    page = render_dashboard(state)
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert embedded(page)["backends"][0]["name"] == state["backends"][0]["name"]


def test_gateway_serves_the_page_behind_the_admin_token():
    cfg = GatewayConfig(backends=[{"url": "http://127.0.0.1:9", "name": "b0"}])
    gw = Gateway(cfg, admin_token="tk", dashboard=render_dashboard)
    plain = Gateway(cfg, admin_token="tk")

    async def go() -> list[httpx.Response]:
        out = []
        for app, path, headers in ((gw, "/dashboard?token=tk", {}), (gw, "/dashboard", {"authorization": "Bearer tk"}),
                                   (gw, "/dashboard?token=wrong", {}), (gw, "/dashboard", {}),
                                   (plain, "/dashboard?token=tk", {})):
            transport = httpx.ASGITransport(app=app.app())
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                out.append(await c.get(path, headers=headers))
        return out

    by_query, by_header, wrong, missing, absent = asyncio.run(asyncio.wait_for(go(), 30))
    for r in (by_query, by_header):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        state = embedded(r.text)
        assert [b["name"] for b in state["backends"]] == ["b0"] and state["policy"] == gw.policy.report()["policy"]
    assert wrong.status_code == 401 and missing.status_code == 401
    assert absent.status_code == 404  # no renderer given: no page


def _node(script: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the chart functions are JavaScript run by the page")
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_charts_keep_the_last_minutes_per_backend_scaled_to_what_they_show():
    series = json.dumps([list(c) for c in CHART_SERIES])
    out = _node(CHART_JS + f"""
    var hist = {{}}, S = {series};
    for (var t = 0; t <= 400; t += 100) {{
      CHARTS.remember(hist, t, [{{name: "b-0", observed_ttft_s: 0.1 * (t / 100 + 1), observed_tpot_s: null,
                                  queued: t / 100, kv_usage: 0.03}}], S, {HISTORY_S - 100});
    }}
    CHARTS.remember(hist, 400, [{{name: "b-0", observed_ttft_s: 0.5, queued: 4, kv_usage: 0.03}}], S, 300);
    var h = hist["b-0"], line = function (i) {{ return CHARTS.line(h, i, 400, 300, 160, 36); }};
    console.log(JSON.stringify({{times: h.map(function (s) {{ return s.t; }}), ttft: line(0), tpot: line(1),
                                queue: line(2), kv: line(3)}}));
    """)
    assert HISTORY_S == 300.0
    assert out["times"] == [200, 300, 400]  # older than the window (200 s here, 300 at the last call) dropped
    assert out["kv"] == {"points": "53.3,3.3 106.7,3.3 160.0,3.3", "top": 3, "last": 3}  # 3 %, not flat on 0-100
    assert out["ttft"]["points"] == "53.3,16.4 106.7,9.8 160.0,3.3" and out["ttft"]["last"] == 500
    assert out["tpot"] == {"points": "", "top": 0, "last": None}  # no observation yet: no line
    assert out["queue"]["top"] == 4


def test_page_draws_a_chart_per_backend_and_series_with_its_unit():
    page = render_dashboard(fleet_state(1))
    assert CHART_JS in page and '<div class="charts" id="charts"></div>' in page
    assert f"var SERIES = {json.dumps([list(c) for c in CHART_SERIES], separators=(',', ':'))}" in page
    assert [(c[1], c[2]) for c in CHART_SERIES] == [("TTFT", "ms"), ("TPOT", "ms"), ("queue", "requests"),
                                                   ("KV used", "%")]
    script = re.findall(r"<script>(.*?)</script>", page, re.S)[0]
    assert _node(f"new Function({json.dumps(script)}); console.log('{{}}');") == {}  # the page's script parses
