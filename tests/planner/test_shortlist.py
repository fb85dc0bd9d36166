"""Which colocated layouts the goodput phase simulates: the best by analytical cost per req/s, and the
one whose analytical fleet at the target rate costs least."""

from __future__ import annotations

from fleetwise.planner import fit, goodput, latency


def test_the_cheapest_fleet_at_a_low_rate_is_simulated_too(spec_factory):
    """Llama-3.1-70B at 0.2 req/s: every layout needs one serving replica and one spare, so the cheapest
    fleet is the smallest layout that meets the SLO (an H100 at fp8: 2 GPUs, $6/h), though per req/s it
    is the dearest; it is simulated beside the best per req/s (refine_top 1), and the rest say why not."""
    spec = spec_factory(model="llama-3.1-70b", weight_dtypes=["bf16", "fp8"], search={"refine_top": 1},
                        accelerators=[{"name": "h100-sxm", "price_per_hour_usd": 3.0},
                                      {"name": "h200-sxm", "price_per_hour_usd": 3.8}])
    search = fit.prepare(spec)
    latency.run(search)
    mixed = goodput._shortlists(search)["mixed"]
    assert [lay.label for lay in mixed] == ["h200-sxm fp8 TP=2 PP=1", "h100-sxm fp8 TP=1 PP=1"]
    sizing = goodput.analytical_sizing(search, search.estimates[mixed[1]])
    assert (sizing.serving, sizing.failures, sizing.upgrade) == (1, 1, 0)
    why = {r.candidate: r.reason for r in search.rejected}
    assert why["colocated h100-sxm fp8 TP=2 PP=1"] == (
        "not simulated: analytical cost $0.26/h per req/s is above the 1 best colocated layouts, and its fleet at "
        "the target rate ($12.00/h) is not the cheapest")
