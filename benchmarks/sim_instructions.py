"""Machine instructions of the simulator's event loop on a busy row, counted by callgrind.

Run:  python3 benchmarks/sim_instructions.py [--requests 6000] [--replicas 8] [--load long|busy]
                                             [--policies round-robin,fleetwise-default]
                                             [--label NAME] [--out benchmarks/results/sim_instructions.json]

Each policy's run is a child process under `valgrind --tool=callgrind
--toggle-collect=CPyDef_events___EventLoop___run`: only the instructions inside the compiled
`EventLoop.run` count (imports, setup and the results digest do not). The workload is
`sim_speed.py`'s busy fleet at its per-replica load (10 req/s per replica, `LONG`: outputs uniform
in 600-2,000 tokens; `BUSY`: the short-output row), on `--replicas` replicas, seed 0, router view
refreshed every 0.25 s, as docs/simulator.md's callgrind tables count it. Instructions do not
inflate with the shared machine's load as CPU seconds do, so two builds compare run by run.
Needs valgrind and the compiled build (`compiled` is recorded; the toggle names a compiled
function, so a pure Python run counts nothing). Rows are merged into `--out` under `--label`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOGGLE = "CPyDef_events___EventLoop___run"
"""The compiled event loop's C function (mypyc's name for `sim.events.EventLoop.run`)."""
FEEDBACK_DELAY_S = 0.25
"""Router view refresh period of the busy rows (`sim_speed.py --feedback-delay` default)."""


def child(policy: str, n: int, replicas: int, load_name: str) -> None:
    """Simulate one row and print its events, engine steps, results digest and whether compiled code ran."""
    sys.path.insert(0, str(HERE))
    import sim_speed

    from fleetwise.core import compiled
    from fleetwise.sim.runner import SimOptions, simulate
    from fleetwise.spec.plan import PlanSpec

    load = sim_speed.LONG if load_name == "long" else sim_speed.BUSY
    reqs = sim_speed.make_requests(n, load.rate_per_replica * replicas, 0, load)
    plan = PlanSpec(name="speed", pools=[{"name": "m", "accelerator": load.accelerator, "model": "llama-3.1-8b",
                                          "replicas": replicas}], routing=policy)
    res = simulate(plan, reqs, options=SimOptions(seed=0, feedback_delay_s=FEEDBACK_DELAY_S))
    print(json.dumps({"events": res.summary["events_processed"], "engine_steps": res.engine_steps,
                      "digest": sim_speed.results_digest(res), "compiled": compiled.native()}))


def count(policy: str, n: int, replicas: int, load_name: str) -> dict[str, object]:
    """One row under callgrind: instructions in the event loop, per event and per engine step."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--toggle-collect={TOGGLE}", f"--callgrind-out-file={out}",
               sys.executable, str(Path(__file__).resolve()), "--child", policy, str(n), str(replicas), load_name]
        run = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
        totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
        if totals is None:
            raise SystemExit(f"sim_instructions: no totals in the callgrind output of {policy}")
    row = json.loads(run.stdout.strip().splitlines()[-1])
    ins = int(totals.group(1))
    return {"policy": policy, "requests": n, "replicas": replicas, "load": load_name, "instructions": ins,
            "per_event": round(ins / row["events"]), "per_engine_step": round(ins / row["engine_steps"]), **row}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--load", choices=("long", "busy"), default="long")
    ap.add_argument("--policies", default="round-robin,fleetwise-default")
    ap.add_argument("--label", default="current", help="key of these rows in --out")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sim_instructions.json")
    a = ap.parse_args()
    rows = {}
    for policy in a.policies.split(","):
        rows[policy] = count(policy, a.requests, a.replicas, a.load)
        print(json.dumps(rows[policy]), flush=True)
    old = json.loads(a.out.read_text()) if a.out.exists() else {}
    old.setdefault("runs", {})[a.label] = rows
    a.out.write_text(json.dumps(old, indent=1) + "\n")


if __name__ == "__main__":
    main()
