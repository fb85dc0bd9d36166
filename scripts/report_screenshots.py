"""Screenshots of example reports for the README and docs: `python3 scripts/report_screenshots.py`.

Builds three reports (a PD simulation under faults, the kept full-size scenario run, the kept
default plan) into a temporary folder, loads each in headless Chromium and writes
docs/img/report-{simulation,scenarios,plan}.png. Needs chromium (Debian: apt-get install -y chromium).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from fleetwise.cli.main import main
from fleetwise.report import write_report
from fleetwise.report.browser import load

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
SIZE = (1280, 1500)


def shoot(html: Path, name: str) -> None:
    out = IMG / f"report-{name}.png"
    got = load(html.resolve().as_uri(), screenshot=out, size=SIZE)
    if got.console or got.returncode:
        sys.exit(f"{html}: console {got.console}, exit {got.returncode}")
    print(f"wrote {out.relative_to(ROOT)}")


def run() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        assert main(["simulate", str(ROOT / "examples/plans/pd-70b.yaml"), "--workload",
                     str(ROOT / "examples/workloads/poisson-chat.yaml"), "--faults",
                     str(ROOT / "examples/plans/pd-70b.faults.yaml"), "--tpot-slo", "0.05", "--quiet",
                     "--out", str(d / "sim"), "--report", str(d / "sim.html")]) == 0
        shoot(d / "sim.html", "simulation")
        shoot(write_report(ROOT / "benchmarks/results/scenarios/scenarios.json", d / "sc.html"), "scenarios")
        shoot(write_report(ROOT / "benchmarks/results/report_examples/plan_default.json", d / "plan.html"), "plan")


if __name__ == "__main__":
    run()
