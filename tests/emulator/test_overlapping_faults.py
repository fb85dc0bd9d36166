"""Overlapping faults of one kind compose on a live replica as the simulator composes them:
slowdowns and KV link factors multiply, hangs and refusals last while any instance does, and each
instance clears by itself."""

from __future__ import annotations

import asyncio

import pytest
from emu_helpers import TOKEN, run, serve

AUTH = {"Authorization": f"Bearer {TOKEN}"}
OK = {"prompt": "hello", "max_tokens": 4}


def test_overlapping_slowdowns_multiply_and_each_clears_by_itself():
    async def go():
        async with serve() as (app, c):
            rep = app.state.replica
            await c.post("/v1/completions", json=OK)  # cached from here on: every later request takes the same steps
            await c.post("/admin/faults", json={"kind": "slowdown", "factor": 3.0, "duration_s": 150}, headers=AUTH)
            r = await c.post("/admin/faults", json={"kind": "slowdown", "factor": 5.0}, headers=AUTH)
            assert r.json()["active"]["slowdown"] == {"kind": "slowdown", "duration_s": None, "factor": 15.0,
                                                      "instances": 2}
            assert rep.driver.slowdown == 15.0
            busy = [rep.status.busy_s]
            await c.post("/v1/completions", json=OK)
            busy.append(rep.status.busy_s)
            await asyncio.sleep(1.8)  # 150 modelled seconds at the test time scale: the x3 one ends
            assert rep.driver.slowdown == 5.0
            assert (await c.get("/admin/faults", headers=AUTH)).json()["active"] == {
                "slowdown": {"kind": "slowdown", "duration_s": None, "factor": 5.0}}
            await c.post("/v1/completions", json=OK)
            busy.append(rep.status.busy_s)
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            assert rep.driver.slowdown == 1.0 and rep.faults.active == {} and rep.faults.instances == {}
            assert busy[1] - busy[0] == pytest.approx(3.0 * (busy[2] - busy[1]), rel=1e-9)  # x15 against x5
    run(go())


def test_overlapping_hangs_and_refusals_nest():
    async def go():
        async with serve() as (app, c):
            f = app.state.replica.faults
            await c.post("/admin/faults", json={"kind": "hang", "duration_s": 60}, headers=AUTH)
            await c.post("/admin/faults", json={"kind": "hang", "duration_s": 20}, headers=AUTH)
            await c.post("/admin/faults", json={"kind": "fail_requests", "status": 429, "duration_s": 60},
                         headers=AUTH)
            await c.post("/admin/faults", json={"kind": "fail_requests", "status": 503, "duration_s": 20},
                         headers=AUTH)
            await c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 2}, headers=AUTH)
            await c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 5}, headers=AUTH)
            assert (f.hung, f.fail_status, f.drop_after_tokens) == (True, 503, 2)  # the latest status, the earliest cut
            await asyncio.sleep(0.4)  # 40 modelled seconds: the first hang and refusal end, the second last
            assert (f.hung, f.fail_status) == (True, 429)
            assert f.active["hang"] == {"kind": "hang", "duration_s": 60.0}  # the one in force
            await asyncio.sleep(0.4)
            assert (f.hung, f.fail_status, sorted(f.active)) == (False, None, ["drop_streams"])
    run(go())
