"""`generate(spec, seed)`: turn a `WorkloadSpec` into a sorted, deterministic list of `Request`s.

Owns drawing arrivals, lengths, sessions, shared prefixes, tenants and version pins, all as
numpy columns (one vectorised draw per quantity), and assigning chained block hashes. Does not
read trace formats (`fleetwise.workload.traces` does) nor know about engines or routing.

Randomness: one named stream per purpose (`workload.arrivals`, `workload.turns`,
`workload.think_time`, `workload.input_tokens`, `workload.output_tokens`, `workload.lengths`,
`workload.tenants`, `workload.tenant_prefix`, `workload.system_prompts`,
`workload.model_version`), so enabling one feature never shifts the numbers another draws.

Phases: (1) draw session starts from the arrival process; (2) expand sessions into turns with
their lengths and arrival times; (3) bound by `num_requests`/`duration_s`, drawing more sessions
if later sessions could still land inside the bound; (4) sort by arrival and assign block ids;
(5) build `Request`s.

Block ids (chained, Mooncake semantics, one per `hash_block_tokens` tokens, the last partial
block included): a shared prefix (system prompt or tenant prefix) of L tokens owns L // B ids
that every request using it starts with; the remaining full blocks get ids of the request's
session stream (system prompt + u1 + o1 + u2 + ...), so a later turn repeats the ids of the
earlier turn's full blocks; the trailing partial block gets an id of its own, because its
content differs from any other request's block at that position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.rng import RngStreams
from fleetwise.errors import SpecError
from fleetwise.spec.workload import GammaArrival, PoissonArrival, TraceArrival, WorkloadSpec
from fleetwise.workload.formats import get_format
from fleetwise.workload.parse import TraceTable
from fleetwise.workload.sample import draw_gaps, draw_request_lengths
from fleetwise.workload.traces import check_run_span, gc_paused, read_trace, replay_arrivals, to_requests

_MAX_GROWTH_ROUNDS = 10  # at most 1024x the first guess of sessions
SESSION_GUESS_MARGIN = 1.1
"""First guess of sessions for `num_requests`: 10% above requests / mean turns (turn counts vary)."""
SESSION_GUESS_SIGMAS = 6
"""First guess of arrivals in `duration_s`: the mean plus 6 standard deviations (cv * sqrt(mean)),
so the doubling retry is practically never needed."""
SESSION_GUESS_SLACK = 16
"""Sessions added to either guess, for small counts where the margins round to nothing."""


@dataclass(frozen=True, slots=True)
class _Sessions:
    """Per-session columns (a single-turn workload has one session per request)."""

    start_s: np.ndarray
    turns: np.ndarray
    tenant: np.ndarray  # index into spec.tenants (0 when there are none)
    group: np.ndarray  # shared-prefix group, -1 for none
    pinned: np.ndarray  # bool


@dataclass(frozen=True, slots=True)
class _Turns:
    """Per-request columns, in generation order (session-major)."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    session: np.ndarray


def generate(spec: WorkloadSpec, seed: int) -> list[Request]:
    """Requests sorted by arrival_s, request_id "0".."n-1"; the same (spec, seed) gives the same list.
    With `client_max_tokens`, every request carries that cap and its output is clipped to it."""
    reqs = check_run_span(_generate(spec, seed))
    cap = spec.client_max_tokens
    if cap is None:
        return reqs
    return [replace(r, output_tokens=min(r.output_tokens, cap), max_tokens=cap) for r in reqs]


def _generate(spec: WorkloadSpec, seed: int) -> list[Request]:
    if isinstance(spec.arrival, TraceArrival) and spec.trace_lengths:
        return _from_trace(spec, seed)
    return _synthetic(spec, seed)


# ---------------------------------------------------------------------------------------------
# Phase 1: session starts
# ---------------------------------------------------------------------------------------------


