"""PD disaggregation vs colocation, both ways: where a prefill/decode split wins on goodput and where it loses.

Run:  python3 benchmarks/pd_crossover.py [--quick] [--seeds 0 1 2 3 4] [--requests 500]
          [--out benchmarks/results/pd_crossover.json] [--img docs/img] [--no-plots]

Setup (all numbers below are module constants, written into the JSON):
- Llama-3.1-70B, bf16 weights and KV, on H200-SXM, TP=4 per replica (within a node), 16 GPUs:
  colocated = 4 `mixed` replicas; disaggregated = P prefill + D decode replicas, P + D = 4,
  every split P:D in {1:3, 2:2, 3:1} is run and the best (highest mean goodput) is reported.
  Colocated is run at max_num_batched_tokens in {512, 2048, 8192} (chunked prefill) and its best
  is reported too, so it is best against best. Round-robin routing, exact router view.
- Workload (`WorkloadSpec` -> `generate`): Poisson arrivals at RATE_RPS (3 req/s on the fleet),
  prompts uniform in [0.9 L, 1.1 L], outputs fixed OUTPUT_TOKENS (256), no shared prefixes.
- SLO: TPOT <= 40 ms and TTFT <= 2.5 x the unloaded prefill time of an L-token prompt on one
  replica (the perf model's step time; 1.53 s at L = 8192, 113 ms at L = 512), i.e. the TTFT
  target scales with the prompt, the TPOT target does not.
- KV link: the plan's `kv_link.gbps`, per GPU NIC; a TP4 replica of this model has 4 KV shards,
  so its port carries 4 NICs (4x the figure). The figures are chosen so that per replica they
  are 400 Gb/s (long case), 10 Gb/s (short case) and 100 Gb/s (prompt sweep).
- goodput = the simulator's `goodput_rps` (requests meeting every SLO / span of the run).

Sections of the JSON: `step_breakdown` (perf-model step costs of a decode batch with and without
a prompt chunk), `case_long_prompts` (L = 8192, 100 Gb/s per GPU), `case_short_prompts` (L = 512,
2.5 Gb/s per GPU), `sweep_prompt` (L from 256 to 12288 at 25 Gb/s per GPU), `sweep_link_long` (L = 8192) and
`sweep_link_short` (L = 512) over 0.5..200 Gb/s per GPU, each with the crossover(s) found. Every figure
is a mean over seeds with its spread (min, max, std). `--quick` runs one seed, fewer requests
and fewer sweep points (well under a minute); the default takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.perf import Deployment, PerfModel, SeqWork
from fleetwise.sim.runner import SimOptions, SimResult, simulate
from fleetwise.spec import catalog
from fleetwise.spec.parallel import ParallelismSpec
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.slo import SLOSpec
from fleetwise.spec.workload import WorkloadSpec
from fleetwise.workload.generate import generate

MODEL = "llama-3.1-70b"
GPU = "h200-sxm"
TP = 4
REPLICAS = 4  # 16 GPUs
RATE_RPS = 3.0
OUTPUT_TOKENS = 256
PROMPT_SPREAD = 0.1  # prompts uniform in [L(1-s), L(1+s)]
TPOT_SLO_S = 0.040
TTFT_SLO_FACTOR = 2.5  # x unloaded prefill time of L tokens
CHUNK = 8192  # max_num_batched_tokens of the PD pools and of the default colocated plan
COLOCATED_CHUNKS = (512, 2048, 8192)
TIE_TOLERANCE = 0.02  # verdict "tie" when the goodputs differ by at most 2%
SPLITS = tuple((p, REPLICAS - p) for p in range(1, REPLICAS))

CASE_LONG = {"prompt_tokens": 8192, "gbps": 100.0}
CASE_SHORT = {"prompt_tokens": 512, "gbps": 2.5}
SWEEP_PROMPT_GBPS = 25.0
SWEEP_PROMPTS = (256, 512, 1024, 2048, 4096, 6144, 8192, 12288)
SWEEP_PROMPTS_QUICK = (512, 2048, 6144, 8192)
SWEEP_LINKS = (0.5, 1.25, 2.5, 6.25, 12.5, 25.0, 50.0, 100.0, 200.0)
SWEEP_LINKS_QUICK = (1.25, 6.25, 25.0, 100.0)
SWEEP_LINK_PROMPT_LONG = 8192
SWEEP_LINK_PROMPT_SHORT = 512


# ---- building blocks --------------------------------------------------------------------------
def deployment() -> Deployment:
    return Deployment(catalog.resolve_model(MODEL), catalog.resolve_gpu(GPU), ParallelismSpec(tp=TP))


_PERF = PerfModel()


def prefill_time_s(prompt_tokens: int) -> float:
    """Unloaded prefill of one prompt on one replica: its chunks of CHUNK tokens, in series."""
    dep, t, done = deployment(), 0.0, 0
    while done < prompt_tokens:
        c = min(CHUNK, prompt_tokens - done)
        t += _PERF.step_time_s([SeqWork(c, done)], dep)
        done += c
    return t


def slo_for(prompt_tokens: int) -> SLOSpec:
    return SLOSpec(tpot_max_s=TPOT_SLO_S, ttft_max_s=round(TTFT_SLO_FACTOR * prefill_time_s(prompt_tokens), 4))


def _pool(name: str, role: str, replicas: int, chunk: int) -> dict[str, Any]:
    return {"name": name, "role": role, "replicas": replicas, "accelerator": GPU, "model": MODEL,
            "parallelism": {"tp": TP}, "engine": {"max_num_batched_tokens": chunk}}


def colocated_plan(chunk: int = CHUNK) -> PlanSpec:
    return PlanSpec(name=f"colocated-{REPLICAS}x-tp{TP}-chunk{chunk}", pools=[_pool("mixed", "mixed", REPLICAS, chunk)],
                    routing="round-robin")


def pd_plan(prefill: int, decode: int, gbps: float) -> PlanSpec:
    return PlanSpec(name=f"pd-{prefill}p{decode}d-tp{TP}-{gbps:g}gbps",
                    pools=[_pool("prefill", "prefill", prefill, CHUNK), _pool("decode", "decode", decode, CHUNK)],
                    kv_link={"gbps": gbps, "latency_s": 20e-6}, routing="round-robin")


def workload(prompt_tokens: int, requests: int) -> WorkloadSpec:
    lo = max(1, round(prompt_tokens * (1 - PROMPT_SPREAD)))
    hi = max(lo, round(prompt_tokens * (1 + PROMPT_SPREAD)))
    return WorkloadSpec.model_validate({
        "arrival": {"kind": "poisson", "rate_rps": RATE_RPS},
        "lengths": {"kind": "independent", "input": {"kind": "uniform", "low_tokens": lo, "high_tokens": hi},
                    "output": {"kind": "fixed", "tokens": OUTPUT_TOKENS}},
        "num_requests": requests,
    })


def _alt_first_token(res: SimResult, slo: SLOSpec) -> dict[str, float]:
    """PD only: metrics if the first token were streamed at prefill end (as DistServe-style
    systems do) instead of after the decode replica's first pass (the simulator's semantics)."""
    rec = res.records
    arr, pend, fin = rec.arrival(), rec.column("prefill_end_s"), rec.column("finish_s")
    done = rec.completed_mask()
    n_out = np.array([r.output_tokens for r in rec.requests], dtype=float)
    ttft = (pend - arr)[done]
    tpot = ((fin - pend) / np.maximum(n_out - 1, 1))[done]
    span = float(np.nanmax(fin) - arr.min())
    good = int(slo.met(ttft, tpot, math.inf).sum())
    return {"goodput_rps": good / span, "slo_attainment": good / len(arr),
            "ttft_p99_s": float(np.percentile(ttft, 99)), "tpot_p99_s": float(np.percentile(tpot, 99))}


def run_one(plan: PlanSpec, prompt_tokens: int, requests: int, seed: int, detail: bool = False) -> dict[str, Any]:
    reqs = generate(workload(prompt_tokens, requests), seed)
    slo = slo_for(prompt_tokens)
    res = simulate(plan, reqs, options=SimOptions(seed=seed, slo=slo))
    s = res.summary
    out: dict[str, Any] = {
        "goodput_rps": s["goodput_rps"], "slo_attainment": s["slo_attainment"],
        "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
        "tpot_p50_s": s["tpot_s"]["p50"], "tpot_p99_s": s["tpot_s"]["p99"],
    }
    if plan.disaggregated:
        kv = s["kv_transfer"]
        out.update(kv_p50_s=kv["p50_s"], kv_p99_s=kv["p99_s"], kv_mean_queue_s=kv["mean_queue_s"],
                   kv_p99_queue_s=kv["p99_queue_s"], kv_bytes_per_request=kv["bytes_total"] / max(kv["count"], 1))
    if detail:
        out.update(itl_p50_s=s["itl_s"]["p50"], itl_p99_s=s["itl_s"]["p99"], e2e_p50_s=s["e2e_s"]["p50"],
                   requests_completed=s["requests_completed"], duration_s=s["duration_s"])
        for role in ("mixed", "prefill", "decode"):
            u = [r["utilization"] for r in s["per_replica"] if r["role"] == role]
            if u:
                out[f"utilization_{role}"] = sum(u) / len(u)
        if plan.disaggregated:
            out.update({f"first_token_at_prefill_end_{k}": v for k, v in _alt_first_token(res, slo).items()})
    return out


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds plus spread of every metric."""
    agg: dict[str, Any] = {}
    for k in runs[0]:
        vals = [float(r[k]) for r in runs]
        agg[k] = {"mean": _r(statistics.fmean(vals)), "min": _r(min(vals)), "max": _r(max(vals)),
                  "std": _r(statistics.pstdev(vals)) if len(vals) > 1 else 0.0}
    return agg


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def compare(prompt_tokens: int, gbps: float, seeds: list[int], requests: int, detail: bool = False,
            colocated: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """All colocated chunk sizes and all P:D splits at one point; best of each by mean goodput."""
    colo = colocated or {c: aggregate([run_one(colocated_plan(c), prompt_tokens, requests, s, detail) for s in seeds])
                         for c in COLOCATED_CHUNKS}
    pd = {f"{p}:{d}": aggregate([run_one(pd_plan(p, d, gbps), prompt_tokens, requests, s, detail) for s in seeds])
          for p, d in SPLITS}
    best_c = max(colo, key=lambda c: colo[c]["goodput_rps"]["mean"])
    best_p = max(pd, key=lambda k: pd[k]["goodput_rps"]["mean"])
    g_c, g_p = colo[best_c]["goodput_rps"]["mean"], pd[best_p]["goodput_rps"]["mean"]
    return {"prompt_tokens": prompt_tokens, "gbps": gbps, "ttft_slo_s": slo_for(prompt_tokens).ttft_max_s,
            "colocated": {str(c): v for c, v in colo.items()}, "pd": pd,
            "best_colocated_chunk": best_c, "best_pd_split": best_p,
            "goodput_colocated": g_c, "goodput_pd": g_p, "pd_minus_colocated": _r(g_p - g_c),
            "verdict": "tie" if abs(g_p - g_c) <= TIE_TOLERANCE * max(g_p, g_c) else "pd" if g_p > g_c else "colocated"}


def crossovers(xs: list[float], diff: list[float], log_x: bool = True) -> list[dict[str, Any]]:
    """Where PD - colocated goodput changes sign, linearly interpolated (in log x)."""
    out = []
    for (x0, d0), (x1, d1) in zip(zip(xs, diff, strict=True), zip(xs[1:], diff[1:], strict=True), strict=False):
        if d0 == 0 or d0 * d1 >= 0:
            continue
        f = d0 / (d0 - d1)
        x = math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0))) if log_x else x0 + f * (x1 - x0)
        out.append({"x": _r(x), "between": [x0, x1], "direction": "pd wins above" if d1 > 0 else "pd wins below"})
    return out


