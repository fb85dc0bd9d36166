"""Agreement with a hand calculation: one replica, fixed lengths, Poisson arrivals at low load.

Hand model (uses only the perf model's step times):
- T_p = step time of one fresh prompt of P tokens; T_d(c) = step time of one decode at context c;
- service S = T_p + sum of T_d over the O-1 decodes; utilisation rho = lambda * S;
- TTFT ~ T_p + rho * T_d / 2: an arrival finds the engine busy with probability rho and then waits
  the residual of the pass in progress (deterministic pass: half of it on average), the M/D/1
  residual term; queues of more than one request are negligible at this load;
- TPOT ~ mean T_d over the decode contexts (interference from other prompts is O(rho * T_p / O)).
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetwise.core.request import Request
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape, Deployment
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.catalog import get_gpu, get_model
from fleetwise.spec.plan import PlanSpec

PROMPT, OUT, RATE, N = 512, 64, 0.25, 600


def poisson_requests(seed: int) -> list[Request]:
    t = np.cumsum(np.random.default_rng(seed).exponential(1 / RATE, N))
    return [Request(str(i), float(t[i]), PROMPT, OUT) for i in range(N)]


@pytest.mark.parametrize("model,gpu", [("llama-3.1-8b", "h100-sxm"), ("qwen2.5-32b", "h200-sxm")])
def test_simulated_ttft_and_tpot_match_step_times_and_md1_estimate(model, gpu):
    plan = PlanSpec(pools=[{"name": "m", "accelerator": gpu, "model": model}])
    bound = PerfModel().bind(Deployment(get_model(model), get_gpu(gpu)))
    t_p = bound.step_time_s(BatchShape.prefill(1, PROMPT))
    t_d = [bound.step_time_s(BatchShape.decode(1, c)) for c in range(PROMPT + 1, PROMPT + OUT)]
    tpot_hand = float(np.mean(t_d))
    rho = RATE * (t_p + sum(t_d))
    ttft_hand = t_p + rho * tpot_hand / 2

    s = simulate(plan, poisson_requests(seed=7), options=SimOptions(seed=7)).summary
    assert s["requests_completed"] == N
    assert s["ttft_s"]["mean"] == pytest.approx(ttft_hand, rel=0.05)
    assert s["tpot_s"]["mean"] == pytest.approx(tpot_hand, rel=0.05)
    # An arrival to an idle engine sees exactly one prefill step: the median is T_p.
    assert s["ttft_s"]["p50"] == pytest.approx(t_p, rel=0.01)
    # Busy fraction: rho, less the time two requests decode in the same passes (at most rho^2).
    assert rho * (1 - rho) <= s["per_replica"][0]["utilization"] <= rho