def _draw_starts(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """Arrival times of the first n sessions (first one after one inter-arrival gap from 0)."""
    a = spec.arrival
    assert isinstance(a, PoissonArrival | GammaArrival), f"not a synthetic arrival: {a.kind}"
    return np.cumsum(draw_gaps(a, a.rate_rps, rng, n))


def _initial_sessions(spec: WorkloadSpec) -> int:
    """A first guess of how many sessions cover the bound (grown later if short)."""
    turns = spec.prefix.sessions.mean_turns if spec.prefix.sessions else 1.0
    guesses = []
    if spec.num_requests is not None:
        guesses.append(spec.num_requests if turns == 1.0
                       else math.ceil(spec.num_requests / turns * SESSION_GUESS_MARGIN) + SESSION_GUESS_SLACK)
    if spec.duration_s is not None:
        rate = getattr(spec.arrival, "rate_rps", 1.0)
        cv = getattr(spec.arrival, "cv", 1.0)
        mean = rate * spec.duration_s
        guesses.append(math.ceil(mean + SESSION_GUESS_SIGMAS * cv * math.sqrt(mean) + SESSION_GUESS_SLACK))
    return max(1, min(guesses))


# ---------------------------------------------------------------------------------------------
# Phase 2: per-session attributes and turns
# ---------------------------------------------------------------------------------------------


def _draw_turns_per_session(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    s = spec.prefix.sessions
    if s is None:
        return np.ones(n, dtype=np.int64)
    if s.turns_distribution == "fixed":
        t = np.full(n, int(s.mean_turns), dtype=np.int64)
    else:
        t = rng.geometric(1.0 / s.mean_turns, size=n).astype(np.int64)
    return np.minimum(t, s.max_turns) if s.max_turns is not None else t


def prefix_groups(spec: WorkloadSpec) -> np.ndarray:
    """Tokens of each shared-prefix group: global system prompts first, then one per tenant."""
    sp = spec.prefix.system_prompts
    sys_tokens = [sp.tokens] * sp.count if sp is not None else []
    return np.array(sys_tokens + [t.prefix_tokens for t in spec.tenants], dtype=np.int64)


def _draw_groups(spec: WorkloadSpec, streams: RngStreams, tenant: np.ndarray) -> np.ndarray:
    """Shared-prefix group per session: the tenant's own prefix if it has one, else a system prompt."""
    n = len(tenant)
    group = np.full(n, -1, dtype=np.int64)
    sp = spec.prefix.system_prompts
    n_sys = sp.count if sp is not None else 0
    if sp is not None:
        rng = streams.get("workload.system_prompts")
        uses = rng.random(n) < sp.fraction
        weights = 1.0 / np.arange(1, sp.count + 1, dtype=np.float64) ** sp.zipf_s
        pick = rng.choice(sp.count, size=n, p=weights / weights.sum())
        group = np.where(uses, pick, -1)
    if any(t.prefix_tokens for t in spec.tenants):
        own_tokens = np.array([t.prefix_tokens for t in spec.tenants])[tenant]
        own_frac = np.array([t.prefix_fraction for t in spec.tenants])[tenant]
        uses_own = streams.get("workload.tenant_prefix").random(n) < own_frac
        own = own_tokens > 0
        group = np.where(own & uses_own, n_sys + tenant, np.where(own, -1, group))
    return group


def _draw_sessions(spec: WorkloadSpec, streams: RngStreams, starts: np.ndarray) -> _Sessions:
    n = len(starts)
    turns = _draw_turns_per_session(spec, streams.get("workload.turns"), n)
    tenant = np.zeros(n, dtype=np.int64)
    if spec.tenants:
        w = np.array([t.weight for t in spec.tenants], dtype=np.float64)
        tenant = streams.get("workload.tenants").choice(len(w), size=n, p=w / w.sum())
    pin = spec.model_version_pin
    pinned = np.zeros(n, dtype=bool)
    if pin is not None:
        pinned = streams.get("workload.model_version").random(n) < pin.fraction
    return _Sessions(starts, turns, tenant, _draw_groups(spec, streams, tenant), pinned)


def _with_none(per_group: np.ndarray) -> np.ndarray:
    """Append a 0 entry so that group -1 (no shared prefix) indexes it."""
    return np.concatenate([per_group, [0]]).astype(np.int64)


def _segment_starts(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _expand(spec: WorkloadSpec, streams: RngStreams, s: _Sessions) -> _Turns:
    """Turns of every session: arrival = start + think gaps; prompt = prefix + history + new user tokens."""
    n = int(s.turns.sum())
    session = np.repeat(np.arange(len(s.turns)), s.turns)
    first = _segment_starts(s.turns)
    u, o = draw_request_lengths(spec.lengths, streams, n)  # type: ignore[arg-type]  # synthetic: checked by the spec
    arrival = s.start_s[session]
    prefix = _with_none(prefix_groups(spec))[s.group]  # group -1 -> the appended 0
    prompt = prefix[session] + u
    sess_spec = spec.prefix.sessions
    if sess_spec is not None:
        think = streams.get("workload.think_time").exponential(sess_spec.think_time_s, size=n)
        think[first] = 0.0
        arrival = arrival + _segmented_cumsum(think, first, s.turns)
        history = _segmented_cumsum(u + o, first, s.turns) - (u + o)  # earlier turns' tokens
        prompt = prompt + history
    turns = _Turns(arrival, prompt, o, session)
    if sess_spec is not None and sess_spec.max_context_tokens is not None:
        turns = _take(turns, np.flatnonzero(prompt <= sess_spec.max_context_tokens))
    return turns


def _segmented_cumsum(x: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum restarting at each segment."""
    c = np.cumsum(x)
    before = np.where(first > 0, c[np.maximum(first - 1, 0)], 0)
    return c - np.repeat(before, counts)


def _take(t: _Turns, idx: np.ndarray) -> _Turns:
    return _Turns(t.arrival_s[idx], t.prompt[idx], t.output[idx], t.session[idx])


# ---------------------------------------------------------------------------------------------
# Phase 3: bounding
# ---------------------------------------------------------------------------------------------


def _bound(spec: WorkloadSpec, t: _Turns, horizon_s: float, complete: bool) -> _Turns | None:
    """Requests inside the bound sorted by arrival, or None when more sessions must be drawn.

    Requests arriving before `horizon_s` (the last drawn session's start) are all drawn:
    any undrawn session starts later. `complete` is true when no session was left undrawn.
    """
    order = np.argsort(t.arrival_s, kind="stable")
    t = _take(t, order)
    covered = len(t.arrival_s) if complete else int(np.searchsorted(t.arrival_s, horizon_s, side="right"))
    enough = complete  # every session drawn (a trace's rows): what there is, even with no bound or fewer
    if spec.duration_s is not None:
        inside = int(np.searchsorted(t.arrival_s, spec.duration_s, side="left"))
        enough = complete or horizon_s >= spec.duration_s
        covered = min(covered, inside)
    if spec.num_requests is not None and covered >= spec.num_requests:
        covered, enough = spec.num_requests, True
    return _take(t, np.arange(covered)) if enough else None


def _synthetic_columns(spec: WorkloadSpec, seed: int) -> tuple[_Turns, _Sessions]:
    if isinstance(spec.arrival, TraceArrival):  # trace arrivals, synthetic lengths: one turn each
        streams = RngStreams(seed)
        table = _trace_table(spec, seed)
        assert table.arrival_s is not None
        s = _draw_sessions(spec, streams, table.arrival_s)
        bounded = _bound(spec, _expand(spec, streams, s), 0.0, complete=True)
        assert bounded is not None
        return bounded, s
    n = _initial_sessions(spec)
    for _ in range(_MAX_GROWTH_ROUNDS):
        streams = RngStreams(seed)
        s = _draw_sessions(spec, streams, _draw_starts(spec, streams.get("workload.arrivals"), n))
        turns = _expand(spec, streams, s)
        if len(turns.arrival_s) == 0:
            break
        bounded = _bound(spec, turns, float(s.start_s[-1]), complete=False)
        if bounded is not None:
            return bounded, s
        n *= 2
    raise SpecError(
        f"could not fill num_requests={spec.num_requests}: sessions keep ending before their first turn "
        "(check prefix.sessions.max_context_tokens against the prompt lengths)"
    )


# ---------------------------------------------------------------------------------------------
# Phase 4: block ids
# ---------------------------------------------------------------------------------------------


def _block_ids(spec: WorkloadSpec, t: _Turns, s: _Sessions) -> tuple[list[int], np.ndarray]:
    """Flat chained block ids of all requests (in t's order) and each request's offset into it."""
    B = spec.hash_block_tokens
    g_full = _with_none(prefix_groups(spec) // B)
    g_base = _segment_starts(g_full)
    n_shared = int(g_full.sum())
    n_full = t.prompt // B
    sess_full = np.zeros(len(s.turns), dtype=np.int64)
    np.maximum.at(sess_full, t.session, n_full)
    s_base = n_shared + _segment_starts(sess_full)
    partial_base = n_shared + int(sess_full.sum())

    nb = -(-t.prompt // B)
    offsets = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    rep = np.repeat(np.arange(len(nb)), nb)
    j = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][rep]
    grp = s.group[t.session]  # -1 indexes the appended "no prefix" group: 0 shared blocks
    ids = np.where(j < g_full[grp][rep], g_base[grp][rep] + j, s_base[t.session][rep] + j)
    ids = np.where(j == n_full[rep], partial_base + rep, ids)
    return ids.tolist(), offsets


# ---------------------------------------------------------------------------------------------
# Phase 5: requests
# ---------------------------------------------------------------------------------------------


def _synthetic(spec: WorkloadSpec, seed: int) -> list[Request]:
    t, s = _synthetic_columns(spec, seed)
    with gc_paused():
        return _build_requests(spec, t, s)


def _build_requests(spec: WorkloadSpec, t: _Turns, s: _Sessions) -> list[Request]:
    flat, off = _block_ids(spec, t, s)
    o = off.tolist()
    hashes = [tuple(flat[o[i]:o[i + 1]]) for i in range(len(o) - 1)]
    names = [x.name for x in spec.tenants] or ["default"]
    tenant = [names[i] for i in s.tenant[t.session].tolist()]
    version = _versions(spec, s.pinned[t.session])
    sessions: list[int | None] = t.session.tolist() if spec.prefix.sessions else [None] * len(hashes)
    n = len(hashes)
    return list(map(Request, map(str, range(n)), t.arrival_s.tolist(), t.prompt.tolist(), t.output.tolist(), hashes,
                    [spec.hash_block_tokens] * n, tenant, sessions, version))


def _versions(spec: WorkloadSpec, pinned: np.ndarray) -> list[str | None]:
    pin = spec.model_version_pin
    if pin is None:
        return [None] * len(pinned)
    return [pin.version if p else None for p in pinned.tolist()]


def _trace_table(spec: WorkloadSpec, seed: int) -> TraceTable:
    a = spec.arrival
    assert isinstance(a, TraceArrival)
    if a.format is not None:
        get_format(a.format, "arrival.format")
    table = replay_arrivals(read_trace(a.path, a.format, a.columns), time_scale=a.time_scale, rate_rps=a.rate_rps,
                            start_s=a.start_s, max_requests=a.max_requests, seed=seed)
    assert table.arrival_s is not None
    n = len(table)
    if spec.duration_s is not None:
        n = int(np.searchsorted(table.arrival_s, spec.duration_s, side="left"))
    if spec.num_requests is not None:
        n = min(n, spec.num_requests)
    return table.take(np.arange(n))


def _from_trace(spec: WorkloadSpec, seed: int) -> list[Request]:
    """Trace arrivals and lengths (and Mooncake hash_ids), tagged with tenants and version pins."""
    table = _trace_table(spec, seed)
    streams = RngStreams(seed)
    s = _draw_sessions(spec, streams, np.zeros(len(table)))
    names = [x.name for x in spec.tenants] or ["default"]
    reqs = to_requests(table, [names[i] for i in s.tenant.tolist()])
    if spec.model_version_pin is not None:
        reqs = [replace(r, model_version=v) for r, v in zip(reqs, _versions(spec, s.pinned), strict=True)]
    return reqs