def step_breakdown() -> dict[str, Any]:
    """Perf-model step costs: a decode batch alone vs with a prompt chunk (colocated), 70B TP4 H200."""
    dep = deployment()
    out: dict[str, Any] = {"deployment": f"{MODEL} {GPU} tp={TP}", "rows": []}
    fields = ("total_s", "gemm_compute_s", "weight_memory_s", "kv_memory_s", "attention_s", "tp_comm_s", "overhead_s")
    for batch, ctx in ((8, 8192 + 128), (16, 8192 + 128), (8, 512 + 128)):
        base = None
        for chunk in (0, 512, 2048, 8192 - batch):
            work = [SeqWork(1, ctx)] * batch + ([SeqWork(chunk, 0)] if chunk else [])
            c = _PERF.step_cost(work, dep)
            row = {"decodes": batch, "decode_context": ctx, "prompt_chunk": chunk, "bound": c.bound}
            row.update({f: _r(getattr(c, f)) for f in fields})
            base = base or c.total_s
            row["x_decode_only"] = _r(c.total_s / base)
            out["rows"].append(row)
    out["kv_bytes_per_token"] = dep.model.kv_bytes_per_token("bf16")
    out["prefill_alone_s"] = {str(L): _r(prefill_time_s(L)) for L in (512, 2048, 8192, 12288)}
    return out


