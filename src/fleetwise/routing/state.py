"""What a policy learns between fleet views: its own in-flight requests and latency feedback.

`InFlight` remembers every request the policy dispatched until it completes or fails, so work
sent after a worker's view was taken (`dispatch_s >= reported_at_s`) is added to that view's
load: a stale or lagged view does not herd every request onto the worker that looked idle.

`LatencyFeedback` keeps per-worker EWMAs of TTFT against what the request should have cost, of
TPOT and of failures, and turns them into a slowness factor relative to the fleet (1 = average).
A worker that slows down gets a factor > 1 (its predicted cost rises, it receives less); the
factor decays back towards 1 without new observations, so a recovered worker gets traffic back.

What a request should have cost: the fleet's TTFT per predicted token for requests of the same
size (`_SizeClasses`). TTFT is not proportional to predicted work: an engine step, the network
and the scheduler add a fixed part, so a small request (a prefix hit, whose uncached prompt is
short) takes more seconds per token than a large one on the same engine. Divided by the work
alone, the workers that get the prefix hits read as slow and lose them; compared with requests
of their own size, they read as what they are.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from dataclasses import dataclass

from fleetwise.routing import kernels
from fleetwise.spec.routing import FeedbackParams

__all__ = ["InFlight", "LatencyFeedback", "Pending", "RecentPicks", "pick_work"]

MAX_TRACKED = 1 << 17
"""In-flight entries kept at most (the oldest are dropped: a driver that never reports back)."""
CHANGE_LOG_MAX = 1 << 12
"""Changed-worker log entries kept (`InFlight.changes_since`); the older half is dropped past it."""
EXACT_FLOAT_INT = 1 << 53
"""Integers below this are exact in an IEEE-754 double (53-bit significand): a sum of terms that
are all multiples of 1/den stays exact while its total, counted in 1/den units, is below it."""


@dataclass(slots=True, init=False)
class Pending:
    """One dispatched request as the router estimated it."""

    request_id: str
    worker: str
    prefill_worker: str | None
    dispatch_s: float
    prefill_tokens: int
    """Uncached prompt tokens still to prefill (0 once the first token arrived)."""
    decode_tokens: int
    """Expected decode tokens (max_output)."""
    predicted_cost: float
    """Token-equivalent work ahead of and including this request at dispatch (no slowness)."""

    def __init__(self, request_id: str, worker: str, prefill_worker: str | None, dispatch_s: float,
                 prefill_tokens: int, decode_tokens: int, predicted_cost: float) -> None:
        self.request_id, self.worker, self.prefill_worker, self.dispatch_s = request_id, worker, prefill_worker, dispatch_s
        self.prefill_tokens, self.decode_tokens, self.predicted_cost = prefill_tokens, decode_tokens, predicted_cost


_NONE: dict[str, Pending] = {}
"""An empty per-worker map to read from (never written)."""


def _per_worker(maps: dict[str, dict[str, Pending]], worker: str) -> dict[str, Pending]:
    """`worker`'s map in `maps`, created on first use."""
    m = maps.get(worker)
    if m is None:
        m = maps[worker] = {}
    return m


def _drop(maps: dict[str, dict[str, Pending]], worker: str, request_id: str) -> bool:
    """Remove `request_id` from `worker`'s map; whether it was there."""
    m = maps.get(worker)
    return m is not None and m.pop(request_id, None) is not None


