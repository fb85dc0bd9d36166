"""The router never sees a request's true output length: not in the request, not in the views.

Two replays of the same arrivals and prompts that differ only in the hidden output lengths must
route identically until the first request finishes (the first moment the router can learn
anything about output lengths, from a `Completed`)."""

from __future__ import annotations

import numpy as np

from fleetwise.core.request import Request
from fleetwise.routing.registry import make_policy
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec

N, RATE_RPS, REPLICAS = 400, 200.0, 8


def replay(output_seed: int) -> list[Request]:
    """400 Poisson arrivals at 200 req/s with log-normal prompts (fixed), outputs 600-2000 tokens
    drawn from `output_seed` (the only difference between replays)."""
    rng = np.random.default_rng(11)
    t = np.cumsum(rng.exponential(1 / RATE_RPS, N))
    prompts = np.clip(rng.lognormal(np.log(900), 0.8, N), 16, 8000).astype(int)
    outs = np.random.default_rng(output_seed).integers(600, 2001, N)
    return [Request(str(i), float(t[i]), int(prompts[i]), int(outs[i])) for i in range(N)]


class Spy:
    """The default policy, recording every request it is asked to route."""

    def __init__(self) -> None:
        self.inner = make_policy("fleetwise-default", seed=0)
        self.name = self.inner.name
        self.asked: list = []

    def route(self, req, fleet):
        self.asked.append((req, fleet))
        return self.inner.route(req, fleet)

    def observe(self, fb):
        self.inner.observe(fb)

    def report(self):
        return self.inner.report()


def run(output_seed: int):
    plan = PlanSpec(name="no-oracle", routing="fleetwise-default",
                    pools=[{"name": "h200", "accelerator": "h200-sxm", "model": "llama-3.1-8b", "replicas": REPLICAS}])
    spy = Spy()
    res = simulate(plan, replay(output_seed), options=SimOptions(seed=0, feedback_delay_s=0.0, policy=spy))
    return spy, res


def test_hidden_output_lengths_do_not_change_decisions_before_the_first_completion():
    (_, a), (_, b) = run(1), run(2)
    assert [r.output_tokens for r in replay(1)] != [r.output_tokens for r in replay(2)]
    first_finish = min(np.nanmin(np.asarray(a.records.finish_s)), np.nanmin(np.asarray(b.records.finish_s)))
    arrivals = np.array([r.arrival_s for r in replay(1)])
    before = np.flatnonzero(arrivals < first_finish)
    assert len(before) == N  # every request is routed before the first one finishes
    wa, wb = np.asarray(a.records.worker), np.asarray(b.records.worker)
    differ = int(np.sum(wa[before] != wb[before]))
    assert differ == 0
    assert len(set(wa.tolist())) == REPLICAS  # the load was spread, not pinned


def test_the_policy_sees_the_clients_cap_and_views_without_token_loads():
    spy, _ = run(1)
    assert len(spy.asked) == N
    for req, fleet in spy.asked:
        assert req.max_output_tokens is None  # the client sent no max_tokens; never the true length
        assert all(w.queued_prefill_tokens is None and w.running_decode_tokens is None for w in fleet.workers)


def test_a_client_cap_reaches_the_policy_and_clips_the_output():
    from fleetwise.spec.workload import WorkloadSpec
    from fleetwise.workload.generate import generate

    wl = WorkloadSpec.model_validate({
        "arrival": {"kind": "poisson", "rate_rps": 10}, "num_requests": 50, "client_max_tokens": 300,
        "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": 100},
                    "output": {"kind": "lognormal", "median_tokens": 300, "sigma": 1.0, "max_tokens": 4000}}})
    reqs = generate(wl, seed=0)
    assert all(r.max_tokens == 300 and 1 <= r.output_tokens <= 300 for r in reqs)
    assert any(r.output_tokens == 300 for r in reqs)
    plan = PlanSpec(name="cap", routing="fleetwise-default",
                    pools=[{"name": "m", "accelerator": "h200-sxm", "model": "llama-3.1-8b", "replicas": 2}])
    spy = Spy()
    simulate(plan, reqs, options=SimOptions(seed=0, policy=spy))
    assert {req.max_output_tokens for req, _ in spy.asked} == {300}
