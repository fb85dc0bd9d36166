"""The reconciling verdict sentence is generated from the plans' facts, one case per situation a
plan can be in: a colocated winner over demoted cheaper P/D plans (what rag-long-context-pd printed
before version-aware pairing), over dearer P/D plans, with no P/D plan meeting the SLO, and a P/D
winner with a layout per phase or with one layout sized off the equal-cost split."""

from __future__ import annotations

from fleetwise.planner.layout import Layout
from fleetwise.planner.ranking import verdict_sentence
from fleetwise.planner.results import Claims
from fleetwise.planner.simulate import FleetShape, PoolShape
from fleetwise.planner.state import Candidate

TP8, TP4, TP2 = (Layout("h200-sxm", "fp8", tp) for tp in (8, 4, 2))


def colo(cost: float) -> Candidate:
    return Candidate(f"colocated {TP8.label}", "colocated", FleetShape((PoolShape("mixed", TP8, 7),)), {}, [], cost)


def split(pl: Layout, dl: Layout, p: int, d: int, cost: float, failed: str | None = None) -> Candidate:
    c = Candidate(f"disaggregated P[{pl.label}] D[{dl.label}]", "disaggregated",
                  FleetShape((PoolShape("prefill", pl, p), PoolShape("decode", dl, d))), {}, [], cost)
    if failed:
        c.claims = Claims([{"claim": failed, "holds": False, "evidence": "", "short_by": "attainment 78.2% is 11.8 "
                            "points under the 90% required"}], 1)
    return c


def test_colocated_winner_names_the_claim_that_demoted_each_cheaper_split():
    demoted = split(TP4, TP4, 3, 2, 76.0, "service survives a rolling upgrade of both pools")
    s = verdict_sentence([colo(212.8), demoted], [4, 3])
    assert s.startswith("the cheapest plan meeting the SLO is colocated (colocated h200-sxm fp8 TP=8 PP=1, $212.80/h)")
    assert "; the cheaper P/D plans were demoted: disaggregated P[h200-sxm fp8 TP=4 PP=1] D[h200-sxm fp8 TP=4 " \
           "PP=1] ($76.00/h) demoted: claim(s) failed in simulation: service survives a rolling upgrade of both " \
           "pools (attainment 78.2% is 11.8 points under the 90% required)" in s
    assert "different layout per phase" not in s


def test_colocated_winner_over_dearer_or_absent_splits():
    s = verdict_sentence([colo(100.0), split(TP4, TP4, 3, 2, 130.0)], [4, 3])
    assert s.endswith("; the cheapest P/D plan meeting the SLO, disaggregated P[h200-sxm fp8 TP=4 PP=1] "
                      "D[h200-sxm fp8 TP=4 PP=1], costs $130.00/h")
    assert verdict_sentence([colo(100.0)], None).endswith("; no P/D plan met the SLO in simulation")


def test_split_winner_says_what_differs_from_the_equal_cost_split():
    s = verdict_sentence([split(TP2, TP4, 5, 1, 76.0), colo(212.8)], [4, 3])
    assert s.endswith("which uses a different layout per phase (prefill h200-sxm fp8 TP=2 PP=1, decode h200-sxm "
                      "fp8 TP=4 PP=1)")
    s = verdict_sentence([split(TP4, TP4, 3, 2, 76.0), colo(212.8)], [4, 3])
    assert s.endswith(", sized P:D 3:2 for the target rate rather than the 4:3 split of the colocated fleet")
    assert "different layout" not in s
