"""Simulator speed of two commits, measured in one run: the round-robin and default-policy rows of
`benchmarks/sim_speed.py`, alternating between the commits so both see the same machine load.

Run:  python3 benchmarks/compare_commits.py BASE [HEAD] [--rr 200000:64] [--default 50000:64]
                                            [--repeats 3] [--load light|busy]
                                            [--out benchmarks/results/compare_commits.json]

Each commit is exported with `git archive` into a temporary directory and every row runs in a
fresh subprocess with that tree's `src` first on `PYTHONPATH` (HEAD defaults to the working
tree). Rows use this checkout's `sim_speed.run_one` (the same workload for both). Reported per
row: each commit's CPU seconds per repeat (`process_time`, the steadier figure on a shared
machine), their medians, `head_over_base`, the ratio of medians (< 1: HEAD is faster), and
`same_results`: both commits' results are identical (`sim_speed.results_digest`: the summary less
its wall time, and the request records byte for byte).
A tree exported by `git archive` runs pure Python (nothing compiled); the working tree runs
what `pip install -e .` built in it (setup.py), so BASE against the working tree compares a
commit as the sources run it with this checkout as installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROW = """
import json, sys
sys.path.insert(0, {bench!r})
from sim_speed import BUSY, LIGHT, run_one
n, reps = {size!r}
load = BUSY if {load!r} == "busy" else LIGHT
print(json.dumps(run_one(n, reps, load.rate_per_replica, 0.25, 0, policy={policy!r}, load=load, digest=True)))
"""


def export(commit: str, into: Path) -> Path:
    """`commit`'s tree under `into` (git archive); returns its src directory."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def run_row(src: Path, size: tuple[int, int], policy: str, load: str = "light") -> dict[str, Any]:
    """One `sim_speed.run_one` row (`load`: sim_speed's light or busy workload) in a fresh
    interpreter importing fleetwise from `src`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = ROW.format(bench=str(ROOT / "benchmarks"), size=size, policy=policy, load=load)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="commit to compare against")
    ap.add_argument("head", nargs="?", default=None, help="commit to measure (default: the working tree)")
    ap.add_argument("--rr", default="200000:64", help="requests:replicas of the round-robin row")
    ap.add_argument("--default", default="50000:64", help="requests:replicas of the default-policy row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", choices=("light", "busy"), default="light",
                    help="sim_speed's workload: light (2 req/s per replica, H100) or busy (10 req/s per replica, "
                         "H200, Azure-like lengths)")
    ap.add_argument("--out", default="benchmarks/results/compare_commits.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": export(a.base, Path(tmp) / "base"),
                 "head": export(a.head, Path(tmp) / "head") if a.head else ROOT / "src"}
        rows: dict[str, Any] = {}
        for policy, spec in (("round-robin", a.rr), ("fleetwise-default", a.default)):
            size = tuple(int(x) for x in spec.split(":"))
            cpu: dict[str, list[float]] = {"base": [], "head": []}
            results: dict[str, dict[str, Any]] = {}
            for _ in range(a.repeats):
                for which, src in trees.items():
                    r = run_row(src, size, policy, a.load)  # type: ignore[arg-type]
                    cpu[which].append(r["cpu_s"])
                    results[which] = r
                    print(policy, which, r["cpu_s"], flush=True)
            med = {k: statistics.median(v) for k, v in cpu.items()}
            rows[policy] = {
                "requests": size[0], "replicas": size[1], "cpu_s": cpu, "median_cpu_s": med,
                "head_over_base": round(med["head"] / med["base"], 3),
                "same_results": results["base"]["digest"] == results["head"]["digest"],
            }
    doc = {"base": a.base, "head": a.head or "working tree", "load": a.load, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
