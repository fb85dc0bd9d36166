"""One deployment builder: the estimate and the simulator price an EP replica with the same skew."""

from __future__ import annotations

from dataclasses import replace

from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape
from fleetwise.planner.fit import resolve_hardware
from fleetwise.planner.layout import Layout
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


def test_measured_expert_load_sets_each_layouts_imbalance(spec_factory, tmp_path) -> None:
    """moe.expert_load: each layout's imbalance comes from the histogram at its EP degree, in the
    estimate and in the simulated plan alike."""
    import json

    counts = [[40, 10] + [10] * 126 for _ in range(48)]  # expert 0 hot in every layer
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"expert_load_pass": counts}))
    spec = spec_factory(model="qwen3-30b-a3b", moe={"expert_load": str(path)})
    hw = resolve_hardware(spec, 4096)
    lay = Layout("h100-sxm", "bf16", tp=2, pp=1, ep=2)
    expected = (40 + 63 * 10) / ((40 + 127 * 10) / 2)  # busiest rank (experts 0-63) over the mean
    assert hw.deployment(lay, spec.kv_dtype).expert_load_imbalance == expected
    plan = to_plan_spec(spec, FleetShape((PoolShape("mixed", lay, 1),)), {"h100-sxm": 3.0})
    assert plan.pools[0].expert_imbalance == expected


def test_fit_line_says_when_the_card_has_no_peak_for_the_weights_compute_dtype(spec_factory) -> None:
    from fleetwise.perf.memory import FitOptions, layout_fit
    from fleetwise.planner.fit import fit_line

    spec = spec_factory(model="llama-3.1-8b", accelerators=[{"name": "a100-80g"}, {"name": "h100-sxm"}])
    hw = resolve_hardware(spec, 4096)

    def line(acc: str, dtype: str) -> str:
        lay = Layout(acc, dtype, tp=1)
        return fit_line(hw, lay, layout_fit(hw.model, hw.gpus[acc], lay.parallelism, dtype, "bf16", FitOptions()), "bf16")

    assert ("; a100-80g lists no fp8 tensor peak: the fp8 weights are read at fp8 size and computed at its bf16 "
            "rate (weight-only, as on cards without it)") in line("a100-80g", "fp8")
    assert "tensor peak" not in line("h100-sxm", "fp8") + line("a100-80g", "int4") + line("a100-80g", "bf16")


def test_moe_line_names_the_imbalance_only_where_experts_span_ranks(spec_factory) -> None:
    """The plan's MoE line: with one EP rank per stage no GPU waits on a busier one, so no
    imbalance (assumed or measured) is quoted and no all-to-all time; with EP=2 both are."""
    from fleetwise.planner import latency
    from fleetwise.planner.fit import prepare
    from fleetwise.planner.sizing import _moe_line

    spec = spec_factory(model="qwen3-30b-a3b", moe={"expert_imbalance": 1.3},
                        search={"max_gpus": 8, "top_k": 2, "refine_top": 2, "seeds": 2, "sample_requests": 200,
                                "disaggregation": "off", "bisect_steps": 4})
    search = prepare(spec)
    latency.run(search)
    lines = {(lay.tp, lay.ep): _moe_line(search, lay) for lay in search.estimates}
    one, split = lines[(1, 1)], lines[(2, 2)]
    assert one is not None and split is not None
    assert "EP=1, every expert on the one GPU, so no expert load imbalance between GPUs" in one
    assert "with no all-to-all" in one and "1.30" not in one and "assumed" not in one
    assert "expert load imbalance 1.30 (busiest rank over mean, assumed, not measured" in split
    assert " ms in all-to-all of " in split
    if (2, 1) in lines:
        assert "every GPU holds a slice of every expert (TP=2)" in str(lines[(2, 1)])
