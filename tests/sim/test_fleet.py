"""Plan validation and fleet building: role families, catalog names, parallelism, memory fit."""

from __future__ import annotations

import json

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.perf.roofline import PerfModel
from fleetwise.sim.events import EventLoop
from fleetwise.sim.fleet import Fleet
from fleetwise.spec.base import validate
from fleetwise.spec.plan import PlanSpec


def pool(**kw):
    base = {"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}
    return {**base, **kw}


def make_fleet(plan: PlanSpec) -> Fleet:
    return Fleet(plan, EventLoop(), PerfModel(), lambda *a: None, lambda rep, now: 0.0)


BAD_PLANS = [
    ({"pools": [pool(bogus=1)]}, "bogus"),
    ({"pools": [pool(role="mixed"), pool(name="p", role="prefill")]}, "mix roles"),
    ({"pools": [pool(role="prefill")]}, "add a `decode` pool"),
    ({"pools": [pool(), pool()]}, "unique"),
    ({"pools": [pool()], "routing": "round-robbin"}, "round-robin"),
    ({"pools": [pool()], "kv_link": {"gbps": 10, "bandwidth_bytes_per_s": 1e9}}, "either"),
    ({"pools": []}, "pools"),
]


@pytest.mark.parametrize("data,needle", BAD_PLANS, ids=[n for _, n in BAD_PLANS])
def test_bad_plan_documents_raise_spec_errors_naming_the_problem(data, needle):
    with pytest.raises(SpecError, match=needle):
        validate(PlanSpec, data, "plan.yaml")


CATALOG_ERRORS = [
    (pool(accelerator="h100"), "unknown gpu 'h100'.*h100-sxm"),
    (pool(model="llama-9"), "unknown model"),
    (pool(parallelism={"tp": 3}), "tp=3 does not divide"),
    (pool(parallelism={"tp": 16}), "exceeds"),
    (pool(parallelism={"ep": 2}), "MoE"),
]


@pytest.mark.parametrize("p,needle", CATALOG_ERRORS, ids=[n for _, n in CATALOG_ERRORS])
def test_plan_check_resolves_catalog_and_parallelism(p, needle):
    plan = PlanSpec(pools=[p])
    with pytest.raises(SpecError, match=needle):
        plan.check()
    with pytest.raises(SpecError, match=needle):
        make_fleet(plan)


def test_every_pool_of_a_plan_serves_one_model(tmp_path):
    """A request may land on any pool and a decode pool reads the prefill pool's KV, so pools of
    different models are refused; the same architecture under another name (a config.json) is not."""
    pd = [pool(name="p", role="prefill"), pool(name="d", role="decode", model="qwen3-32b")]
    plan = PlanSpec(pools=pd, kv_link={"gbps": 100})
    msg = ("plan: pools.1 (d): model 'qwen3-32b' is another model than pools.0's 'llama-3.1-8b'; every pool "
           "of a plan serves the same model (any pool may take a request, a decode pool reads the prefill "
           "pool's KV): give each pool the same model")
    with pytest.raises(SpecError) as err:
        plan.check()
    assert str(err.value) == msg
    with pytest.raises(SpecError, match="another model"):
        PlanSpec(pools=[pool(name="a"), pool(name="b", model="llama-3.1-70b")]).check()
    cfg = tmp_path / "Llama-3.1-8B" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({  # Llama-3.1-8B's shapes, a shorter context
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}))
    PlanSpec(pools=[pool(name="a"), pool(name="b", model=str(cfg))]).check()


def test_a_model_that_does_not_fit_says_fit_failed_and_suggests_fleetwise_fit():
    plan = PlanSpec(pools=[pool(model="llama-3.1-405b", accelerator="h100-sxm")])
    with pytest.raises(SpecError, match=r"fit failed.*fleetwise fit"):
        make_fleet(plan)


def test_the_suggested_fit_command_runs_and_names_the_memory_share(capsys):
    """The hint is a command line `fleetwise fit` accepts, for the pool as written (fp8 weights,
    a memory share of 1%: what left no room), and the message names that share."""
    plan = PlanSpec(pools=[pool(weight_dtype="fp8", gpu_memory_utilization=0.01)])
    with pytest.raises(SpecError) as err:
        make_fleet(plan)
    msg = str(err.value)
    assert "gpu_memory_utilization 0.01" in msg
    command = msg.split("see `fleetwise ")[1].split("`")[0].split()
    assert command == ["fit", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weight-dtype", "fp8",
                       "--gpu-memory-utilization", "0.01"]
    assert main(command) == 0
    assert "does not fit" in capsys.readouterr().out


def test_fleet_builds_named_replicas_with_kv_capacity_and_ports_only_for_pd():
    plan = PlanSpec(pools=[pool(name="pre", role="prefill", replicas=2), pool(name="dec", role="decode", replicas=3)],
                    kv_link={"gbps": 100})
    fleet = make_fleet(plan)
    assert fleet.names == ["pre-0", "pre-1", "dec-0", "dec-1", "dec-2"]
    assert all(r.kv_capacity_tokens > 100_000 for r in fleet.replicas)
    assert [r.role for r in fleet.replicas] == ["prefill"] * 2 + ["decode"] * 3
    assert plan.kv_link.bytes_per_s == 100e9 / 8
    views = fleet.workers(1.5)
    assert [v.name for v in views] == fleet.names
    assert all(v.healthy and v.reported_at_s == 1.5 and v.pool in ("pre", "dec") for v in views)


def test_load_plan_file_checks_catalog(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_text("pools:\n  - {name: m, accelerator: h100-sxm, model: llama-3.1-8b, parallelism: {tp: 5}}\n")
    with pytest.raises(SpecError, match=r"plan.yaml: pools.0 \(m\).*tp=5"):
        PlanSpec.load(f)


def test_slowdown_rebinds_the_engine_step_times() -> None:
    """An unslowed replica prices steps with the bound perf model itself; a slowdown scales both
    step-time functions; back at 1.0 the model's own methods return."""
    from fleetwise.engine.bundle import decode_shape

    fleet = make_fleet(PlanSpec(name="t", pools=[pool(replicas=1)]))
    rep = fleet.replicas[0]
    assert rep.perf is not None
    eng, shape = rep.engine, decode_shape(8, 8 * 700, 900)
    base = rep.perf.step_time_s(shape)
    assert eng.step_time == rep.perf.step_time_s and eng.decode_time == rep.perf.decode_time_s
    rep.slowdown = 2.5
    assert eng.step_time(shape) == base * 2.5 and eng.decode_time(8, 8 * 700, 900) == base * 2.5
    rep.slowdown = rep.slowdown / 2.5
    assert rep.slowdown == 1.0 and eng.step_time == rep.perf.step_time_s
