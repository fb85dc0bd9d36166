"""Speed against Vidur: requests simulated per wall-clock and CPU second, same fleet and requests.

Run:  python3 benchmarks/vidur_compare.py [--requests 5000] [--replicas 4] [--rate 16]
                                          [--workload vidur|azure] [--vidur-scheduler sarathi|vllm]
                                          [--chunk-size 512] [--batch-cap 128] [--large-requests N]
                                          [--vidur-venv DIR] [--out benchmarks/results/vidur_compare.json]

Vidur (PyPI `vidur`, pinned by --vidur-version) lives in a throwaway virtual environment OUTSIDE
the repository: --vidur-venv, or the environment variable FLEETWISE_VIDUR_VENV, default
/tmp/vidur-venv. The script creates it on first use with a CPython 3.11/3.10 (--vidur-python,
else the first of ~/.pyenv/versions/3.11*, 3.10*, python3.11, python3.10 found) and
`pip install vidur==VERSION`, and reuses it afterwards. It is never a fleetwise dependency.

Matched by default: Vidur's own request list, the same model and card, the same scheduler
settings (Sarathi-style chunked prefill, 512-token chunks = fleetwise's max_num_batched_tokens,
batch cap = max_num_seqs, block size) and the same KV capacity (fleetwise's fit, given to Vidur
as num_blocks). One run does, in order:
1. Offline Vidur inputs in a temporary work dir (never the repo): synthetic profiling tables
   from fleetwise's roofline laid out as the model-hub cache Vidur's `snapshot_download` reads
   under HF_HUB_OFFLINE=1 (see benchmarks/vidur_tables.py).
2. Vidur in a subprocess of the venv's python (this file with --vidur-child): the simulator is
   built (predictor training, request generation: reported as setup); with `--workload vidur`
   its synthetic generator draws --requests lengths from --length-trace (Vidur's arXiv
   summarization file) with Poisson arrivals at --rate, and the child exports that list; then
   only its event loop `Simulator.run` is timed (wall and process CPU), output writing
   excluded. Events it handles are counted. `--workload azure` instead replays the first
   --requests rows of the Azure conversation trace rescaled to --rate (the earlier setup).
3. fleetwise in this process on the same request list and fleet: `simulate()` timed the same
   way, in the fast mode (router view refreshed every --feedback-delay s; with round-robin
   routing the results equal the exact mode's, which is also run and reported).
4. The whole process of each, on the same list: Vidur's child from its first line to the end of
   its output writing (imports, predictor training, event loop, metrics files), and fleetwise
   as a user runs it, in a fresh interpreter (benchmarks/fleetwise_child.py, which imports only
   json, time and pathlib before fleetwise: imports, plan and requests,
   `simulate()`, summary.json and requests.csv); CPU seconds of each process (`whole_process`).
   Also the `fleetwise simulate` command on the same list as a CSV trace (`--no-cli` skips it;
   its CPU seconds from the kernel, interpreter start and exit included). fleetwise's bytecode
   is written first, as a regular install has it, and every timed child, Vidur's too, runs with
   one BLAS thread, the fleetwise command's default (benchmarks/vidur_process.py says why).
5. Optionally fleetwise alone on a larger request set (--large-requests; lengths resampled).
Writes the JSON (--out) and prints it. The machine's load average is recorded around each
timed part: on a loaded 2-core machine, CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_venv import ensure_venv as ensure_peer_venv
from peer_venv import find_python
from vidur_process import best_of_process, child_env, compile_bytecode, run_fleetwise_cli, whole_process

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
DEFAULT_LENGTHS = REPO.parent / "shared" / "traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
DEFAULT_RATE = {"vidur": 16.0, "azure": 40.0}
"""Arrival rate per workload, req/s (vidur: arXiv prompts average ~2,600 tokens; about 4 req/s per replica)."""
DEFAULT_VENV = os.environ.get("FLEETWISE_VIDUR_VENV", "/tmp/vidur-venv")
VIDUR_VERSION = "0.0.26"

# fleetwise catalog name -> Vidur's name for the same architecture / card.
VIDUR_MODELS = {"llama-3.1-8b": "meta-llama/Llama-3-8B", "llama-3.1-70b": "meta-llama/Llama-3-70B"}
VIDUR_DEVICES = {"h100-sxm": ("h100", "h100_dgx"), "a100-80g": ("a100", "a100_dgx")}
COMPUTE_REPO = "fleetwise-offline/roofline-{model}-{device}"
NETWORK_REPO = "fleetwise-offline/roofline-{network}"
TRACE_DATE = "2024-01-01"  # Vidur's trace replay keeps the rows of one Date


# ---------------------------------------------------------------------------------------------
# The Vidur side (runs inside the venv's python: stdlib + vidur only)
# ---------------------------------------------------------------------------------------------


def _vidur_child(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    t_start = time.perf_counter()
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        LinearRegressionExecutionTimePredictorConfig,
        MetricsConfig,
        PoissonRequestIntervalGeneratorConfig,
        RandomForrestExecutionTimePredictorConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SarathiSchedulerConfig,
        SimulationConfig,
        SyntheticRequestGeneratorConfig,
        TraceRequestGeneratorConfig,
        TraceRequestLengthGeneratorConfig,
        VllmSchedulerConfig,
    )
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    s = spec
    pred_common = dict(
        model_profiling_dataset=s["compute_repo"], network_profiling_dataset=s["network_repo"],
        cache_dir=s["cache_dir"], prediction_max_tokens_per_request=s["max_tokens"],
        prediction_max_prefill_chunk_size=s["chunk_size"], prediction_max_batch_size=s["batch_cap"],
        use_native_execution_time_predictor=s["native_predictor"], k_fold_cv_splits=2, num_training_job_threads=1,
    )
    if s["predictor"] == "linear_regression":
        pred = LinearRegressionExecutionTimePredictorConfig(**pred_common)
    else:  # Vidur's default predictor, with a trimmed hyper-parameter grid so training takes seconds
        pred = RandomForrestExecutionTimePredictorConfig(num_estimators=[100], max_depth=[16], min_samples_split=[2],
                                                         **pred_common)
    if s["scheduler"] == "sarathi":
        sched = SarathiSchedulerConfig(batch_size_cap=s["batch_cap"], chunk_size=s["chunk_size"])
    else:
        sched = VllmSchedulerConfig(batch_size_cap=s["batch_cap"], max_tokens_in_batch=s["max_tokens"])
    if s["workload"] == "vidur":  # Vidur's own generator: lengths from its trace file, Poisson arrivals
        requests_cfg = SyntheticRequestGeneratorConfig(
            seed=s["seed"], num_requests=s["requests"],
            length_generator_config=TraceRequestLengthGeneratorConfig(
                seed=s["seed"], trace_file=s["length_trace"], max_tokens=s["max_tokens"]),
            interval_generator_config=PoissonRequestIntervalGeneratorConfig(seed=s["seed"], qps=s["qps"]))
    else:
        requests_cfg = TraceRequestGeneratorConfig(
            trace_file=s["trace_csv"], date=TRACE_DATE, prefill_scale_factor=1.0, decode_scale_factor=1.0,
            time_scale_factor=1.0, max_tokens=s["max_tokens"])
    cfg = SimulationConfig(
        seed=s["seed"],
        cluster_config=ClusterConfig(
            num_replicas=s["replicas"],
            replica_config=ReplicaConfig(model_name=s["model"], device=s["device"], network_device=s["network_device"],
                                         num_pipeline_stages=1, tensor_parallel_size=1),
            cache_config=CacheConfig(block_size=s["block_size"], num_blocks=s["num_blocks"]),
            global_scheduler_config=RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=sched,
        ),
        request_generator_config=requests_cfg,
        execution_time_predictor_config=pred,
        metrics_config=MetricsConfig(output_dir=s["output_dir"], write_metrics=s["write_metrics"],
                                     enable_chrome_trace=s["chrome_trace"], store_plots=False, write_json_trace=False),
    )
    set_seeds(s["seed"])
    t_cfg = time.perf_counter()
    sim = Simulator(cfg)
    t_built = time.perf_counter()

    marks: dict[str, float] = {}
    write_output = sim._write_output

    def _mark_then_write() -> None:  # the event loop ends where output writing begins
        marks["wall"], marks["cpu"] = time.perf_counter(), time.process_time()
        write_output()
        marks["end_wall"], marks["end_cpu"] = time.perf_counter(), time.process_time()

    sim._write_output = _mark_then_write
    # What Vidur will simulate, after its own clipping: (arrival s, prompt, output) in request order.
    reqs = sorted((ev._request.id, ev._request.arrived_at, ev._request.num_prefill_tokens,
                   ev._request.num_decode_tokens) for _, ev in sim._event_queue)
    if s.get("requests_out"):
        Path(s["requests_out"]).write_text(json.dumps([[a, p, d] for _, a, p, d in reqs]))
    tokens = [sum(r[2] for r in reqs), sum(r[3] for r in reqs)]
    events = [len(sim._event_queue)]
    add_events = sim._add_events

    def _count_then_add(new_events: list) -> None:  # every event but the arrivals passes here once
        events[0] += len(new_events)
        add_events(new_events)

    sim._add_events = _count_then_add
    w0, c0 = time.perf_counter(), time.process_time()
    sim.run()
    wall, cpu = marks["wall"] - w0, marks["cpu"] - c0
    n = len(reqs)
    out = {"requests": n, "tokens_in_out": tokens, "wall_s": wall, "cpu_s": cpu, "simulated_s": float(sim._time),
           "events_processed": events[0], "events_per_request": round(events[0] / n, 2),
           "import_s": t_cfg - t_start, "setup_s": t_built - t_cfg, "write_output_s": marks["end_wall"] - marks["wall"],
           "whole_wall_s": marks["end_wall"] - t_start, "whole_cpu_s": marks["end_cpu"]}
    try:  # headline numbers from Vidur's own request metrics, for a sanity look at the load
        import pandas as pd

        f = glob.glob(f"{cfg.metrics_config.output_dir}/**/request_metrics.csv", recursive=True)
        if f:
            df = pd.read_csv(f[0])
            for col, key in [("request_e2e_time", "e2e"), ("prefill_e2e_time", "ttft"),
                             ("decode_time_execution_plus_preemption_normalized", "tpot")]:
                if col in df:
                    out[f"{key}_p50_s"] = round(float(df[col].median()), 4)
                    out[f"{key}_p99_s"] = round(float(df[col].quantile(0.99)), 4)
            out["requests_completed"] = int(len(df))
            if "request_num_restarts" in df:  # preemptions by recompute (a request may restart more than once)
                out["preemptions"] = int(df["request_num_restarts"].sum())
                out["requests_preempted"] = int((df["request_num_restarts"] > 0).sum())
    except Exception as err:  # noqa: BLE001 - metrics are a side note; the timing stands without them
        out["metrics_error"] = repr(err)
    import vidur

    out["version"] = getattr(vidur, "__version__", None)
    Path(out_path).write_text(json.dumps(out))


def run_fleetwise_process(a: argparse.Namespace, work: Path, requests_json: Path, replicas: int) -> dict:
    """fleetwise's whole process (`fleetwise_child.py` in a fresh interpreter, this environment's
    fleetwise): imports, setup, simulation and output writing, as Vidur's child is timed whole."""
    spec_path, result = work / "fleetwise_spec.json", work / "fleetwise_result.json"
    plan = plan_document(a, replicas)
    spec_path.write_text(json.dumps({"requests": str(requests_json), "plan": plan, "seed": a.seed,
                                     "feedback_delay_s": a.feedback_delay, "output_dir": str(work / "fleetwise_out")}))
    load0 = os.getloadavg()
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().with_name("fleetwise_child.py")), str(spec_path),
                        str(result)], capture_output=True, text=True, env=child_env())
    if r.returncode != 0:
        sys.exit(f"fleetwise child failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in json.loads(result.read_text()).items()}
    out["loadavg_before"] = [round(x, 2) for x in load0]
    return out


# ---------------------------------------------------------------------------------------------
# The venv
# ---------------------------------------------------------------------------------------------


def ensure_venv(venv: Path, python: str | None, version: str) -> Path:
    """Create (once) and return the python of a venv with vidur==version installed."""
    interpreter = python or (None if (venv / "bin" / "python").exists() else
                             find_python(None, ("3.11", "3.10"), "--vidur-python"))
    return ensure_peer_venv(venv, "vidur", version, interpreter or "python3", " (a few minutes)")


# ---------------------------------------------------------------------------------------------
# Requests and the fleetwise side
# ---------------------------------------------------------------------------------------------


def load_requests(trace: Path, n: int, rate: float | None, max_tokens: int):
    from dataclasses import replace

    from fleetwise.workload.traces import load_trace

    reqs = load_trace(trace, rate_rps=rate, max_requests=n)
    return [r if r.prompt_tokens + r.output_tokens <= max_tokens
            else replace(r, prompt_tokens=max(1, max_tokens - r.output_tokens)) for r in reqs]


def large_requests(base, n: int, rate: float, seed: int):
    """n requests with (prompt, output) resampled from `base`, Poisson arrivals at `rate`."""
    import numpy as np

    from fleetwise.core.request import Request

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), n)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    p = np.array([r.prompt_tokens for r in base])[idx]
    o = np.array([r.output_tokens for r in base])[idx]
    return [Request(str(i), float(t[i]), int(p[i]), int(o[i])) for i in range(n)]


