"""A real benchmark client through the gateway: NVIDIA AIPerf drives `fleetwise gateway` in front
of two `fleetwise emulate` replicas for a minute; zero errors expected, and AIPerf's request
count must equal the gateway's own count of answered requests.

Run:  python3 benchmarks/gateway_real_client.py --aiperf /tmp/aiperf-venv/bin/aiperf
                                                [--duration 60] [--concurrency 8] [--policy fleetwise-default]

AIPerf lives in a throwaway venv outside the repository; its tokenizer directory is written
here over the emulator's vocabulary (`emulator_real_client.write_tokenizer`, no download).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from emulator_real_client import find_export, run_aiperf, stat, write_tokenizer  # noqa: E402
from gateway_overhead import free_port, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", required=True)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--policy", default="fleetwise-default")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gateway_real_client.json"))
    a = ap.parse_args()
    ports = [free_port() for _ in range(2)]
    emus = [start([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", a.model, "--gpu", "h100-sxm",
                   "--time-scale", str(a.time_scale), "--port", str(p)], p, timeout_s=120) for p in ports]
    gport = free_port()
    cmd = [sys.executable, "-m", "fleetwise.cli.main", "gateway", "--policy", a.policy, "--port", str(gport)]
    for p in ports:
        cmd += ["--backend", f"http://127.0.0.1:{p}"]
    gw = start(cmd, gport)
    url = f"http://127.0.0.1:{gport}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tokdir, art = Path(tmp) / "tokenizer", Path(tmp) / "artifacts"
            write_tokenizer(tokdir, str(Path(a.aiperf).parent / "python"))
            wall = run_aiperf(a.aiperf, a.model, url, tokdir, art, a.concurrency, a.duration, a.input_tokens,
                              a.output_tokens)
            export = find_export(art)
        with urllib.request.urlopen(url + "/metrics") as r:
            metrics = r.read().decode()
    finally:
        stop(gw)
        for e in emus:
            stop(e)
    answered: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("fleetwise_gateway_requests_total{"):
            answered[line.split("{", 1)[1].split("}", 1)[0]] = float(line.rsplit(" ", 1)[1])
    ms = 1e-3 * a.time_scale
    reqs = stat(export, "request_count")
    out = {
        "client": "aiperf", "through": "fleetwise gateway", "policy": a.policy, "backends": 2,
        "duration_s": a.duration, "concurrency": a.concurrency, "aiperf_wall_s": wall,
        "aiperf_requests": reqs.get("avg", reqs), "aiperf_error_request_count": export.get("error_request_count"),
        "aiperf_error_summary": export.get("error_summary"),
        "aiperf_ttft_s": {k: float(v) * ms for k, v in stat(export, "time_to_first_token", "ttft").items()
                          if k in ("avg", "p50", "p99")},
        "aiperf_itl_s": {k: float(v) * ms for k, v in stat(export, "inter_token_latency", "itl").items()
                         if k in ("avg", "p50", "p99")},
        "gateway_requests_total": answered, "load_average": os.getloadavg()[0],
    }
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
