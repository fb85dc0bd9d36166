"""The output-length predictor: what a router expects of a request's decode work, learned from completions."""

from __future__ import annotations

import numpy as np
import pytest

from fleetwise.routing.predictor import MAX_OPEN, OutputPredictor
from fleetwise.spec.routing import OutputPredictorParams

NO_DECAY = OutputPredictorParams(half_life_requests=1e12)


def test_before_any_completion_every_request_gets_the_prior_capped_by_max_tokens():
    p = OutputPredictor(OutputPredictorParams(prior_tokens=300.0))
    assert p.predict("a", 100) == 300.0
    assert p.predict("b", 5000) == 300.0
    assert p.predict("a", 100, max_tokens=64) == 64.0
    assert p.predict("a", 100, max_tokens=0) == 300.0  # 0 / absent: no cap
    assert p.expect("r1", "a", 100, max_tokens=None) == 300


def test_buckets_are_geometric_in_prompt_length():
    p = OutputPredictor(OutputPredictorParams(bucket_ratio=2.0))
    assert [p.bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 1023, 1024)] == [0, 0, 1, 1, 2, 2, 3, 9, 10]


def test_three_level_shrinkage_exact():
    k, prior = 8.0, 256.0
    p = OutputPredictor(NO_DECAY)
    for i, out in enumerate([100, 200, 300]):  # tenant a, prompts in bucket 10 (1024..2047)
        p.expect(f"a{i}", "a", 1500)
        p.completed(f"a{i}", out)
    p.expect("b0", "b", 100)
    p.completed("b0", 1000)
    fleet = (100 + 200 + 300 + 1000 + k * prior) / (4 + k)
    tenant_a = (600 + k * fleet) / (3 + k)
    bucket_a10 = (600 + k * tenant_a) / (3 + k)
    assert p.predict("a", 1024) == pytest.approx(bucket_a10, rel=1e-12)
    assert p.predict("a", 100) == pytest.approx(tenant_a, rel=1e-12)  # a's other buckets: the tenant mean
    assert p.predict("new", 100) == pytest.approx(fleet, rel=1e-12)  # an unseen tenant: the fleet mean
    assert p.observed == 4


def test_decay_halves_old_observations_after_the_half_life():
    p = OutputPredictor(OutputPredictorParams(half_life_requests=1.0, prior_weight=1e-9))
    p.learn("a", 3, 100)
    p.learn("a", 3, 400)  # the first now weighs 1/2
    assert p.predict("a", 8) == pytest.approx((100 * 0.5 + 400) / 1.5, rel=1e-6)


def test_learns_per_tenant_and_prompt_bucket_and_beats_a_single_mean():
    """Outputs depend on the tenant and on the prompt length; after learning, the per-key
    prediction is much closer than the fleet-wide mean (seeded, exact workload)."""
    rng = np.random.default_rng(7)
    mean_of = {("chat", False): 150, ("chat", True): 60, ("summ", False): 400, ("summ", True): 900}
    p = OutputPredictor()
    flat: list[float] = []
    err_p, err_flat = [], []
    for i in range(6000):
        tenant = "chat" if rng.random() < 0.6 else "summ"
        long = bool(rng.random() < 0.5)
        prompt = int(rng.integers(2048, 4096)) if long else int(rng.integers(64, 256))
        out = max(1, int(rng.exponential(mean_of[(tenant, long)])))
        rid = str(i)
        guess = p.expect(rid, tenant, prompt)
        if i >= 3000:
            err_p.append(abs(guess - mean_of[(tenant, long)]))
            err_flat.append(abs(np.mean(flat) - mean_of[(tenant, long)]))
        flat.append(out)
        p.completed(rid, out)
    assert np.mean(err_p) < 0.1 * np.mean(err_flat)
    for (tenant, long), mean in mean_of.items():
        assert p.predict(tenant, 3000 if long else 100) == pytest.approx(mean, rel=0.15)


def test_completed_learns_only_requests_it_expected_and_failed_ones_are_forgotten():
    p = OutputPredictor(NO_DECAY)
    p.completed("never-seen", 5000)
    p.expect("x", "a", 10)
    p.forget("x")
    p.completed("x", 5000)
    assert p.observed == 0 and p.predict("a", 10) == 256.0
    p.expect("y", "a", 10)
    p.completed("y", 100)
    p.completed("y", 100)  # a duplicate completion is ignored
    assert p.observed == 1


def test_open_requests_are_bounded():
    p = OutputPredictor()
    for i in range(MAX_OPEN + 10):
        p.expect(str(i), "a", 10)
    p.completed("0", 7)  # the oldest were dropped
    assert p.observed == 0
    p.completed(str(MAX_OPEN + 9), 7)
    assert p.observed == 1


def test_same_inputs_same_predictions():
    def run() -> list[float]:
        p = OutputPredictor()
        out = []
        for i in range(200):
            out.append(p.expect(str(i), f"t{i % 3}", 50 + 37 * i))
            if i % 2:
                p.completed(str(i - 1), 10 + (i * 13) % 500)
        return out

    assert run() == run()
