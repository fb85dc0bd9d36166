"""fleetwise's whole process for `vidur_compare.py`: a script that, like a user's, imports only
what it needs (json, time, pathlib) before fleetwise, so that the process's CPU seconds are
fleetwise's and not the benchmark harness's (argparse, subprocess, tempfile... about 45 ms).

Run:  python3 benchmarks/fleetwise_child.py SPEC.json RESULT.json   (vidur_compare.py does)
"""

import json
import sys
import time
from pathlib import Path


def main(spec_path: str, out_path: str) -> None:
    """fleetwise as a user runs it, in a fresh process: import, build the plan and the requests,
    simulate, write summary.json and requests.csv; each phase timed, and the whole process's CPU."""
    t_start = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    from fleetwise.core.request import Request
    from fleetwise.sim.runner import SimOptions, simulate
    from fleetwise.spec.plan import PlanSpec

    t_imported = time.perf_counter()
    rows = json.loads(Path(spec["requests"]).read_text())
    reqs = [Request(str(i), float(t), int(p), int(d)) for i, (t, p, d) in enumerate(rows)]
    plan = PlanSpec(**spec["plan"])
    t_built = time.perf_counter()
    res = simulate(plan, reqs, options=SimOptions(seed=spec["seed"], feedback_delay_s=spec["feedback_delay_s"]))
    t_simulated = time.perf_counter()
    res.write(spec["output_dir"])
    t_end, cpu_end = time.perf_counter(), time.process_time()
    Path(out_path).write_text(json.dumps({
        "requests": len(reqs), "import_s": t_imported - t_start, "setup_s": t_built - t_imported,
        "simulate_s": t_simulated - t_built, "write_output_s": t_end - t_simulated,
        "whole_wall_s": t_end - t_start, "whole_cpu_s": cpu_end,
        "events_processed": res.summary["events_processed"]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
