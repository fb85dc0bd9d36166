"""The whole-process side of `vidur_compare.py` for fleetwise: its package's bytecode, the
`fleetwise simulate` command on the matched request list, and the whole-process comparison.

Bytecode: a regular `pip install` writes every module's bytecode (Vidur's venv has it); an
editable install does not, and where PYTHONDONTWRITEBYTECODE is set (as on the shared machine
these figures come from) Python then compiles fleetwise's sources on every start. So before the
timed processes run, `compile_bytecode` writes the bytecode of the fleetwise package they import,
once, as an installed package has it; the JSON records that it did.
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}
"""Set for every timed child, Vidur's and fleetwise's alike (the environment may override it):
one BLAS thread, the `fleetwise` command's own default (`cli.main.BLAS_THREADS`). Otherwise
numpy's OpenBLAS starts a spinning thread per core at import, about 0.06 CPU s per process on
this 2-core machine, which neither simulator's work uses (Vidur's predictor trains with one job)."""


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a timed child: BLAS_THREADS under this process's environment, then `extra`."""
    return {**BLAS_THREADS, **os.environ, **extra}


TRACE_COLUMNS = "arrival=arrival_s,prompt=prompt_tokens,output=output_tokens"
"""The request list as a CSV in no registered trace format, read by `--trace-columns`."""


def compile_bytecode() -> str:
    """Write the bytecode of the fleetwise package this interpreter imports (as `pip install`
    does); returns the package's directory."""
    spec = importlib.util.find_spec("fleetwise")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("fleetwise is not importable from this interpreter")
    root = list(spec.submodule_search_locations)[0]
    compileall.compile_dir(root, quiet=1)
    return root


def write_trace_csv(rows: list[list[float]], path: Path) -> Path:
    """The request list [[arrival s, prompt, output], ...] as the CSV `fleetwise simulate --trace` reads."""
    with path.open("w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for t, p, d in rows:
            f.write(f"{t!r},{int(p)},{int(d)}\n")
    return path


def fleetwise_command() -> list[str]:
    """The `fleetwise` console script of this interpreter's environment (else `python -m`)."""
    script = Path(sys.executable).with_name("fleetwise")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fleetwise.cli.main"]


def run_fleetwise_cli(plan: dict, rows: list[list[float]], work: Path, seed: int, feedback_delay_s: float) -> dict:
    """`fleetwise simulate PLAN --trace CSV` as a user runs it: the whole process's CPU seconds
    (its own and its children's, from the kernel: interpreter start and exit included) and wall."""
    plan_path, out_dir = work / "fleetwise_plan.json", work / "fleetwise_cli_out"
    plan_path.write_text(json.dumps(plan))
    trace = write_trace_csv(rows, work / "fleetwise_requests.csv")
    cmd = [*fleetwise_command(), "simulate", str(plan_path), "--trace", str(trace), "--trace-columns", TRACE_COLUMNS,
           "--seed", str(seed), "--feedback-delay", repr(feedback_delay_s), "--out", str(out_dir)]
    load0 = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"fleetwise simulate failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    summary = json.loads((out_dir / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"requests": summary["requests_total"], "whole_cpu_s": round(cpu, 3), "whole_wall_s": round(wall, 3),
            "events_processed": summary["events_processed"], "loadavg_before": [round(x, 2) for x in load0],
            "command": "fleetwise simulate PLAN --trace CSV --trace-columns ... --feedback-delay S --out DIR"}


def best_of_process(runs: list[dict]) -> dict:
    """The whole-process run with the least CPU, with every run's CPU and wall seconds."""
    best = dict(min(runs, key=lambda r: r["whole_cpu_s"]))
    if len(runs) > 1:
        best["runs"] = [{"whole_wall_s": r["whole_wall_s"], "whole_cpu_s": r["whole_cpu_s"],
                         "loadavg_before": r["loadavg_before"]} for r in runs]
    return best


def whole_process(vidur_runs: list[dict], fw: dict, cli: dict | None, bytecode: str) -> dict:
    """Both simulators' whole processes on the same request list: phases, and the CPU ratios
    (the instrumented API run, and the `fleetwise simulate` command where it ran). Vidur's is its
    run of least whole-process CPU (a run whose predictor came from its cache: the first run of
    a fresh work dir trains it, several CPU seconds more), every run's listed."""
    keys = ("import_s", "setup_s", "write_output_s", "whole_wall_s", "whole_cpu_s")
    vidur = min(vidur_runs, key=lambda r: r["whole_cpu_s"])
    out = {"vidur": {k: vidur.get(k) for k in keys} | {"event_loop_s": vidur["wall_s"],
                                                        "runs": [{k: r.get(k) for k in keys} for r in vidur_runs]},
           "fleetwise": fw,
           "ratio_cpu": round(vidur["whole_cpu_s"] / fw["whole_cpu_s"], 1),
           "ratio_wall": round(vidur["whole_wall_s"] / fw["whole_wall_s"], 1),
           "fleetwise_bytecode": f"written before timing (compileall of {bytecode}), as a regular install has it",
           "blas_threads": f"{BLAS_THREADS} in every timed child's environment (Vidur's and fleetwise's)"}
    if cli:
        out["fleetwise_cli"] = cli
        out["ratio_cpu_cli"] = round(vidur["whole_cpu_s"] / cli["whole_cpu_s"], 1)
    return out
