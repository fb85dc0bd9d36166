"""Seeded runs against the digests recorded before the simulator's speed work: byte-identical results.

Each case replays a seeded request list against a fleet and hashes the summary (less its wall
time) and the request records (CSV bytes). The digests were recorded on commit 7a11b65 (before
issue 26's changes to the engine, the simulator and the routing fast paths); any change of a
step time, a routing decision, a score or a record changes them. A change that is meant to
alter results must say why in its commit and record the new digests here.

Cases: the long-output busy fleet of `benchmarks/sim_speed.py` (outputs uniform in 600-2,000
tokens, 10 req/s per replica: every replica holds `max_num_seqs` decodes and a queue) routed
round-robin and by the default policy, in the fast (feedback delay 0.25 s) and the exact mode;
the short-output busy fleet (Azure-like lengths) by the default policy; a P/D fleet with faults.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fleetwise.core.request import Request
from fleetwise.sim.results import write_records
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.base import validate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec

ROOT = Path(__file__).resolve().parents[2]


def busy_requests(n: int, rate_rps: float, seed: int, long_outputs: bool) -> list[Request]:
    """Poisson arrivals, log-normal prompts (median 900); outputs uniform 600-2,000 or log-normal (median 120)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    ins = np.clip(rng.lognormal(np.log(900), 0.8, n), 16, 8000).astype(int)
    if long_outputs:
        outs = rng.integers(600, 2001, n)
    else:
        outs = np.clip(rng.lognormal(np.log(120), 0.9, n), 2, 1000).astype(int)
    return [Request(str(i), float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]


def digest(plan: PlanSpec, reqs: list[Request], faults: FaultScenario | None, delay_s: float,
           tmp: Path) -> tuple[str, dict]:
    res = simulate(plan, reqs, faults, SimOptions(seed=7, feedback_delay_s=delay_s))
    summary = {k: v for k, v in res.summary.items() if k != "sim_wall_s"}
    h = hashlib.sha256(json.dumps(summary, sort_keys=True).encode())
    h.update(write_records(res.records, res.replica_names, tmp / "requests.csv").read_bytes())
    return h.hexdigest(), summary


def busy_plan(replicas: int, routing: str) -> PlanSpec:
    return PlanSpec(name="busy", pools=[{"name": "m", "accelerator": "h200-sxm", "model": "llama-3.1-8b",
                                         "replicas": replicas}], routing=routing)


CASES = {
    # case: (replicas, routing, requests, long outputs, feedback delay s)
    "long-rr": (6, "round-robin", 2400, True, 0.25),
    "long-default": (6, "fleetwise-default", 2400, True, 0.25),
    "long-default-exact": (4, "fleetwise-default", 900, True, 0.0),
    "short-default": (16, "fleetwise-default", 1500, False, 0.25),
}
GOLDEN = {
    "long-rr": "f196d66e4407a44dad5c24328ebe088dc2526a72b01a9d826070740fc49ec1f4",
    "long-default": "bc49cc60057519665149a3f59cc7aaf10e630793fe4b65785cdc2c8a7a8dc654",
    "long-default-exact": "46b4dc0b695f675130b1d938cc5141b7410fb5f5579f1b001b444af38898e957",
    "short-default": "b4dc0655ed04b0de3725126d1db25534baa4e0828c6ee87b816c5180a130bdc5",
    "pd-faults": "0df8320af6adba42e42cc07d94abec99a70d0146c1c48e1a9a1960079226ceef",
}
"""SHA-256 of each case's summary and records, recorded on commit 7a11b65 and recorded again when the
perf model's elementwise traffic became counted per width (default-profile step times moved by under 2%),
and for long-default and pd-faults again when a prompt chunk's cached context became streamed KV in the
longest-row bound (later chunks of long prompts cost more; long-default's queue then drains differently:
TTFT p90 11.13 -> 10.15 s, TPOT p50 27.30 -> 27.38 ms; pd-faults' summary is unchanged, its records move),
and for the three default-policy busy cases again when the load bound's share check came to weigh each
recent pick by its own predicted work instead of counting decisions (seed 7: long-default TTFT p90
10.15 -> 10.00 s, long-default-exact 0.211 -> 0.272 s, short-default 0.0786 -> 0.0775 s; over seeds 1-5
the exact case's TTFT p99 is 0.445 -> 0.368 s), and for pd-faults again when a recovery decision no
route tick covers came to refresh the view once it was `feedback_delay_s` old (the prefill pool's
rolling upgrade starts after the last arrival; the router had never heard of the drains and sent 15
recoveries to downed replicas: failed 17 -> 2, `replica_unavailable` 15 -> 0; the busy cases unchanged),
and for the four delayed-mode cases again when the end of a run came to deliver the router the feedback
buffered since the last route tick (ticks stop with the arrivals, so it never heard most completions:
long-default's router reported 1,951 of 2,400 requests in flight and 449 outputs observed; now 0 and
2,400). Only the summary's `router` entry moved (in_flight, the slowness factors, the output predictor):
the records, every other summary field and the exact case are as before."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_busy_fleet_results_are_unchanged(case: str, tmp_path: Path) -> None:
    replicas, routing, n, long_outputs, delay = CASES[case]
    reqs = busy_requests(n, 10.0 * replicas, 7, long_outputs)
    got, summary = digest(busy_plan(replicas, routing), reqs, None, delay, tmp_path)
    assert summary["requests_completed"] == n
    assert got == GOLDEN[case], f"{case}: results changed ({summary['ttft_s']}, {summary['events_processed']} events)"


def test_pd_fleet_with_faults_results_are_unchanged(tmp_path: Path) -> None:
    plan = validate(PlanSpec, yaml.safe_load((ROOT / "examples/plans/pd-70b.yaml").read_text()), "pd-70b.yaml")
    faults = validate(FaultScenario, yaml.safe_load((ROOT / "examples/plans/pd-70b.faults.yaml").read_text()),
                      "faults")
    rng = np.random.default_rng(7)
    n = 300
    t = np.cumsum(rng.exponential(1 / 6.0, n))
    ins = np.clip(rng.lognormal(np.log(900), 0.8, n), 16, 8000).astype(int)
    outs = rng.integers(600, 2001, n)
    reqs = [Request(str(i), float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]
    got, summary = digest(plan, reqs, faults, 0.05, tmp_path)
    assert summary["requests_completed"] > 0
    assert got == GOLDEN["pd-faults"], f"pd-faults: results changed ({summary['events_processed']} events)"
