"""Where simulation tasks run: in this process, in a local process pool, or on a Ray cluster.

Owns one method, `map(fn, ctx, items)`, that keeps the input order so results are deterministic
whatever the worker count. Tasks are top-level functions of (context, item); the context is sent
once per task. Ray is optional (`pip install fleetwise[ray]`) and only imported when asked for.

`--ray ADDRESS` takes what `ray.init(address=...)` takes: `auto`, `HOST:PORT` of a running head
(`ray start --head`), or `ray://HOST:PORT` (Ray Client). Before connecting to a `HOST:PORT` the
executor checks that the port answers, because `ray.init` on an address where nothing listens
retries for minutes before it fails; a cluster it cannot reach or join is one-line `SpecError`.
Ray runs one task per item, in whatever processes the cluster has; `--workers` does not apply.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from functools import partial
from typing import Any, TypeVar

from fleetwise.errors import SpecError

T = TypeVar("T")
R = TypeVar("R")


class Executor:
    """Runs `fn(ctx, item)` for each item; `workers` 1 runs inline."""

    def __init__(self, workers: int = 1, ray_address: str | None = None,
                 on_task: Callable[[int, int], None] | None = None) -> None:
        if workers < 1:
            raise SpecError(f"--workers={workers}: must be at least 1")
        self.workers = workers
        self.ray_address = ray_address
        self.on_task = on_task
        """Called with (tasks done, tasks in the batch) as each result comes back, in order."""
        self._pool: ProcessPoolExecutor | None = None

    @property
    def parallel(self) -> bool:
        """Whether tasks run beside each other (worker processes or a Ray cluster)."""
        return self.workers > 1 or bool(self.ray_address)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def map(self, fn: Callable[[Any, T], R], ctx: Any, items: Sequence[T],
            cost: Callable[[T], float] | None = None) -> list[R]:
        """`[fn(ctx, it) for it in items]`, in the input order whatever ran where. With `cost` (a
        task's relative run time), parallel workers are handed the costliest tasks first, so a long
        task does not start last and leave the other workers idle while it runs (longest first)."""
        if not items:
            return []
        if not self.ray_address and (self.workers == 1 or len(items) == 1):
            return self._counted((fn(ctx, it) for it in items), len(items))
        order = sorted(range(len(items)), key=lambda i: -cost(items[i])) if cost else list(range(len(items)))
        todo = [items[i] for i in order]
        if self.ray_address:
            done = self._counted(_ray_map(self.ray_address, fn, ctx, todo), len(todo))
        else:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.workers)
            done = self._counted(self._pool.map(partial(fn, ctx), todo), len(todo))
        out: list[R] = [None] * len(items)  # type: ignore[list-item]
        for i, r in zip(order, done, strict=True):
            out[i] = r
        return out

    def map_pruned(self, fn: Callable[[Any, T], R], ctx: Any, items: Sequence[T], cost: Callable[[T], float],
                   prune: Callable[[int, R], Iterable[int]]) -> list[R | None]:
        """`map` with the costliest first, except that after each result `prune(i, result)` names
        items (by index) no longer worth running: those not started yet are not run, None in
        their place. Each worker process is handed its next item only when it is free (a pool
        queues items ahead, which could then not be dropped). Inline and on Ray every item runs."""
        if self.ray_address or self.workers == 1 or len(items) < 2:
            return list(self.map(fn, ctx, items, cost))
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        waiting = sorted(range(len(items)), key=lambda i: -cost(items[i]))
        running: dict[Future[R], int] = {}
        out: list[R | None] = [None] * len(items)
        done = 0
        while waiting or running:
            while waiting and len(running) < self.workers:
                i = waiting.pop(0)
                running[self._pool.submit(fn, ctx, items[i])] = i
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in sorted(finished, key=running.__getitem__):
                i = running.pop(f)
                out[i] = f.result()
                done += 1
                if self.on_task is not None:
                    self.on_task(done, len(items))
                dropped = set(prune(i, f.result()))
                waiting = [j for j in waiting if j not in dropped]
        return out

    def _counted(self, results: Iterable[R], total: int) -> list[R]:
        """The results as a list, telling `on_task` after each one."""
        out: list[R] = []
        for r in results:
            out.append(r)
            if self.on_task is not None:
                self.on_task(len(out), total)
        return out


def _ray_map(address: str, fn: Callable[[Any, T], R], ctx: Any, items: Sequence[T]) -> list[R]:
    try:
        import ray  # type: ignore[import-not-found]
    except ImportError:
        raise SpecError("--ray needs Ray: pip install 'fleetwise[ray]' (or drop --ray to use local processes)") from None
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise SpecError(f"--ray {address}: cannot join the Ray cluster: {_first_line(err)}") from None
    remote = ray.remote(fn)
    ctx_ref = ray.put(ctx)
    return list(ray.get([remote.remote(ctx_ref, it) for it in items]))


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `HOST:PORT` or `ray://HOST:PORT`; None for `auto`, `local` and other forms."""
    rest = address.removeprefix("ray://")
    if "://" in rest or ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, in one line, when nothing listens at a `HOST:PORT` Ray address."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as err:
        raise SpecError(f"--ray {address}: nothing answers at {hp[0]}:{hp[1]} ({err.strerror or err}); "
                        f"start a head with `ray start --head` or pass its address") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
