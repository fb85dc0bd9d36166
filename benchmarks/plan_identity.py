"""Plans unchanged: plan every spec of `examples/`, `benchmarks/specs/` and the built-in question
with two source trees and compare the sections a change to the search must leave alone.

Run:  python3 benchmarks/plan_identity.py BASE [HEAD] [--workers N] [--only NAME ...] [--sides base,head]
                                          [--compiled head] [--keep DIR] [--out benchmarks/results/plan_identity.json]

BASE and HEAD are commits (exported with `git archive`, pure Python) or `.` for the working
tree (default HEAD). Each spec runs as `fleetwise plan SPEC -o OUT --quiet --workers N` in a
fresh subprocess with that tree's `src` first on `PYTHONPATH`, one after the other, so each
figure is the process's own CPU time (user + system of it and its workers, getrusage). The
sections compared are the plan document's `plans`, `fleet`, `disaggregation` and `infeasible`
(what a search change must not move; `candidates`, `pd_sweep` and `search` may); `search.wall_s`
is never compared. Prints one line per spec and writes the figures and any differing section.
With `--keep DIR` each side's result (document and figures) is kept as `DIR/NAME.SIDE.result.json`
and reused by a later run with the same DIR while its tree's sources and the spec are unchanged
(`fingerprint`; a changed tree is planned again), so a base measured once (`--sides base`) is
compared with the working tree as it changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("plans", "fleet", "disaggregation", "infeasible")
"""The plan document's sections that must stay identical (docs/planner.md, "How the search is bounded")."""
CLI = "from fleetwise.cli.main import main; main()"


def specs() -> list[tuple[str, Path | None]]:
    """(name, path or None for the built-in question) of every spec planned."""
    found = sorted([*(ROOT / "examples").glob("*.yaml"), *(ROOT / "benchmarks" / "specs").glob("*.yaml")])
    return [("built-in", None)] + [(p.stem, p) for p in found if _is_planning_spec(p)]


def _is_planning_spec(path: Path) -> bool:
    """A planning spec has `workload.rate_rps` and an `slo` (examples/ also holds fleets and gateways)."""
    import yaml

    d = yaml.safe_load(path.read_text())
    return isinstance(d, dict) and "slo" in d and isinstance(d.get("workload"), dict) and "rate_rps" in d["workload"]


def tree(ref: str, tmp: Path) -> Path:
    """The `src` directory of `ref`: this checkout's for `.`, else the commit exported."""
    if ref == ".":
        return ROOT / "src"
    dest = tmp / ref.replace("/", "_")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def plan_one(src: Path, spec: Path | None, out: Path, workers: int, compiled: bool = False) -> dict[str, Any]:
    """Plan one spec with the tree at `src`: its document, CPU and wall seconds. Pure Python
    unless `compiled` (the tree's built extensions, if any, then load: `.` after `pip install -e .`)."""
    env = {**os.environ, "PYTHONPATH": str(src), "FLEETWISE_PURE_PYTHON": "" if compiled else "1"}
    cmd = [sys.executable, "-c", CLI, "plan", *([str(spec)] if spec else []), "-o", str(out), "--quiet",
           "--workers", str(workers)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if r.returncode not in (0, 1):
        raise RuntimeError(f"fleetwise plan {spec or ''} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return {"doc": doc, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "simulations": (doc.get("search") or {}).get("simulations")}


def compare(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """The sections of `SECTIONS` that differ between two plan documents."""
    return [s for s in SECTIONS if json.dumps(base.get(s), sort_keys=True) != json.dumps(head.get(s), sort_keys=True)]


def fingerprint(src: Path, spec: Path | None) -> str:
    """SHA-256 of the tree's Python sources (paths and bytes) and the spec: what a kept result was planned from."""
    h = hashlib.sha256()
    for path in sorted(src.rglob("*.py")):
        h.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(spec.read_bytes() if spec else b"built-in")
    return h.hexdigest()


def _result(a: argparse.Namespace, tmp: Path, name: str, side: str, src: Path, spec: Path | None) -> dict[str, Any]:
    """One side's result: kept from an earlier run with the same --keep and the same sources, else planned now."""
    kept = tmp / f"{name}.{side}.result.json"
    fp = fingerprint(src, spec)
    if kept.exists():
        old = dict(json.loads(kept.read_text()))
        if old.get("fingerprint") == fp:
            return old
        print(f"{kept}: planned from other sources than {side}'s now; planning again", file=sys.stderr)
    if side not in a.sides.split(","):
        return {}
    got = plan_one(src, spec, tmp / f"{name}.{side}.json", a.workers, side in a.compiled.split(","))
    got["fingerprint"] = fp
    kept.write_text(json.dumps(got))
    print(json.dumps({"spec": name, "side": side, **{k: got[k] for k in ("cpu_s", "wall_s", "simulations")}}),
          file=sys.stderr, flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default=".")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="spec names (file stems, `built-in`) to plan")
    ap.add_argument("--keep", default=None, help="directory to keep (and reuse) each side's results in")
    ap.add_argument("--sides", default="base,head", help="which sides to plan now (the others must be kept)")
    ap.add_argument("--compiled", default="", help="sides to run with their built extensions (`head` for `.` "
                                                   "installed with `pip install -e .`); the rest run pure Python")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_identity.json"))
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fw-planid-") as t:
        tmp = Path(a.keep or t)
        srcs = {"base": tree(a.base, tmp), "head": tree(a.head, tmp)}
        for name, spec in specs():
            if a.only and name not in a.only:
                continue
            got = {side: r for side, src in srcs.items() if (r := _result(a, tmp, name, side, src, spec))}
            if len(got) < 2:
                continue
            diff = compare(got["base"]["doc"], got["head"]["doc"])
            row = {"spec": name, "identical": not diff, "differs": diff,
                   **{f"{side}_{k}": got[side][k] for side in got for k in ("cpu_s", "wall_s", "simulations")}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"schema": "fleetwise-plan-identity/1", "base": a.base, "head": a.head,
                                       "workers": a.workers, "specs": rows}, indent=1) + "\n")
    print(f"{sum(r['identical'] for r in rows)}/{len(rows)} identical; wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
