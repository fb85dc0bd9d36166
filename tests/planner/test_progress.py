"""The planner's progress: one fraction per phase and per finished simulation task, rising to 1."""

from __future__ import annotations

import pytest

from fleetwise.planner.api import plan
from fleetwise.planner.executor import Executor
from fleetwise.planner.progress import PHASE_SHARES, PhaseMeter
from fleetwise.planner.state import PlanOptions


def _square(ctx: int, x: int) -> int:
    return ctx * x * x


def test_meter_advances_through_phase_shares_and_never_goes_back():
    got: list[float] = []
    m = PhaseMeter(got.append)
    m.phase("latency")
    m.phase("goodput")
    m.tasks(1, 4)
    m.tasks(4, 4)
    m.phase("refinement")
    m.tasks(1, 2)
    m.tasks(1, 1)  # a second batch of the same phase restarts its count: the fraction does not fall
    m.phase("disaggregation")
    m.finish()
    lat, gp, rf = PHASE_SHARES["latency"], PHASE_SHARES["goodput"], PHASE_SHARES["refinement"]
    assert got == pytest.approx([lat, lat + gp / 4, lat + gp, lat + gp + rf / 2, lat + gp + rf, 1.0])
    assert sum(PHASE_SHARES.values()) == pytest.approx(1.0)


def test_executor_tells_each_task_in_order_and_returns_results_unchanged():
    seen: list[tuple[int, int]] = []
    with Executor(1, on_task=lambda d, t: seen.append((d, t))) as ex:
        assert ex.map(_square, 2, [1, 2, 3]) == [2, 8, 18]
    assert seen == [(1, 3), (2, 3), (3, 3)]
    with Executor(2, on_task=lambda d, t: seen.append((d, t))) as ex:  # worker processes, same order
        assert ex.map(_square, 3, [1, 2]) == [3, 12]
    assert seen[3:] == [(1, 2), (2, 2)]


def test_a_plan_reports_rising_fractions_ending_at_one(spec_factory):
    got: list[float] = []
    spec = spec_factory(search={"refine_top": 2, "seeds": 1, "bisect_steps": 2, "sample_requests": 100})
    search = plan(spec, PlanOptions(workers=1, progress=got.append))
    assert not search.infeasible
    assert got[-1] == 1.0 and got == sorted(got) and len(set(got)) == len(got)
    # two colocated layouts are measured: the goodput phase is told half-way, between the phase marks
    lat, gp = PHASE_SHARES["latency"], PHASE_SHARES["goodput"]
    assert got[:3] == pytest.approx([lat, lat + gp / 2, lat + gp])
