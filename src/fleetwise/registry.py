"""`Registry`: the one registry of named plugins (trace formats, report kinds, fault kinds, ...).

Sits below every layer (stdlib only), beside `errors`. A plugin module registers itself once, at
import, with the decorator `@REG.register(key)`; a second registration of the same key is a bug and
raises. Lookups read like a mapping; `lookup` turns an unknown key into the caller's error with the
closest known keys, so each registry's users get the same message shape.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class Registry(Mapping[K, V], Generic[K, V]):
    """Key -> registered value, in registration order; each key registered once."""

    def __init__(self, what: str) -> None:
        self.what = what
        """What a value is, for messages ("trace format", "report kind")."""
        self._items: dict[K, V] = {}

    def add(self, key: K, value: V) -> V:
        """Register `value` under `key`; ValueError if `key` is already registered."""
        if key in self._items:
            raise ValueError(f"{self.what} {key!r} registered twice")
        self._items[key] = value
        return value

    def register(self, key: K, make: Callable[[T], V] | None = None) -> Callable[[T], T]:
        """Decorator registering the decorated object (or `make(obj)`) under `key`; returns the object."""

        def deco(obj: T) -> T:
            self.add(key, make(obj) if make is not None else obj)  # type: ignore[arg-type]
            return obj

        return deco

    def remove(self, key: K) -> V:
        """Take `key` out again (a plugin registered for a test's lifetime)."""
        return self._items.pop(key)

    def closest(self, key: str, n: int = 3) -> list[str]:
        """Up to `n` registered keys closest to `key` (for "did you mean" messages)."""
        return difflib.get_close_matches(key, [str(k) for k in self._items], n=n, cutoff=0.5)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._items)!r})"
