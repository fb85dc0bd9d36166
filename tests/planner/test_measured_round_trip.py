"""The loop from a running fleet back to the plan, end to end and seeded: an emulated fleet whose
replicas are secretly 30% slower than the model (a slowdown injected where the calibration cannot
see it), driven by the load generator; `calibrate --from-metrics` recovers the slowdown within 5%;
the re-plan adds the replicas it calls for; the simulator confirms the SLO with them (and that the
first plan misses it on the slower hardware)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleetwise.cli.main import main
from fleetwise.planner.measured import service_rates
from fleetwise.planner.metrics_page import parse_page
from fleetwise.spec.base import validate
from fleetwise.spec.workload import WorkloadSpec
from fleetwise.workload.generate import generate

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SPEC = """\
model: llama-3.1-8b
accelerators: [{name: h100-sxm}]
workload: {rate_rps: 45, prompt_tokens: {kind: fixed, tokens: 512}, output_tokens: {kind: fixed, tokens: 64}}
slo: {ttft_s: 0.5, tpot_s: 0.015}
weight_dtypes: [bf16]
headroom: {burst_factor: 1.0, failures_to_survive: 0, upgrade_batch_replicas: 0}
search: {max_gpus: 16, top_k: 1, refine_top: 1, seeds: 2, sample_requests: 200, disaggregation: "off", bisect_steps: 4}
"""
HIDDEN_SLOWDOWN = 1.3
TIME_SCALE = 0.25
"""Modelled seconds per wall second of the emulated fleet: slower than real time, so a wall
millisecond of a busy host's scheduling lateness is a quarter of a modelled one."""
MEASURE_RATE_RPS = 20.0
"""Modelled arrival rate of the measurement load (below the fleet's capacity, as a live fleet runs)."""
MEASURE_REQUESTS = 120
TOKEN = "round-trip"
START_WAIT_S = 120.0


def _wait_health(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while True:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.2)


def _gpus(fleet: dict) -> int:
    """GPUs of a fleet document: replicas x TP x PP over its pools."""
    return sum(p["replicas"] * p.get("parallelism", {}).get("tp", 1) * p.get("parallelism", {}).get("pp", 1)
               for p in fleet["pools"])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _drive(url: str) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import emulator_loadgen as lg
    finally:
        sys.path.remove(str(BENCHMARKS))
    spec = validate(WorkloadSpec, {"arrival": {"kind": "poisson", "rate_rps": MEASURE_RATE_RPS},
                                   "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": 512},
                                               "output": {"kind": "fixed", "tokens": 64}},
                                   "num_requests": MEASURE_REQUESTS}, "load")
    reqs = generate(spec, seed=7)
    results, _ = lg.run(lg.replay(reqs, [lg.Target(url)] * len(reqs), "llama-3.1-8b", TIME_SCALE))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]


