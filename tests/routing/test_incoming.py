"""IncomingKv at its cap: the oldest hand-offs are dropped first and the per-worker tokens follow."""

from fleetwise.routing.incoming import IncomingKv
from fleetwise.routing.state import MAX_TRACKED


def test_cap_drops_the_oldest_and_keeps_worker_tokens_exact() -> None:
    kv = IncomingKv()
    extra = 5
    for i in range(MAX_TRACKED + extra):
        kv.add(f"r{i}", f"d{i % 2}", 1 + i % 3)
    assert len(kv) == MAX_TRACKED
    kept = range(extra, MAX_TRACKED + extra)
    for w in (0, 1):
        assert kv.tokens(f"d{w}") == sum(1 + i % 3 for i in kept if i % 2 == w)
    kv.landed("r0")  # already dropped: no change
    kv.landed(f"r{extra}")  # the oldest kept one
    assert len(kv) == MAX_TRACKED - 1
    assert kv.tokens("d1") == sum(1 + i % 3 for i in kept if i % 2 == 1 and i != extra)
