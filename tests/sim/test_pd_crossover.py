"""The disaggregation claim both ways (benchmarks/pd_crossover.py, small and seeded).

Llama-3.1-70B on 16 H200 (TP4): 3 PD splits vs colocated (3 chunk sizes), 120 requests, seed 0.
Long prompts (8192) + tight TPOT + fast link: PD wins; short prompts (512) + 2.5 Gb/s per GPU
(10 Gb/s per TP4 replica): PD loses.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("pd_crossover")


def test_long_prompts_tight_tpot_pd_wins(bench):
    r = bench.compare(8192, 100.0, seeds=[0], requests=120)
    assert r["goodput_pd"] > r["goodput_colocated"]
    assert r["verdict"] == "pd"
    best_c = r["colocated"][str(r["best_colocated_chunk"])]
    best_p = r["pd"][r["best_pd_split"]]
    # Why: colocated decodes share steps with prompt chunks (TPOT over the 40 ms target), PD decodes do not.
    assert best_c["tpot_p50_s"]["mean"] > bench.TPOT_SLO_S > best_p["tpot_p99_s"]["mean"]


def test_short_prompts_slow_link_pd_loses(bench):
    r = bench.compare(512, 2.5, seeds=[0], requests=120)
    assert r["goodput_pd"] < r["goodput_colocated"]
    assert r["verdict"] == "colocated"
    # Why: a 512-token prompt's KV (168 MB) takes longer on 4 x 2.5 Gb/s than the whole TTFT target.
    best_p = r["pd"][r["best_pd_split"]]
    assert best_p["kv_p50_s"]["mean"] > r["ttft_slo_s"]


def test_decode_step_inflated_by_prompt_chunk(bench):
    rows = bench.step_breakdown()["rows"]
    alone = next(x for x in rows if x["decodes"] == 16 and x["prompt_chunk"] == 0)
    mixed = next(x for x in rows if x["decodes"] == 16 and x["prompt_chunk"] == 2048)
    assert alone["bound"] == "memory" and mixed["bound"] == "compute"
    assert mixed["total_s"] > 4 * alone["total_s"]


def test_transfer_grows_with_prompt(bench):
    a = bench.run_one(bench.pd_plan(2, 2, 25.0), 1024, 40, seed=0)
    b = bench.run_one(bench.pd_plan(2, 2, 25.0), 4096, 40, seed=0)
    assert b["kv_bytes_per_request"] > 3.5 * a["kv_bytes_per_request"]
    assert b["kv_p50_s"] > 3.5 * a["kv_p50_s"]
