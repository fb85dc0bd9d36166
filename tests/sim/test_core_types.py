"""The types made per request or per view refresh construct without the dataclasses module's
generated `__init__` (core/views.py says why). The core ones keep the frozen dataclass interface:
every field is set from its parameter, in field order, positionally and by keyword;
`dataclasses.replace`, equality, hashing and the frozen error on assignment are the dataclass's;
the defaults are the documented ones. The simulator's `Arrival` and the engine's `CacheEntry` too.
A workload's `Request` as well, which also pickles and copies (the planner's workers receive them)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import sys
from typing import Any

import pytest

from fleetwise.core.compiled import native
from fleetwise.core.feedback import Cancelled, Completed, Dispatched, Failed, FirstToken
from fleetwise.core.request import Request
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, RoutingDecision, WorkerView
from fleetwise.engine.blocks import CacheEntry
from fleetwise.routing.plugins import Candidate
from fleetwise.routing.signals import Columns
from fleetwise.routing.state import Pending
from fleetwise.sim.events import Arrival
from fleetwise.spec.kv_format import KvFormat

W = WorkerView("w0")
SAMPLES: dict[type, tuple[Any, ...]] = {
    WorkerView: ("w1", "decode", "p", "h200-sxm", "v2", "eu", False, 3, 4, 5, 6, 0.25, 1024, 32, 1.5, 2.0,
                 KvFormat("v2")),
    FleetView: (2.5, (W,), ()),
    KvLinkView: ("p0", "d0", 1e9, 0.002, 3, False),
    RouteRequest: ("r1", 100, 50, (1, 2), "t", "v2", "eu", 3.5, 256),
    RoutingDecision: ("w1", "p1", {"w1": 1.0}, "why", True, "prefix"),
    Dispatched: (1.0, "r1", "w1", 100, (7,), "p1"),
    FirstToken: (1.0, "r1", "w1", 0.5),
    Completed: (1.0, "r1", "w1", 20, 0.01, 2.0),
    Failed: (1.0, "r1", "w1", "crash"),
    Cancelled: (1.0, "r1", "w1", "gone"),
    Request: ("r1", 2.5, 100, 50, (1, 2), 256, "t", 7, "v2", "eu", 64),
}
"""A value per field, in field order, none of them the field's default."""

DEFAULTS: dict[type, tuple[tuple[Any, ...], dict[str, Any]]] = {
    WorkerView: (("w",), {"role": "mixed", "pool": "default", "accelerator": "", "model_version": "v1",
                          "region": "default", "healthy": True, "queued_requests": 0, "running_requests": 0,
                          "queued_prefill_tokens": 0, "running_decode_tokens": 0, "kv_usage": 0.0,
                          "kv_capacity_tokens": 0, "block_size": 16, "reported_at_s": 0.0, "weight": 1.0,
                          "kv_format": None}),
    FleetView: ((1.0, ()), {"links": ()}),
    KvLinkView: (("p", "d", 1.0, 0.0), {"active_transfers": 0, "healthy": True}),
    RouteRequest: (("r", 10, None), {"block_hashes": (), "tenant": "default", "model_version": None,
                                     "region": None, "arrival_s": 0.0, "hash_block_tokens": 512}),
    RoutingDecision: (("w",), {"prefill_worker": None, "scores": {}, "reason": "", "safe_mode": False,
                               "kind": ""}),
    Dispatched: ((1.0, "r", "w", 10), {"block_hashes": (), "prefill_worker": None}),
    Request: (("r", 0.5, 10, 5), {"block_hashes": (), "hash_block_tokens": 512, "tenant": "default",
                                  "session_id": None, "model_version": None, "region": None, "max_tokens": None}),
}
"""Required arguments and the documented defaults of the optional fields."""


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_every_field_is_set_from_its_parameter_in_field_order(cls: type) -> None:
    values = SAMPLES[cls]
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(names) == len(values)
    positional, keyword = cls(*values), cls(**dict(zip(names, values, strict=True)))
    for obj in (positional, keyword):
        assert [getattr(obj, n) for n in names] == list(values)
    assert positional == keyword
    if cls is not RoutingDecision:  # its scores are a dict: unhashable, as before
        assert hash(positional) == hash(keyword)
    changed = dataclasses.replace(positional, **{names[0]: SAMPLES[cls][0]})
    assert changed == positional and changed is not positional


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_fields_stay_frozen(cls: type) -> None:
    obj = cls(*SAMPLES[cls])
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, first, SAMPLES[cls][0])
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        delattr(obj, first)


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda c: c.__name__)
def test_defaults_are_the_documented_ones(cls: type) -> None:
    args, defaults = DEFAULTS[cls]
    obj = cls(*args)
    assert {n: getattr(obj, n) for n in defaults} == defaults


