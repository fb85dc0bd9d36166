"""Hypothesis runs derandomised by default, so a test run is reproducible (the brief: seeded
randomness, exact expectations). `HYPOTHESIS_PROFILE=hunt` draws fresh examples and keeps a
database, for bug hunting outside CI."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("hunt", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


TIERS: dict[str, tuple[str, ...]] = {
    # whole modules (path) or single tests (path::name, parameters ignored) -> their tiers
    "tests/ledger/test_live_failure_points.py": ("slow", "external"),   # subprocess fleets, 5-40 s each
    "tests/ledger/test_gateway_crash.py": ("slow", "external"),         # SIGKILLed gateway processes
    "tests/ledger/test_crash_keys_verify.py": ("external",),            # a writer process killed mid-write
    "tests/emulator/test_live.py": ("slow", "external"),                # `fleetwise emulate` processes
    "tests/report/test_browser.py": ("slow", "external"),               # headless Chromium
    "tests/report/test_reports.py": ("slow",),                          # plans and scenarios drawn in full
    "tests/report/test_perfetto.py": ("slow",),
    "tests/sim/test_compiled.py": ("slow",),                            # pure-Python runs in subprocesses
    "tests/sim/test_fast_paths.py": ("slow",),
    "tests/hostile/test_properties.py": ("slow",),                      # hypothesis over whole CLI runs
    "tests/planner/test_pd.py": ("slow",),
    "tests/planner/test_headroom.py": ("slow",),
    "tests/planner/test_sim_memo.py": ("slow",),
    "tests/planner/test_profile.py": ("slow",),
    "tests/planner/test_progress.py": ("slow",),
    "tests/gateway/test_load.py": ("slow",),
    "tests/workload/test_traces.py": ("slow",),
    "tests/emulator/test_pd_and_events.py::test_a_pull_reaches_the_decode_engine_at_its_modelled_landing_however_late_its_answer":
        ("slow", "wallclock"),
    "tests/live/test_clock.py": ("wallclock",),
    "tests/emulator/test_server.py": ("wallclock",),
    "tests/emulator/test_abort_eos_links.py": ("wallclock",),
    "tests/emulator/test_lean_server.py": ("wallclock",),
    "tests/gateway/test_gateway.py": ("wallclock",),
}
"""Test tiers (markers registered in pyproject.toml): `slow` (seconds to minutes each; `pytest -m "not
slow"` runs the rest in about a minute), `external` (a real PostgreSQL server, Chromium or subprocess
fleets), `wallclock` (asserts on real elapsed time, with margins a loaded 2-core machine meets). CI runs
every tier. Tests using the PostgreSQL fixtures are `external` wherever they are."""

EXTERNAL_FIXTURES = frozenset({"postgres_url", "pg_database"})
"""Fixtures that start a real server: a test asking for one is `external`."""
SLOW_FIXTURES = frozenset({"small_results"})
"""Fixtures that take minutes (the small scenario suite): a test asking for one is `slow`."""


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 (pytest's hook signature)
    import pytest

    for item in items:
        path, _, rest = item.nodeid.partition("::")
        name = rest.split("[", 1)[0]
        tiers = set(TIERS.get(path, ())) | set(TIERS.get(f"{path}::{name}", ()))
        fixtures = set(getattr(item, "fixturenames", ()))
        if EXTERNAL_FIXTURES & fixtures:
            tiers.add("external")
        if SLOW_FIXTURES & fixtures:
            tiers.add("slow")
        if "ledger_url" in fixtures and "[postgres]" in item.nodeid:
            tiers.add("external")
        for tier in sorted(tiers):
            item.add_marker(getattr(pytest.mark, tier))
