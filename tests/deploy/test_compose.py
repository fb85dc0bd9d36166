"""Target `compose`: one emulated replica per plan replica (its `fleetwise emulate` command parses
and builds a valid emulator config) and the gateway, whose config names every replica."""

from __future__ import annotations

import yaml

from fleetwise.cli.emulate_cmd import config_from_args
from fleetwise.cli.main import build_parser
from fleetwise.deploy import DeployOptions, render
from fleetwise.gateway.config import GatewayConfig
from fleetwise.spec.base import validate


def test_compose_runs_every_replica_emulated_behind_the_gateway(fleet):
    files = render(fleet, "compose", DeployOptions(fleetwise_image="fw:test"))
    compose = yaml.safe_load(files["compose.yaml"])
    names = [f"{p.name}-{i}" for p in fleet.pools for i in range(p.replicas)]
    assert list(compose["services"]) == [*names, "gateway"]
    parser = build_parser()
    for pool in fleet.pools:
        for i in range(pool.replicas):
            svc = compose["services"][f"{pool.name}-{i}"]
            assert svc["image"] == "fw:test" and svc["command"][:2] == ["fleetwise", "emulate"]
            cfg = config_from_args(parser.parse_args(svc["command"][1:]))
            assert (cfg.model, cfg.gpu, cfg.tp, cfg.pp, cfg.role) == (
                pool.model, pool.accelerator, pool.parallelism.tp, pool.parallelism.pp, pool.role)
            assert (cfg.max_num_seqs, cfg.enable_prefix_caching, cfg.port, cfg.step_time_factor) == (
                pool.engine.max_num_seqs, pool.engine.enable_prefix_caching, 8000, pool.step_time_factor)
            # a prefill replica keeps unread KV for the fleet's lease (the emulator's default is vLLM's 480 s)
            assert cfg.kv_lease_s == (fleet.failure_domains.kv_lease_s if pool.role == "prefill" else 480.0)
            kv = cfg.kv_events  # each replica publishes its KV events as vLLM does, on every interface
            assert kv is not None and kv.publishes and (kv.endpoint, kv.replay_endpoint) == (
                "tcp://*:5557", "tcp://*:5558")
    gw = compose["services"]["gateway"]
    assert set(gw["depends_on"]) == set(names) and gw["ports"] == ["8000:8000"]
    cfg = validate(GatewayConfig, yaml.safe_load(files["gateway.yaml"]), "gateway.yaml", strict=True)
    assert [b.url for b in cfg.backends] == [f"http://{n}:8000" for n in names]
    # the gateway follows each replica's feed by its service name (prefix-aware routing sees the caches)
    assert [(b.kv_events.endpoint, b.kv_events.replay_endpoint) for b in cfg.backends if b.kv_events] == [
        (f"tcp://{n}:5557", f"tcp://{n}:5558") for n in names]
    assert cfg.tokenizer == "fleetwise" and cfg.limits.hash_block_tokens == fleet.pools[0].engine.block_size


def test_a_pools_max_model_len_reaches_its_emulated_replicas(fleet):
    pools = [p.model_copy(update={"engine": p.engine.model_copy(update={"max_model_len": 8192})}) for p in fleet.pools]
    files = render(fleet.model_copy(update={"pools": pools}), "compose", DeployOptions(fleetwise_image="fw:test"))
    parser = build_parser()
    for svc in [s for n, s in yaml.safe_load(files["compose.yaml"])["services"].items() if n != "gateway"]:
        assert config_from_args(parser.parse_args(svc["command"][1:])).max_model_len == 8192


def test_an_emulated_moe_replica_runs_the_pools_expert_parallel_layout():
    """The emulated replica prices its steps as the simulator prices the pool's: the same
    deployment, expert parallelism and expert load imbalance included (an emulated EP 4 replica
    that ran EP 1 measured 1.147x the model with no slowdown hidden in it)."""
    from fleetwise.perf.types import pool_deployment
    from fleetwise.spec.catalog import resolve_gpu, resolve_model
    from fleetwise.spec.plan import PlanSpec

    plan = validate(PlanSpec, {"name": "moe", "pools": [
        {"name": "moe", "replicas": 1, "accelerator": "h100-sxm", "model": "qwen3-30b-a3b",
         "parallelism": {"tp": 4, "ep": 4}, "expert_imbalance": 1.3}]}, "plan")
    files = render(plan, "compose", DeployOptions(fleetwise_image="fw:test"))
    svc = yaml.safe_load(files["compose.yaml"])["services"]["moe-0"]
    cfg = config_from_args(build_parser().parse_args(svc["command"][1:]))
    model, gpu = resolve_model("qwen3-30b-a3b"), resolve_gpu("h100-sxm")
    assert pool_deployment(model, gpu, cfg.pool()) == pool_deployment(model, gpu, plan.pools[0])
    assert (cfg.pool().parallelism.ep, cfg.pool().expert_imbalance) == (4, 1.3)


def test_every_engine_knob_of_a_pool_reaches_its_emulated_replicas(fleet):
    """A hand-edited fleet's engine settings (chunked prefill off among them) are the ones its
    emulated replicas run, so a rehearsal, and the calibration that simulates the same pool, see
    one engine. `max_bundle_steps` is the simulator's event batching, not an engine setting."""
    changed = {"enable_chunked_prefill": False, "enable_prefix_caching": False, "max_num_seqs": 64,
               "max_num_batched_tokens": 4096, "block_size": 32, "max_model_len": 8192}
    pools = [p.model_copy(update={"engine": p.engine.model_copy(update=changed)}) for p in fleet.pools]
    files = render(fleet.model_copy(update={"pools": pools}), "compose", DeployOptions(fleetwise_image="fw:test"))
    parser = build_parser()
    services = yaml.safe_load(files["compose.yaml"])["services"]
    for pool in pools:
        cfg = config_from_args(parser.parse_args(services[f"{pool.name}-0"]["command"][1:]))
        assert cfg.pool().engine.model_dump(exclude={"max_bundle_steps"}) == pool.engine.model_dump(
            exclude={"max_bundle_steps"})
