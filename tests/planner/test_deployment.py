"""One deployment builder: the estimate and the simulator price an EP replica with the same skew."""

from __future__ import annotations

from dataclasses import replace

from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape
from fleetwise.planner.fit import Layout, resolve_hardware
from fleetwise.planner.simulate import FleetShape, PoolShape, to_plan_spec
from fleetwise.sim.runner import SimOptions, Simulation


def test_ep_replica_in_simulation_carries_the_expert_imbalance(spec_factory) -> None:
    spec = spec_factory(model="qwen3-30b-a3b", moe={"expert_imbalance": 1.3})
    hw = resolve_hardware(spec, 4096)
    lay = Layout("h100-sxm", "bf16", tp=2, pp=1, ep=2)
    plan = to_plan_spec(spec, FleetShape((PoolShape("mixed", lay, 1),)), {"h100-sxm": 3.0})
    assert plan.pools[0].expert_imbalance == 1.3
    rep = Simulation(plan, [], None, SimOptions()).fleet.replicas[0]
    assert rep.deployment.expert_load_imbalance == 1.3
    assert rep.deployment == hw.deployment(lay, spec.kv_dtype)
    shape = BatchShape.decode(64, 1024)
    skewed = PerfModel().bind(rep.deployment).step_time_s(shape)
    even = PerfModel().bind(replace(rep.deployment, expert_load_imbalance=1.0)).step_time_s(shape)
    assert rep.engine.step_time(shape) == skewed > even


def test_dense_or_ep1_replicas_ignore_the_imbalance(spec_factory) -> None:
    spec = spec_factory(moe={"expert_imbalance": 1.5})
    hw = resolve_hardware(spec, 4096)
    assert hw.deployment(Layout("h100-sxm", "bf16", tp=2), "bf16").expert_load_imbalance == 1.0
