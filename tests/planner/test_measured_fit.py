"""The step-time fit recovers a known factor from service rates the model itself produces at that
factor, for colocated and for prefill/decode pools, and each pool's own factor in a heterogeneous
fleet; a measured document for another model is refused."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner.measured import (
    MEASURED_SCHEMA,
    ServiceRates,
    fit_factors,
    load_measured,
    modelled_service,
    service_rates,
)
from fleetwise.planner.metrics_page import parse_page
from fleetwise.spec.base import validate
from fleetwise.spec.plan import PlanSpec

PD = {"name": "pd", "routing": "round-robin",
      "pools": [{"name": "prefill", "role": "prefill", "replicas": 1, "accelerator": "h200-sxm",
                 "model": "llama-3.1-8b"},
                {"name": "decode", "role": "decode", "replicas": 1, "accelerator": "h200-sxm",
                 "model": "llama-3.1-8b"}]}
MIXED = {"name": "mixed", "routing": "round-robin",
         "pools": [{"name": "mixed", "replicas": 2, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}]}
TRUE_FACTOR = 1.2


@pytest.mark.parametrize("doc", [MIXED, PD])
def test_fit_recovers_a_factor_the_model_produced(doc):
    plan = validate(PlanSpec, doc, "plan")
    load = ServiceRates(requests=400, prompt_tokens=1024, output_tokens=96, prefill_s=0.0, decode_s_per_token=0.0,
                        rate_rps=6.0)
    loads = {p.name: load for p in plan.pools}
    truth = modelled_service(plan, loads, {p.name: TRUE_FACTOR for p in plan.pools}, seed=11)  # another seed
    measured = {name: ServiceRates(400, 1024, 96, m.prefill_s, m.decode_s_per_token, 6.0) for name, m in truth.items()}
    fits = fit_factors(plan, measured, seed=0)
    assert set(fits) == {p.name for p in plan.pools}
    for factor, lo, hi in fits.values():
        assert factor == pytest.approx(TRUE_FACTOR, rel=0.03)
        assert lo < TRUE_FACTOR < hi


def dump(req=100, prompt=100000, gen=12800, pre_n=100, pre_sum=5.0, dec_n=100, dec_sum=100.0) -> str:
    """A replica's vLLM metrics page with these counter and histogram values."""
    return "\n".join([
        "# TYPE vllm:request_success counter", f'vllm:request_success_total{{finished_reason="stop"}} {req}',
        "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total {prompt}",
        "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total {gen}",
        "# TYPE vllm:request_prefill_time_seconds histogram",
        f'vllm:request_prefill_time_seconds_bucket{{le="+Inf"}} {pre_n}',
        f"vllm:request_prefill_time_seconds_count {pre_n}", f"vllm:request_prefill_time_seconds_sum {pre_sum}",
        "# TYPE vllm:request_decode_time_seconds histogram",
        f'vllm:request_decode_time_seconds_bucket{{le="+Inf"}} {dec_n}',
        f"vllm:request_decode_time_seconds_count {dec_n}", f"vllm:request_decode_time_seconds_sum {dec_sum}", ""])


@pytest.mark.parametrize(("values", "message"), [
    ({"pre_sum": "NaN"}, r"r.prom: vllm:request_prefill_time_seconds_sum is nan; "),
    ({"prompt": "+Inf"}, r"r.prom: vllm:prompt_tokens_total is inf; "),
    ({"pre_sum": -5}, r"r.prom: vllm:request_prefill_time_seconds_sum is -5; "),
])
def test_a_metrics_page_with_a_nonsensical_value_names_the_metric(values, message):
    with pytest.raises(SpecError, match=message):
        parse_page(dump(**values), "r.prom")


def test_counters_that_fell_between_two_scrapes_are_refused_as_a_restart():
    (before,) = parse_page(dump(req=1000, pre_n=1000, pre_sum=50.0), "a.prom")
    for after in (dump(req=100), dump(req=1100, pre_n=1100, pre_sum=40.0)):
        with pytest.raises(SpecError, match=r"b.prom: vllm:\S+ fell from \S+ to \S+ between the two scrapes "
                                            r"\(the replica restarted\?\); measure again"):
            parse_page(after, "b.prom")[0].minus(before, 60.0)


@pytest.mark.parametrize(("values", "role", "message"), [
    ({"pre_sum": 0}, "mixed", r"r.prom: vllm:request_prefill_time_seconds records 0 s over 100 requests"),
    ({"pre_n": 0, "pre_sum": 0}, "prefill", r"r.prom: vllm:request_prefill_time_seconds records 0 s over 0 requests"),
    ({"dec_sum": 0}, "decode", r"r.prom: vllm:request_decode_time_seconds records 0 s over 12,700 decode tokens"),
    ({"gen": 100, "dec_sum": 0}, "mixed", r"r.prom: vllm:request_decode_time_seconds records 0 s over 0 decode tokens"),
])
def test_a_pool_without_the_service_time_its_role_needs_is_refused(values, role, message):
    with pytest.raises(SpecError, match=message):
        service_rates(parse_page(dump(**values), "r.prom"), role)