class InFlight:
    """Requests dispatched and not yet completed, by request id and per worker, in dispatch order.

    Route calls arrive in time order, so each per-worker map is ordered by `dispatch_s` and
    `since()` walks back from the newest entry only as far as the view's age.
    """

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, Pending] = OrderedDict()
        """Every entry by request id, in dispatch order: an `OrderedDict`, whose oldest entry is
        found in O(1) when `MAX_TRACKED` evicts (a plain dict's first live entry is found by
        scanning past the slots its deletions left, quadratic while an overloaded fleet keeps
        evicting). The per-worker maps below are plain dicts (mypyc compiles their reads and writes
        natively, an `OrderedDict`'s as generic calls): they are read by key and from the newest end."""
        self._serving: dict[str, dict[str, Pending]] = {}
        self._prefilling: dict[str, dict[str, Pending]] = {}
        self._version: dict[str, int] = {}
        self._log: list[str] = []
        """Workers in the order their entries changed (`changes_since`); `_log_base` is the
        position of its first element since the ledger began."""
        self._log_base = 0
        """Bumped per worker whenever its entries change (keys the `since` memo)."""
        self._since: dict[str, tuple[float, int, float, tuple[int, float]]] = {}
        self._sums: dict[str, list[int]] = {}
        """Per worker, kept as entries come and go: [requests, expected decode tokens of those it
        serves, prompt tokens it still carries]; `outstanding` reads them in O(1)."""
        self._ratios: dict[float, tuple[int, int]] = {}
        self._latest: dict[str, float] = {}
        """Per worker, the latest `dispatch_s` of any entry it was given (serving or prefilling):
        `since` a later time finds none of its entries without walking them."""

    def _sum(self, worker: str, n: int, decode: int, prefill: int) -> None:
        s = self._sums.get(worker)
        if s is None:
            s = self._sums[worker] = [0, 0, 0]
        s[0] += n
        s[1] += decode
        s[2] += prefill

    def _account(self, p: Pending, sign: int) -> None:
        """Add (`sign` 1) or remove (-1) `p`'s share of the per-worker sums."""
        colocated = p.prefill_worker is None
        self._sum(p.worker, sign, sign * p.decode_tokens, sign * p.prefill_tokens if colocated else 0)
        if not colocated:
            self._sum(p.prefill_worker, sign, 0, sign * p.prefill_tokens)  # type: ignore[arg-type]

    def _touch(self, p: Pending) -> None:
        v, log = self._version, self._log
        v[p.worker] = v.get(p.worker, 0) + 1
        log.append(p.worker)
        if p.prefill_worker is not None:
            v[p.prefill_worker] = v.get(p.prefill_worker, 0) + 1
            log.append(p.prefill_worker)
        if len(log) > CHANGE_LOG_MAX:
            half = len(log) // 2
            del log[:half]
            self._log_base += half

    def changes_since(self, mark: int) -> tuple[list[str] | None, int]:
        """Workers whose entries changed since `mark` (a position an earlier call returned; 0 at
        first), with repeats, and the position to pass next time. None: the log no longer
        reaches back that far (the caller must treat every worker as changed)."""
        end = self._log_base + len(self._log)
        if mark < self._log_base:
            return None, end
        return self._log[mark - self._log_base:], end

    def add(self, p: Pending) -> None:
        self.pop(p.request_id)
        self._by_id[p.request_id] = p
        _per_worker(self._serving, p.worker)[p.request_id] = p
        if p.prefill_worker is not None:
            _per_worker(self._prefilling, p.prefill_worker)[p.request_id] = p
        self._account(p, 1)
        self._touch(p)
        latest, t = self._latest, p.dispatch_s
        if not latest.get(p.worker, -math.inf) >= t:
            latest[p.worker] = t
        if p.prefill_worker is not None and not latest.get(p.prefill_worker, -math.inf) >= t:
            latest[p.prefill_worker] = t
        while len(self._by_id) > MAX_TRACKED:
            self.pop(next(iter(self._by_id)))

    def get(self, request_id: str) -> Pending | None:
        return self._by_id.get(request_id)

    def prefill_done(self, request_id: str) -> None:
        """The first token arrived: the prompt no longer weighs on any worker."""
        p = self._by_id.get(request_id)
        if p is not None:
            if p.prefill_worker is None:
                self._sum(p.worker, 0, 0, -p.prefill_tokens)
            elif _drop(self._prefilling, p.prefill_worker, request_id):
                self._sum(p.prefill_worker, -1, 0, -p.prefill_tokens)
            p.prefill_tokens = 0
            self._touch(p)

    def pop(self, request_id: str) -> Pending | None:
        p = self._by_id.pop(request_id, None)
        if p is not None:
            self._touch(p)
            _drop(self._serving, p.worker, request_id)
            self._sum(p.worker, -1, -p.decode_tokens, -p.prefill_tokens if p.prefill_worker is None else 0)
            if p.prefill_worker is not None and _drop(self._prefilling, p.prefill_worker, request_id):
                self._sum(p.prefill_worker, -1, 0, -p.prefill_tokens)
        return p

    def __len__(self) -> int:
        return len(self._by_id)

    def since(self, worker: str, since_s: float, decode_weight: float) -> tuple[int, float]:
        """(requests, token-equivalent work) dispatched to `worker` at or after `since_s`.

        A prefill worker carries its requests' prompt tokens until the first token; the decode
        (or mixed) worker carries the expected decode tokens until completion, and a mixed
        worker also the prompt until the first token. Memoised per worker until its entries
        change (a router asks for every worker on every request, against the same view), and
        (0, 0.0) at once when no entry it was ever given is that recent (`_latest`).
        """
        if self._latest.get(worker, -math.inf) < since_s:  # the walk would stop at its newest entry
            return 0, 0.0
        ver = self._version.get(worker, 0)
        hit = self._since.get(worker)
        if hit is not None and hit[0] == since_s and hit[1] == ver and hit[2] == decode_weight:
            return hit[3]
        out = self._since_walk(worker, since_s, decode_weight)
        self._since[worker] = (since_s, ver, decode_weight, out)
        return out

    def outstanding(self, worker: str, decode_weight: float) -> tuple[int, float]:
        """(requests, token-equivalent work) of every request on `worker` the ledger still holds:
        the fallback for a view without token backlogs.

        Read in O(1) from the per-worker sums; the same float as `outstanding_walk` whenever that
        walk's arithmetic is exact: `decode_weight = num/den` (a binary fraction) makes every term
        a multiple of 1/den, and while the total in 1/den units stays below `EXACT_FLOAT_INT`
        every partial sum is exact, in any order. Otherwise (never with the presets' weights) it
        walks."""
        s = self._sums.get(worker)
        if s is None:
            return self.outstanding_walk(worker, decode_weight)
        ratio = self._ratios.get(decode_weight)
        if ratio is None:
            ratio = self._ratios[decode_weight] = (
                float(decode_weight).as_integer_ratio() if math.isfinite(decode_weight) else (0, 0))
        num, den = ratio
        units = num * s[1] + den * s[2]
        if den and units < EXACT_FLOAT_INT:
            return s[0], units / den
        return self.outstanding_walk(worker, decode_weight)

    def outstanding_walk(self, worker: str, decode_weight: float) -> tuple[int, float]:
        """`outstanding` by walking every entry (in dispatch order, newest first)."""
        return self._since_walk(worker, -math.inf, decode_weight)

    def _since_walk(self, worker: str, since_s: float, decode_weight: float) -> tuple[int, float]:
        n, tokens = 0, 0.0
        for p in reversed(self._serving.get(worker, _NONE).values()):
            if p.dispatch_s < since_s:
                break
            n += 1
            tokens += decode_weight * p.decode_tokens
            if p.prefill_worker is None:
                tokens += p.prefill_tokens
        for p in reversed(self._prefilling.get(worker, _NONE).values()):
            if p.dispatch_s < since_s:
                break
            n += 1
            tokens += p.prefill_tokens
        return n, tokens