@pytest.mark.slow
def test_calibrate_recovers_the_hidden_slowdown_and_the_replan_holds(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    fleet, first = tmp_path / "fleet.json", tmp_path / "plan.json"
    assert main(["plan", str(spec), "--json", str(first), "--fleet-out", str(fleet), "--workers", "1",
                 "--quiet"]) == 0
    planned = json.loads(fleet.read_text(encoding="utf-8"))
    gpus_before = _gpus(planned)

    port, log = _free_port(), tmp_path / "fleet.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--plan", str(fleet),
                                 "--port", str(port), "--time-scale", str(TIME_SCALE), "--admin-token", TOKEN],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_health(url, proc, log)
        hidden = httpx.post(url + "/admin/faults", json={"kind": "slowdown", "factor": HIDDEN_SLOWDOWN},
                            headers={"Authorization": f"Bearer {TOKEN}"})
        assert hidden.status_code == 200
        before, after = tmp_path / "before.prom", tmp_path / "after.prom"
        t0 = time.monotonic()
        before.write_text(httpx.get(url + "/metrics").text, encoding="utf-8")
        _drive(url)
        after.write_text(httpx.get(url + "/metrics").text, encoding="utf-8")
        wall = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(20)

    measured = tmp_path / "measured.json"
    assert main(["calibrate", "--from-metrics", f"mixed-0={before},{after}", "--plan", str(fleet),
                 "--interval", f"{wall:.3f}", "--time-scale", str(TIME_SCALE), "-o", str(measured)]) == 0
    doc = json.loads(measured.read_text(encoding="utf-8"))
    pool = doc["pools"][0]
    print(f"measured step-time factor {pool['step_time_factor']} (95% CI {pool['ci95']}), hidden {HIDDEN_SLOWDOWN}")
    assert pool["requests"] == MEASURE_REQUESTS
    assert abs(pool["step_time_factor"] / HIDDEN_SLOWDOWN - 1) < 0.05
    lo, hi = pool["ci95"]
    assert lo < pool["step_time_factor"] < hi and hi - lo < 0.2 * pool["step_time_factor"]

    replan, refleet = tmp_path / "replan.json", tmp_path / "refleet.json"
    assert main(["plan", str(spec), "--measured", str(measured), "--json", str(replan), "--fleet-out", str(refleet),
                 "--workers", "1", "--quiet"]) == 0
    redoc = json.loads(refleet.read_text(encoding="utf-8"))
    assert _gpus(redoc) > gpus_before  # more replicas, or larger ones: the analytical phase prices x1.3 too
    assert all(p["step_time_factor"] == pytest.approx(pool["step_time_factor"]) for p in redoc["pools"])
    explanation = json.loads(replan.read_text(encoding="utf-8"))["plans"][0]["explanation"]
    assert any(line.startswith("mixed replicas: sized from measured service: step times x") for line in explanation)
    assert any(line.startswith("routing: every simulation routed with fleetwise-default") for line in explanation)

    workload = tmp_path / "load.yaml"
    workload.write_text(json.dumps({"arrival": {"kind": "poisson", "rate_rps": 45},
                                    "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": 512},
                                                "output": {"kind": "fixed", "tokens": 64}},
                                    "num_requests": 2000}), encoding="utf-8")
    slow_first = tmp_path / "slow-first.json"  # the first plan on the hardware as it really is
    slow_first.write_text(json.dumps({**planned, "pools": [{**p, "step_time_factor": HIDDEN_SLOWDOWN}
                                                           for p in planned["pools"]]}), encoding="utf-8")
    verdicts = {}
    for name, path in (("replan", refleet), ("first", slow_first)):
        out = tmp_path / f"sim-{name}"
        assert main(["simulate", str(path), "--workload", str(workload), "--out", str(out), "--quiet"]) == 0
        s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        verdicts[name] = (s["ttft_s"]["p90"] <= 0.5 and s["tpot_s"]["p90"] <= 0.015, s["slo_attainment"])
    assert verdicts["replan"][0] and verdicts["replan"][1] >= 0.9, verdicts
    assert not verdicts["first"][0], verdicts


def test_service_rates_from_a_metrics_dump(tmp_path):
    text = "\n".join([
        "# TYPE vllm:request_success counter", 'vllm:request_success_total{finished_reason="length"} 40',
        "# TYPE vllm:prompt_tokens counter", "vllm:prompt_tokens_total 20480",
        "# TYPE vllm:generation_tokens counter", "vllm:generation_tokens_total 2560",
        "# TYPE vllm:request_prefill_time_seconds histogram",
        'vllm:request_prefill_time_seconds_bucket{le="0.01"} 0', 'vllm:request_prefill_time_seconds_bucket{le="0.02"} 40',
        'vllm:request_prefill_time_seconds_bucket{le="+Inf"} 40', "vllm:request_prefill_time_seconds_count 40",
        "vllm:request_prefill_time_seconds_sum 0.6",
        "# TYPE vllm:request_decode_time_seconds histogram",
        'vllm:request_decode_time_seconds_bucket{le="0.5"} 0', 'vllm:request_decode_time_seconds_bucket{le="1.0"} 40',
        'vllm:request_decode_time_seconds_bucket{le="+Inf"} 40', "vllm:request_decode_time_seconds_count 40",
        "vllm:request_decode_time_seconds_sum 25.2", ""])
    (m,) = parse_page(text, "dump.prom")
    m.span_s = 10.0
    r = service_rates([m])
    assert (r.requests, r.prompt_tokens, r.output_tokens, r.rate_rps) == (40, 512, 64, 4.0)
    assert r.prefill_s == pytest.approx(0.015) and r.prefill_tokens_per_s == pytest.approx(512 / 0.015)
    assert r.decode_s_per_token == pytest.approx(25.2 / (2560 - 40))
    assert r.decode_tokens_per_s == pytest.approx((2560 - 40) / 25.2)
