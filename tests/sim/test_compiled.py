"""The compiled simulator (mypyc, setup.py) against its pure Python sources: identical results.

One seeded busy run and one P/D run with faults, each in two fresh processes: one on the
compiled modules, one with `FLEETWISE_PURE_PYTHON=1`. The summaries (less the wall time) must
be equal and the request records byte-identical. Skipped, saying why, where the install
compiled nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwise.core import compiled

RUN = r"""
import json, sys
from pathlib import Path

import numpy as np
import yaml

from fleetwise.core.request import Request
from fleetwise.core import compiled
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.base import validate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec

case, out = sys.argv[1], Path(sys.argv[2])
rng = np.random.default_rng(7)
n, rate = (1500, 160.0) if case == "busy" else (300, 6.0)
t = np.cumsum(rng.exponential(1 / rate, n))
ins = np.clip(rng.lognormal(np.log(900), 0.8, n), 16, 8000).astype(int)
outs = np.clip(rng.lognormal(np.log(120), 0.9, n), 2, 1000).astype(int)
reqs = [Request(str(i), float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]
if case == "busy":
    plan = PlanSpec(name="busy", pools=[{"name": "m", "accelerator": "h200-sxm", "model": "llama-3.1-8b",
                                         "replicas": 16}], routing="fleetwise-default")
    faults, delay = None, 0.25
else:
    plan = validate(PlanSpec, yaml.safe_load(open("examples/plans/pd-70b.yaml")), "pd-70b.yaml")
    faults = validate(FaultScenario, yaml.safe_load(open("examples/plans/pd-70b.faults.yaml")), "faults")
    delay = 0.05
res = simulate(plan, reqs, faults, SimOptions(seed=7, feedback_delay_s=delay))
res.summary.pop("sim_wall_s")
paths = res.write(out)
print(json.dumps({"native": compiled.native(), "summary": json.loads(Path(paths["summary"]).read_text()),
                  "records": Path(paths["records"]).read_text()}))
"""

ROOT = Path(__file__).resolve().parents[2]


def run(case: str, out: Path, pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    proc = subprocess.run([sys.executable, "-c", RUN, case, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout)


@pytest.mark.skipif(not compiled.modules(), reason="nothing was compiled at install (pure Python build)")
@pytest.mark.parametrize("case", ["busy", "pd-faults"])
def test_compiled_run_equals_pure_python(case: str, tmp_path: Path) -> None:
    native = run(case, tmp_path / "native", pure=False)
    if not native["native"]:
        pytest.skip("the compiled modules are older than their sources: rebuild with `pip install -e .`")
    pure = run(case, tmp_path / "pure", pure=True)
    assert pure["native"] is False
    assert native["summary"] == pure["summary"]
    assert native["records"] == pure["records"]
    assert native["summary"]["requests_completed"] > 0
