"""The checks phase simulates headroom terms and claims only for plans that can still be reported:
the pruned search must give the full search's answer, and skip only plans the full search did
not report."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleetwise.planner import checks, disaggregation, fit, goodput, latency, ranking, refinement, sizing
from fleetwise.planner.executor import Executor
from fleetwise.planner.report import to_json
from fleetwise.planner.state import Search
from fleetwise.spec.planning import planning_spec_from_dict

SPEC: dict[str, Any] = {
    "name": "checks-8b", "model": "llama-3.1-8b", "accelerators": [{"name": "h200-sxm"}],
    "workload": {"rate_rps": 2, "prompt_tokens": {"kind": "uniform", "min_tokens": 3000, "max_tokens": 6000},
                 "output_tokens": {"kind": "uniform", "min_tokens": 400, "max_tokens": 800}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9},
    "weight_dtypes": ["bf16"],
    "headroom": {"failures_to_survive": 1, "upgrade_batch_replicas": 0, "burst_factor": 1.0, "cold_start_s": 10.0},
    "search": {"max_gpus": 6, "top_k": 1, "refine_top": 2, "seeds": 1, "sample_requests": 50,
               "disaggregation": "auto", "bisect_steps": 2},
}


def _check_everything(cands: list[Any], key: Any, k: int, checked: set[str]) -> list[Any]:
    """The full search: every plan that met the SLO is checked, whatever its bound."""
    return [c for c in cands if c.key not in checked]


def _refined(doc: dict[str, Any]) -> Search:
    """The search up to refinement (`api.plan`'s phases before the checks)."""
    spec = planning_spec_from_dict(doc)
    search = fit.prepare(spec)
    search.top_k = spec.search.top_k
    latency.run(search)
    with Executor(1) as ex:
        goodput.run(search, ex)
        sizing.run(search)
        refinement.run(search, ex)
    return search


def _finish(search: Search, workers: int = 1) -> Search:
    """`api.plan`'s phases from the checks on."""
    with Executor(workers) as ex:
        checks.run(search, ex)
        disaggregation.run(search, ex)
    ranking.run(search)
    return search


@pytest.fixture(scope="module")
def refined() -> Search:
    return _refined(SPEC)


@pytest.mark.slow
def test_pruned_checks_give_the_full_search_answer(refined: Search, monkeypatch: pytest.MonkeyPatch) -> None:
    pruned = _finish(copy.deepcopy(refined))
    with monkeypatch.context() as m:
        m.setattr(checks, "undecided", _check_everything)
        full = _finish(copy.deepcopy(refined))
    a, b = to_json(pruned), to_json(full)
    assert a["plans"] == b["plans"] and a["fleet"] == b["fleet"]
    assert a["disaggregation"] == b["disaggregation"]
    assert not full.unchecked and pruned.unchecked, "the spec must leave some plan unchecked"
    assert pruned.simulations < full.simulations
    full_rank = {c["candidate"]: c["rank"] for c in b["candidates"]}
    for c in a["candidates"]:
        if c["verdict"] == "not_checked":  # skipped only where the full search did not report it
            assert full_rank[c["candidate"]] is None or full_rank[c["candidate"]] > refined.top_k
        elif c["rank"] is not None:  # an exact rank is the full search's rank
            assert c["rank"] == full_rank[c["candidate"]]


@pytest.mark.slow
def test_runs_simulated_ahead_in_workers_give_the_same_checks(refined: Search,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetwise.planner import simulate

    one = _finish(copy.deepcopy(refined))
    simulate._memo.clear()  # the checks must find the workers' verdicts under run_fleet's own keys
    here: list[object] = []
    real = simulate.simulate_fleet
    monkeypatch.setattr(simulate, "simulate_fleet", lambda *a, **k: here.append(a) or real(*a, **k))
    two = _finish(copy.deepcopy(refined), workers=2)
    assert to_json(one) | {"search": None} == to_json(two) | {"search": None}
    assert one.simulations == two.simulations
    added = any(h.added for c in two.refined if c.refined for h in c.refined.headroom)
    assert here == [] or added, "a run simulated ahead was not found in the memo"
