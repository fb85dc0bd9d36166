"""Planner search speed: `fleetwise plan` on the built-in question and on the slowest example.

Run:  python3 benchmarks/planner_speed.py [--repeat 3] [--workers N] [--profile | --no-profile]
                                          [--spec SPEC.yaml --target-s S]
                                          [--out benchmarks/results/planner_speed.json]

Issue 26 asks the default `fleetwise plan` (no spec: the built-in question, Llama-3.1-70B chat on
H100 vs H200 at 10 req/s) to answer in under 3 s and the slowest spec of examples/ and
benchmarks/specs/ in under 10 s on the 2-core machine, plans unchanged. The slowest, measured
with --workers 1 on the unchanged code (CPU s: pd-8b-sharegpt 150, rag-long-context-pd 77, the
built-in question 73, hetero-prefill-decode 66, planner-speed-70b-3gpus 61, aic-qwen3-32b 25,
moe-2.8t 17, aic-llama-3.1-70b 10), is examples/pd-8b-sharegpt.yaml: Llama-3.1-8B at 40 req/s,
P/D only, so every run carries 2,400 requests. `--spec` times one spec instead (the issue-5
question, benchmarks/specs/planner-speed-70b-3gpus.yaml, had a 60 s target).

Each repeat runs the real command line, `fleetwise plan [SPEC] -o OUT [--workers N]`, as a
subprocess and records its wall time, its CPU time (user + system of the process and its worker
processes, from getrusage(RUSAGE_CHILDREN)), the 1-minute load average before and after (other
work on a 2-core machine shows up there and in wall > CPU / cores), and the planner's own
counters (`search`: layouts estimated, candidates sized, simulations, wall_s), and the plans.
`pure_python` says whether the runs used the sources (`FLEETWISE_PURE_PYTHON=1`, or no compiled
build in the checkout) rather than the mypyc-compiled modules, which are several times faster.

Profiling (--profile, and automatically when the median wall time misses the target): one more
run in a subprocess under cProfile with --workers 1, so every simulation runs in the profiled
process; the JSON gets the cumulative time of each planner phase and the top functions by
internal time. The profile itself is written next to --out only when --keep-profile is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [("built-in question", None, 3.0), ("slowest example", REPO / "examples" / "pd-8b-sharegpt.yaml", 10.0)]
"""(name, spec or None for the built-in one, target wall seconds): issue 26's two targets."""
CLI = "from fleetwise.cli.main import main; main()"
# planner phases (fleetwise.planner.api.plan calls them in this order)
PHASES = [("api.py", "plan"), ("fit.py", "prepare"), ("latency.py", "run"), ("goodput.py", "run"),
          ("sizing.py", "run"), ("refinement.py", "run"), ("checks.py", "run"), ("disaggregation.py", "run"),
          ("ranking.py", "run"), ("report.py", "to_json"), ("report.py", "render")]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fleetwise_source() -> dict:
    """The commit the run used, and whether src/ had uncommitted changes; with PYTHONPATH set
    (another tree's `src` first, e.g. a commit exported for a before/after pair) that path,
    since the checkout's commit is then not what ran."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
    out = {"commit": git("rev-parse", "--short", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "--", "src"))}
    if os.environ.get("PYTHONPATH"):
        out["pythonpath"] = os.environ["PYTHONPATH"]
    return out


def run_once(spec: Path | None, workers: int | None, out: Path) -> dict:
    cmd = [sys.executable, "-c", CLI, "plan", *([str(spec)] if spec else []), "-o", str(out), "--quiet"]
    if workers:
        cmd += ["--workers", str(workers)]
    load0, cpu0, t0 = os.getloadavg()[0], _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall, cpu, load1 = time.perf_counter() - t0, _children_cpu() - cpu0, os.getloadavg()[0]
    if r.returncode not in (0, 1):
        raise RuntimeError(f"fleetwise plan failed ({r.returncode}):\n{r.stderr[-2000:]}")
    d = json.loads(out.read_text())
    plans = [{"rank": p["rank"], "kind": p["kind"], "gpus": p["gpus"], "cost_per_hour": p["cost_per_hour"],
              "pools": [f"{x['replicas']}x {x['role']} {x['accelerator']} {x['weight_dtype']} TP{x['tp']} PP{x['pp']}"
                        for x in p["pools"]]} for p in d["plans"]]
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_over_wall": round(cpu / wall, 2),
            "load_avg_1m_before": round(load0, 2), "load_avg_1m_after": round(load1, 2),
            "exit_code": r.returncode, "search": d.get("search"), "infeasible": d.get("infeasible"), "plans": plans}


def profile(spec: Path | None, out_json: Path, prof: Path, top: int = 25) -> dict:
    args = [*([str(spec)] if spec else []), "-o", str(out_json), "--quiet", "--workers", "1"]
    code = (f"import cProfile, sys; sys.argv = ['fleetwise', 'plan', *{args!r}]\n"
            f"from fleetwise.cli.main import main\n"
            f"cProfile.run('try:\\n main()\\nexcept SystemExit:\\n pass', {str(prof)!r})")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    st = pstats.Stats(str(prof))
    total = max(v[3] for v in st.stats.values())  # type: ignore[attr-defined]
    phases = {}
    for fname, func in PHASES:
        for (f, _line, name), (_cc, _nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            if f.endswith("planner/" + fname) and name == func:
                phases[f"{fname.removesuffix('.py')}.{name}"] = round(ct, 2)
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    by_tottime = [{"function": f"{Path(f).parent.name}/{Path(f).name}:{line}({name})", "calls": nc,
                   "tottime_s": round(tt, 2), "cumtime_s": round(ct, 2)}
                  for (f, line, name), (_cc, nc, tt, ct, _c) in rows]
    cum = sorted(st.stats.items(), key=lambda kv: kv[1][3], reverse=True)  # type: ignore[attr-defined]
    by_cum = [{"function": f"{Path(f).parent.name}/{Path(f).name}:{line}({name})", "calls": nc,
               "cumtime_s": round(ct, 2)} for (f, line, name), (_cc, nc, _tt, ct, _c) in cum
              if "fleetwise" in f][:top]
    d = json.loads(out_json.read_text())
    return {"workers": 1, "wall_s": round(wall, 2), "profiled_total_s": round(total, 2),
            "load_avg_1m_before": round(load0, 2), "search": d.get("search"), "phases_cum_s": phases,
            "top_by_tottime": by_tottime, "top_fleetwise_by_cumtime": by_cum}


def time_case(name: str, spec: Path | None, target_s: float, a: argparse.Namespace, out: Path, tmp: str) -> dict:
    """`a.repeat` timed runs of one spec (and a profile when asked or when the median misses)."""
    runs = []
    for i in range(a.repeat):
        r = run_once(spec, a.workers, Path(tmp) / f"plan{i}.json")
        print(f"{name} run {i + 1}/{a.repeat}: wall {r['wall_s']} s, CPU {r['cpu_s']} s, load "
              f"{r['load_avg_1m_before']} -> {r['load_avg_1m_after']}, {r['search']}", file=sys.stderr)
        runs.append(r)
    walls = [r["wall_s"] for r in runs]
    med = statistics.median(walls)
    shown = (str(spec.relative_to(REPO)) if spec.is_relative_to(REPO) else str(spec)) if spec else None
    result = {
        "case": name, "spec": shown,
        "command": f"fleetwise plan {spec.name if spec else ''} -o OUT".replace("  ", " ")
                   + (f" --workers {a.workers}" if a.workers else ""),
        "target_s": target_s, "wall_s_median": med, "wall_s_min": min(walls), "wall_s_max": max(walls),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs), "meets_target": med < target_s,
        "runs": runs,
    }
    if a.profile or (not a.no_profile and med >= target_s):
        prof = (out.with_name(f"{out.stem}-{name.replace(' ', '-')}.prof") if a.keep_profile else Path(tmp) / "plan.prof")
        result["profile"] = profile(spec, Path(tmp) / "prof.json", prof)
        print(f"{name} profile (workers 1): wall {result['profile']['wall_s']} s, phases "
              f"{result['profile']['phases_cum_s']}", file=sys.stderr)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=None, help="time this spec alone (default: issue 26's two cases)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="passed to fleetwise plan (default: its own, the CPU count)")
    ap.add_argument("--target-s", type=float, default=10.0, help="the target of --spec")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--profile", action="store_true", help="always add a cProfile run")
    g.add_argument("--no-profile", action="store_true", help="never profile, even on a miss")
    ap.add_argument("--keep-profile", action="store_true", help="keep the .prof files next to --out")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "planner_speed.json"))
    a = ap.parse_args()

    out = Path(a.out)
    cases = [("spec", Path(a.spec).resolve(), a.target_s)] if a.spec else CASES
    with tempfile.TemporaryDirectory(prefix="fw-planspeed-") as tmp:
        timed = [time_case(name, spec, target, a, out, tmp) for name, spec, target in cases]
    result = {
        "schema": "fleetwise-planner-speed/2",
        "fleetwise_source": fleetwise_source(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "pure_python": os.environ.get("FLEETWISE_PURE_PYTHON") == "1" or not (REPO / "src" / "fleetwise" / "core" / "compiled.json").exists(),
        "cases": timed,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps([{k: c[k] for k in ("case", "wall_s_median", "cpu_s_median", "target_s", "meets_target")}
                      for c in timed]))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