@dataclass(slots=True)
class _Ewma:
    value: float = 0.0
    n: int = 0

    def add(self, x: float, alpha: float) -> None:
        self.value = x if self.n == 0 else (1 - alpha) * self.value + alpha * x
        self.n += 1


TTFT_SIZE_CLASSES_PER_OCTAVE = 2
"""Size classes of predicted cost per doubling (`_SizeClasses`): requests within a factor of
sqrt(2) of each other are compared, so a fixed part of TTFT skews a comparison by at most that."""


class _SizeClasses:
    """Per size class of predicted cost (`TTFT_SIZE_CLASSES_PER_OCTAVE` per doubling), each
    worker's EWMA of TTFT per predicted token. The class's reference is the median over the
    workers with `min_samples` there (at least two: one worker alone is compared with nobody);
    a request in a class without one uses the nearest class that has one (the smaller first).
    Each class keeps its eligible workers' values sorted, so an observation updates the median
    in O(log workers) comparisons (tests/routing recompute it from the EWMAs)."""

    def __init__(self, params: FeedbackParams) -> None:
        self.p = params
        self._need: int = params.min_samples
        self._ewma: dict[int, dict[str, _Ewma]] = {}
        self._sorted: dict[int, list[float]] = {}
        """Per class, the values of the workers with `min_samples` there, ascending."""
        self._lo, self._hi = 0, -1
        """The smallest and largest class seen (none while `_lo > _hi`)."""

    @staticmethod
    def size_class(cost: float) -> int:
        """The class of a predicted cost (tokens, >= 1)."""
        return int(TTFT_SIZE_CLASSES_PER_OCTAVE * math.log2(cost))

    def reference(self, k: int) -> float | None:
        """Class `k`'s reference (None: fewer than two workers with enough samples there)."""
        vals = self._sorted.get(k)
        if vals is None or len(vals) < 2:
            return None
        mid = len(vals) // 2
        ref = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
        return ref if ref > 0 else None

    def expected_per_token(self, k: int) -> float | None:
        """The fleet's TTFT per token for requests of class `k` (None: no reference yet)."""
        ref = self.reference(k)
        if ref is not None:
            return ref
        for d in range(1, max(k - self._lo, self._hi - k) + 1):
            for j in (k - d, k + d):
                ref = self.reference(j)
                if ref is not None:
                    return ref
        return None

    def add(self, worker: str, k: int, per_token: float, alpha: float) -> None:
        """One observation of `worker` in class `k`."""
        m = self._ewma.get(k)
        if m is None:
            m = self._ewma[k] = {}
            self._sorted[k] = []
            self._lo, self._hi = (k, k) if self._lo > self._hi else (min(self._lo, k), max(self._hi, k))
        e = m.get(worker)
        if e is None:
            e = m[worker] = _Ewma()
        vals, need = self._sorted[k], self._need
        if e.n >= need:
            del vals[bisect_left(vals, e.value)]
        e.add(per_token, alpha)
        if e.n >= need:
            insort(vals, e.value)

    def forget(self, worker: str) -> None:
        for k, m in self._ewma.items():
            e = m.pop(worker, None)
            if e is not None and e.n >= self.p.min_samples:
                vals = self._sorted[k]
                del vals[bisect_left(vals, e.value)]


