"""Simulator speed: requests simulated per wall-clock and per CPU second, at several sizes.

Run:  python3 benchmarks/sim_speed.py [--sizes 10000:8,100000:64] [--skip-1m]
                                      [--default-size 1000000:64 | --skip-default] [--only-default]
                                      [--busy-size 1000000 | --skip-busy] [--only-busy]
                                      [--busy-policies round-robin,fleetwise-default]
                                      [--long-size 1000000 | --skip-long] [--only-long]
                                      [--profile DIR] [--out benchmarks/results/sim_speed.json]

Workload: Poisson arrivals at `--rate-per-replica` x replicas, prompt/output lengths drawn
lognormally around 1024/256 tokens (clipped), Llama-3.1-8B on H100 SXM, one GPU per replica,
round-robin routing, router view refreshed every `--feedback-delay` seconds (the fast mode of
docs/simulator.md). Each size runs `simulate()` once, timed by wall clock (`perf_counter`) and
by this process's CPU time (`process_time`: the steadier figure on a shared machine). Then
the headline run, 1,000,000 requests over 64 replicas (target: under 120 s), unless
`--skip-1m`. Last, the same workload routed by the default policy (`fleetwise-default`: O(workers)
scoring per request) at `--default-size` (1,000,000:64 unless `--skip-default`), stored under
`default_policy`; `--only-default` runs just that one and merges it into an existing `--out`.
Busy load (`busy`, the realistic case: replicas kept busy): Llama-3.1-8B on H200 SXM, 64
replicas, Poisson arrivals at 640 req/s (10 req/s per replica), Azure-conversation-like lengths
(prompts log-normal, median 900 tokens, sigma 0.8, capped at 8000; outputs log-normal, median
120, sigma 0.9, capped at 1000: the Azure 2023 conversation trace has input p50/p90 1020/2734
and output p50/p90 129/424, ../shared/traces/README.md), `--busy-size` requests, routed by
round-robin and by `fleetwise-default` in the same run (`busy.round_robin`, `busy.default`,
`busy.default_over_rr_cpu`); `--only-busy` runs just that and merges it into `--out`.
Long-output busy load (`busy_long`): the same fleet, rate and prompts with outputs uniform in
600-2,000 tokens (median 1,300: reasoning and agent traffic), `--long-size` requests, both
policies; `--only-long` runs just that (with `--only-busy`, both busy loads) and merges it into
`--out`. Busy rows add `engine_steps` (a fused step counts once), `passes_per_step`,
`us_per_event` and `us_per_engine_step` (CPU).
`--profile DIR` profiles each busy run with cProfile instead (DIR/busy-<policy>.prof and a
text summary of the top functions; timings under the profiler are not speed figures).
Each row records `compiled`: whether the mypyc-compiled simulator modules ran (setup.py,
docs/simulator.md "Compiled modules"; `FLEETWISE_PURE_PYTHON=1` measures the pure sources).
All ratios in the output compare figures measured in this one run:
- `cpu_share`: CPU seconds / wall seconds (well below 1: the machine was busy with other work);
- `vs_smallest`: requests/CPU-second relative to the smallest size (how the rate scales);
- `exact_over_fast`: at the smallest size, CPU time of the exact mode (feedback_delay 0, a
  fresh view per arrival) over the fast mode's; with round-robin both give the same results;
- `x_vidur_high`: requests/wall-second over 350, the top of the range Vidur reaches on this
  machine (100-350 requests/s; `benchmarks/vidur_compare.py` measures it on a shared request
  set); the goal is at least 20.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.core.request import Request
from fleetwise.sim.results import write_records
from fleetwise.sim.runner import SimOptions, SimResult, simulate
from fleetwise.spec.plan import PlanSpec

try:
    from fleetwise.core import compiled
except ImportError:  # a tree from before the compiled build (compare_commits runs older commits)
    compiled = None  # type: ignore[assignment]

VIDUR_HIGH_RPS = 350.0
TARGET_S = 120.0


@dataclass(frozen=True)
class Load:
    """A benchmark workload: card, per-replica Poisson rate and log-normal lengths (median, sigma, clip)."""

    accelerator: str
    rate_per_replica: float
    prompt: tuple[float, float, int, int]
    output: tuple[float, float, int, int]
    output_uniform: tuple[int, int] | None = None
    """Outputs uniform in [lo, hi] tokens instead of `output`'s log-normal."""