def test_a_prefill_pool_needs_no_decode_time_and_a_decode_pool_no_prefill_time():
    assert service_rates(parse_page(dump(dec_sum=0, gen=100), "r.prom"), "prefill").prefill_s == 0.05
    assert service_rates(parse_page(dump(pre_sum=0), "r.prom"), "decode").decode_s_per_token == 100 / 12700


GOOD_POOL = {"pool": "mixed", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "step_time_factor": 1.3,
             "ci95": [1.2, 1.4], "requests": 100}


@pytest.mark.parametrize(("change", "message"), [
    ({"requests": 0}, r"m.json: pools.0.requests: must be greater than 0, got 0"),
    ({"requests": -5}, r"m.json: pools.0.requests: must be greater than 0, got -5"),
    ({"requests": "many"}, r"m.json: pools.0.requests: expected a number, got 'many'"),
    ({"requests": None}, r"m.json: pools.0.requests: expected a number, got None"),
    ({"step_time_factor": "abc"}, r"m.json: pools.0.step_time_factor: expected a number, got 'abc'"),
    ({"step_time_factor": 0}, r"m.json: pools.0.step_time_factor: must be greater than 0, got 0"),
    ({"step_time_factor": 1e300}, r"m.json: pools.0.step_time_factor: must be at most 1000, got 1e\+300"),
    ({"ci95": [1.2]}, r"m.json: pools.0.ci95: expected \[low, high\] around step_time_factor 1.3, got list of 1 \[1.2\]"),
    ({"ci95": "x"}, r"m.json: pools.0.ci95: expected \[low, high\] around step_time_factor 1.3, got 'x'"),
    ({"ci95": [1.4, 1.2]}, r"m.json: pools.0.ci95: expected \[low, high\] around step_time_factor 1.3, got list of 2 \[1.4, 1.2\]"),
    ({"ci95": [0.1, 0.2]}, r"m.json: pools.0.ci95: expected \[low, high\] around step_time_factor 1.3, got list of 2 \[0.1, 0.2\]"),
    ({"ci95": [1.2, "x"]}, r"m.json: pools.0.ci95.1: expected a number, got 'x'"),
])
def test_a_measured_document_with_a_nonsensical_figure_names_the_field(change, message):
    doc = {"schema": MEASURED_SCHEMA, "pools": [{**GOOD_POOL, **change}]}
    with pytest.raises(SpecError, match=message):
        load_measured(doc, "m.json", "llama-3.1-8b")


def test_a_measured_document_that_measures_nothing_the_spec_plans_on_is_refused():
    with pytest.raises(SpecError, match=r"m.json: pools: empty; nothing was measured"):
        load_measured({"schema": MEASURED_SCHEMA, "pools": []}, "m.json", "llama-3.1-8b")
    with pytest.raises(SpecError, match=r"m.json: pools: empty; nothing was measured"):
        load_measured({"schema": MEASURED_SCHEMA}, "m.json", "llama-3.1-8b")
    doc = {"schema": MEASURED_SCHEMA, "pools": [GOOD_POOL]}
    with pytest.raises(SpecError, match=r"m.json: measured on h100-sxm, but the spec plans on h200-sxm, mi300x; "
                                        r"the measurement would change nothing"):
        load_measured(doc, "m.json", "llama-3.1-8b", ["h200-sxm", "mi300x"])
    (m,) = load_measured(doc, "m.json", "llama-3.1-8b", ["h100-sxm", "h200-sxm"])
    assert m.step_time_factor == 1.3


def test_measured_document_of_another_model_is_refused():
    doc = {"schema": MEASURED_SCHEMA, "pools": [{"pool": "mixed", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                                                 "step_time_factor": 1.3, "ci95": [1.2, 1.4], "requests": 100}]}
    (m,) = load_measured(doc, "m.json", "llama-3.1-8b")
    assert (m.accelerator, m.step_time_factor, m.ci95) == ("h100-sxm", 1.3, (1.2, 1.4))
    with pytest.raises(SpecError, match=r"m.json: pools.0.model: measured on 'llama-3.1-8b', but the spec plans "
                                        r"'llama-3.1-70b'"):
        load_measured(doc, "m.json", "llama-3.1-70b")
    with pytest.raises(SpecError, match=r"m.json: schema: 'fleetwise-plan/1' is not fleetwise-measured/1"):
        load_measured({"schema": "fleetwise-plan/1"}, "m.json", "llama-3.1-8b")


HETERO = {"name": "hetero", "routing": "round-robin",
          "pools": [{"name": "old", "replicas": 1, "accelerator": "h100-sxm", "model": "llama-3.1-8b"},
                    {"name": "new", "replicas": 1, "accelerator": "h200-sxm", "model": "llama-3.1-8b"}]}


