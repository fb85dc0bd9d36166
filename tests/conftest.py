"""Hypothesis runs derandomised by default, so a test run is reproducible (the brief: seeded
randomness, exact expectations). `HYPOTHESIS_PROFILE=hunt` draws fresh examples and keeps a
database, for bug hunting outside CI."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
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
    "tests/spec/test_engine_metrics.py::test_adding_an_engine_is_one_new_file_the_gateway_then_reads": ("slow",),
    "tests/workload/test_traces.py": ("slow",),
    "tests/emulator/test_pd_and_events.py::test_a_pull_reaches_the_decode_engine_at_its_modelled_landing_however_late_its_answer":
        ("slow", "wallclock"),
    # The quick tier's heaviest tests (over about a second each, or their parameters together, on the
    # loaded 2-core host: roughly 0.4 s of CPU and up), measured with `--durations`; CI runs them.
    "tests/routing/test_fast_path.py::test_fast_path_decides_as_the_reference": ("slow",),
    "tests/routing/test_feedback.py::test_slowed_worker_loses_share_then_regains_it": ("slow",),
    "tests/routing/test_feedback.py::test_without_feedback_the_slow_worker_keeps_more_traffic": ("slow",),
    "tests/routing/test_weights.py::test_weighted_random_share_follows_weights": ("slow",),
    "tests/routing/test_vector.py::test_each_scorer_equals_its_reference_on_the_kept_workers": ("slow",),
    "tests/routing/test_vector.py::test_bounded_equals_load_bound": ("slow",),
    "tests/routing/test_vector.py::test_factors_equal_factor": ("slow",),
    "tests/routing/test_vector.py::test_totals_and_ties_equal_the_reference": ("slow",),
    "tests/routing/test_plugins.py::test_prefix_index_matches_a_reference_model": ("slow",),
    "tests/routing/test_predictor.py::test_learns_per_tenant_and_prompt_bucket_and_beats_a_single_mean": ("slow",),
    "tests/routing/test_predictor.py::test_open_requests_are_bounded": ("slow",),
    "tests/routing/test_inflight_sums.py::test_sums_equal_the_walk_after_every_change": ("slow",),
    "tests/planner/test_measured_fit.py::test_fit_recovers_a_factor_the_model_produced": ("slow",),
    "tests/planner/test_measured.py::test_plan_sizes_from_the_measurement_and_says_so": ("slow",),
    "tests/perf/test_measure.py::test_moe_block_matches_a_per_token_reference": ("slow",),
    "tests/perf/test_calibrate.py::test_cli_calibrate_then_predict_json": ("slow",),
    "tests/perf/test_calibrate.py::test_extrapolation_to_larger_shapes": ("slow",),
    "tests/perf/test_calibrate.py::test_leave_shapes_out": ("slow",),
    "tests/sim/test_two_drivers.py::test_simulator_and_harness_make_identical_decisions": ("slow",),
    "tests/sim/test_regions.py::test_two_regions_keeps_the_pinned_tenant_in_its_region": ("slow",),
    "tests/sim/test_runner.py::test_requests_still_held_at_the_end_are_failed_not_lost": ("slow",),
    "tests/sim/test_pd_crossover.py": ("slow",),
    "tests/sim/test_recording.py::test_request_bounded_recorder_stops_once_its_requests_have_ended": ("slow",),
    "tests/engine/test_decode_time.py::test_decode_time_equals_step_time": ("slow",),
    "tests/engine/test_decode_time.py::test_affine_count_le_matches_the_bisection": ("slow",),
    "tests/engine/test_properties.py": ("slow",),                        # hypothesis over whole engine runs
    "tests/engine/test_blocks.py::test_random_operations_preserve_invariants": ("slow",),
    "tests/emulator/test_request_parser.py::test_any_body_is_a_request_or_a_4xx_api_error": ("slow",),
    "tests/emulator/test_request_parser.py::test_the_emulator_answers_any_json_body_with_a_result_or_an_openai_4xx":
        ("slow",),
    "tests/emulator/test_text.py::test_encode_equals_the_piecewise_reference": ("slow",),
    "tests/emulator/test_errors_and_faults.py::test_fail_requests_then_clear_and_duration_clears_by_itself": ("slow",),
    "tests/emulator/test_pd_and_events.py::test_unpulled_kv_is_freed_when_the_lease_expires": ("slow",),
    "tests/emulator/test_abort_eos_links.py::test_a_decode_request_whose_client_disconnects_during_its_kv_pull_is_dropped":
        ("slow", "wallclock"),
    "tests/emulator/test_push_stream.py::test_pushed_streams_carry_what_the_whole_answer_carries": ("slow",),
    "tests/live/test_http_limits.py": ("slow", "wallclock"),             # waits out real timeouts
    "tests/gateway/test_kv_links_live.py::test_the_gateway_avoids_a_degraded_kv_link": ("slow",),
    "tests/gateway/test_stall.py::test_a_stream_on_a_replica_that_hangs_mid_way_migrates_and_completes": ("slow",),
    "tests/gateway/test_fuzz.py::test_random_fields_never_5xx": ("slow",),
    "tests/gateway/test_kv_pairing.py::test_every_hand_off_stays_within_a_model_version": ("slow",),
    "tests/gateway/test_gateway.py::test_tenant_limits_answer_429_with_retry_after": ("slow", "wallclock"),
    "tests/gateway/test_gateway.py::test_stale_metrics_engage_safe_mode_and_fresh_ones_leave_it": ("slow", "wallclock"),
    "tests/gateway/test_kv_events.py::test_two_gateways_converge_on_the_same_prefix_view_from_kv_events": ("slow",),
    "tests/workload/test_generate.py::test_arrival_rate_and_burstiness": ("slow",),
    "tests/cli/test_deploy_flags.py::test_deploy_flags": ("slow",),
    "tests/cli/test_plan_cli.py::test_json_out_and_exit_0": ("slow",),
    "tests/cli/test_fleet_cli.py": ("slow",),                            # a plan searched for the module
    "tests/deploy/test_k8s.py::test_names_kubernetes_refuses_are_named": ("slow",),
    "tests/deploy/test_k8s.py::test_manifests_validate_against_the_kubernetes_schemas": ("slow",),
    "tests/deploy/test_k8s.py::test_gateway_config_secret_and_dns_names": ("slow",),
    "tests/perf/test_uncertainty.py::test_bands_of_the_shipped_calibration": ("slow",),   # calibrates the shipped data
    "tests/live/test_clock.py": ("wallclock",),
    "tests/emulator/test_server.py": ("wallclock",),
    "tests/emulator/test_abort_eos_links.py": ("wallclock",),
    "tests/emulator/test_lean_server.py": ("wallclock",),
    "tests/gateway/test_gateway.py": ("wallclock",),
}
"""Test tiers (markers registered in pyproject.toml): `slow` (about a second or more each; `pytest -m "not
slow"` runs the rest in about a minute of CPU: 52 s user + 2 s system measured, pure Python, no bytecode
cache, 1,563 tests), `external` (a real PostgreSQL server, Chromium or subprocess
fleets), `wallclock` (asserts on real elapsed time, with margins a loaded 2-core machine meets). CI runs
every tier. Tests using the PostgreSQL fixtures are `external` wherever they are."""

EXTERNAL_FIXTURES = frozenset({"postgres_url", "pg_database"})
"""Fixtures that start a real server: a test asking for one is `external` (and `slow`)."""
SLOW_FIXTURES = frozenset({"small_results", "small_search", "sim_run", "routing_run", "scenario_run", "plan_run"})
"""Fixtures that take minutes, or tens of seconds of CPU (the small scenario suite, a planner search,
the simulations and plan the reports are drawn from): a test asking for one is `slow`."""


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 (pytest's hook signature)
    import pytest

    for item in items:
        path, _, rest = item.nodeid.partition("::")
        name = rest.split("[", 1)[0]
        tiers = set(TIERS.get(path, ())) | set(TIERS.get(f"{path}::{name}", ()))
        fixtures = set(getattr(item, "fixturenames", ()))
        if EXTERNAL_FIXTURES & fixtures:
            tiers |= {"external", "slow"}
        if SLOW_FIXTURES & fixtures:
            tiers.add("slow")
        if "ledger_url" in fixtures and "[postgres]" in item.nodeid:
            tiers |= {"external", "slow"}  # starts (or looks for) a PostgreSQL server
        for tier in sorted(tiers):
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """Import a script of `benchmarks/` by its file stem (the scripts are not a package)."""
    def load(stem: str) -> ModuleType:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{stem}.py"
        spec = importlib.util.spec_from_file_location(stem, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[stem] = mod
        spec.loader.exec_module(mod)
        return mod
    return load