def vidur_requests(path: Path):
    """The request list Vidur's own generator made (exported by the child), as fleetwise requests."""
    from fleetwise.core.request import Request

    rows = json.loads(path.read_text())
    return [Request(str(i), float(t), int(p), int(d)) for i, (t, p, d) in enumerate(rows)]


def step_budget(a: argparse.Namespace) -> int:
    """Tokens per step: the chunk size with chunked prefill (sarathi), else the request cap."""
    return a.chunk_size if a.vidur_scheduler == "sarathi" else a.max_tokens


def fleetwise_plan(a: argparse.Namespace, replicas: int):
    from fleetwise.spec.plan import PlanSpec

    return PlanSpec(**plan_document(a, replicas))


def plan_document(a: argparse.Namespace, replicas: int) -> dict:
    """The matched fleet as a plan document (what `PlanSpec` validates)."""
    return dict(name="vidur-compare", routing="round-robin", pools=[{
        "name": "m", "accelerator": a.gpu, "model": a.model, "replicas": replicas,
        "gpu_memory_utilization": a.gpu_memory_utilization, "engine": {"max_num_batched_tokens": step_budget(a), "max_num_seqs": a.batch_cap, "block_size": a.block_size,
                   "enable_prefix_caching": False, "enable_chunked_prefill": a.vidur_scheduler == "sarathi"}}])


