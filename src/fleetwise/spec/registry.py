"""One way to register a plugin once: a decorator that files an object in a table under its key."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def register_into(table: dict[K, V], key: K, what: str) -> Callable[[V], V]:
    """Decorator putting the decorated object in `table[key]`; ValueError when `key` is taken."""

    def wrap(obj: V) -> V:
        if key in table:
            raise ValueError(f"{what} {key!r} registered twice")
        table[key] = obj
        return obj

    return wrap