@dataclass(slots=True)
class _WorkerStats:
    ttft_ratio: _Ewma
    """TTFT over what the fleet takes for requests of the same size (`_SizeClasses`)."""
    tpot: _Ewma
    failures: _Ewma
    last_obs_s: float = 0.0


@dataclass(slots=True)
class _Terms:
    """Per-worker constants of `LatencyFeedback.factors` between observations (a dataclass, which
    mypyc makes a native class: a `NamedTuple` is built by its interpreted `__new__`)."""

    ttft: tuple[float, float] | None
    """(fleet median, EWMA - median) of the TTFT ratio, or None when undefined."""
    tpot: tuple[float, float] | None
    last_obs_s: float
    failure_factor: float | None
    """`1 + failure_penalty * failure EWMA`, or None without failure observations."""


class _TermLists:
    """The `_Terms` of a list of workers as the lists `kernels.slowness` reads, one element per
    worker (never observed: no term, failure factor 1, and `seen` False: its factor is 1,
    unclamped); `set` replaces one worker's."""

    def __init__(self, workers: list[str], terms: list[_Terms | None], medians: tuple[object, ...]) -> None:
        self.workers = workers
        self.pos = {w: i for i, w in enumerate(workers)}
        self.medians = medians
        """The fleet medians the terms were computed against (`LatencyFeedback._medians`)."""
        n = len(terms)
        self.last_obs, self.failure = [0.0] * n, [1.0] * n
        self.has1, self.ref1, self.dev1 = [False] * n, [1.0] * n, [0.0] * n
        self.has2, self.ref2, self.dev2 = [False] * n, [1.0] * n, [0.0] * n
        self.seen = [True] * n
        self.unseen = 0
        """How many `seen` are False."""
        for i, t in enumerate(terms):
            self.set(i, t)

    def set(self, i: int, t: _Terms | None) -> None:
        """Worker `i`'s terms (an absent ratio: `has` False; 1, the identity of `*`, without failures)."""
        seen = t is not None
        if seen != self.seen[i]:
            self.unseen += -1 if seen else 1
            self.seen[i] = seen
        self.last_obs[i] = t.last_obs_s if t is not None else 0.0
        ttft, tpot = (t.ttft, t.tpot) if t is not None else (None, None)
        self.has1[i] = ttft is not None
        self.ref1[i], self.dev1[i] = ttft if ttft is not None else (1.0, 0.0)
        self.has2[i] = tpot is not None
        self.ref2[i], self.dev2[i] = tpot if tpot is not None else (1.0, 0.0)
        self.failure[i] = t.failure_factor if t is not None and t.failure_factor is not None else 1.0