def kv_blocks(a: argparse.Namespace) -> int:
    """KV blocks of one replica as fleetwise sizes them (given to Vidur so both have the same memory)."""
    from fleetwise.perf.memory import FitOptions, kv_capacity_tokens
    from fleetwise.perf.types import Deployment
    from fleetwise.spec import catalog

    dep = Deployment(catalog.resolve_model(a.model), catalog.resolve_gpu(a.gpu))
    cap = kv_capacity_tokens(dep, FitOptions(max_num_batched_tokens=step_budget(a), max_num_seqs=a.batch_cap,
                                             gpu_memory_utilization=a.gpu_memory_utilization))
    return cap // a.block_size


def run_fleetwise(a: argparse.Namespace, reqs, replicas: int, feedback_delay: float | None = None) -> dict:
    import gc

    from fleetwise.sim.runner import SimOptions, simulate

    plan = fleetwise_plan(a, replicas)
    delay = a.feedback_delay if feedback_delay is None else feedback_delay
    gc.collect()
    load0 = os.getloadavg()
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(plan, reqs, options=SimOptions(seed=a.seed, feedback_delay_s=delay))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s = res.summary
    return {"requests": len(reqs), "replicas": replicas, "feedback_delay_s": delay,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "rps": round(len(reqs) / wall, 1), "rps_cpu": round(len(reqs) / cpu, 1),
            "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "requests_completed": s["requests_completed"], "simulated_s": round(s["duration_s"], 1),
            "events_processed": s["events_processed"],
            "events_per_request": round(s["events_processed"] / len(reqs), 2),
            "e2e_p50_s": round(s["e2e_s"]["p50"], 4), "e2e_p99_s": round(s["e2e_s"]["p99"], 4),
            "ttft_p50_s": round(s["ttft_s"]["p50"], 4), "ttft_p99_s": round(s["ttft_s"]["p99"], 4),
            "tpot_p50_s": round(s["tpot_s"]["p50"], 4), "tpot_p99_s": round(s["tpot_s"]["p99"], 4),
            "preemptions": int(sum(r["preemptions"] for r in s["per_replica"])),
            "kv_usage_max": round(max(r["kv_usage"]["max"] for r in s["per_replica"]), 4)}


