"""The live fleet page renderer: self-contained, shows the state it is given, safe with hostile names."""

from __future__ import annotations

import asyncio
import json
import re

import httpx

from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.report.dashboard import render_dashboard


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