# ---- plots -------------------------------------------------------------------------------------
def plot(results: dict[str, Any], img_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def panel(ax: Any, sweep: dict[str, Any], key: str, xlabel: str, title: str) -> None:
        pts = sweep["points"]
        xs = [p[key] for p in pts]
        for name, col, lab in (("colocated", "tab:blue", "colocated (best chunk)"), ("pd", "tab:red", "PD (best P:D)")):
            best = [p[name][str(p["best_colocated_chunk"]) if name == "colocated" else p["best_pd_split"]]["goodput_rps"]
                    for p in pts]
            m = [b["mean"] for b in best]
            ax.plot(xs, m, "o-", color=col, label=lab, ms=4)
            ax.fill_between(xs, [b["min"] for b in best], [b["max"] for b in best], color=col, alpha=0.15, lw=0)
        for i, p in enumerate(pts):
            ax.annotate(p["best_pd_split"], (xs[i], p["goodput_pd"]), textcoords="offset points", xytext=(0, 5),
                        fontsize=6, color="tab:red", ha="center")
        for c in sweep["crossovers"]:
            ax.axvline(c["x"], color="k", ls="--", lw=0.8)
            ax.annotate(f"crossover ~{c['x']:.0f}", (c["x"], 0.05), fontsize=7, rotation=90, ha="right", va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs], fontsize=6, rotation=45)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("goodput (req/s)")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")

    sp = results["sweep_prompt"]
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    panel(ax, sp, "prompt_tokens", "prompt tokens (mean)",
          f"Llama-3.1-70B, 16x H200 (TP4), {RATE_RPS:g} req/s, out {OUTPUT_TOKENS}, KV link {sp['gbps']:g} Gb/s per GPU\n"
          f"SLO: TPOT<={TPOT_SLO_S * 1e3:g} ms, TTFT<={TTFT_SLO_FACTOR:g}x unloaded prefill")
    fig.tight_layout()
    p = img_dir / "pd_crossover_prompt.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(str(p))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    for ax, key in zip(axes, ("sweep_link_long", "sweep_link_short"), strict=True):
        sw = results[key]
        panel(ax, sw, "gbps", "KV link per GPU NIC (Gb/s)",
              f"prompt {sw['prompt_tokens']} tokens, TTFT SLO {sw['ttft_slo_s'] * 1e3:.0f} ms, TPOT SLO "
              f"{TPOT_SLO_S * 1e3:g} ms")
    fig.tight_layout()
    p = img_dir / "pd_crossover_link.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(str(p))
    return paths


