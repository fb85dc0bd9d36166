"""Planner on Ray: `fleetwise plan --ray ADDRESS` against a local Ray instance, checked against `--workers 2`.

Run:  python3 benchmarks/planner_ray.py [--venv /tmp/ray-venv] [--repeat 1] [--num-cpus 2]
                                        [--spec benchmarks/specs/planner-speed-70b-3gpus.yaml]
                                        [--out benchmarks/results/planner_ray.json]

Issue 5 ("Output") asks for `--ray ADDRESS`, the optional extra `fleetwise[ray]`, to be "tested with
a local Ray instance in a benchmark, not in CI". This is that benchmark. It:

1. creates (or reuses) a throwaway venv outside the repo (--venv, or $FLEETWISE_RAY_VENV; default
   /tmp/ray-venv) and installs this checkout into it editable with the extra,
   `pip install -e REPO[ray]` (`ray[default]`); if that fails, `pip install -e REPO` plus plain
   `ray`. A venv whose python already imports Ray and this checkout's fleetwise is reused as is.
   What installed (and how long it took) goes into the JSON.
2. starts a local Ray head in that venv, `ray start --head --num-cpus N --include-dashboard=false
   --block` on its own port and temp dir, in a session of its own, and stops it at the end by
   signalling that process (never `ray stop`, which ends every Ray process of the user).
3. runs the real command line with the venv's python, `fleetwise plan SPEC --json OUT --ray
   127.0.0.1:PORT` and `fleetwise plan SPEC --json OUT --workers 2`, --repeat times each, and checks
   that the JSON documents are identical apart from `search.wall_s`.

Timings per run: wall time; CPU time of the command (user + system of it and its reaped children,
from getrusage(RUSAGE_CHILDREN); with --workers 2 that includes the pool processes); for the Ray
run also the CPU time the Ray instance spent meanwhile (all processes of the head's session, from
/proc: workers, raylet, GCS, agents), with the instance's idle CPU rate measured before the runs
so its housekeeping can be told apart (sampled every 0.25 s, see SessionCpu); and the 1-minute load average before and after. On a
2-core machine shared with other work, wall > CPU / cores shows up there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "benchmarks" / "specs" / "planner-speed-70b-3gpus.yaml"
CLI = "from fleetwise.cli.main import main; import sys; sys.exit(main())"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- venv


def _probe(py: Path) -> dict | None:
    """Ray version and fleetwise location seen by the venv's python, or None when either is missing."""
    code = ("import json, ray, fleetwise; "
            "print(json.dumps({'ray': ray.__version__, 'fleetwise': fleetwise.__file__, "
            "'dashboard_extra': importlib.util.find_spec('aiohttp') is not None and "
            "importlib.util.find_spec('opencensus') is not None}))")
    r = subprocess.run([str(py), "-c", "import importlib.util; " + code], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    info = json.loads(r.stdout.strip().splitlines()[-1])
    return info if Path(info["fleetwise"]).resolve().is_relative_to(REPO / "src") else None


def ensure_venv(venv: Path) -> dict:
    """Create or reuse `venv` with this checkout and Ray; report what was installed."""
    py = venv / "bin" / "python"
    if venv.resolve().is_relative_to(REPO):
        raise SystemExit(f"--venv {venv}: must be outside the repository")
    if py.exists() and (info := _probe(py)):
        log(f"reusing {venv}: ray {info['ray']}")
        return {"venv": str(venv), "reused": True, "installed": None, "attempts": [], **info}
    t0 = time.perf_counter()
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    attempts = []
    for label, cmds in [("ray[default] via fleetwise[ray]", [[f"-e{REPO}[ray]"]]),
                        ("plain ray", [[f"-e{REPO}"], ["ray"]])]:
        log(f"installing into {venv}: {label} ...")
        ok, tail = True, ""
        for args in cmds:
            r = subprocess.run([str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
            if r.returncode != 0:
                ok, tail = False, (r.stderr or r.stdout)[-1500:]
                break
        attempts.append({"what": label, "ok": ok, **({"error_tail": tail} if not ok else {})})
        if ok and (info := _probe(py)):
            return {"venv": str(venv), "reused": False, "installed": label, "install_s": round(time.perf_counter() - t0, 1),
                    "attempts": attempts, **info}
    raise SystemExit(f"could not install Ray into {venv}: {json.dumps(attempts, indent=1)}")


# ---------------------------------------------------------------- Ray head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_cpu(sid: int) -> dict[tuple[int, int], float]:
    """{(pid, start time): utime + stime + reaped children's, in s} of every live process in session `sid`."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[3]) == sid and f[0] != "Z":  # f[3]: session id; zombies have nothing left to count
            out[(int(d), int(f[19]))] = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / CLK_TCK
    return out


def _session_pids(sid: int) -> list[int]:
    return [pid for pid, _start in _session_cpu(sid)]


class SessionCpu:
    """CPU time spent by the processes of session `sid` between start() and stop(), sampled every `every_s`.

    Ray's worker processes (in the head's session) exit when the driver does and nobody reaps them
    into a parent's cutime, so a single before/after reading would lose them: this keeps the last
    value seen for each process. What a process spends in its last interval before it exits is missed.
    """

    def __init__(self, sid: int, every_s: float = 0.25) -> None:
        self.sid, self.every_s = sid, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.last.update(_session_cpu(self.sid))

    def start(self) -> SessionCpu:
        self.base = _session_cpu(self.sid)
        self.last = dict(self.base)
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.last.update(_session_cpu(self.sid))
        return sum(v - self.base.get(k, 0.0) for k, v in self.last.items())


class RayHead:
    """`ray start --head --block` in its own session; `stop()` signals it and anything left in that session."""

    def __init__(self, venv: Path, num_cpus: int) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = Path(tempfile.mkdtemp(prefix="fw-ray-", dir="/tmp"))  # Ray's socket paths must be short
        cmd = [str(venv / "bin" / "ray"), "start", "--head", "--num-cpus", str(num_cpus), "--include-dashboard=false",
               "--disable-usage-stats", "--port", str(self.port), "--temp-dir", str(self.temp_dir),
               "--ray-client-server-port", str(_free_port()), "--block"]
        self.command = " ".join(["ray", *cmd[1:]])
        self.log_path = self.temp_dir / "ray-start.log"
        t0 = time.perf_counter()
        self._log = open(self.log_path, "w")  # closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.sid = self.proc.pid
        self._wait_ready(venv, timeout_s=120)
        self.start_s = round(time.perf_counter() - t0, 1)

    def _wait_ready(self, venv: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}:\n{self.log_path.read_text()[-2000:]}")
            r = subprocess.run([str(venv / "bin" / "ray"), "status", "--address", self.address],
                               capture_output=True, text=True)
            if r.returncode == 0 and "CPU" in r.stdout:
                return
            time.sleep(2)
        raise RuntimeError(f"Ray head not ready after {timeout_s} s:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> dict:
        """SIGTERM to `ray start --block` (it stops what it started); then SIGKILL, by pid, what is left."""
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 10
        while (left := _session_pids(self.sid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return {"stop_s": round(time.perf_counter() - t0, 1), "killed_after_term": len(left)}


# ---------------------------------------------------------------- runs


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_plan(py: Path, spec: Path, out: Path, extra: list[str], head: RayHead | None) -> dict:
    cmd = [str(py), "-c", CLI, "plan", str(spec), "-o", str(out), *extra]
    load0, cpu0, t0 = os.getloadavg()[0], _children_cpu(), time.perf_counter()
    sampler = SessionCpu(head.sid).start() if head else None
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    ray_cpu = sampler.stop() if sampler else 0.0
    res: dict[str, Any] = {"args": extra, "exit_code": r.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                           "load_avg_1m_before": round(load0, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}
    if head:
        res["ray_cluster_cpu_s"] = round(ray_cpu, 2)
        res["cpu_total_s"] = round(cpu + ray_cpu, 2)
    else:
        res["cpu_total_s"] = res["cpu_s"]
    res["cpu_over_wall"] = round(res["cpu_total_s"] / wall, 2)
    if r.returncode not in (0, 1) or not out.exists():
        res["error_tail"] = r.stderr[-3000:]
        return res
    res["search"] = json.loads(out.read_text()).get("search")
    return res


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def compare(ray_json: Path, local_json: Path) -> dict:
    a, b = json.loads(ray_json.read_text()), json.loads(local_json.read_text())
    for d in (a, b):
        d.get("search", {}).pop("wall_s", None)
    diffs = _diff(a, b)
    best = a["plans"][0] if a.get("plans") else None
    return {"identical_except_wall_s": not diffs, "differences": diffs[:20], "plans": len(a.get("plans", [])),
            "best_plan": best and {"kind": best["kind"], "gpus": best["gpus"], "cost_per_hour": best["cost_per_hour"],
                                   "pools": [f"{x['replicas']}x {x['role']} {x['accelerator']} {x['weight_dtype']} "
                                             f"TP{x['tp']} PP{x['pp']}" for x in best["pools"]]}}


def fleetwise_source() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "--", "src"))}


def _summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if "search" in r]
    if not ok:
        return {"ok_runs": 0}
    return {"ok_runs": len(ok), "wall_s_median": statistics.median(r["wall_s"] for r in ok),
            "cpu_total_s_median": statistics.median(r["cpu_total_s"] for r in ok),
            "load_avg_1m_median": statistics.median(r["load_avg_1m_before"] for r in ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default=os.environ.get("FLEETWISE_RAY_VENV", "/tmp/ray-venv"),
                    help="throwaway venv outside the repo (default $FLEETWISE_RAY_VENV or /tmp/ray-venv)")
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command (default 1: the machine is shared)")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs the local Ray head offers (default 2)")
    ap.add_argument("--workers", type=int, default=2, help="--workers of the local comparison run (default 2)")
    ap.add_argument("--idle-s", type=float, default=5.0, help="seconds to measure the idle Ray instance's CPU")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "planner_ray.json"))
    a = ap.parse_args()

    spec, out, venv = Path(a.spec).resolve(), Path(a.out), Path(a.venv)
    install = ensure_venv(venv)
    py = venv / "bin" / "python"
    result: dict[str, Any] = {
        "schema": "fleetwise-planner-ray/1",
        "spec": str(spec.relative_to(REPO)) if spec.is_relative_to(REPO) else str(spec),
        "fleetwise_source": fleetwise_source(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "install": install,
    }
    head = RayHead(venv, a.num_cpus)
    log(f"Ray head at {head.address} ready in {head.start_s} s")
    ray_runs, local_runs, comparisons = [], [], []
    try:
        idle = SessionCpu(head.sid).start()
        time.sleep(a.idle_s)
        idle_rate = idle.stop() / a.idle_s
        result["ray"] = {"version": install["ray"], "address": head.address, "command": head.command,
                         "num_cpus": a.num_cpus, "start_s": head.start_s, "idle_cpu_s_per_s": round(idle_rate, 3)}
        with tempfile.TemporaryDirectory(prefix="fw-planray-") as tmp:
            for i in range(a.repeat):
                rj, lj = Path(tmp) / f"ray{i}.json", Path(tmp) / f"local{i}.json"
                r = run_plan(py, spec, rj, ["--ray", head.address], head)
                log(f"ray   {i + 1}/{a.repeat}: exit {r['exit_code']}, wall {r['wall_s']} s, CPU {r['cpu_s']} s driver"
                    f" + {r['ray_cluster_cpu_s']} s cluster, load {r['load_avg_1m_before']} -> {r['load_avg_1m_after']}")
                r["cluster_cpu_s_over_idle"] = round(r["ray_cluster_cpu_s"] - idle_rate * r["wall_s"], 2)
                ray_runs.append(r)
                w = run_plan(py, spec, lj, ["--workers", str(a.workers)], None)
                log(f"local {i + 1}/{a.repeat}: exit {w['exit_code']}, wall {w['wall_s']} s, CPU {w['cpu_s']} s,"
                    f" load {w['load_avg_1m_before']} -> {w['load_avg_1m_after']}")
                local_runs.append(w)
                if "search" in r and "search" in w:
                    comparisons.append(compare(rj, lj))
    finally:
        result["ray_stop"] = head.stop()
    result["commands"] = {"ray": f"fleetwise plan {spec.name} --json OUT --ray {head.address}",
                          "local": f"fleetwise plan {spec.name} --json OUT --workers {a.workers}"}
    result["ray_works"] = bool(ray_runs) and all("search" in r for r in ray_runs)
    result["identical_except_wall_s"] = bool(comparisons) and all(c["identical_except_wall_s"] for c in comparisons)
    result["summary"] = {"ray": _summary(ray_runs), "local": _summary(local_runs)}
    result["comparisons"] = comparisons
    result["runs"] = {"ray": ray_runs, "local": local_runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("ray_works", "identical_except_wall_s", "summary")}))
    log(f"wrote {out}")
    if not result["ray_works"] or not result["identical_except_wall_s"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
