"""Named, seeded random streams: adding a consumer never shifts the numbers another one draws."""

from __future__ import annotations

import hashlib

import numpy as np


class RngStreams:
    """`streams.get("arrivals")` always yields the same generator sequence for the same seed."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._streams: dict[str, np.random.Generator] = {}

    def get(self, name: str) -> np.random.Generator:
        """The generator of stream `name`, seeded from (seed, name) on first use."""
        g = self._streams.get(name)
        if g is None:
            digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
            g = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            self._streams[name] = g
        return g
