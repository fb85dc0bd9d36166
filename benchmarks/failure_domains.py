"""PD failure points x failure-domain configurations in the simulator: what each fault costs.

Run:  python3 benchmarks/failure_domains.py [--requests 600] [--seeds 0 1 2]
          [--out benchmarks/results/failure_domains.json] [--markdown]

Setup (module constants, written into the JSON):
- Llama-3.1-8B bf16 on H100-SXM, TP1; 2 prefill + 2 decode replicas; KV link 50 Gb/s per GPU NIC;
  round-robin routing, exact router view.
- Requests: Poisson arrivals at RATE_RPS, prompts uniform in [PROMPT_LO, PROMPT_HI], outputs
  uniform in [OUT_LO, OUT_HI] (numpy, seeded), no shared prefixes.
- One fault per run, at FAULT_AT_S (mid-run), one failure point each:
  prefill replica lost before hand-off (prefill-0 crashes), KV link failing mid-transfer (every
  port down for LINK_DOWN_S), decode replica lost mid-stream (decode-0 crashes), decode pool full
  (decode-0 refuses KV for FULL_S), lease expiry (decode-0's port at 1% bandwidth for SLOW_S, lease
  LEASE_S), and the decode loss again with the short lease (migration bursts against a lease
  shorter than transfers under load). Crashed replicas come back after RESTART_S.
- Configurations: `migrate` (the defaults: 2 re-prefills, migrate once), `fail` (2 re-prefills,
  a decode loss ends the stream), `no-recovery` (no re-prefill, decode loss fails); all with the
  default 30 s KV lease, except the failure points in SHORT_LEASE (lease LEASE_S).
Per run: completed / re-prefilled / migrated / failed, extra TTFT and extra end-to-end latency
of the affected requests (those with a recovery attempt, or failed, against the same requests
in the fault-free run of the same seed), recovery and wasted GPU-seconds (modelled, see
`fleetwise.sim.recovery`), orphaned KV GB x s, tokens delivered vs billed vs computed.
Figures are sums (counts, tokens, GPU-s) or means (latencies) over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.core.request import Request
from fleetwise.sim.runner import SimOptions, SimResult, simulate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec

MODEL, GPU = "llama-3.1-8b", "h100-sxm"
KV_GBPS = 50.0
RATE_RPS = 6.0
PROMPT_LO, PROMPT_HI = 1000, 8000
OUT_LO, OUT_HI = 100, 400
FAULT_AT_S = 30.0
RESTART_S = 20.0
LINK_DOWN_S = 0.5
FULL_S = 5.0
SLOW_S = 10.0
LEASE_S = 1.0

DECODE_CRASH = [{"kind": "crash", "replica": "decode-0", "at_s": FAULT_AT_S, "restart_after_s": RESTART_S}]
FAILURE_POINTS: dict[str, list[dict[str, Any]]] = {
    "prefill lost before hand-off": [{"kind": "crash", "replica": "prefill-0", "at_s": FAULT_AT_S,
                                      "restart_after_s": RESTART_S}],
    "KV link fails mid-transfer": [{"kind": "kv_link", "start_s": FAULT_AT_S, "end_s": FAULT_AT_S + LINK_DOWN_S,
                                    "bandwidth_factor": 0.0}],
    "decode lost mid-stream": DECODE_CRASH,
    "decode pool full": [{"kind": "decode_full", "replica": "decode-0", "start_s": FAULT_AT_S,
                          "end_s": FAULT_AT_S + FULL_S}],
    "lease expiry": [{"kind": "kv_link", "replica": "decode-0", "start_s": FAULT_AT_S, "end_s": FAULT_AT_S + SLOW_S,
                      "bandwidth_factor": 0.01}],
    f"decode lost mid-stream, {LEASE_S:g} s lease": DECODE_CRASH,
}
SHORT_LEASE = {"lease expiry", f"decode lost mid-stream, {LEASE_S:g} s lease"}
"""Failure points run with `kv_lease_s = LEASE_S`; the others with the default lease."""
CONFIGS: dict[str, dict[str, Any]] = {
    "migrate": {},
    "fail": {"on_decode_failure": "fail"},
    "no-recovery": {"max_reprefills": 0, "on_decode_failure": "fail"},
}


def plan(decisions: dict[str, Any]) -> PlanSpec:
    pools = [{"name": n, "role": n, "accelerator": GPU, "model": MODEL, "replicas": 2} for n in ("prefill", "decode")]
    return PlanSpec(name="pd-8b", pools=pools, kv_link={"gbps": KV_GBPS}, failure_domains=decisions)


def requests(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / RATE_RPS, n))
    p = rng.integers(PROMPT_LO, PROMPT_HI + 1, n)
    o = rng.integers(OUT_LO, OUT_HI + 1, n)
    return [Request(str(i), float(t[i]), int(p[i]), int(o[i])) for i in range(n)]


def compare(run: SimResult, base: SimResult) -> dict[str, Any]:
    """One fault run against the fault-free run of the same requests."""
    fd = run.summary["failure_domains"]
    r, b = run.records, base.records
    n = len(r.requests)
    affected = [i for i in range(n) if r.retries[i] > 0 or i in r.failure]
    done = [i for i in affected if not math.isnan(r.finish_s[i])]
    ttft = [r.first_token_s[i] - b.first_token_s[i] for i in done]
    e2e = [r.finish_s[i] - b.finish_s[i] for i in done]
    return {
        **fd["requests"],
        "affected": len(affected),
        "failure_reasons": run.summary["failure_reasons"],
        "reprefills_by_reason": fd["reprefills"]["by_reason"],
        "migrations_by_reason": fd["migrations"]["by_reason"],
        "leases_expired": fd["leases_expired"],
        "extra_ttft_mean_s": float(np.mean(ttft)) if ttft else 0.0,
        "extra_e2e_mean_s": float(np.mean(e2e)) if e2e else 0.0,
        "ttft_p99_s": run.summary["ttft_s"]["p99"],
        "base_ttft_p99_s": base.summary["ttft_s"]["p99"],
        "recovery_gpu_s": fd["gpu_s"]["recovery"],
        "wasted_gpu_s": fd["gpu_s"]["wasted"],
        "orphaned_kv_gb_s": fd["orphaned_kv_byte_s"] / 1e9,
        **{f"tokens_{k}": v for k, v in fd["tokens"].items()},
    }


def merge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum counts and token/GPU figures over seeds; mean the latencies."""
    out: dict[str, Any] = {}
    for k, v in rows[0].items():
        if isinstance(v, dict):
            acc: dict[str, int] = {}
            for row in rows:
                for kk, vv in row[k].items():
                    acc[kk] = acc.get(kk, 0) + vv
            out[k] = dict(sorted(acc.items()))
        elif k.endswith("_s") and ("ttft" in k or "e2e" in k):
            out[k] = round(float(np.mean([row[k] for row in rows])), 6)
        else:
            total = sum(row[k] for row in rows)
            out[k] = round(total, 6) if isinstance(total, float) else total
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| failure point | config | completed | re-prefilled | migrated | failed | extra TTFT (mean, s) | "
             "extra E2E (mean, s) | recovery GPU-s | wasted GPU-s | orphaned KV GB·s | delivered | billed | "
             "computed (gen + prompt) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for fp, by_cfg in doc["results"].items():
        for cfg, m in by_cfg.items():
            lines.append(
                f"| {fp} | {cfg} | {m['completed']} | {m['reprefilled']} | {m['migrated']} | {m['failed']} | "
                f"{m['extra_ttft_mean_s']:.3f} | {m['extra_e2e_mean_s']:.3f} | {m['recovery_gpu_s']:.2f} | "
                f"{m['wasted_gpu_s']:.2f} | {m['orphaned_kv_gb_s']:.2f} | {m['tokens_delivered']} | "
                f"{m['tokens_billed_generated']} | {m['tokens_computed_generated']} + {m['tokens_computed_prompt']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="benchmarks/results/failure_domains.json")
    ap.add_argument("--markdown", action="store_true", help="print the docs table")
    args = ap.parse_args()
    wall0 = time.perf_counter()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {fp: {c: [] for c in CONFIGS} for fp in FAILURE_POINTS}
    base_summary: list[dict[str, Any]] = []
    for seed in args.seeds:
        reqs = requests(args.requests, seed)
        base = simulate(plan(CONFIGS["migrate"]), reqs, None, SimOptions(seed=seed))
        base_summary.append({"seed": seed, "completed": base.summary["requests_completed"],
                             "ttft_p99_s": base.summary["ttft_s"]["p99"], "e2e_p99_s": base.summary["e2e_s"]["p99"]})
        for fp, faults in FAILURE_POINTS.items():
            for cfg, decisions in CONFIGS.items():
                lease = {"kv_lease_s": LEASE_S} if fp in SHORT_LEASE else {}
                run = simulate(plan({**decisions, **lease}), reqs, FaultScenario(name=fp, faults=faults), SimOptions(seed=seed))
                assert run.summary["requests_completed"] + run.summary["requests_failed"] == len(reqs)
                results[fp][cfg].append(compare(run, base))
    doc = {
        "benchmark": "failure_domains",
        "setup": {"model": MODEL, "gpu": GPU, "pools": "2 prefill + 2 decode, TP1", "kv_gbps_per_gpu": KV_GBPS,
                  "rate_rps": RATE_RPS, "requests": args.requests, "seeds": args.seeds,
                  "prompt_tokens": [PROMPT_LO, PROMPT_HI], "output_tokens": [OUT_LO, OUT_HI],
                  "fault_at_s": FAULT_AT_S, "restart_after_s": RESTART_S, "link_down_s": LINK_DOWN_S,
                  "decode_full_s": FULL_S, "slow_link_s": SLOW_S, "kv_lease_s": LEASE_S,
                  "failure_points": FAILURE_POINTS, "configs": CONFIGS},
        "fault_free": base_summary,
        "results": {fp: {c: merge(rows) for c, rows in by.items()} for fp, by in results.items()},
        "wall_s": round(time.perf_counter() - wall0, 2),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} ({doc['wall_s']} s)")
    if args.markdown:
        print(markdown(doc))


if __name__ == "__main__":
    main()
