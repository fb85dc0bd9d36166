"""Prefix index, scorers, load bound and pickers, with exact numbers and seeded tie-breaks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference_policy import load_bound

from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.errors import SpecError
from fleetwise.routing import make_policy
from fleetwise.routing.plugins import (
    FILTERS,
    PICKERS,
    SCORERS,
    Candidate,
    PickerState,
    candidate_columns,
    own_cost,
)
from fleetwise.routing.prefix_index import PrefixIndex
from fleetwise.spec.base import validate
from fleetwise.spec.routing import CostParams, LoadBoundParams, RoutingSpec
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS


def cand(name, load=0.0, own=100.0, slowness=1.0, prefix=0, requests=0, kv=0.0):
    return Candidate(WorkerView(name, kv_usage=kv), requests, load, own, slowness, prefix)


REQ = RouteRequest("r", 160, 10, block_hashes=(1, 2, 3, 4))


def test_prefix_index_longest_leading_run_and_lru():
    ix = PrefixIndex(max_blocks_per_worker=4)
    ix.insert("a", [1, 2, 3])
    assert ix.match("a", [1, 2, 3, 4]) == 3
    assert ix.match("a", [2, 3]) == 2 and ix.match("a", [9, 1]) == 0 and ix.match("b", [1]) == 0
    ix.evict("a", [2])
    assert ix.match("a", [1, 2, 3]) == 1  # a hole ends the reusable prefix
    ix.insert("a", [5, 6, 7])  # 1,3,5,6,7 -> over cap 4: the LRU (1) goes
    assert ix.size("a") == 4 and ix.match("a", [1]) == 0 and ix.match("a", [3]) == 1
    ix.drop_worker("a")
    assert ix.workers() == []


@given(st.lists(st.lists(st.integers(0, 20), max_size=10), max_size=20), st.lists(st.integers(0, 20), max_size=10))
def test_prefix_index_matches_a_reference_model(inserts, query):
    ix, ref = PrefixIndex(8), []
    for batch in inserts:
        ix.insert("w", batch)
        for h in batch:
            if h in ref:
                ref.remove(h)
            ref.append(h)
        ref = ref[-8:]
    expect = 0
    for h in query:
        if h not in ref:
            break
        expect += 1
    assert ix.match("w", query) == expect and ix.size("w") == len(ref)


def test_scorers_exact():
    cs = [cand("a", load=100, prefix=4, requests=1, kv=0.25), cand("b", load=300, slowness=2.0, requests=3, kv=1.5)]
    got = {s: SCORERS[s](REQ, candidate_columns(REQ, cs)) for s in ("load", "requests", "prefix", "kv", "feedback")}
    assert got["load"] == [200 / 200, 200 / 800]
    assert got["requests"] == [1.0, 0.5]
    assert got["prefix"] == [1.0, 0.0]
    assert got["kv"] == [0.75, 0.0]  # clamped to [0, 1]
    assert got["feedback"] == [1.0, 0.5]
    no_hashes = RouteRequest("x", 10, 1)
    assert SCORERS["prefix"](no_hashes, candidate_columns(no_hashes, cs)) == [0.0, 0.0]


def test_scorers_score_only_the_kept_workers_in_order():
    cs = [cand("a", load=100, requests=1), cand("b", load=300, requests=3), cand("c", load=50, requests=0)]
    cols = candidate_columns(REQ, cs)
    cols.kept = [0, 1]
    assert SCORERS["load"](REQ, cols) == [1.0, 200 / 400]  # the best of a and b, not c
    assert SCORERS["requests"](REQ, cols) == [1.0, 0.5]


def test_own_cost_subtracts_cached_blocks():
    cost = CostParams(decode_token_weight=0.5, per_request_tokens=32)
    req = RouteRequest("r", 160, 10, block_hashes=(1, 2, 3, 4), hash_block_tokens=16)
    assert own_cost(req, 0, cost, 10) == 160 + 5 + 32
    assert own_cost(req, 4, cost, 10) == 96 + 5 + 32
    assert own_cost(req, 20, cost, 10) == 0 + 5 + 32
    assert own_cost(req, 0, cost, 0) == 160 + 32  # a prefill-only worker: no decode work
    # a Mooncake-style entry covers 512 prompt tokens, not one 16-token KV block
    long = RouteRequest("m", 2000, 10, block_hashes=(1, 2, 3), hash_block_tokens=512)
    assert own_cost(long, 3, cost, 10) == (2000 - 1536) + 5 + 32


def test_load_bound_tokens_and_share():
    cs = [cand("a", load=1000), cand("b", load=0), cand("c", load=200)]
    kept, bound, excluded = load_bound(cs, [], LoadBoundParams(c=1.25))
    assert bound == 1.25 * 400 and excluded == ["a"]  # 1000 > 500 + own 100
    kept, _, excluded = load_bound(cs, [("c", 100), ("c", 100), ("b", 100)], LoadBoundParams(c=1.25))
    # share of the recent work: c took 200 of 300 tokens > 1.25 * (300 + own 100) / 3 = 166.7 -> out as well
    assert [k.name for k in kept] == ["b"] and excluded == ["a", "c"]
    # weighted by work, not decisions: b's one long prompt (3000 of 3200) puts b out, c's two short ones do not
    kept, _, excluded = load_bound(cs, [("b", 3000), ("c", 100), ("c", 100)], LoadBoundParams(c=1.25))
    assert [k.name for k in kept] == ["c"] and excluded == ["a", "b"]


def test_pickers_seeded_and_stable():
    ps = PickerState(np.random.default_rng(0))
    abc = ["a", "b", "c"]
    assert [abc[ps.round_robin(abc)] for _ in range(4)] == ["a", "b", "c", "a"]
    assert ps.round_robin(["a", "c"]) == 1  # stable when b leaves: the next name after "a", c
    tot = [0.5, 0.9, 0.9]
    assert ps.max(abc, tot, "random") == (2, 2)  # seed 0 breaks the b/c tie towards c
    assert PickerState(np.random.default_rng(1)).max(abc, tot, "random") == (1, 2)
    ps.chosen("b")
    assert ps.max(abc, tot, "lru") == (2, 1)  # c never chosen, b just was
    ps.chosen("c")
    assert ps.max(abc, tot, "lru") == (1, 1)
    assert PickerState(np.random.default_rng(0)).power_of_two([0.1, 0.9, 0.5]) == (1, 2)  # b over c
    assert PickerState(np.random.default_rng(0)).random(["x", "y", "z"]) == 2


def test_max_breaks_ties_in_name_order_whatever_the_order_given():
    # pair keys of a P/D pick are not always in name order: the tie is ordered by name first
    names, tot = ["b->x", "a->x", "c->x"], [0.9, 0.9, 0.1]
    for seed in range(6):
        want = ["a->x", "b->x"][int(np.random.default_rng(seed).integers(2))]
        i, tied = PickerState(np.random.default_rng(seed)).max(names, tot, "random")
        assert (names[i], tied) == (want, 2)


def test_the_registry_declares_every_plugin_once_and_each_has_its_implementation():

    assert ROUTING_PLUGINS.missing() == []
    assert tuple(SCORERS) == ROUTING_PLUGINS.names("scorer")
    assert set(FILTERS) == set(ROUTING_PLUGINS.names("filter"))
    assert set(PICKERS) == set(ROUTING_PLUGINS.names("picker"))
    with pytest.raises(ValueError, match="implemented twice"):
        ROUTING_PLUGINS.implements("scorer", "load")(lambda req, cs: {})
    with pytest.raises(ValueError, match="not declared"):
        ROUTING_PLUGINS.implements("scorer", "latency")(lambda req, cs: {})


def test_plan_validation_reads_the_same_registry_and_names_the_closest_plugin():
    with pytest.raises(SpecError, match=r"routing.*scorers: unknown scorer 'lod'; closest: load"):
        validate(RoutingSpec, {"policy": "round-robin", "params": {"scorers": {"lod": 1.0}}}, "plan.yaml")
    with pytest.raises(SpecError, match=r"unknown picker 'best'"):
        validate(RoutingSpec, {"policy": "round-robin", "params": {"picker": "best"}}, "plan.yaml")


def test_decisions_carry_a_structured_kind_per_picker():
    view = FleetView(0.0, (WorkerView("a"), WorkerView("b")))
    kinds = {name: make_policy(name, seed=1).route(RouteRequest("r", 10, 1), view).kind
             for name in ("round-robin", "random", "power-of-two", "least-outstanding", "fleetwise-default")}
    assert kinds == {"round-robin": "round-robin", "random": "random", "power-of-two": "power-of-two",
                     "least-outstanding": "least-outstanding", "fleetwise-default": "least-cost"}
    down = FleetView(0.0, (WorkerView("a", healthy=False),))
    rejected = make_policy("round-robin").route(RouteRequest("r", 10, 1), down)
    assert (rejected.worker, rejected.kind) == (None, "rejected")


index_op = st.tuples(st.sampled_from(["insert", "evict", "drop"]), st.integers(0, 5),
                     st.lists(st.integers(0, 12), max_size=8))


@given(st.lists(index_op, max_size=40), st.lists(st.integers(0, 12), max_size=10), st.integers(1, 6))
def test_match_all_is_every_workers_match(ops, query, cap):
    """The hash -> holders masks give every worker's leading run, as `match` does one worker at a
    time, through inserts past the LRU cap, evictions and workers dropped."""
    ix = PrefixIndex(cap)
    workers = [f"w{i}" for i in range(6)]
    for kind, w, hashes in ops:
        if kind == "insert":
            ix.insert(workers[w], hashes)
        elif kind == "evict":
            ix.evict(workers[w], hashes)
        else:
            ix.drop_worker(workers[w])
    want = {w: ix.match(w, query) for w in workers}
    assert dict(ix.match_all(query)) == {w: k for w, k in want.items() if k}
    assert len(ix.match_all(query)) == len(dict(ix.match_all(query)))  # each worker once
    held = {h for w in workers for h in ix.blocks(w)}
    assert set(ix._holders) == held  # no hash outlives its last holder
