"""The planner's executor: input order kept inline and in a process pool; Ray errors are one clear line.

None of these tests needs Ray: a missing Ray is simulated by blocking the import, and the
unreachable-address check is a plain TCP probe. The `--ray` path itself is exercised against a
local Ray instance by benchmarks/planner_ray.py, not here.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner import executor as ex_mod
from fleetwise.planner.executor import Executor


def _slow_first(ctx: tuple[int, int], item: int) -> tuple[int, int]:
    """Earlier items sleep longer, so a pool that returned in completion order would reverse them."""
    n, base = ctx
    time.sleep(0.01 * (n - item))
    return base + item, os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_map_keeps_input_order(workers: int) -> None:
    items = list(range(8))
    with Executor(workers=workers) as ex:
        out = ex.map(_slow_first, (len(items), 100), items)
    assert [v for v, _pid in out] == [100 + i for i in items]
    pids = {pid for _v, pid in out}
    if workers == 1:
        assert pids == {os.getpid()}  # inline, no pool
    else:
        assert os.getpid() not in pids  # ran in worker processes


def _started(ctx: None, item: int) -> tuple[int, float]:
    return item, time.monotonic()


def test_map_with_cost_hands_out_the_costliest_first_and_keeps_input_order() -> None:
    """With one worker process the tasks run one after the other in the order handed out: the
    costliest first (ties in input order), and the results still come back in input order."""
    items = [3, 9, 1, 9, 5]
    with Executor(workers=2) as ex:
        ex._pool = ex_mod.ProcessPoolExecutor(max_workers=1)
        out = ex.map(_started, None, items, cost=lambda it: float(it))
    assert [it for it, _t in out] == items
    started = [t for _it, t in out]
    assert sorted(range(len(items)), key=lambda i: started[i]) == [1, 3, 4, 0, 2]


def test_map_empty_and_single_item() -> None:
    with Executor(workers=2) as ex:
        assert ex.map(_slow_first, (1, 0), []) == []
        assert ex.map(_slow_first, (1, 5), [0]) == [(5, os.getpid())]  # one item runs inline
        assert ex._pool is None


def test_workers_must_be_positive() -> None:
    with pytest.raises(SpecError, match="--workers=0"):
        Executor(workers=0)


def test_ray_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with Executor(workers=2, ray_address="auto") as ex, \
            pytest.raises(SpecError, match=r"--ray needs Ray: pip install 'fleetwise\[ray\]'"):
        ex.map(_slow_first, (1, 0), [0])
    # an empty map never touches Ray
    with Executor(ray_address="auto") as ex:
        assert ex.map(_slow_first, (1, 0), []) == []


@pytest.mark.parametrize(("address", "expected"), [
    ("auto", None), ("local", None), ("", None),
    ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("ray://head.example:10001", ("head.example", 10001)),
    ("[::1]:6379", ("::1", 6379)), ("http://127.0.0.1:8265", None), ("host:port", None),
])
def test_host_port(address: str, expected: tuple[str, int] | None) -> None:
    assert ex_mod._host_port(address) == expected


def test_unreachable_address_fails_fast() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match=f"--ray 127.0.0.1:{port}: nothing answers"):
        ex_mod._check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.perf_counter() - t0 < 3.0
    ex_mod._check_reachable("auto")  # nothing to probe


def test_reachable_address_passes() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        ex_mod._check_reachable(f"127.0.0.1:{srv.getsockname()[1]}", timeout_s=2.0)


def _item(ctx: None, item: int) -> int:
    time.sleep(0.05)
    return item


@pytest.mark.parametrize("workers", [1, 2])
def test_map_pruned_drops_the_items_a_result_names_before_they_start(workers: int) -> None:
    """Two items run at a time, costliest first: when 5 comes back it names 2, 1 and 0, which have
    not started (a free worker is handed one item at a time), so they never run; 3 and 4 do.
    Inline every item runs."""
    items = [5, 4, 3, 2, 1, 0]
    with Executor(workers=workers) as ex:
        out = ex.map_pruned(_item, None, items, cost=float, prune=lambda i, r: [3, 4, 5] if r == 5 else [])
    assert out == ([5, 4, 3, None, None, None] if workers == 2 else items)