def test_a_decision_without_scores_gets_its_own_empty_dict() -> None:
    a, b = RoutingDecision("w"), RoutingDecision("w")
    assert a.scores == {} and a.scores is not b.scores
    assert a.rejected is False and RoutingDecision(None).rejected is True


MUTABLE: dict[type, tuple[tuple[Any, ...], dict[str, Any]]] = {
    Candidate: ((W, 3, 2.5, 1.5, 1.25, 4, 0.5), {"slowness": 1.0, "prefix_blocks": 0, "kv_room": 0.0}),
    Columns: (([1.0], [2.0], [1.5], [3], [4], [0.25], 5, [0], [W], [2.0], [0.5]), {"weight": None, "kv_room": None}),
    Pending: (("r1", "w1", "p1", 1.5, 100, 50, 20.5), {}),
}
"""The routing policy's per-decision records (not frozen): a value per field, none of them the
default, and the documented defaults of the optional fields."""


@pytest.mark.parametrize("cls", list(MUTABLE), ids=lambda c: c.__name__)
def test_policy_records_set_every_field_and_keep_their_defaults(cls: type) -> None:
    values, defaults = MUTABLE[cls]
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(names) == len(values)
    positional, keyword = cls(*values), cls(**dict(zip(names, values, strict=True)))
    for obj in (positional, keyword):
        assert [getattr(obj, n) for n in names] == list(values)
    assert positional == keyword and dataclasses.replace(positional) == positional
    short = cls(*values[:len(names) - len(defaults)])
    assert {n: getattr(short, n) for n in defaults} == defaults


@pytest.mark.parametrize("cls", [*SAMPLES, *MUTABLE, Arrival, CacheEntry], ids=lambda c: c.__name__)
def test_the_constructor_is_the_class_own_not_the_generated_one(cls: type) -> None:
    """The dataclasses module writes its `__init__` as Python even for a compiled class: these
    classes keep theirs (compiled natively, or, from the sources, the function in their module)."""
    init = cls.__init__
    if inspect.isfunction(init):  # the sources run
        assert init.__code__.co_filename == inspect.getsourcefile(sys.modules[cls.__module__])
    else:
        assert native()


def test_arrival_and_cache_entry_set_their_fields() -> None:
    assert Arrival(7).index == 7
    e = CacheEntry((3, 1), 4)
    assert (e.key, e.num_blocks, e.ref_count) == ((3, 1), 4, 0)
    assert CacheEntry((3, 1), 4, 2).ref_count == 2


def test_a_request_pickles_and_copies_to_an_equal_request() -> None:
    r = Request(*SAMPLES[Request])
    for twin in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert twin == r and type(twin) is Request
        assert [getattr(twin, f.name) for f in dataclasses.fields(Request)] == list(SAMPLES[Request])
    assert pickle.loads(pickle.dumps([r, Request("x", 0.0, 1, 1)]))[1].prompt_tokens == 1


def test_a_request_takes_numpy_and_iterable_inputs_as_python_values() -> None:
    """Counts from numpy arrays, a float32 arrival and block ids in a list or numpy ints construct the
    same request as Python values (compiled or not); a float count is refused, not truncated."""
    np = pytest.importorskip("numpy")
    plain = Request("r1", 2.5, 100, 50, (1, 2), 256, "t", 7, "v2", "eu", 64)
    for hashes in ([1, 2], np.array([1, 2]), (np.int64(1), np.int64(2))):
        r = Request("r1", np.float32(2.5), np.int64(100), np.int32(50), hashes, np.int16(256), "t",
                    np.int64(7), "v2", "eu", np.uint16(64))
        assert r == plain and hash(r) == hash(plain)
        assert [type(getattr(r, f.name)) for f in dataclasses.fields(Request)] == \
            [type(getattr(plain, f.name)) for f in dataclasses.fields(Request)]
        assert all(type(h) is int for h in r.block_hashes)
    with pytest.raises(TypeError):
        Request("r1", 0.0, 100.5, 50)  # type: ignore[arg-type]
