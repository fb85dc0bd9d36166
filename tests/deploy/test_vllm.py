"""Target `vllm`: every emitted `vllm serve` flag is in the recorded argument list of the pinned
vLLM release, the P/D halves get the NIXL connector with their roles, and the gateway config
fronting them validates."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import yaml

from fleetwise.deploy import DeployOptions, render
from fleetwise.deploy.vllm import (
    RECORDED_ARGS,
    recorded_flags,
    recorded_kv_transfer,
    serve_argv,
    unknown_flags,
)
from fleetwise.errors import SpecError
from fleetwise.gateway.config import GatewayConfig
from fleetwise.spec.base import validate
from fleetwise.spec.plan import PlanSpec

OPTS = DeployOptions()


def _commands(files):
    out = {}
    for rel, text in files.items():
        if rel.startswith("vllm/"):
            line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
            out[rel] = shlex.split(line.removeprefix("exec "))
    return out


def test_scripts_run_under_sh(fleet, tmp_path):
    """Each script is valid sh and execs `vllm serve` with the pool's environment (a stub `vllm`
    on PATH prints what it got)."""
    import os
    import subprocess

    stub = tmp_path / "bin" / "vllm"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "$VLLM_NIXL_SIDE_CHANNEL_PORT:$VLLM_NIXL_ABORT_REQUEST_TIMEOUT|$1 $2 $3"\n',
                    encoding="utf-8")
    stub.chmod(0o755)
    for rel, text in render(fleet, "vllm", OPTS).items():
        if rel.startswith("vllm/"):
            script = tmp_path / "s.sh"
            script.write_text(text, encoding="utf-8")
            env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
            out = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            env_seen, _, args = out.stdout.strip().partition("|")
            port, _, lease = env_seen.partition(":")
            assert args.startswith("serve ") and port == ("5600" if "prefill" in rel or "decode" in rel else "")
            # the KV lease: how long a NIXL producer keeps a finished prefill's KV that no decode reads
            assert lease == (str(math.ceil(fleet.failure_domains.kv_lease_s)) if "prefill" in rel else "")


def test_record_names_its_source_and_version():
    doc = json.loads(RECORDED_ARGS.read_text(encoding="utf-8"))
    assert doc["version"].startswith("v0.11")
    assert all(len(s["commit"]) == 40 and s["repo"] == "vllm-project/vllm" for s in doc["sources"])
    assert (RECORDED_ARGS.parent / "VLLM_ARGS.md").is_file()
    assert {"--tensor-parallel-size", "--no-enable-prefix-caching", "--kv-transfer-config"} <= recorded_flags()


def test_every_emitted_flag_is_recorded(fleet):
    cmds = _commands(render(fleet, "vllm", OPTS))
    assert sorted(cmds) == sorted(f"vllm/{p.name}.sh" for p in fleet.pools)
    for argv in cmds.values():
        assert argv[:2] == ["vllm", "serve"]
        flags = [a for a in argv[2:] if a.startswith("-")]
        assert flags and unknown_flags(flags) == []


def test_pool_settings_become_flags(fleet):
    for pool in fleet.pools:
        argv = serve_argv(pool, OPTS)
        opt = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
        assert opt["--tensor-parallel-size"] == str(pool.parallelism.tp)
        assert opt["--pipeline-parallel-size"] == str(pool.parallelism.pp)
        assert opt["--max-num-seqs"] == str(pool.engine.max_num_seqs)
        assert opt["--max-num-batched-tokens"] == str(pool.engine.max_num_batched_tokens)
        assert opt["--served-model-name"] == pool.model
        assert ("--enable-prefix-caching" in argv) == pool.engine.enable_prefix_caching
        assert ("--no-enable-prefix-caching" in argv) == (not pool.engine.enable_prefix_caching)
        assert ("--enable-expert-parallel" in argv) == (pool.parallelism.ep > 1)
        assert opt.get("--quantization") == ("fp8" if pool.weight_dtype == "fp8" else None)
        assert opt["--kv-cache-dtype"] == ("fp8" if pool.kv_dtype == "fp8" else "auto")
        assert (opt.get("--distributed-executor-backend") == "ray") == (pool.parallelism.gpus > 8)
        assert "--max-model-len" not in argv  # unset: vLLM's own default, the model's context


def test_a_pool_max_model_len_becomes_the_flag(fleet):
    pool = fleet.pools[0]
    pool = pool.model_copy(update={"engine": pool.engine.model_copy(update={"max_model_len": 8192})})
    argv = serve_argv(pool, OPTS)
    assert argv[argv.index("--max-model-len") + 1] == "8192"


def test_pd_halves_use_nixl_with_their_roles(fleet):
    for pool in fleet.pools:
        argv = serve_argv(pool, OPTS)
        if pool.role == "mixed":
            assert "--kv-transfer-config" not in argv
            continue
        cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert cfg == {"kv_connector": "NixlConnector",
                       "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[pool.role]}
        known = recorded_kv_transfer()
        assert set(cfg) <= set(known["fields"]) and cfg["kv_role"] in known["kv_role"]


def test_gateway_config_validates_and_names_every_replica(fleet):
    files = render(fleet, "vllm", OPTS)
    cfg = validate(GatewayConfig, yaml.safe_load(files["gateway.yaml"]), "gateway.yaml", strict=True)
    assert [b.name for b in cfg.backends] == [f"{p.name}-{i}" for p in fleet.pools for i in range(p.replicas)]
    assert [b.role for b in cfg.backends] == [p.role for p in fleet.pools for _ in range(p.replicas)]
    assert cfg.routing.policy == fleet.routing
    assert cfg.models == (fleet.pools[0].model,)


def test_a_renamed_flag_fails(monkeypatch):
    assert unknown_flags(["--tensor-parallel-size", "2", "--enable-chunked-prefil", "--max-num-seqs=4"]) == [
        "--enable-chunked-prefil"]


def test_model_without_hf_repository_asks_for_model_path(fleet, tmp_path):
    from fleetwise.spec.catalog import resolve_model

    model = resolve_model(fleet.pools[0].model).model_copy(update={"source": "measured in-house"})
    path = tmp_path / "model.json"
    path.write_text(model.model_dump_json(), encoding="utf-8")
    pool = fleet.pools[0].model_copy(update={"model": str(path)})
    with pytest.raises(SpecError, match="names no Hugging Face repository; pass --model-path"):
        serve_argv(pool, OPTS)
    assert serve_argv(pool, DeployOptions(model_path="/models/x"))[2] == "/models/x"


@pytest.mark.parametrize(("par", "ok"), [({"tp": 4, "ep": 2}, False), ({"tp": 2, "pp": 2, "ep": 2}, True),
                                         ({"tp": 2, "pp": 2, "ep": 4}, True), ({"tp": 4, "ep": 4}, True),
                                         ({"tp": 4, "ep": 1}, True), ({"tp": 2, "pp": 4, "ep": 4}, False)])
def test_an_expert_parallel_degree_vllm_cannot_run_is_refused(par, ok):
    """vLLM's --enable-expert-parallel spreads each layer's experts over the TP ranks of its pipeline
    stage: EP 1, TP or TP x PP (the planner's) run as written; another degree would silently run as EP = TP."""
    pool = validate(PlanSpec, {"name": "moe", "pools": [{"name": "moe", "replicas": 1, "accelerator": "h100-sxm",
                                                          "model": "qwen3-30b-a3b", "parallelism": par}]}, "p").pools[0]
    if ok:
        assert ("--enable-expert-parallel" in serve_argv(pool, OPTS)) == (par["ep"] > 1)
        return
    with pytest.raises(SpecError, match=rf"pool moe: parallelism.ep={par['ep']} is not an expert-parallel degree vLLM "
                                        rf"runs with tp={par['tp']}, pp={par.get('pp', 1)}: --enable-expert-parallel "
                                        rf"spreads each layer's experts over the {par['tp']} TP ranks of its stage; "
                                        rf"use ep={'1 or 4' if par['tp'] == 4 else '1, 2 or 8'}$"):
        serve_argv(pool, OPTS)
