"""Hypothesis runs derandomised by default, so a test run is reproducible (the brief: seeded
randomness, exact expectations). `HYPOTHESIS_PROFILE=hunt` draws fresh examples and keeps a
database, for bug hunting outside CI."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("hunt", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
