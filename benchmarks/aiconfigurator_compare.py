"""Cross-check against NVIDIA aiconfigurator: same model, system, lengths, SLOs and GPU budget.

Run:  python3 benchmarks/aiconfigurator_compare.py [--backends trtllm,vllm] [--no-steps]
                                                   [--aic-venv DIR] [--work-dir DIR]
                                                   [--out benchmarks/results/aiconfigurator_compare.json]

aiconfigurator (PyPI `aiconfigurator`, pinned by --aic-version) lives in a throwaway virtual
environment OUTSIDE the repository: --aic-venv, or the environment variable FLEETWISE_AIC_VENV,
default /tmp/aic-venv. On first use the script creates it with a CPython 3.11-3.13 (the versions
aiconfigurator supports; --aic-python, else the newest ~/.pyenv/versions/3.11*, 3.12*, 3.13*, or
python3.11-3.13 on PATH) and `pip install aiconfigurator==VERSION`, and reuses it afterwards. It
is never a fleetwise dependency, and nothing here imports it: its CLI runs as a subprocess
with HF_HUB_OFFLINE=1 (the wheel ships its model configs and its per-kernel performance
databases, so no network is needed).

The question comes from the fleetwise specs in benchmarks/specs/aic-*.yaml (one per model):
prompt and output lengths (fixed), the TTFT/TPOT targets, the GPU budget (search.max_gpus) and
the target rate. For each model the script runs
1. aiconfigurator in budget mode, per backend:
   `aiconfigurator cli default --model HF_ID --total-gpus BUDGET --system h200_sxm --backend B
    --isl ISL --osl OSL --ttft TTFT_MS --tpot TPOT_MS --top-n 5 --save-dir WORK`
   (best aggregated and disaggregated configurations, tokens/s/GPU at the most the budget serves);
2. aiconfigurator in rate mode (the question fleetwise answers): the same with
   `--target-request-rate RATE` instead of --total-gpus (fewest GPUs for the rate);
3. `fleetwise plan SPEC -o OUT --top 5` (timed);
4. single steps priced by both (unless --no-steps): `aiconfigurator cli estimate --estimate-mode
   static_ctx|static_gen` (one prompt of ISL tokens; a decode batch over ISL..ISL+OSL context)
   against fleetwise's roofline with the factors the planner uses (`PerfModel()`), so the
   differences in the plans can be traced to step times.
Writes the JSON (--out) and prints a side-by-side summary.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_venv import ensure_venv as ensure_peer_venv
from peer_venv import find_python

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = os.environ.get("FLEETWISE_AIC_VENV", "/tmp/aic-venv")
AIC_VERSION = "0.12.0"
SYSTEM = "h200_sxm"  # aiconfigurator's name for fleetwise's h200-sxm

# (label, aiconfigurator model id (config bundled in the wheel), fleetwise spec)
CASES = [
    ("Qwen3-32B", "Qwen/Qwen3-32B", "benchmarks/specs/aic-qwen3-32b-h200.yaml"),
    ("Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", "benchmarks/specs/aic-llama-3.1-70b-h200.yaml"),
]
# Single steps priced by both tools: ("ctx", tp, 1) one prompt; ("gen", tp, batch) decode.
STEP_POINTS = {
    "Qwen3-32B": [("ctx", 1, 1), ("ctx", 2, 1), ("ctx", 4, 1), ("gen", 2, 1), ("gen", 4, 1),
                  ("gen", 2, 56), ("gen", 4, 216)],
    "Llama-3.1-70B": [("ctx", 2, 1), ("ctx", 4, 1), ("gen", 2, 1), ("gen", 4, 1), ("gen", 8, 1),
                      ("gen", 2, 16), ("gen", 4, 128)],
}


# ---- the aiconfigurator venv -------------------------------------------------------------------
def ensure_venv(venv: Path, python: str | None, version: str) -> Path:
    """Create (once) and return the `aiconfigurator` executable of a venv with that version."""
    exe = venv / "bin" / "aiconfigurator"
    interpreter = python or (None if (venv / "bin" / "python").exists() else
                             find_python(None, ("3.11", "3.12", "3.13"), "--aic-python"))
    ensure_peer_venv(venv, "aiconfigurator", version, interpreter or "python3", " (about a minute)")
    if not exe.exists():
        sys.exit(f"{venv}: aiconfigurator is installed but its command is missing; remove the venv and rerun")
    return exe


def _aic_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    return env


def _run_aic(exe: Path, args: list[str], log: Path) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([str(exe), "cli", *args, "--no-color"], capture_output=True, text=True, env=_aic_env())
    wall = time.perf_counter() - t0
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"aiconfigurator {' '.join(args)} failed ({r.returncode}); log {log}:\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr, wall


# ---- parsing aiconfigurator's output -----------------------------------------------------------
def _f(x: str) -> float:
    return float(x) if x not in ("", None) else 0.0


def _agg_row(r: dict[str, str], budget: int | None) -> dict:
    per = int(_f(r["num_total_gpus"]))
    reps = (budget // per) if budget else None
    return {
        "backend": r["backend"], "parallel": f"TP{r['tp']} PP{r['pp']}", "tp": int(r["tp"]), "pp": int(r["pp"]),
        "gpus_per_replica": per, "replicas": reps, "gpus_used": per * reps if reps else None,
        "batch_size": int(_f(r["bs"])), "weights": r["gemm"], "kv": r["kvcache"],
        "tokens_per_s_per_gpu": _f(r["tokens/s/gpu"]), "tokens_per_s_per_user": _f(r["tokens/s/user"]),
        "req_per_s": _f(r["request_rate"]) * reps if reps else None, "req_per_s_per_replica": _f(r["request_rate"]),
        "ttft_ms": _f(r["ttft"]), "tpot_ms": _f(r["tpot"]), "memory_gib_per_gpu": _f(r["memory"]),
    }


def _disagg_row(r: dict[str, str], budget: int | None) -> dict:
    per = int(_f(r["num_total_gpus"]))
    reps = (budget // per) if budget else None
    pw, dw = int(_f(r["(p)workers"])), int(_f(r["(d)workers"]))
    return {
        "backend": r["(p)backend"], "prefill": f"{pw}x TP{r['(p)tp']} PP{r['(p)pp']} bs{r['(p)bs']}",
        "decode": f"{dw}x TP{r['(d)tp']} PP{r['(d)pp']} bs{r['(d)bs']}", "pd_workers": f"{pw}:{dw}",
        "prefill_tp": int(r["(p)tp"]), "decode_tp": int(r["(d)tp"]), "decode_batch": int(_f(r["(d)bs"])),
        "gpus_per_replica": per, "replicas": reps, "gpus_used": per * reps if reps else None,
        "weights": r["(p)gemm"], "kv": r["(p)kvcache"],
        "tokens_per_s_per_gpu": _f(r["tokens/s/gpu"]), "tokens_per_s_per_user": _f(r["tokens/s/user"]),
        "req_per_s": _f(r["request_rate"]) * reps if reps else None, "req_per_s_per_replica": _f(r["request_rate"]),
        "ttft_ms": _f(r["ttft"]), "tpot_ms": _f(r["tpot"]),
        "memory_gib_per_gpu": {"prefill": _f(r["(p)memory"]), "decode": _f(r["(d)memory"])},
    }


def _read_topn(save_dir: Path, mode: str) -> list[dict[str, str]]:
    files = sorted(save_dir.rglob(f"{mode}/best_config_topn.csv"))
    if not files:
        return []
    with files[-1].open() as fh:
        return list(csv.DictReader(fh))


def aic_default(exe: Path, model: str, q: dict, backend: str, work: Path, *, budget: int | None,
                rate: float | None) -> dict:
    tag = f"{model.split('/')[-1]}_{backend}_{'gpus' + str(budget) if budget else 'rate' + str(rate)}"
    save = work / tag
    args = ["default", "--model", model, "--system", SYSTEM, "--backend", backend,
            "--isl", str(q["isl"]), "--osl", str(q["osl"]), "--ttft", f"{q['ttft_ms']:g}", "--tpot", f"{q['tpot_ms']:g}",
            "--top-n", "5", "--save-dir", str(save)]
    args += ["--total-gpus", str(budget)] if budget else ["--target-request-rate", f"{rate:g}"]
    out, wall = _run_aic(exe, args, work / f"{tag}.log")
    res: dict = {"command": "aiconfigurator cli " + " ".join(a for a in args if not a.startswith(str(work))
                                                              ).replace("--save-dir", "--save-dir DIR"),
                 "wall_s": round(wall, 1)}
    m = re.search(r"Best Experiment Chosen: (\w+)", out)
    res["best_mode"] = m.group(1) if m else None
    for mode in ("agg", "disagg"):
        need = re.search(rf"{mode} GPUs needed: (\d+) \(replicas: (\d+)\)", out)
        rows = _read_topn(save, mode)
        if budget:
            res[mode] = [(_agg_row if mode == "agg" else _disagg_row)(r, budget) for r in rows]
        else:  # rate mode: replicas from aiconfigurator's own "GPUs needed" line for the best row
            res[mode] = [(_agg_row if mode == "agg" else _disagg_row)(r, None) for r in rows[:3]]
            if need:
                res[f"{mode}_gpus_needed"] = int(need.group(1))
                res[f"{mode}_replicas_needed"] = int(need.group(2))
    return res


def aic_step(exe: Path, model: str, q: dict, kind: str, tp: int, bs: int, backend: str, work: Path) -> dict:
    mode = "static_ctx" if kind == "ctx" else "static_gen"
    args = ["estimate", "--model", model, "--system", SYSTEM, "--backend", backend, "--isl", str(q["isl"]),
            "--osl", str(q["osl"]), "--estimate-mode", mode, "--bs", str(bs), "--tp", str(tp)]
    out, _ = _run_aic(exe, args, work / f"est_{model.split('/')[-1]}_{kind}_tp{tp}_bs{bs}.log")
    m = re.search(r"TTFT:\s+([\d.]+) ms" if kind == "ctx" else r"TPOT:\s+([\d.]+) ms", out)
    return {"ms": float(m.group(1)) if m else None}


# ---- fleetwise ---------------------------------------------------------------------------------
def question(spec_path: Path) -> dict:
    from fleetwise.spec.planning import load_planning_spec

    s = load_planning_spec(spec_path)
    w = s.workload
    assert w.prompt_tokens is not None and w.output_tokens is not None
    assert w.prompt_tokens.kind == "fixed" and w.output_tokens.kind == "fixed", "the cross-check needs fixed lengths"
    return {"model": s.model, "accelerator": s.accelerators[0].name, "isl": w.prompt_tokens.tokens,
            "osl": w.output_tokens.tokens, "ttft_ms": s.slo.ttft_s * 1e3, "tpot_ms": s.slo.tpot_s * 1e3,
            "percentile": s.slo.percentile, "attainment": s.slo.attainment, "budget_gpus": s.search.max_gpus,
            "rate_rps": w.rate_rps, "weight_dtypes": list(s.weight_dtypes), "kv_dtype": s.kv_dtype}


def _fw_plan_row(p: dict, q: dict) -> dict:
    pools = {x["role"]: x for x in p["pools"]}
    row = {"rank": p["rank"], "kind": p["kind"], "gpus": p["gpus"],
           "pools": [f"{x['replicas']}x {x['role']} TP{x['tp']} PP{x['pp']} {x['weight_dtype']}" for x in p["pools"]],
           "pd_ratio": p.get("pd_ratio"),
           "served_tokens_per_s_per_gpu": q["rate_rps"] * q["osl"] / p["gpus"],
           "ttft_p50_ms": p["predicted"]["ttft_p50_s"] * 1e3, "ttft_p99_ms": p["predicted"]["ttft_p99_s"] * 1e3,
           "tpot_p50_ms": p["predicted"]["tpot_p50_s"] * 1e3, "tpot_p99_ms": p["predicted"]["tpot_p99_s"] * 1e3,
           "slo_attainment": p["predicted"]["slo_attainment"],
           "slo_attainment_ci95": p["predicted"].get("slo_attainment_ci95"),
           "engine": p.get("engine")}
    h = p["headroom"]
    # capacity: what the plan's replicas sustain within the SLO (measured goodput), per GPU
    if "mixed" in pools:
        g = h["mixed"]["goodput_per_replica_rps"]
        row["capacity_req_per_s"] = g * pools["mixed"]["replicas"]
    else:
        row["capacity_req_per_s"] = min(h[r]["goodput_per_replica_rps"] * pools[r]["replicas"]
                                        for r in ("prefill", "decode"))
        row["goodput_per_replica_rps"] = {r: h[r]["goodput_per_replica_rps"] for r in ("prefill", "decode")}
    if "mixed" in pools:
        row["goodput_per_replica_rps"] = h["mixed"]["goodput_per_replica_rps"]
    row["capacity_tokens_per_s_per_gpu"] = row["capacity_req_per_s"] * q["osl"] / p["gpus"]
    return row


def fleetwise_plan(spec_path: Path, q: dict, work: Path) -> dict:
    out = work / (spec_path.stem + ".plan.json")
    t0, c0 = time.perf_counter(), os.times()
    r = subprocess.run([sys.executable, "-c", "from fleetwise.cli.main import main; main()", "plan", str(spec_path), "-o", str(out), "--top", "5"],
                       capture_output=True, text=True, cwd=REPO)
    wall, c1 = time.perf_counter() - t0, os.times()
    if r.returncode not in (0, 1):
        raise RuntimeError(f"fleetwise plan {spec_path} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    d = json.loads(out.read_text())
    rows = [_fw_plan_row(p, q) for p in d["plans"]]
    best = {k: next((x for x in rows if x["kind"] == k), None) for k in ("colocated", "disaggregated")}
    dis = d.get("disaggregation") or {}
    return {"command": f"fleetwise plan {spec_path.relative_to(REPO)} --json OUT --top 5", "exit_code": r.returncode,
            "wall_s": round(wall, 1), "cpu_s": round((c1.children_user + c1.children_system)
                                                     - (c0.children_user + c0.children_system), 1),
            "infeasible": d.get("infeasible"), "plans": rows, "best": rows[0] if rows else None,
            "best_colocated": best["colocated"], "best_disaggregated": best["disaggregated"],
            "disaggregation_verdict": dis.get("verdict"), "disaggregation_reason": dis.get("reason"),
            "rejected": [f"{x['candidate']}: {x['reason']}" for x in d.get("rejected", [])],
            "search": d.get("search")}


def fleetwise_step(model: str, accel: str, kind: str, tp: int, bs: int, q: dict) -> dict:
    """The planner's roofline (default factors, as `fleetwise.planner.latency` uses) for one step."""
    from fleetwise.perf import Deployment, PerfModel, SeqWork
    from fleetwise.perf.memory import FitOptions, layout_fit
    from fleetwise.spec.catalog import resolve_gpu, resolve_model
    from fleetwise.spec.parallel import ParallelismSpec

    m, g = resolve_model(model), resolve_gpu(accel)
    dep = Deployment(m, g, ParallelismSpec(tp=tp), "bf16", q["kv_dtype"])
    fit = layout_fit(m, g, ParallelismSpec(tp=tp), "bf16", q["kv_dtype"], FitOptions(context_tokens=q["isl"] + q["osl"]))
    fits = fit.kv_capacity_tokens >= (q["isl"] + q["osl"]) * bs  # the whole batch at full context
    pm = PerfModel()
    if kind == "ctx":
        c = pm.step_cost([SeqWork(q["isl"], 0)], dep)
    else:  # static_gen's TPOT averages the steps over context ISL..ISL+OSL: the middle step
        c = pm.step_cost([SeqWork(1, q["isl"] + q["osl"] // 2)] * bs, dep)
    parts = {k: round(getattr(c, k) * 1e3, 2) for k in ("weight_memory_s", "gemm_compute_s", "kv_memory_s",
                                                          "attention_s", "tp_comm_s", "overhead_s")}
    return {"ms": round(c.total_s * 1e3, 2), "bound": c.bound, "parts_ms": parts, "fits_in_fleetwise": fits}


def fleetwise_source() -> dict:
    """The commit the run used, and whether src/ had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "--", "src"))}


# ---- report ------------------------------------------------------------------------------------
def _aic_line(r: dict | None) -> str:
    if not r:
        return "-"
    if "pd_workers" in r:
        shape = f"({r['replicas']}x) P {r['prefill']} + D {r['decode']} (P:D workers {r['pd_workers']})"
    else:
        shape = f"{r['replicas']}x {r['parallel']} bs{r['batch_size']}"
    return (f"{shape} = {r['gpus_used']} GPUs: {r['tokens_per_s_per_gpu']:.0f} tok/s/GPU, "
            f"{r['req_per_s']:.2f} req/s, TTFT {r['ttft_ms']:.0f} ms, TPOT {r['tpot_ms']:.1f} ms")


def _fw_line(r: dict | None) -> str:
    if not r:
        return "-"
    return (f"{' + '.join(r['pools'])} = {r['gpus']} GPUs (P:D {r['pd_ratio'] or '-'}): "
            f"served {r['served_tokens_per_s_per_gpu']:.0f} tok/s/GPU, capacity {r['capacity_tokens_per_s_per_gpu']:.0f}"
            f" tok/s/GPU ({r['capacity_req_per_s']:.2f} req/s), TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms,"
            f" TPOT p50/p99 {r['tpot_p50_ms']:.1f}/{r['tpot_p99_ms']:.1f} ms, attainment {r['slo_attainment']:.1%}")


def summary_text(result: dict) -> str:
    lines = []
    for case in result["cases"]:
        q = case["question"]
        lines.append(f"== {case['label']} on {q['accelerator']} / {SYSTEM}: ISL {q['isl']} OSL {q['osl']}, TTFT "
                     f"{q['ttft_ms']:.0f} ms, TPOT {q['tpot_ms']:.0f} ms, budget {q['budget_gpus']} GPUs, rate {q['rate_rps']:g} req/s")
        for b, a in case["aiconfigurator"].items():
            bud = a["budget"]
            lines.append(f"  aic {b} best ({bud['best_mode']}):")
            lines.append(f"    agg    {_aic_line(bud['agg'][0] if bud['agg'] else None)}")
            lines.append(f"    disagg {_aic_line(bud['disagg'][0] if bud['disagg'] else None)}")
            rr = a.get("rate")
            if rr:
                lines.append(f"    at {q['rate_rps']:g} req/s: agg needs {rr.get('agg_gpus_needed')} GPUs, disagg "
                             f"{rr.get('disagg_gpus_needed')} GPUs (best: {rr['best_mode']})")
        f = case["fleetwise"]
        lines.append(f"  fleetwise ({f['wall_s']} s): verdict {f['disaggregation_verdict']}; infeasible: {f['infeasible']}")
        lines.append(f"    best          {_fw_line(f['best'])}")
        lines.append(f"    colocated     {_fw_line(f['best_colocated'])}")
        lines.append(f"    disaggregated {_fw_line(f['best_disaggregated'])}")
        for s in case.get("steps", []):
            lines.append(f"    step {s['kind']} TP{s['tp']} bs{s['batch']}: aic {s['aic_ms']} ms, fleetwise "
                         f"{s['fleetwise_ms']} ms ({s['ratio_fw_over_aic']}x){'' if s['fits_in_fleetwise'] else ' [does not fit in fleetwise]'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="trtllm,vllm", help="aiconfigurator backends, comma-separated")
    ap.add_argument("--step-backend", default="trtllm", help="backend for the single-step estimates")
    ap.add_argument("--no-steps", action="store_true", help="skip the single-step comparison")
    ap.add_argument("--no-rate-mode", action="store_true", help="skip aiconfigurator's --target-request-rate runs")
    ap.add_argument("--aic-venv", default=DEFAULT_VENV)
    ap.add_argument("--aic-python", default=None)
    ap.add_argument("--aic-version", default=AIC_VERSION)
    ap.add_argument("--work-dir", default=None, help="keep aiconfigurator's outputs and logs here (default: temp dir)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "aiconfigurator_compare.json"))
    a = ap.parse_args()

    exe = ensure_venv(Path(a.aic_venv), a.aic_python, a.aic_version)
    tmp = None if a.work_dir else tempfile.TemporaryDirectory(prefix="fw-aic-")
    work = Path(a.work_dir or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    cases = []
    try:
        for label, hf, spec in CASES:
            sp = REPO / spec
            q = question(sp)
            print(f"{label}: aiconfigurator ({a.backends}) and fleetwise ...", file=sys.stderr)
            aic = {}
            for b in a.backends.split(","):
                aic[b] = {"budget": aic_default(exe, hf, q, b, work, budget=q["budget_gpus"], rate=None)}
                if not a.no_rate_mode:
                    aic[b]["rate"] = aic_default(exe, hf, q, b, work, budget=None, rate=q["rate_rps"])
            fw = fleetwise_plan(sp, q, work)
            steps = []
            if not a.no_steps:
                for kind, tp, bs in STEP_POINTS[label]:
                    ae = aic_step(exe, hf, q, kind, tp, bs, a.step_backend, work)
                    fe = fleetwise_step(q["model"], q["accelerator"], kind, tp, bs, q)
                    steps.append({"kind": "prefill (one ISL prompt)" if kind == "ctx" else "decode step (TPOT)",
                                  "tp": tp, "batch": bs, "aic_backend": a.step_backend, "aic_ms": ae["ms"],
                                  "fleetwise_ms": fe["ms"], "fleetwise_bound": fe["bound"],
                                  "fleetwise_parts_ms": fe["parts_ms"], "fits_in_fleetwise": fe["fits_in_fleetwise"],
                                  "ratio_fw_over_aic": round(fe["ms"] / ae["ms"], 2) if ae["ms"] else None})
            cases.append({"label": label, "aic_model": hf, "fleetwise_spec": spec, "question": q,
                          "aiconfigurator": aic, "fleetwise": fw, "steps": steps})
    finally:
        if tmp is not None:
            tmp.cleanup()
    aic_ver = subprocess.run([str(Path(a.aic_venv) / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('aiconfigurator'), m.version('aiconfigurator-core'))"],
                             capture_output=True, text=True).stdout.split()
    result = {
        "schema": "fleetwise-aiconfigurator-compare/1",
        "aiconfigurator": {"version": aic_ver[0] if aic_ver else None, "core": aic_ver[1] if len(aic_ver) > 1 else None,
                           "system": SYSTEM, "backends": a.backends.split(","), "venv": a.aic_venv,
                           "offline": "HF_HUB_OFFLINE=1; model configs and perf databases ship in aiconfigurator-core"},
        "fleetwise_source": fleetwise_source(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_end": os.getloadavg()},
        "wall_s": round(time.perf_counter() - t_start, 1),
        "cases": cases,
    }
    result["summary"] = summary_text(result).splitlines()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary_text(result))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