def _measured_per_pool(plan: PlanSpec, factors: dict[str, float], rate_rps: float) -> dict[str, ServiceRates]:
    """What each pool's metrics would say of the whole fleet run at `rate_rps` (round-robin over
    both pools, each pool's steps x its own factor): per-pool means and per-replica rates."""
    import numpy as np

    from fleetwise.core.request import Request
    from fleetwise.sim.runner import SimOptions, simulate

    slow = plan.model_copy(update={"pools": [p.model_copy(update={"step_time_factor": factors[p.name]})
                                             for p in plan.pools]})
    arrivals = np.cumsum(np.random.default_rng(5).exponential(1.0 / rate_rps, 3000))
    rec = simulate(slow, [Request(f"m-{i}", float(t), 1024, 96) for i, t in enumerate(arrivals)],
                   options=SimOptions(seed=5)).records
    worker, start = rec.column("worker"), rec.column("prefill_start_s")
    first, end = rec.column("first_token_s"), rec.column("finish_s")
    out = {}
    for w, pool in enumerate(plan.pools):
        mine = worker == w
        out[pool.name] = ServiceRates(float(mine.sum()), 1024, 96, float((first[mine] - start[mine]).mean()),
                                      float(((end[mine] - first[mine]) / 95).mean()), float(mine.sum() / arrivals[-1]))
    return out


def test_each_pool_of_a_heterogeneous_fleet_is_fitted_at_its_own_load_and_speed():
    """Two colocated pools on different cards, one 1.5x slower than modelled: each pool's factor is
    fitted at the load the router gave it, with the other pool at its own speed."""
    plan = validate(PlanSpec, HETERO, "plan")
    truth = {"old": 1.5, "new": 1.0}
    fits = fit_factors(plan, _measured_per_pool(plan, truth, 16.0), seed=0)
    for name, (factor, lo, hi) in fits.items():
        assert factor == pytest.approx(truth[name], rel=0.03), fits
        assert lo < truth[name] < hi, fits


PD_POOLS = [{"pool": "prefill", "role": "prefill", "accelerator": "h200-sxm", "model": "llama-3.1-8b",
             "step_time_factor": 1.5, "ci95": [1.2, 1.8], "requests": 120},
            {"pool": "decode", "role": "decode", "accelerator": "h200-sxm", "model": "llama-3.1-8b",
             "step_time_factor": 1.0, "ci95": [0.99, 1.01], "requests": 120}]


def test_prefill_and_decode_pools_measured_on_one_card_keep_their_own_factors(spec_factory):
    """A P/D fleet whose prefill pool runs 1.5x the model and whose decode pool runs as modelled:
    re-planned P/D pools keep their role's factor (a merged 1.25 would grow decode and starve
    prefill); a colocated candidate on the card takes the merge; the analytical phase prices
    prompt steps at the prefill factor and decode-only steps at the decode one."""
    from fleetwise.perf.types import BatchShape, SeqWork
    from fleetwise.planner import fit
    from fleetwise.planner.latency import priced

    measured = load_measured({"schema": MEASURED_SCHEMA, "pools": PD_POOLS}, "m.json", "llama-3.1-8b")
    assert {(m.accelerator, m.role, m.step_time_factor) for m in measured} == {
        ("h200-sxm", None, 1.25), ("h200-sxm", "prefill", 1.5), ("h200-sxm", "decode", 1.0)}
    spec = spec_factory(accelerators=[{"name": "h200-sxm"}], measured_service=[m.model_dump() for m in measured])
    assert [spec.step_time_factor("h200-sxm", r) for r in ("prefill", "decode", "mixed")] == [1.5, 1.0, 1.25]
    assert spec.step_time_factor("h100-sxm", "prefill") == 1.0
    search = fit.prepare(spec)
    lay = next(lay for lay, _ in search.enumeration.fitting if lay.accelerator == "h200-sxm")
    dep = search.hw.deployment(lay, "bf16")
    bound, pricer = search.perf.bind(dep), priced(search, dep, "h200-sxm")
    prompt, decode = BatchShape.of([SeqWork(512, 0)]), BatchShape.decode(8, 1024)
    assert pricer.step_time_s(prompt) == pytest.approx(1.5 * bound.step_time_s(prompt), rel=1e-12)
    assert pricer.step_time_s(decode) == pytest.approx(1.0 * bound.step_time_s(decode), rel=1e-12)


def test_a_card_measured_only_on_its_prefill_pool_leaves_decode_modelled(spec_factory):
    """A dump that misses the decode pool (only prefill replicas scraped): the prefill factor is
    no measurement of decode steps, so re-planned decode and colocated pools on the card stay
    modelled (they took the prefill pool's 1.5 and the report called them measured)."""
    measured = load_measured({"schema": MEASURED_SCHEMA, "pools": PD_POOLS[:1]}, "m.json", "llama-3.1-8b")
    assert [(m.accelerator, m.role, m.step_time_factor) for m in measured] == [("h200-sxm", "prefill", 1.5)]
    spec = spec_factory(accelerators=[{"name": "h200-sxm"}], measured_service=[m.model_dump() for m in measured])
    assert [spec.step_time_factor("h200-sxm", r) for r in ("prefill", "decode", "mixed")] == [1.5, 1.0, 1.0]
    assert spec.measured_for("h200-sxm", "decode") is None