LIGHT = Load("h100-sxm", 2.0, (1024, 0.6, 16, 8000), (256, 0.6, 2, 2000))
"""The original speed workload (replicas mostly idle between requests)."""
BUSY = Load("h200-sxm", 10.0, (900, 0.8, 16, 8000), (120, 0.9, 2, 1000))
"""Replicas kept busy: 64 x 10 = 640 req/s, Azure-conversation-like lengths (see the docstring)."""
LONG = Load("h200-sxm", 10.0, (900, 0.8, 16, 8000), (0, 0, 0, 0), output_uniform=(600, 2000))
"""Reasoning/agent-like outputs on the busy fleet: outputs uniform in 600-2,000 tokens (median 1,300)."""
BUSY_REPLICAS = 64
BUSY_TARGETS_S = {"round-robin": 60.0, "fleetwise-default": 120.0}
"""CPU-second targets of the busy 1M-request run on the 2-core reference machine."""


def make_requests(n: int, rate_rps: float, seed: int, load: Load = LIGHT) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    (pm, ps, plo, phi), (om, os_, olo, ohi) = load.prompt, load.output
    ins = np.clip(rng.lognormal(np.log(pm), ps, n), plo, phi).astype(int)
    if load.output_uniform is None:
        outs = np.clip(rng.lognormal(np.log(om), os_, n), olo, ohi).astype(int)
    else:
        outs = rng.integers(load.output_uniform[0], load.output_uniform[1] + 1, n)
    return [Request(str(i), float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]


def results_digest(res: SimResult) -> str:
    """SHA-256 of a run's results: its summary (less the wall time) and its request records (CSV bytes)."""
    import hashlib
    import tempfile

    summary = {k: v for k, v in res.summary.items() if k != "sim_wall_s"}
    h = hashlib.sha256(json.dumps(summary, sort_keys=True).encode())
    with tempfile.TemporaryDirectory() as tmp:
        path = write_records(res.records, res.replica_names, Path(tmp) / "requests.csv")
        h.update(path.read_bytes())
    return h.hexdigest()


def run_one(n: int, replicas: int, rate_per_replica: float, delay: float, seed: int,
            policy: str = "round-robin", load: Load = LIGHT, profile: Path | None = None,
            digest: bool = False) -> dict[str, Any]:
    """One timed `simulate()` run; `digest=True` adds `results_digest` (computed after the timing)."""
    reqs = make_requests(n, rate_per_replica * replicas, seed, load)
    plan = PlanSpec(name="speed", pools=[{"name": "m", "accelerator": load.accelerator, "model": "llama-3.1-8b",
                                          "replicas": replicas}], routing=policy)
    opts = SimOptions(seed=seed, feedback_delay_s=delay)
    load0 = os.getloadavg()[0]
    w0, c0 = time.perf_counter(), time.process_time()
    if profile is not None:
        import cProfile

        prof = cProfile.Profile()
        res = prof.runcall(simulate, plan, reqs, options=opts)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        _write_profile(prof, profile, f"{'long' if load.output_uniform else 'busy'}-{policy}")
    else:
        res = simulate(plan, reqs, options=opts)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s = res.summary
    return {
        "requests": n,
        "replicas": replicas,
        "routing": policy,
        "rate_rps": rate_per_replica * replicas,
        "feedback_delay_s": delay,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_share": round(cpu / wall, 3),
        "requests_per_wall_s": round(n / wall, 1),
        "requests_per_cpu_s": round(n / cpu, 1),
        "events_processed": s["events_processed"],
        "events_per_cpu_s": round(s["events_processed"] / cpu, 1),
        "engine_steps": res.engine_steps,
        "passes_per_step": round(res.engine_passes / max(res.engine_steps, 1), 2),
        "simulated_s": s["duration_s"],
        "requests_completed": s["requests_completed"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "tpot_p50_s": s["tpot_s"]["p50"],
        "queue_p50_s": s["queue_s"]["p50"],
        "mean_utilization": round(float(np.mean([r["utilization"] for r in s["per_replica"]])), 3),
        "loadavg_1m_before": round(load0, 2),
        "x_vidur_high": round(n / wall / VIDUR_HIGH_RPS, 1),
        "accelerator": load.accelerator,
        "profiled": profile is not None,
        "compiled": compiled is not None and compiled.native(),
        **({"digest": results_digest(res)} if digest else {}),
    }


def _write_profile(prof: Any, out_dir: Path, stem: str) -> None:
    """DIR/<stem>.prof and DIR/<stem>.txt (top 40 functions by own time and by cumulative time)."""
    import io
    import pstats

    out_dir.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(out_dir / f"{stem}.prof"))
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(40)
    (out_dir / f"{stem}.txt").write_text(buf.getvalue())


BUSY_POLICIES = {"round-robin": "round_robin", "fleetwise-default": "default"}
"""Policies of the busy rows and their keys under `busy`."""


def run_busy(a: argparse.Namespace, load: Load = BUSY, size: int | None = None) -> dict[str, Any]:
    """`load` on the busy fleet routed by each of `--busy-policies` (round-robin, then the default
    policy), in this one run; `size` requests (default `--busy-size`)."""
    n = a.busy_size if size is None else size
    outs = (f"outputs uniform {load.output_uniform[0]}-{load.output_uniform[1]}" if load.output_uniform else
            f"outputs lognormal(median {load.output[0]:g}, sigma {load.output[1]:g}) <= {load.output[3]}")
    out: dict[str, Any] = {"workload": (f"{BUSY_REPLICAS} x llama-3.1-8b on {load.accelerator}, "
                                        f"{load.rate_per_replica * BUSY_REPLICAS:g} req/s Poisson, prompts "
                                        f"lognormal(median {load.prompt[0]:g}, sigma {load.prompt[1]:g}) <= "
                                        f"{load.prompt[3]}, {outs}"),
                           "targets_cpu_s_at_1m": BUSY_TARGETS_S}
    policies = [p for p in BUSY_POLICIES if p in a.busy_policies.split(",")]
    for policy in policies:
        r = run_one(n, BUSY_REPLICAS, load.rate_per_replica, a.feedback_delay, a.seed, policy, load,
                    a.profile)
        r["us_per_event"] = round(r["cpu_s"] / r["events_processed"] * 1e6, 2)
        r["us_per_engine_step"] = round(r["cpu_s"] / r["engine_steps"] * 1e6, 2)
        print(json.dumps(r), flush=True)
        out[BUSY_POLICIES[policy]] = r
    if len(policies) == len(BUSY_POLICIES):
        out["default_over_rr_cpu"] = round(out["default"]["cpu_s"] / out["round_robin"]["cpu_s"], 2)
    if n == 1_000_000 and a.profile is None:
        out["target_met_cpu"] = {p: out[BUSY_POLICIES[p]]["cpu_s"] < BUSY_TARGETS_S[p] for p in policies}
    return out


def merge_busy(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` busy rows over `old`: a policy not rerun keeps its row and verdict; the ratio of the
    two policies is kept only when both rows come from one run."""
    rerun = [p for p, key in BUSY_POLICIES.items() if key in new]
    merged = {**old, **new}
    if "default_over_rr_cpu" not in new:
        merged.pop("default_over_rr_cpu", None)
    met = {p: v for p, v in old.get("target_met_cpu", {}).items() if p not in rerun}
    merged["target_met_cpu"] = {**met, **new.get("target_met_cpu", {})}
    return merged


def run_default(a: argparse.Namespace) -> dict[str, Any]:
    """The workload routed by `fleetwise-default` (scores every worker per request)."""
    n, reps = (int(x) for x in a.default_size.split(":"))
    r = run_one(n, reps, a.rate_per_replica, a.feedback_delay, a.seed, policy="fleetwise-default")
    print(json.dumps(r), flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000:8,100000:64", help="requests:replicas,... run before the 1M run")
    ap.add_argument("--skip-1m", action="store_true", help="skip the 1,000,000-request, 64-replica run")
    ap.add_argument("--rate-per-replica", type=float, default=2.0)
    ap.add_argument("--feedback-delay", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--default-size", default="1000000:64", help="requests:replicas of the default-policy run")
    ap.add_argument("--skip-default", action="store_true", help="skip the default-policy run")
    ap.add_argument("--only-default", action="store_true",
                    help="run only the default-policy run and merge it into an existing --out")
    ap.add_argument("--busy-size", type=int, default=1_000_000, help="requests of the busy-load runs")
    ap.add_argument("--skip-busy", action="store_true", help="skip the busy-load runs")
    ap.add_argument("--busy-policies", default=",".join(BUSY_POLICIES),
                    help="policies of the busy rows (with --only-busy, rows of policies not rerun are kept)")
    ap.add_argument("--only-busy", action="store_true",
                    help="run only the busy-load runs and merge them into an existing --out")
    ap.add_argument("--long-size", type=int, default=1_000_000, help="requests of the long-output busy runs")
    ap.add_argument("--skip-long", action="store_true", help="skip the long-output busy runs")
    ap.add_argument("--only-long", action="store_true",
                    help="run only the long-output busy runs and merge them into an existing --out")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="profile the busy-load runs with cProfile into DIR (timings then are not speed figures)")
    ap.add_argument("--out", default="benchmarks/results/sim_speed.json")
    a = ap.parse_args()
    if a.only_busy or a.only_long:
        rows = {"busy": run_busy(a)} if a.only_busy else {}
        if not a.skip_long:
            rows["busy_long"] = run_busy(a, LONG, a.long_size)
        if a.profile is None:
            path = Path(a.out)
            out = json.loads(path.read_text()) if path.exists() else {"benchmark": "sim_speed"}
            for key, busy in rows.items():
                out[key] = merge_busy(out.get(key, {}), busy)
            path.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(rows, indent=2))
        return
    if a.only_default:
        out = json.loads(Path(a.out).read_text())
        out["default_policy"] = run_default(a)
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["default_policy"], indent=2))
        return
    sizes = [tuple(int(x) for x in part.split(":")) for part in a.sizes.split(",") if part]
    if not a.skip_1m:
        sizes.append((1_000_000, 64))
    runs = []
    for n, reps in sizes:
        r = run_one(n, reps, a.rate_per_replica, a.feedback_delay, a.seed)
        print(json.dumps(r), flush=True)
        runs.append(r)
    base = runs[0]
    for r in runs:
        r["vs_smallest"] = round(r["requests_per_cpu_s"] / base["requests_per_cpu_s"], 2)
    n0, reps0 = sizes[0]
    exact = run_one(n0, reps0, a.rate_per_replica, 0.0, a.seed)
    out: dict[str, Any] = {
        "benchmark": "sim_speed",
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count()},
        "model": "llama-3.1-8b", "accelerator": "h100-sxm", "routing": "round-robin",
        "runs": runs,
        "exact_mode": exact,
        "exact_over_fast_cpu": round(exact["cpu_s"] / base["cpu_s"], 2),
        "exact_equals_fast": (exact["ttft_p50_s"], exact["tpot_p50_s"]) == (base["ttft_p50_s"], base["tpot_p50_s"]),
        "target": "1,000,000 requests over 64 replicas in under 120 s; >= 20x Vidur's requests/s",
    }
    if not a.skip_default:
        out["default_policy"] = run_default(a)
    if not a.skip_busy:
        out["busy"] = run_busy(a)
    if not a.skip_long:
        out["busy_long"] = run_busy(a, LONG, a.long_size)
    big = next((r for r in runs if r["requests"] == 1_000_000 and r["replicas"] == 64), None)
    if big is not None:
        out["target_met_wall"] = big["wall_s"] < TARGET_S
        out["target_met_cpu"] = big["cpu_s"] < TARGET_S
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
