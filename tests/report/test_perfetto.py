"""The Chrome/Perfetto trace of a small PD run: valid against the trace-event schema, with a track
per replica (steps and batch composition), per KV link (transfers) and per request (phases),
bounded by the window asked for."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

from fleetwise.cli.main import main
from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.report.perfetto import PID_LINKS, PID_REPLICAS, PID_REQUESTS, Window, trace_events
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs/schema/chrome-trace.schema.json").read_text())


def threads(doc, pid):
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def slices(doc, pid):
    by = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == pid:
            by[e["tid"]].append(e)
    return by


def test_trace_is_valid_and_has_every_track(sim_run):
    doc = json.loads((sim_run / "trace.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    summary = json.loads((sim_run / "summary.json").read_text())
    names = [r["name"] for r in summary["per_replica"]]
    assert list(threads(doc, PID_REPLICAS).values()) == names
    steps = slices(doc, PID_REPLICAS)
    assert set(steps) == {1, 2, 3, 4}  # every replica stepped inside the window
    for tid, evs in steps.items():
        evs.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(evs, evs[1:], strict=False))
        role = names[tid - 1].split("-")[0]
        for e in evs:
            a = e["args"]
            assert set(a) == {"prefill_tokens", "decodes", "passes", "preempted", "tokens"}
            assert (a["prefill_tokens"] > 0) == (role == "prefill") and (a["decodes"] > 0) == (role == "decode")
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert counters == {f"{n} load" for n in names}
    links = threads(doc, PID_LINKS)
    assert links and all(" → " in n for n in links.values())
    assert {n.split(" #")[0] for n in links.values()} <= {f"{p} → {d}" for p in names[:2] for d in names[2:]}
    for evs in slices(doc, PID_LINKS).values():  # lanes never overlap
        evs.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(evs, evs[1:], strict=False))
    # Requests 10..59 (arrival order), each a request span with its phases nested inside.
    with (sim_run / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: (float(r["arrival_s"]), int(r["request_id"])))
    want = [r["request_id"] for r in rows[10:60]]
    assert list(threads(doc, PID_REQUESTS).values()) == [f"req {rid}" for rid in want]
    for tid, evs in slices(doc, PID_REQUESTS).items():
        top = next(e for e in evs if e["name"].startswith("request"))
        phases = {e["name"]: e for e in evs if e is not top}
        row = rows[tid - 1]
        if not row["failure"]:
            assert set(phases) == {"queue", "prefill", "transfer", "decode"}
            assert phases["decode"]["ts"] + phases["decode"]["dur"] == pytest.approx(
                float(row["finish_s"]) * 1e6, abs=2e-3)
        for e in phases.values():
            assert top["ts"] <= e["ts"] and e["ts"] + e["dur"] <= top["ts"] + top["dur"] + 1e-3  # us rounding
    lo, hi = doc["otherData"]["window_s"]
    assert all(e["ts"] + e["dur"] >= lo * 1e6 - 1e-3 and e["ts"] <= hi * 1e6 + 1e-3
               for evs in steps.values() for e in evs)


def test_time_window_bounds_requests_and_steps():
    plan = PlanSpec(kv_link={"gbps": 100.0, "latency_s": 1e-3}, pools=[
        {"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b"},
        {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    reqs = [Request(str(i), i * 0.1, 512, 16) for i in range(50)]
    w = Window.parse(None, "1:2")
    rec = w.recorder([r.arrival_s for r in reqs])
    res = simulate(plan, reqs, options=SimOptions(recorder=rec))
    doc = trace_events(res, rec, w)
    jsonschema.validate(doc, SCHEMA)
    # Arrivals at 1.0, 1.1, ..., 1.9 (float steps: i * 0.1 for i in 10..19, all in [1, 2)).
    assert list(threads(doc, PID_REQUESTS).values()) == [f"req {i}" for i in range(10, 20)]
    for evs in slices(doc, PID_REPLICAS).values():
        assert all(e["ts"] + e["dur"] >= 1e6 - 1e-3 and e["ts"] <= 2e6 + 1e-3 for e in evs)
    assert doc["otherData"]["requests_traced"] == 10


@pytest.mark.parametrize("req,win,msg", [
    ("5", None, "expected START:END"), ("9:3", None, "need 0 <= START < END"),
    ("0:5", "0:1", "give one window"), (None, "a:b", "expected START:END")])
def test_bad_windows_are_refused_with_the_flag(req, win, msg):
    with pytest.raises(SpecError, match=msg):
        Window.parse(req, win)


def test_trace_and_report_inside_a_new_out_dir(tmp_path):
    out = tmp_path / "runs" / "pd"  # does not exist yet: made by the run, with the trace and report in it
    assert main(["simulate", str(ROOT / "examples/plans/pd-70b.yaml"), "--workload",
                 str(ROOT / "examples/workloads/poisson-chat.yaml"), "--requests", "30", "--out", str(out),
                 "--trace-events", str(out / "trace.json"), "--quiet"]) == 0
    doc = json.loads((out / "trace.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["otherData"]["requests_traced"] == 30
    assert main(["simulate", str(ROOT / "examples/plans/pd-70b.yaml"), "--workload",
                 str(ROOT / "examples/workloads/poisson-chat.yaml"), "--requests", "30", "--out", str(out),
                 "--trace-events", str(tmp_path / "nowhere" / "trace.json"), "--quiet"]) == 2
