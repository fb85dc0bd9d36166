"""The step-time fit recovers a known factor from service rates the model itself produces at that
factor, for colocated and for prefill/decode pools; a measured document for another model is refused."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner.measured import (
    MEASURED_SCHEMA,
    ServiceRates,
    fit_factor,
    load_measured,
    modelled_service,
)
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


@pytest.mark.parametrize("doc,pool", [(MIXED, "mixed"), (PD, "prefill"), (PD, "decode")])
def test_fit_recovers_a_factor_the_model_produced(doc, pool):
    plan = validate(PlanSpec, doc, "plan")
    load = ServiceRates(requests=400, prompt_tokens=1024, output_tokens=96, prefill_s=0.0, decode_s_per_token=0.0,
                        rate_rps=6.0)
    m = modelled_service(plan, pool, load, TRUE_FACTOR, seed=11)  # "measured": the model at 1.2x, another seed
    measured = ServiceRates(400, 1024, 96, m.prefill_s, m.decode_s_per_token, 6.0)
    factor, lo, hi = fit_factor(plan, pool, measured, seed=0)
    assert factor == pytest.approx(TRUE_FACTOR, rel=0.03)
    assert lo < TRUE_FACTOR < hi


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
