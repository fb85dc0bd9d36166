"""BlockPool: accounting, prefix spans, LRU eviction (exact), and random-operation invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.engine.blocks import BlockPool


def test_allocate_and_free_keep_capacity():
    pool = BlockPool(10)
    assert pool.allocate(7)
    assert (pool.num_used, pool.num_free) == (7, 3)
    assert not pool.allocate(4)
    assert (pool.num_used, pool.num_free) == (7, 3)
    pool.free(7)
    assert (pool.num_used, pool.num_free, pool.usage) == (0, 10, 0.0)
    pool.check()


def test_promote_release_and_reacquire_a_span():
    pool = BlockPool(10)
    pool.allocate(4)
    entry = pool.promote((1, 0), 3)
    assert entry is not None and entry.ref_count == 1
    assert (pool.num_private, pool.num_used, pool.num_cached) == (1, 4, 3)
    assert pool.promote((1, 0), 1) is None  # duplicate key stays private
    pool.release(entry)
    assert (pool.num_used, pool.num_free, pool.lru_keys()) == (1, 9, [(1, 0)])
    pool.acquire(entry)
    assert (pool.num_used, pool.lru_keys(), entry.ref_count) == (4, [], 1)
    pool.check()


def test_lru_evicts_least_recently_freed_span_first_and_trims_from_the_tail():
    pool = BlockPool(8)
    pool.allocate(6)
    a, b, c = (pool.promote((k, 0), 2) for k in (1, 2, 3))
    assert a and b and c
    for entry in (b, a, c):  # freed in this order: b is least recent
        pool.release(entry)
    assert pool.lru_keys() == [(2, 0), (1, 0), (3, 0)]
    assert pool.allocate(5)  # 2 free + b (2) + 1 block of a
    assert pool.get((2, 0)) is None
    assert a.num_blocks == 1 and pool.get((1, 0)) is a
    assert pool.lru_keys() == [(1, 0), (3, 0)]
    pool.check()


def test_grow_moves_private_blocks_into_a_span():
    pool = BlockPool(8)
    pool.allocate(5)
    entry = pool.promote((9, 0), 2)
    assert entry is not None
    pool.grow(entry, 3)
    assert (entry.num_blocks, pool.num_private, pool.num_used) == (5, 0, 5)
    pool.check()


def test_reset_drops_everything():
    pool = BlockPool(6)
    pool.allocate(4)
    entry = pool.promote((1, 0), 2)
    assert entry is not None
    pool.release(entry)
    pool.reset()
    assert (pool.num_free, pool.num_cached, pool.lru_keys()) == (6, 0, [])
    pool.check()


ops = st.lists(st.tuples(st.sampled_from(["alloc", "free", "promote", "release", "acquire"]),
                         st.integers(0, 6), st.integers(0, 5)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_operations_preserve_invariants(sequence):
    pool = BlockPool(16)
    held: list = []  # referenced entries, one element per reference
    for op, n, key in sequence:
        if op == "alloc":
            before = pool.num_free
            assert pool.allocate(n) == (n <= before)
        elif op == "free":
            pool.free(min(n, pool.num_private))
        elif op == "promote" and pool.num_private:
            entry = pool.promote((key, 0), min(max(n, 1), pool.num_private))
            if entry is not None:
                held.append(entry)
        elif op == "release" and held:
            pool.release(held.pop(n % len(held)))
        elif op == "acquire" and pool.get((key, 0)) is not None:
            entry = pool.get((key, 0))
            pool.acquire(entry)
            held.append(entry)
        pool.check()
        assert all(e.ref_count >= 0 for e in held)
        assert pool.num_used + pool.num_free == pool.capacity


def test_kv_events_report_spans_stored_and_fully_evicted_in_order():
    pool = BlockPool(10)
    assert pool.events is None  # off by default: nothing recorded
    pool.events = []
    pool.allocate(6)
    a = pool.promote((7, 0), 3)
    b = pool.promote((8, 1), 3)
    assert a is not None and b is not None
    assert pool.promote((7, 0), 1) is None  # a duplicate stays private: no event
    pool.release(a)
    pool.release(b)
    pool.allocate(7)  # 4 free blocks, then all 3 of span 7 (least recently used)
    assert pool.events == [(True, 7), (True, 8), (False, 7)]
    pool.allocate(2)  # a trimmed span stays cached: no event
    assert pool.events == [(True, 7), (True, 8), (False, 7)]
    pool.allocate(1)  # the last block of span 8 goes
    assert pool.events[-1] == (False, 8)
    pool.reset()  # a crash drops pending events (the driver reports the worker down)
    assert pool.events == []
