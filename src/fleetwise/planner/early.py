"""Runs stopped as soon as their verdict is certain, for callers that need only pass or fail.

Owns `VerdictWatch`, which wraps a run's routing policy (the policy still hears every event and
decides every route) and ends the simulation by raising `CertainMiss` once so many requests
cannot meet the SLO that the attainment cannot reach the SLO's, or `CertainPass` once so many
have met it that neither the attainment nor an SLO percentile can fall short whatever the
requests still running do; and the counts behind both (`allowed_misses`, `needed_for_percentile`).
`simulate.passes` runs the goodput bisection's runs through it. Figures a plan reports never come
from a stopped run. Does not simulate.
"""

from __future__ import annotations

import math
from types import BuiltinMethodType, MethodType
from typing import Any

from fleetwise.core.feedback import Completed, FirstToken

KEEP_UP_BACKLOG = 0.1
"""Most growth of a run's backlog (requests arrived with no first token yet) from the middle of its
arrivals to the last one, as a share of the arrivals in between, for the run to pass. A fleet whose
backlog grows faster serves under 1/1.1 of its arrival rate: its TTFT grows without bound, however
loose the TTFT target is against the run's span (at 300 s, a one-minute run of a replica offered
twice what it serves still has every TTFT under the target: `tests/planner/test_keep_up.py`). A
tight target already fails such a run (a tenth of half a one-minute run is 3 s of wait added by
its end), so this judges the runs a loose TTFT target cannot; a fleet that keeps up grows its
backlog by about nothing (1% in that test at half the load)."""


def backlog_growth(arrival: Any, first_token: Any) -> float:
    """Growth of the backlog (arrived, no first token yet) from the middle of the arrivals to the
    last arrival, as a share of the arrivals after the middle (0.0 when none; arrays of seconds,
    a request with no first token NaN or inf)."""
    import numpy as np

    arrival, first = np.asarray(arrival, dtype=float), np.asarray(first_token, dtype=float)
    if arrival.size < 2:
        return 0.0
    end = float(arrival.max())
    mid = (float(arrival.min()) + end) / 2
    first = np.where(np.isnan(first), np.inf, first)
    later = int((arrival > mid).sum())
    if later == 0:
        return 0.0
    growth = (arrival.size - int((first <= end).sum())) - (int((arrival <= mid).sum()) - int((first <= mid).sum()))
    return max(0.0, growth / later)


class CertainMiss(Exception):
    """Enough requests have missed that the run's attainment cannot reach the SLO's."""


class CertainPass(Exception):
    """Enough requests have met the SLO that the run passes whatever the rest do."""


def _attains(met: int, n: int, attainment: float) -> bool:
    """The simulator summary's attainment test: met / n rounded to 9 decimals (`sim.results._r`)."""
    return round(met / n, 9) >= attainment


def allowed_misses(n: int, attainment: float) -> int:
    """Most requests of `n` that may miss while the attainment (met / n, as the simulator's summary
    rounds it) still reaches `attainment`; -1 when even none missing falls short."""
    m = max(0, min(n, math.floor(n * (1.0 - attainment))))
    while m < n and _attains(n - m - 1, n, attainment):
        m += 1
    while m >= 0 and not _attains(n - m, n, attainment):
        m -= 1
    return m


def needed_for_percentile(n: int, percentile: float) -> int:
    """Values at or under a target, among at most `n`, that keep the `percentile`-th percentile
    (numpy's linear interpolation, as `sim.results.pct` takes it) at or under the target however
    large the others are: the sorted values at ranks floor(h) and ceil(h), h = p/100 x (m - 1),
    are both good once ceil(h) + 1 are; h grows with m, so m = n is the worst case. One more is
    asked than that, so h's floating-point rounding can never make the answer wrong."""
    return math.floor(percentile / 100.0 * (n - 1)) + 2


MISS_MARGIN = 1e-9
"""Relative margin around a target: a figure counts as a miss only above target x (1 + margin)
and as met only under target x (1 - margin), so a figure equal to the target up to rounding is
never counted either way (the watch may stop later, never wrongly)."""


