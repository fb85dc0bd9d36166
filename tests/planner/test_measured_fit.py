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
