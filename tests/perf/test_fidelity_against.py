"""benchmarks/perf_fidelity.py --against: every median/max |error| % figure of two results files compared,
the worse ones counted; the stored results against the 19067bb baseline of issue 24's criterion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def fidelity():
    bench = str(RESULTS.parent)
    sys.path.insert(0, bench)
    try:
        import perf_fidelity
    finally:
        sys.path.remove(bench)
    return perf_fidelity


def test_figures_and_worse_count(fidelity):
    before = {"in_sample": {"median_abs_pct": 1.0, "max_abs_pct": 9.0, "factors": {"gemm_mem_eff": 0.8},
                            "by_kind": {"decode": {"points": 3, "median_abs_pct": 2.0, "max_abs_pct": 5.0}}},
              "old_only": {"median_abs_pct": 1.0}}
    after = {"in_sample": {"median_abs_pct": 1.5, "max_abs_pct": 8.0, "factors": {"gemm_mem_eff": 0.9},
                           "by_kind": {"decode": {"points": 3, "median_abs_pct": 2.0, "max_abs_pct": 5.01}},
                           "worst_points": [{"median_abs_pct": 99.0}]}}
    assert fidelity.figures(after) == {"in_sample/median_abs_pct": 1.5, "in_sample/max_abs_pct": 8.0,
                                       "in_sample/by_kind/decode/median_abs_pct": 2.0,
                                       "in_sample/by_kind/decode/max_abs_pct": 5.01}
    lines, worse = fidelity.against(before, after)
    assert worse == 2
    assert [line.endswith("WORSE") for line in lines[:4]] == [True, False, False, True]
    assert lines[4] == "in_sample: 2 of 4 worse, changes sum to -0.49 points"
    assert lines[-1] == ("2 of 4 comparable figures worse by 0.51 points in all, the most in_sample/median_abs_pct +0.50"
                         " (1 figures in one document only, not compared)")
    assert fidelity.against(before, before)[0][-1] == "0 of 5 comparable figures worse"


def test_stored_results_against_the_baseline(fidelity):
    """The stored figures against commit 19067bb's (the robust fit, the tile-padding cap): 28 of 84 worse by 12.70
    points in all, listed in docs/perf-model.md with their cause."""
    base = json.loads((RESULTS / "perf_fidelity_19067bb.json").read_text(encoding="utf-8"))
    now = json.loads((RESULTS / "perf_fidelity.json").read_text(encoding="utf-8"))
    lines, worse = fidelity.against(base, now)
    assert worse == 28 and lines[-1].startswith(
        "28 of 84 comparable figures worse by 12.70 points in all, the most held_out/qwen3-30b-a3b/by_kind/decode/"
        "max_abs_pct +2.87")
    assert lines[-6:-1] == ["in_sample: 5 of 8 worse, changes sum to +1.56 points",
                            "held_out: 2 of 16 worse, changes sum to -11.42 points",
                            "held_out_kinds: 8 of 24 worse, changes sum to -7.78 points",
                            "held_out_shapes: 6 of 8 worse, changes sum to +0.78 points",
                            "extrapolation: 7 of 28 worse, changes sum to -20.38 points"]