class VerdictWatch:
    """The run's routing policy, unchanged, with counts of the requests whose outcome is settled.

    A request misses for certain when its first token comes after the TTFT target (the
    simulator's TTFT adds only a network delay to the feedback's) or when it finishes with a time
    per output token over the TPOT target (the feedback's is the simulator's formula). It meets
    the SLO for certain when it finishes with both under their targets, less `network_s` for TTFT
    (a request of one output token has no TPOT: the simulator leaves it out of the TPOT
    percentile and counts it as meeting that target). More than `allowed`
    misses raise `CertainMiss`; `CertainPass` is raised once the met requests reach the attainment
    and, for each watched target, `needed_for_percentile` finished requests are under it. A target
    of None is not watched.

    With `arrivals` (each request's arrival, seconds), the run must also keep up with them
    (`backlog_growth` at most `KEEP_UP_BACKLOG`, as `simulate._judge` requires): a pass is certain
    only once every request has its first token and the backlog held, and a miss once every
    request has one and it did not.

    A request still waiting past its TTFT target is not counted until its first token: the
    simulator reports a first token at the end of the engine step that produced it, stamped with
    the token's own time, so a later event does not prove the token is not already made.

    It hears every feedback and stands in front of every routing decision of the bisection's
    runs, so both are kept cheap: the policy's methods are looked up once (`__getattr__` keeps
    each bound method it hands out) and `observe` does a few dict and set operations per event.
    """

    def __init__(self, policy: Any, ttft_s: float | None, tpot_s: float | None, n: int, attainment: float,
                 percentile: float, network_s: float = 0.0, arrivals: dict[str, float] | None = None) -> None:
        self._policy = policy
        self._policy_observe = policy.observe
        self._allowed = allowed_misses(n, attainment)
        self._ttft_late = ttft_s * (1 + MISS_MARGIN) if ttft_s is not None else math.inf
        self._tpot_late = tpot_s * (1 + MISS_MARGIN) if tpot_s is not None else math.inf
        self._ttft_ok = (ttft_s * (1 - MISS_MARGIN) - network_s) if ttft_s is not None else math.inf
        self._tpot_ok = tpot_s * (1 - MISS_MARGIN) if tpot_s is not None else math.inf
        self._ttft_watch, self._tpot_watch = ttft_s is not None, tpot_s is not None
        self._met_needed = n - self._allowed
        self._pct_needed = needed_for_percentile(n, percentile)
        self._missed: set[str] = set()
        self._first: dict[str, float] = {}
        """The largest TTFT seen per request."""
        self._done: set[str] = set()
        self._met = self._ttft_good = self._tpot_good = 0
        self._arrivals = arrivals
        self._kept_up: bool | None = None if arrivals is not None else True

    def observe(self, fb: Any) -> None:
        self._policy_observe(fb)
        kind = type(fb)  # the feedback classes are final: an identity test, cheaper than isinstance
        if kind is FirstToken:
            rid, ttft = fb.request_id, fb.ttft_s
            first = self._first
            prev = first.get(rid, 0.0)
            first[rid] = ttft if ttft > prev else prev
            if ttft > self._ttft_late:
                self._miss(rid)
        elif kind is Completed:
            self._completed(fb)

    def _completed(self, fb: Any) -> None:
        rid, tpot = fb.request_id, fb.tpot_s
        if tpot > self._tpot_late:
            self._miss(rid)
            return
        done = self._done
        if rid in done:
            return
        done.add(rid)
        ttft_ok = self._first.get(rid, math.inf) <= self._ttft_ok
        tpot_ok = tpot <= self._tpot_ok
        self._ttft_good += ttft_ok
        self._tpot_good += tpot_ok and fb.output_tokens > 1
        if rid not in self._missed and (ttft_ok or not self._ttft_watch) and (tpot_ok or not self._tpot_watch):
            self._met += 1
        if (self._met >= self._met_needed
                and (not self._ttft_watch or self._ttft_good >= self._pct_needed)
                and (not self._tpot_watch or self._tpot_good >= self._pct_needed)
                and self._keeps_up()):
            raise CertainPass

    def _keeps_up(self) -> bool:
        """Whether the run kept up with its arrivals; False until every request has a first token
        (then a backlog that grew too much is a certain miss)."""
        if self._kept_up is None:
            arr = self._arrivals
            assert arr is not None
            if len(self._first) < len(arr):
                return False
            ids = list(arr)
            self._kept_up = backlog_growth([arr[i] for i in ids],
                                           [arr[i] + self._first[i] for i in ids]) <= KEEP_UP_BACKLOG
            if not self._kept_up:
                raise CertainMiss
        return self._kept_up

    def _miss(self, rid: str) -> None:
        if rid not in self._missed:
            self._missed.add(rid)
            if len(self._missed) > self._allowed:
                raise CertainMiss

    def __getattr__(self, name: str) -> Any:
        """The policy's attribute; a method is kept on the watch, so the next lookup is direct."""
        value = getattr(self._policy, name)
        if isinstance(value, (MethodType, BuiltinMethodType)):  # interpreted or compiled class's
            setattr(self, name, value)
        return value