class LatencyFeedback:
    """Per-worker latency EWMAs -> slowness factor relative to the fleet."""

    def __init__(self, params: FeedbackParams) -> None:
        self.p = params
        self._on: bool = params.enabled
        self._need: int = params.min_samples
        self._alpha: float = params.alpha
        self._failure_penalty: float = params.failure_penalty
        self._kernel_args: tuple[float, float, float, float] = (
            params.half_life_s, params.min_factor, params.max_factor, params.deadband)
        """What `kernels.slowness` reads of `p` per decision, as plain values (a pydantic field read
        costs some 200 instructions even from compiled code)."""
        self._w: dict[str, _WorkerStats] = {}
        self._sizes = _SizeClasses(params)
        self._sorted: dict[str, list[float]] = {"ttft_ratio": [], "tpot": []}
        """Per ratio EWMA, the values of the workers with `min_samples` of it, ascending (kept per
        observation in O(log workers) comparisons: the fleet median is read, not sorted, per decision)."""
        self._lists: _TermLists | None = None
        """The terms of the workers last asked for, brought up to date per observation."""
        self._dirty: set[str] = set()
        """Workers observed (or forgotten) since `_lists` was brought up to date."""

    def _stats(self, worker: str) -> _WorkerStats:
        self._dirty.add(worker)
        s = self._w.get(worker)
        if s is None:
            s = self._w[worker] = _WorkerStats(_Ewma(), _Ewma(), _Ewma())
        return s

    def first_token(self, worker: str, ttft_s: float, predicted_cost: float, now_s: float) -> None:
        """A TTFT of `ttft_s` seconds for `predicted_cost` tokens of work (ahead and its own), against
        the fleet's TTFT per token at that size; with no reference yet it counts as normal (1)."""
        s = self._stats(worker)
        cost = max(predicted_cost, 1.0)
        per_token = max(ttft_s, 0.0) / cost
        k = self._sizes.size_class(cost)
        ref = self._sizes.expected_per_token(k)
        self._observe(s.ttft_ratio, "ttft_ratio", per_token / ref if ref is not None else 1.0)
        self._sizes.add(worker, k, per_token, self._alpha)
        s.last_obs_s = max(s.last_obs_s, now_s)

    def completed(self, worker: str, tpot_s: float, output_tokens: int, now_s: float) -> None:
        s = self._stats(worker)
        if output_tokens > 1 and tpot_s > 0:
            self._observe(s.tpot, "tpot", tpot_s)
        s.failures.add(0.0, self._alpha)
        s.last_obs_s = max(s.last_obs_s, now_s)

    def failed(self, worker: str, now_s: float) -> None:
        if not worker:  # rejected before any worker took it: says nothing of a worker
            return
        s = self._stats(worker)
        s.failures.add(1.0, self._alpha)
        s.last_obs_s = max(s.last_obs_s, now_s)

    def forget(self, worker: str) -> None:
        self._dirty.add(worker)
        s = self._w.pop(worker, None)
        if s is not None:
            for attr, e in (("ttft_ratio", s.ttft_ratio), ("tpot", s.tpot)):
                if e.n >= self.p.min_samples:
                    vals = self._sorted[attr]
                    del vals[bisect_left(vals, e.value)]
        self._sizes.forget(worker)

    def _observe(self, e: _Ewma, attr: str, x: float) -> None:
        """Add `x` to the ratio EWMA `e` (`attr`), keeping `_sorted[attr]` in step."""
        vals, need = self._sorted[attr], self._need
        if e.n >= need:
            del vals[bisect_left(vals, e.value)]
        e.add(x, self._alpha)
        if e.n >= need:
            insort(vals, e.value)

    def _reference(self, attr: str) -> tuple[int, float]:
        """(workers with enough samples, their median EWMA) for `attr`: O(1) from `_sorted`."""
        vals = self._sorted[attr]
        ref = 0.0
        if vals:
            mid = len(vals) // 2
            ref = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
        return len(vals), ref

    def _ratio_term(self, mine: _Ewma, attr: str) -> tuple[float, float] | None:
        """(fleet median, this worker's EWMA minus it) for `attr`, or None when the ratio is
        undefined (too few samples here or in the fleet, or a non-positive median). The ratio at
        age `a` is `(median + (EWMA - median) * 0.5 ** (a / half_life)) / median`: the median (not
        the mean) is the reference so one slow worker does not make every other worker look fast;
        decaying the value itself means a worker that stopped getting traffic drifts back to
        "normal" and is tried again, while the others stay at 1. `mine`: the worker's EWMA of `attr`."""
        if mine.n < self._need:
            return None
        count, ref = self._reference(attr)
        if count < 2 or ref <= 0:
            return None
        return ref, mine.value - ref

    def _worker_terms(self, worker: str) -> _Terms | None:
        """What `factors` needs of `worker` apart from the time (None: never observed)."""
        s = self._w.get(worker)
        if s is None:
            return None
        fail = 1.0 + self._failure_penalty * s.failures.value if s.failures.n else None
        return _Terms(self._ratio_term(s.ttft_ratio, "ttft_ratio"), self._ratio_term(s.tpot, "tpot"), s.last_obs_s, fail)

    def _medians(self) -> tuple[object, ...]:
        """What every worker's terms read of the fleet: the TTFT-ratio and TPOT medians (and counts)."""
        return self._reference("ttft_ratio"), self._reference("tpot")

    def factor(self, worker: str, now_s: float) -> float:
        """Slowness at `now_s` (1 = the fleet's median; within `deadband` of 1 it is exactly 1):
        `factors` of one worker."""
        if not self.p.enabled or worker not in self._w:
            return 1.0
        return self._factors(_TermLists([worker], [self._worker_terms(worker)], ()), now_s)[0]

    def factors(self, workers: list[str], now_s: float) -> list[float]:
        """Each of `workers`' slowness at `now_s` (a router's per-request pass over the fleet):
        the geometric mean of the age-decayed TTFT and TPOT ratios (`_ratio_term`; a ratio of 0 is
        left out), times the failure factor, clamped, exactly 1 within `deadband` of 1, by
        `kernels.slowness` over the per-worker constants (`_term_lists`)."""
        if not self._on:
            return [1.0] * len(workers)
        return self._factors(self._term_lists(workers), now_s)

    def _factors(self, a: _TermLists, now_s: float) -> list[float]:
        half_life, lo, hi, band = self._kernel_args
        f = kernels.slowness(now_s, half_life, a.last_obs, a.has1, a.ref1, a.dev1, a.has2, a.ref2, a.dev2,
                             a.failure, lo, hi, band)
        seen = a.seen  # an index loop: mypyc compiles `zip` natively only without `strict=True`
        return [f[i] if seen[i] else 1.0 for i in range(len(f))] if a.unseen else f

    def _term_lists(self, workers: list[str]) -> _TermLists:
        """The terms of `workers` as lists, kept between calls: an observation changes the
        observed worker's terms only, unless it moved a fleet median (then every worker's)."""
        a, medians = self._lists, self._medians()
        if a is None or (a.workers is not workers and a.workers != workers):
            self._dirty.clear()
            a = self._lists = _TermLists(workers, [self._worker_terms(w) for w in workers], medians)
            return a
        if a.medians != medians:  # every observed worker's ratio terms are read against the new medians
            self._remedian(a, medians)
        if self._dirty:
            pos = a.pos
            for w in self._dirty:
                i = pos.get(w)
                if i is not None:
                    a.set(i, self._worker_terms(w))
            self._dirty.clear()
        return a

    def _remedian(self, a: _TermLists, medians: tuple[object, ...]) -> None:
        """`a`'s ratio terms against new fleet medians (`_ratio_term` of each worker, inline:
        what else `_worker_terms` gives is unchanged for a worker not observed since)."""
        (c1, r1), (c2, r2) = self._reference("ttft_ratio"), self._reference("tpot")
        ok1, ok2, need, stats = c1 >= 2 and r1 > 0, c2 >= 2 and r2 > 0, self._need, self._w
        for i, w in enumerate(a.workers):
            s = stats.get(w)
            if s is None:
                continue
            e = s.ttft_ratio
            has = a.has1[i] = ok1 and e.n >= need
            a.ref1[i], a.dev1[i] = (r1, e.value - r1) if has else (1.0, 0.0)
            e = s.tpot
            has = a.has2[i] = ok2 and e.n >= need
            a.ref2[i], a.dev2[i] = (r2, e.value - r2) if has else (1.0, 0.0)
        a.medians = medians

    def snapshot(self, now_s: float) -> dict[str, float]:
        """Every known worker's current factor (for reports)."""
        return {w: round(self.factor(w, now_s), 4) for w in sorted(self._w)}


