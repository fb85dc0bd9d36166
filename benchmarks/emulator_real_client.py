"""A real benchmark client against the emulator: NVIDIA AIPerf drives one `fleetwise emulate`
process for a minute; its TTFT and ITL are compared with the emulator's own histograms.

Run:  python3 benchmarks/emulator_real_client.py --aiperf /tmp/aiperf-venv/bin/aiperf
                                                 [--duration 60] [--concurrency 8] [--time-scale 1]
                                                 [--out benchmarks/results/emulator_real_client.json]

AIPerf lives in a throwaway venv outside the repository (`python3 -m venv /tmp/aiperf-venv &&
/tmp/aiperf-venv/bin/pip install aiperf`). It needs a Hugging Face tokenizer directory to build
prompts; this script writes one with `tokenizers` (a WordLevel model over the emulator's
vocabulary, whitespace pre-tokenizer), so a word of generated text is one token on both sides,
and AIPerf counts tokens from the server's `usage` (`--use-server-token-count`: its synthetic
prompts are English words the emulator's tokenizer splits differently). No download: the
directory is made here (a local path: AIPerf's offline mode expects a hub cache, so it runs
online-mode and simply never needs the network).

Compared (modelled seconds; the emulator runs at `--time-scale`, AIPerf measures wall time, so
its figures are multiplied by the time scale): AIPerf's TTFT and inter-token latency (mean and
p50) against the emulator's `vllm:time_to_first_token_seconds` and
`vllm:inter_token_latency_seconds` means (sum / count over the run) and the p50 of its own
per-request records (`GET /fleetwise/requests`). Also: AIPerf's request count and error count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from emulator_loadgen import percentiles  # noqa: E402
from processes import wait_healthy  # noqa: E402

from fleetwise.core.tokens import WORDS  # noqa: E402

START_TIMEOUT_S = 120.0


_TOKENIZER_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
d, words = sys.argv[1], json.load(open(sys.argv[2]))
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.save(d + "/tokenizer.json")
"""


def write_tokenizer(d: Path, python: str) -> None:
    """A Hugging Face tokenizer directory whose tokens are the emulator's vocabulary words, built
    with `tokenizers` by `python` (the client's throwaway venv has it; the project does not)."""
    d.mkdir(parents=True, exist_ok=True)
    words = d / "words.json"
    words.write_text(json.dumps(list(WORDS)))
    subprocess.run([python, "-c", _TOKENIZER_SCRIPT, str(d), str(words)], check=True, timeout=120)
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": 131072}))
    (d / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[UNK]", "bos_token": "<s>",
                                                           "eos_token": "</s>"}))


def metric_mean(text: str, name: str) -> float:
    s = re.search(rf"^{re.escape(name)}_sum{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    c = re.search(rf"^{re.escape(name)}_count{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    return float(s.group(1)) / float(c.group(1)) if s and c and float(c.group(1)) else float("nan")


def find_export(d: Path) -> dict[str, Any]:
    for p in sorted(d.rglob("*.json")):
        if "profile_export" in p.name:
            return dict(json.loads(p.read_text()))
    raise RuntimeError(f"no AIPerf JSON export under {d}")


def stat(export: dict[str, Any], *names: str) -> dict[str, Any]:
    for n in names:
        if n in export:
            return dict(export[n])
    return {}


def run_aiperf(aiperf: str, model: str, url: str, tokdir: Path, art: Path, concurrency: int, duration_s: int,
               input_tokens: int, output_tokens: int) -> float:
    """One streamed `aiperf profile` run of fixed-length completions; returns its wall seconds."""
    cmd = [aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "completions",
           "--streaming", "--tokenizer", str(tokdir), "--concurrency", str(concurrency),
           "--benchmark-duration", str(duration_s), "--synthetic-input-tokens-mean", str(input_tokens),
           "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(output_tokens),
           "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--artifact-dir", str(art), "--ui", "none", "--use-server-token-count"]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s * 4 + 300)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"aiperf failed ({run.returncode}): {run.stderr[-1500:]} {run.stdout[-2500:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", required=True, help="the aiperf executable (throwaway venv)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "emulator_real_client.json"))
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", "emulate", "--model", args.model,
                             "--gpu", args.gpu, "--port", str(port), "--time-scale", str(args.time_scale)],
                            stdout=subprocess.DEVNULL)
    try:
        wait_healthy(url, proc, START_TIMEOUT_S)
        with tempfile.TemporaryDirectory() as tmp:
            tokdir, art = Path(tmp) / "tokenizer", Path(tmp) / "artifacts"
            write_tokenizer(tokdir, str(Path(args.aiperf).parent / "python"))
            wall = run_aiperf(args.aiperf, args.model, url, tokdir, art, args.concurrency, args.duration,
                              args.input_tokens, args.output_tokens)
            export = find_export(art)
        with urllib.request.urlopen(url + "/metrics") as r:
            metrics = r.read().decode()
        with urllib.request.urlopen(url + "/fleetwise/requests") as r:
            recs = json.loads(r.read())
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    scale = args.time_scale
    rows = [dict(zip(recs["columns"], r, strict=True)) for r in recs["rows"]]
    srv_ttft = percentiles([r["first_token_s"] - r["arrival_s"] for r in rows if r["first_token_s"] is not None])
    srv_tpot = percentiles([(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in rows
                            if r["output_tokens"] > 1])
    ttft, itl = stat(export, "time_to_first_token", "ttft"), stat(export, "inter_token_latency", "itl")
    ms = 1e-3 * scale  # AIPerf reports milliseconds of wall time

    def conv(d: dict[str, Any]) -> dict[str, float]:
        return {k: float(d[k]) * ms for k in ("avg", "p50", "p90", "p99") if k in d}

    reqs = stat(export, "request_count")
    errors = {"error_summary": export.get("error_summary"), "error_request_count": export.get("error_request_count")}
    out = {
        "client": "aiperf", "model": args.model, "gpu": args.gpu, "time_scale": scale, "duration_s": args.duration,
        "concurrency": args.concurrency, "aiperf_wall_s": wall,
        "aiperf_requests": reqs.get("avg", reqs), "aiperf_errors": errors,
        "aiperf_ttft_s": conv(ttft), "aiperf_itl_s": conv(itl),
        "emulator_ttft_s": {"mean_from_histogram": metric_mean(metrics, "vllm:time_to_first_token_seconds"),
                            **srv_ttft},
        "emulator_itl_s": {"mean_from_histogram": metric_mean(metrics, "vllm:inter_token_latency_seconds"),
                           "tpot_from_records": srv_tpot},
        "load_average": os.getloadavg()[0],
    }
    a, e = out["aiperf_ttft_s"], out["emulator_ttft_s"]
    out["ttft_mean_ratio"] = a.get("avg", float("nan")) / e["mean_from_histogram"]
    out["itl_mean_ratio"] = out["aiperf_itl_s"].get("avg", float("nan")) / out["emulator_itl_s"]["mean_from_histogram"]
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