def prepare_vidur(a: argparse.Namespace, reqs, work: Path) -> dict:
    """Write the offline profiling tables and the trace CSV; return the child's base spec."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vidur_tables import write_offline_profiles

    vmodel = VIDUR_MODELS[a.model]
    device, network = VIDUR_DEVICES[a.gpu]
    compute_repo = COMPUTE_REPO.format(model=vmodel.split("/")[-1].lower(), device=device)
    network_repo = NETWORK_REPO.format(network=network.replace("_", "-"))
    cache = work / "vidur_cache"
    tables = write_offline_profiles(
        cache, model=a.model, gpu=a.gpu, vidur_model=vmodel, vidur_device=device, vidur_network_device=network,
        compute_repo=compute_repo, network_repo=network_repo, max_tokens=a.max_tokens, max_chunk=step_budget(a),
        max_batch=a.batch_cap, block_size=a.block_size, batch_cap=a.batch_cap)
    trace_csv = work / "vidur_trace.csv"
    with trace_csv.open("w") as f:
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for r in reqs or []:
            f.write(f"{TRACE_DATE},{r.arrival_s!r},{r.prompt_tokens},{r.output_tokens}\n")
    return {"seed": a.seed, "replicas": a.replicas, "model": vmodel, "device": device, "network_device": network,
            "block_size": a.block_size, "num_blocks": kv_blocks(a), "batch_cap": a.batch_cap,
            "max_tokens": a.max_tokens, "chunk_size": step_budget(a), "scheduler": a.vidur_scheduler,
            "workload": a.workload, "requests": a.requests, "qps": a.rate, "length_trace": str(a.length_trace),
            "requests_out": str(work / "vidur_requests.json"),
            "predictor": a.vidur_predictor, "native_predictor": a.vidur_native, "chrome_trace": False,
            "write_metrics": True,
            "trace_csv": str(trace_csv), "cache_dir": str(cache), "output_dir": str(work / "vidur_out"),
            "compute_repo": compute_repo, "network_repo": network_repo,
            "tables": {"compute_rows": tables["compute_rows"], "attention_rows": tables["attention_rows"]}}


def run_vidur(a: argparse.Namespace, reqs, work: Path, py: Path, spec: dict, tag: str) -> dict:
    """One Vidur run in the venv's python; its event loop's wall and CPU seconds."""
    spec_path, result = work / f"spec_{tag}.json", work / f"vidur_result_{tag}.json"
    spec_path.write_text(json.dumps(spec))
    env = child_env(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", WANDB_MODE="disabled",
                    HF_HOME=str(work / "hf_home"), PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    log = work / f"vidur_{tag}.log"
    load0 = os.getloadavg()
    with log.open("w") as lf:
        r = subprocess.run([str(py), str(Path(__file__).resolve()), "--vidur-child", str(spec_path), str(result)],
                           cwd=work, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=a.vidur_timeout)
    if r.returncode != 0:
        tail = log.read_text()[-4000:]
        sys.exit(f"Vidur failed (exit {r.returncode}); log {log}:\n{tail}")
    out = json.loads(result.read_text())
    ours = [sum(r.prompt_tokens for r in reqs), sum(r.output_tokens for r in reqs)] if reqs else out["tokens_in_out"]
    if out["tokens_in_out"] != ours:
        sys.exit(f"Vidur's request set differs from fleetwise's: tokens {out['tokens_in_out']} vs {ours}")
    out.update({"replicas": a.replicas, "native_predictor": spec["native_predictor"],
                "chrome_trace": spec["chrome_trace"], "write_metrics": spec["write_metrics"],
                "rps": round(out["requests"] / out["wall_s"], 1),
                "rps_cpu": round(out["requests"] / out["cpu_s"], 1),
                "loadavg_before": [round(x, 2) for x in load0],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()], "tables": spec["tables"]})
    for k in ("wall_s", "cpu_s", "simulated_s", "import_s", "setup_s", "write_output_s", "whole_wall_s",
              "whole_cpu_s"):
        out[k] = round(out[k], 3)
    return out


def markdown_table(out: dict) -> str:
    """The headline rows as a Markdown table (for docs/benchmarks.md)."""
    rows = ["| run | requests | replicas | wall s | CPU s | req/wall s | req/CPU s | events/request | load avg (1 min) |",
            "|---|---|---|---|---|---|---|---|---|"]
    names = [("vidur", "Vidur (metrics on)"), ("vidur_no_metrics", "Vidur, no metrics"),
             ("vidur_default_tracing", "Vidur, Chrome trace + Python lookups"),
             ("fleetwise", "fleetwise (fast mode)"), ("fleetwise_exact_mode", "fleetwise (exact mode)"),
             ("fleetwise_large", "fleetwise, larger set")]
    for key, label in names:
        r = out.get(key)
        if r:
            rows.append(f"| {label} | {r['requests']:,} | {r['replicas']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                        f"{r['rps']:,.0f} | {r['rps_cpu']:,.0f} | {r.get('events_per_request', '-')} | "
                        f"{r['loadavg_before'][0]:.2f} |")
    tail = (f"\nfleetwise / Vidur: **{out['ratio_wall']}x** per wall second, **{out['ratio_cpu']}x** per CPU second "
            f"(exact mode: {out['ratio_wall_exact_mode']}x wall, {out.get('ratio_cpu_exact_mode')}x CPU")
    if out.get("ratio_cpu_vs_vidur_no_metrics"):
        tail += f"; against Vidur with no metrics: {out['ratio_cpu_vs_vidur_no_metrics']}x CPU"
    m = out.get("matched") or {}
    lat = ["", "| figure | Vidur | fleetwise (fast) | fleetwise (exact) |", "|---|---|---|---|"]
    for k, v in m.items():
        lat.append(f"| {k} | {v['vidur']} | {v['fleetwise']} | {v['fleetwise_exact_mode']} |")
    wp = out.get("whole_process")
    if wp:
        v, f = wp["vidur"], wp["fleetwise"]
        tail += (f").\n\nWhole process (imports, setup, simulation, output writing): Vidur {v['whole_cpu_s']:.2f} CPU s "
                 f"(import {v['import_s']:.2f} s, setup {v['setup_s']:.2f} s), fleetwise {f['whole_cpu_s']:.2f} CPU s "
                 f"(import {f['import_s']:.2f} s, setup {f['setup_s']:.2f} s, simulate {f['simulate_s']:.2f} s, "
                 f"write {f['write_output_s']:.2f} s): **{wp['ratio_cpu']}x** per CPU second, {wp['ratio_wall']}x wall")
        if wp.get("fleetwise_cli"):
            tail += (f"; the `fleetwise simulate` command {wp['fleetwise_cli']['whole_cpu_s']:.2f} CPU s: "
                     f"**{wp['ratio_cpu_cli']}x**")
    return "\n".join(rows) + "\n" + tail + ")." + ("\n" + "\n".join(lat) if m else "")


def best_of(runs: list[dict]) -> dict:
    """The run with the least wall time, with the least CPU time of all runs and every run's times."""
    best = dict(min(runs, key=lambda r: r["wall_s"]))
    if len(runs) > 1:
        best["cpu_s"] = min(r["cpu_s"] for r in runs)
        best["rps_cpu"] = round(best["requests"] / best["cpu_s"], 1)
        best["runs"] = [{"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "loadavg_before": r["loadavg_before"]}
                        for r in runs]
    return best


def _git_state() -> dict:
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    return {"commit": git("rev-parse", "--short", "HEAD"), "src_modified": bool(git("status", "--porcelain", "src"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["vidur", "azure"], default="vidur",
                    help="vidur: Vidur's own generator (lengths from --length-trace, Poisson at --rate), its request "
                         "list given to fleetwise; azure: the first --requests rows of --trace, rescaled to --rate")
    ap.add_argument("--length-trace", type=Path, default=DEFAULT_LENGTHS,
                    help="Vidur's request-length file (num_prefill_tokens,num_decode_tokens,...)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--requests", type=int, default=5000, help="requests (both simulators)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rate", type=float, default=None,
                    help=f"arrival rate, req/s (default {DEFAULT_RATE['vidur']:g} for vidur, {DEFAULT_RATE['azure']:g} "
                         "for azure)")
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(VIDUR_MODELS))
    ap.add_argument("--gpu", default="h100-sxm", choices=sorted(VIDUR_DEVICES))
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="prompt+output cap per request (default 4096 for vidur: Vidur's default, every arXiv "
                         "request fits; 8192 for azure), also the step budget of the vllm scheduler")
    ap.add_argument("--chunk-size", type=int, default=512,
                    help="sarathi: prefill chunk = step token budget (fleetwise max_num_batched_tokens)")
    ap.add_argument("--batch-cap", type=int, default=128, help="max sequences per replica (max_num_seqs)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                    help="fleetwise's memory fit (KV blocks then given to Vidur); lower it to put the KV cache "
                         "under pressure")
    ap.add_argument("--feedback-delay", type=float, default=0.25,
                    help="fleetwise router view refresh (round-robin gives the same results at any value)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--large-requests", type=int, default=0, help="fleetwise-only run on more requests; 0 skips it")
    ap.add_argument("--large-replicas", type=int, default=16)
    ap.add_argument("--vidur-venv", type=Path, default=Path(DEFAULT_VENV),
                    help="throwaway venv for Vidur, outside the repo (env FLEETWISE_VIDUR_VENV)")
    ap.add_argument("--vidur-python", default=None, help="interpreter that creates the venv (3.10/3.11)")
    ap.add_argument("--vidur-version", default=VIDUR_VERSION)
    ap.add_argument("--vidur-scheduler", default="sarathi", choices=["vllm", "sarathi"],
                    help="sarathi (default): chunked prefill mixed with decodes, fleetwise chunked prefill on; "
                         "vllm: Vidur's vLLM-v0 scheduler, fleetwise chunked prefill off")
    ap.add_argument("--vidur-predictor", default="random_forrest", choices=["random_forrest", "linear_regression"])
    ap.add_argument("--vidur-native", action=argparse.BooleanOptionalAction, default=True,
                    help="Vidur's C++ execution-time lookups (its fastest setting)")
    ap.add_argument("--vidur-extra-runs", action=argparse.BooleanOptionalAction, default=False,
                    help="also time Vidur with no metrics at all, and with its default Chrome trace on and "
                         "Python predictor lookups")
    ap.add_argument("--repeats", type=int, default=2,
                    help="timed runs of Vidur and of fleetwise on the shared set; the best of each is reported")
    ap.add_argument("--cli", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the whole `fleetwise simulate` command on the same list (--repeats runs)")
    ap.add_argument("--vidur-timeout", type=float, default=3600)
    ap.add_argument("--work-dir", type=Path, default=None, help="temp files (default: a fresh dir, removed after)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vidur_compare.json")
    a = ap.parse_args()
    if a.vidur_venv.resolve().is_relative_to(REPO):
        sys.exit(f"--vidur-venv {a.vidur_venv} is inside the repository; put it outside (e.g. /tmp/vidur-venv)")
    needed = a.length_trace if a.workload == "vidur" else a.trace
    if not Path(needed).is_file():
        sys.exit(f"{needed}: no such trace (the public traces live in ../shared/traces beside the checkout); "
                 f"pass --{'length-trace' if a.workload == 'vidur' else 'trace'} PATH")
    a.rate = DEFAULT_RATE[a.workload] if a.rate is None else a.rate
    a.max_tokens = a.max_tokens or (4096 if a.workload == "vidur" else 8192)

    py = ensure_venv(a.vidur_venv, a.vidur_python, a.vidur_version)
    reqs = load_requests(a.trace, a.requests, a.rate, a.max_tokens) if a.workload == "azure" else None
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="vidur-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        spec = prepare_vidur(a, reqs, work)
        vidur_runs = [run_vidur(a, reqs, work, py, spec, f"lean{i}") for i in range(a.repeats)]
        vidur = best_of(vidur_runs)
        if reqs is None:  # the list Vidur generated and simulated, exported by its child
            reqs = vidur_requests(Path(spec["requests_out"]))
        requests_json = work / "fleetwise_requests.json"
        rows = [[r.arrival_s, r.prompt_tokens, r.output_tokens] for r in reqs]
        requests_json.write_text(json.dumps(rows))
        bytecode = compile_bytecode()
        fw_process = best_of_process([run_fleetwise_process(a, work, requests_json, a.replicas)
                                      for _ in range(a.repeats)])
        fw_cli = best_of_process([run_fleetwise_cli(plan_document(a, a.replicas), rows, work, a.seed, a.feedback_delay)
                                  for _ in range(a.repeats)]) if a.cli else None
        vidur_defaults = vidur_bare = None
        if a.vidur_extra_runs:
            vidur_bare = run_vidur(a, reqs, work, py, dict(spec, write_metrics=False), "no_metrics")
            vidur_defaults = run_vidur(a, reqs, work, py, dict(spec, native_predictor=False, chrome_trace=True),
                                       "defaults")
    finally:
        if a.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    source = _git_state()  # the fleetwise code about to be timed
    fw = best_of([run_fleetwise(a, reqs, a.replicas) for _ in range(a.repeats)])
    fw_exact = best_of([run_fleetwise(a, reqs, a.replicas, feedback_delay=0.0) for _ in range(a.repeats)])
    large = None
    if a.large_requests:
        per_replica = a.rate / a.replicas
        big = large_requests(reqs, a.large_requests, per_replica * a.large_replicas, a.seed)
        large = run_fleetwise(a, big, a.large_replicas)
        large["workload"] = (f"{a.large_requests} requests, (prompt, output) resampled from the {len(reqs)} above, "
                             f"Poisson arrivals at {per_replica * a.large_replicas:g} req/s")
    sarathi = a.vidur_scheduler == "sarathi"
    if a.workload == "vidur":
        described = (f"Vidur's synthetic generator: {a.requests} requests, lengths drawn from {a.length_trace.name} "
                     f"(clipped to prompt+output <= {a.max_tokens}), Poisson arrivals at {a.rate:g} req/s, seed "
                     f"{a.seed}; the generated list exported and replayed by fleetwise")
    else:
        described = (f"first {a.requests} rows of {a.trace.name}, arrivals rescaled to {a.rate:g} req/s, "
                     f"prompt clipped to prompt+output <= {a.max_tokens}")
    out = {
        "benchmark": "vidur_compare",
        "machine": {"cores": os.cpu_count(), "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "fleetwise_source": source,
        "vidur": vidur,
        "vidur_no_metrics": vidur_bare,
        "vidur_default_tracing": vidur_defaults,
        "fleetwise": fw,
        "fleetwise_exact_mode": fw_exact,
        "fleetwise_large": large,
        "ratio_wall": round(fw["rps"] / vidur["rps"], 1),
        "ratio_cpu": round(fw["rps_cpu"] / vidur["rps_cpu"], 1),
        "ratio_wall_exact_mode": round(fw_exact["rps"] / vidur["rps"], 1),
        "ratio_cpu_exact_mode": round(fw_exact["rps_cpu"] / vidur["rps_cpu"], 1),
        "ratio_cpu_vs_vidur_no_metrics": round(fw["rps_cpu"] / vidur_bare["rps_cpu"], 1) if vidur_bare else None,
        "matched": matched_figures(vidur, fw, fw_exact),
        "whole_process": whole_process(vidur_runs, fw_process, fw_cli, bytecode),
        "target": "fleetwise's whole process >= 30x Vidur's on the matched request list (issue 26)",
        "setup": {
            "model": f"{a.model} (Vidur: {VIDUR_MODELS[a.model]})",
            "gpu": f"{a.gpu} (Vidur: {'/'.join(VIDUR_DEVICES[a.gpu])})",
            "replicas": a.replicas, "tp": 1, "pp": 1, "routing": "round-robin (both)",
            "workload": a.workload, "requests": described,
            "batch_cap": a.batch_cap, "max_tokens_per_request": a.max_tokens,
            "step_token_budget": step_budget(a), "chunk_size": a.chunk_size if sarathi else None,
            "block_size": a.block_size, "kv_blocks_per_replica": kv_blocks(a),
            "gpu_memory_utilization": a.gpu_memory_utilization,
            "vidur_scheduler": a.vidur_scheduler, "vidur_predictor": a.vidur_predictor,
            "vidur_native_predictor": a.vidur_native,
            "fleetwise_engine": {"enable_chunked_prefill": sarathi, "max_num_batched_tokens": step_budget(a),
                                 "max_num_seqs": a.batch_cap, "enable_prefix_caching": False,
                                 "feedback_delay_s": a.feedback_delay},
        },
        "notes": NOTES + [f"Best of {a.repeats} runs each for Vidur (metrics on) and fleetwise on the shared set "
                          "(least wall; least CPU), every run listed under 'runs'; the other variants ran once."],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    print(markdown_table(out))


def matched_figures(vidur: dict, fw: dict, fw_exact: dict) -> dict:
    """Side by side: latency percentiles, preemptions and events per request of both simulators."""
    keys = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "preemptions",
            "events_per_request", "simulated_s")
    return {k: {"vidur": vidur.get(k), "fleetwise": fw.get(k), "fleetwise_exact_mode": fw_exact.get(k)}
            for k in keys}


NOTES = [
    "Vidur ran offline: HF_HUB_OFFLINE=1 and synthetic profiling tables (mlp.csv.xz, attention.csv.xz; "
    "network tables unused at TP=1/PP=1) generated from fleetwise's roofline PerfModel for the same model "
    "and card, laid out as the model-hub cache its snapshot_download reads (benchmarks/vidur_tables.py). "
    "Its prediction download fails offline and it trains its predictor from those tables (setup_s).",
    "Timed: Vidur's Simulator.run event loop only (not import, predictor training, request generation or "
    "output writing); fleetwise's simulate() call (fleet build, event loop, summary). Both single-process.",
    "Vidur metrics (the 'vidur' entry, used for ratio_wall/ratio_cpu): request/batch/utilization metrics on "
    "(fleetwise also records per-request results), plots and Chrome trace off, C++ execution-time lookups.",
    "Events: Vidur counts every event its loop pops (arrivals, global/replica schedule, batch and stage "
    "start/end); fleetwise every event its loop pops (route ticks, routed arrivals, step ends, kicks, samples). "
    "fleetwise fuses decode-only passes between events, Vidur runs one event chain per batch.",
    "Preemptions: both preempt by recompute. Vidur's sarathi scheduler reserves blocks for a request's whole "
    "prompt at admission and keeps a watermark of 1% of the blocks free; fleetwise (vLLM v1) allocates blocks "
    "per scheduled chunk with no watermark, so it admits more requests into the same memory and preempts when "
    "their later chunks and decodes outgrow it.",
]

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--vidur-child":
        _vidur_child(sys.argv[2], sys.argv[3])
    else:
        main()
