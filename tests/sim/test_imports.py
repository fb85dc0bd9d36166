"""What loading the simulator loads: a run's whole process is dominated by its imports at small
sizes (benchmarks/vidur_compare.py, `whole_process`), so the simulator must not pull in models
and stores it never uses."""

from __future__ import annotations

import json
import subprocess
import sys

NOT_ON_THE_SIM_PATH = (
    "fleetwise.spec.planning",  # the planning spec (a plan names only PlanSLOSpec, in spec.slo)
    "fleetwise.spec.workload",  # the workload models (a simulation takes a request list)
    "fleetwise.ledger.store",  # the ledger's stores (the simulator bills through ledger.usage)
    "fleetwise.ledger.backends",
    "sqlite3",
    "yaml",  # PyYAML loads with the first YAML document (spec.yaml_input); a plan given as data needs none
    "matplotlib",
    "scipy",
)


def test_the_simulator_and_a_plan_load_without_the_planner_models_or_the_ledger_stores() -> None:
    code = ("import json, sys; import fleetwise.sim.runner, fleetwise.spec.plan; "
            f"print(json.dumps([m for m in {list(NOT_ON_THE_SIM_PATH)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []


def test_the_ledger_still_offers_its_stores_by_name() -> None:
    from fleetwise import ledger
    from fleetwise.ledger.backends import open_ledger
    from fleetwise.ledger.store import Ledger, Outcome

    assert (ledger.open_ledger, ledger.Ledger, ledger.Outcome) == (open_ledger, Ledger, Outcome)
    assert callable(ledger.verify)  # the function, not the module of the same name