# ---- main ----------------------------------------------------------------------------------------
def sweep(key: str, values: tuple[float, ...], fixed: dict[str, Any], seeds: list[int], requests: int) -> dict[str, Any]:
    pts = []
    colo_cache: dict[int, dict[str, Any]] | None = None
    for v in values:
        args = {**fixed, key: v}
        # Colocated does not depend on the link: run it once per link sweep.
        pt = compare(int(args["prompt_tokens"]), float(args["gbps"]), seeds, requests,
                     colocated=colo_cache if key == "gbps" else None)
        if key == "gbps":
            colo_cache = {int(c): a for c, a in pt["colocated"].items()}
        pts.append(pt)
        print(f"  {key}={v:g}: colocated {pt['goodput_colocated']:.3f} (chunk {pt['best_colocated_chunk']}) "
              f"pd {pt['goodput_pd']:.3f} ({pt['best_pd_split']}) -> {pt['verdict']}", flush=True)
    xs = [float(p[key]) for p in pts]
    return {**fixed, "points": pts, "crossovers": crossovers(xs, [p["pd_minus_colocated"] for p in pts])}


def run_all(seeds: list[int], requests: int, quick: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "benchmark": "pd_crossover",
        "command": None,
        "setup": {"model": MODEL, "gpu": GPU, "tp": TP, "gpus": TP * REPLICAS, "replicas": REPLICAS,
                  "splits": [f"{p}:{d}" for p, d in SPLITS], "colocated_chunks": list(COLOCATED_CHUNKS),
                  "pd_chunk": CHUNK, "rate_rps": RATE_RPS, "output_tokens": OUTPUT_TOKENS,
                  "prompt_spread": PROMPT_SPREAD, "tpot_slo_s": TPOT_SLO_S, "ttft_slo_factor": TTFT_SLO_FACTOR,
                  "routing": "round-robin", "seeds": seeds, "requests": requests, "quick": quick,
                  "kv_link_latency_s": 20e-6},
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
    }
    res["step_breakdown"] = step_breakdown()
    print("case: long prompts, fast link", flush=True)
    res["case_long_prompts"] = compare(CASE_LONG["prompt_tokens"], CASE_LONG["gbps"], seeds, requests, detail=True)
    print(f"  -> {res['case_long_prompts']['verdict']}", flush=True)
    print("case: short prompts, slow link", flush=True)
    res["case_short_prompts"] = compare(CASE_SHORT["prompt_tokens"], CASE_SHORT["gbps"], seeds, requests, detail=True)
    print(f"  -> {res['case_short_prompts']['verdict']}", flush=True)
    print(f"sweep: prompt length at {SWEEP_PROMPT_GBPS:g} Gb/s", flush=True)
    res["sweep_prompt"] = sweep("prompt_tokens", SWEEP_PROMPTS_QUICK if quick else SWEEP_PROMPTS,
                                {"gbps": SWEEP_PROMPT_GBPS}, seeds, requests)
    links = SWEEP_LINKS_QUICK if quick else SWEEP_LINKS
    for key, L in (("sweep_link_long", SWEEP_LINK_PROMPT_LONG), ("sweep_link_short", SWEEP_LINK_PROMPT_SHORT)):
        print(f"sweep: KV link at prompt {L}", flush=True)
        res[key] = sweep("gbps", links, {"prompt_tokens": L}, seeds, requests)
        res[key]["ttft_slo_s"] = slo_for(L).ttft_max_s
    res["sweep_prompt"]["ttft_slo_s"] = {str(p["prompt_tokens"]): p["ttft_slo_s"] for p in res["sweep_prompt"]["points"]}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 120 requests, fewer sweep points")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 3 4 (quick: 0)")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default 500; quick: 120)")
    ap.add_argument("--out", default="benchmarks/results/pd_crossover.json")
    ap.add_argument("--img", default="docs/img")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    seeds = a.seeds if a.seeds is not None else ([0] if a.quick else [0, 1, 2, 3, 4])
    requests = a.requests if a.requests is not None else (120 if a.quick else 500)
    res = run_all(seeds, requests, a.quick)
    cmd = "python3 benchmarks/pd_crossover.py" + (" --quick" if a.quick else "")
    res["command"] = cmd + f" --seeds {' '.join(map(str, seeds))} --requests {requests}"
    if not a.no_plots:
        res["plots"] = plot(res, Path(a.img))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out} ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