def pick_work(own: float) -> int:
    """A pick's work in the share check: its own predicted cost rounded to whole tokens, at least 1
    (whole tokens keep the window's running sums exact as picks enter and leave it)."""
    return max(1, round(own))


class RecentPicks:
    """Per pool (`mixed`, `prefill`, `decode`), the last `window` workers chosen with the work each
    took (its own predicted cost, in whole tokens, at least 1) and each worker's summed work among
    them (the load bound's share check)."""

    __slots__ = ("window", "picks", "counts")

    def __init__(self, window: int) -> None:
        self.window = max(1, window)
        self.picks: dict[str, deque[tuple[str, int]]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        """Per pool, each worker's work (tokens) in the window (a plain dict, which compiled code reads
        natively; a worker never picked has no entry: read with `.get(name, 0)`)."""

    def add(self, pool: str, name: str, work: int) -> tuple[str, int] | None:
        """Note `name` as chosen in `pool` for `work` tokens; returns the pick that fell out of the window."""
        dq = self.picks.get(pool)
        if dq is None:
            dq = self.picks[pool] = deque(maxlen=self.window)
            self.counts[pool] = {}
        counts = self.counts[pool]
        dropped = None
        if len(dq) == self.window:  # the deque's maxlen
            dropped = dq[0]
            counts[dropped[0]] -= dropped[1]  # about to fall out of the window
        dq.append((name, work))
        counts[name] = counts.get(name, 0) + work
        return dropped
