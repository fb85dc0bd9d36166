"""Sliding-window attention in the engine's KV blocks: a windowed layer keeps only the blocks of its
window, so a long sequence holds the full layers' blocks plus at most a window's worth of the
windowed layers' (vLLM frees the blocks that leave the window), and more sequences fit."""

from __future__ import annotations

import pytest

from fleetwise.engine.api import Engine, EngineConfig
from fleetwise.engine.pools import build_pool, kv_window
from fleetwise.engine.window import KvWindow
from fleetwise.sim.runner import plan_perf, simulate
from fleetwise.spec.catalog import get_model
from fleetwise.spec.plan import PlanSpec

from .engine_factories import affine_time, drive, make_request


def test_catalog_windows_become_the_engines_layer_mix():
    assert kv_window(get_model("gemma-3-27b"), 16) == KvWindow(10, 52, 1024, 16)
    assert kv_window(get_model("mistral-7b-v0.1"), 16) == KvWindow(0, 32, 4096, 16)
    assert kv_window(get_model("llama-3.1-8b"), 16) is None


def test_blocks_are_full_layers_over_the_context_plus_windowed_layers_over_the_window():
    gemma = KvWindow(10, 52, 1024, 16)  # a window touches at most cdiv(1023, 16) + 1 = 65 blocks
    assert [gemma.blocks(n) for n in (1, 16, 17, 1024, 1040, 1041, 16_000)] == [1, 1, 2, 64, 65, 66, 216]
    assert gemma.blocks(16_000) == -(-(10 * 1000 + 52 * 65) // 62)
    mistral = KvWindow(0, 32, 4096, 16)  # every layer windowed: the window's blocks, however long
    assert [mistral.blocks(n) for n in (4096, 4112, 4113, 32_768)] == [256, 257, 257, 257]
    assert gemma.max_tokens(216, 131_072) == 16_016 and gemma.blocks(16_017) == 217


def test_a_windowed_engine_runs_long_sequences_side_by_side_and_returns_every_block():
    """400 blocks: a 7,300-token sequence needs 457 blocks in full (it never fits), 129 with gemma's
    window (three fit side by side)."""
    window = KvWindow(10, 52, 1024, 16)
    engine = Engine("w", "mixed", EngineConfig(), 400, affine_time, window=window)
    assert engine.config.enable_prefix_caching  # on: these prompts carry no hashes and share nothing
    reqs = [make_request(i, prompt=7000, output=300) for i in range(3)]

    def check(e: Engine) -> None:
        e.pool.check()
        assert e.pool.num_used <= 400

    trace = drive(engine, reqs, check=check)
    assert sorted(trace.finish_s) == ["0", "1", "2"] and trace.preempted == 0
    assert engine.pool.num_used == 0 and engine.pool.num_free == 400
    assert max(o for o in (s.num_seqs for s in trace.steps)) == 3  # all three ran at once
    full = Engine("f", "mixed", EngineConfig(enable_prefix_caching=False), 400, affine_time)
    assert not full.fits(reqs[0]) and engine.fits(reqs[0])
    assert (window.blocks(7300), -(-7300 // 16)) == (129, 457)


def _gemma_plan(tmp_path, windowed: bool) -> PlanSpec:
    model = get_model("gemma-3-27b")
    if not windowed:
        model = model.model_copy(update={"sliding_window": None, "window_layers": None})
    path = tmp_path / f"gemma-{windowed}.json"
    path.write_text(model.model_dump_json())
    return PlanSpec(pools=[{"name": "g", "accelerator": "h100-sxm", "model": str(path)}])


def test_a_windowed_model_holds_more_long_sequences_than_the_same_model_without_its_window(tmp_path):
    """gemma-3-27b on one H100: 2,398 blocks. A 12,200-token sequence holds 763 of them without the
    window (3 fit, a 4th admitted by chunks) and 178 with it: all 12 requests run at once."""
    assert (KvWindow(10, 52, 1024, 16).blocks(12_200), -(-12_200 // 16)) == (178, 763)
    reqs = [make_request(i, prompt=12_000, output=200, arrival_s=0.01 * i) for i in range(12)]
    got = {}
    for windowed in (True, False):
        plan = _gemma_plan(tmp_path, windowed)
        build = build_pool(plan.pools[0], plan_perf(plan), "plan: pools.0")
        s = simulate(plan, reqs).summary
        rep = s["per_replica"][0]
        got[windowed] = (build.kv_capacity_tokens // 16, build.max_model_len, s["requests_completed"],
                         rep["preemptions"], max(rep["running"]["value"]))
    assert got[True] == (2398, 131_072, 12, 0, 12)  # windowed, the whole context fits one replica
    assert got[False] == (2398, 2398 * 16, 12, 0, 4)


def test_mistral_sequences_past_the_window_hold_only_its_blocks():
    """mistral-7b-v0.1 windows every layer at 4,096: a 20,000-token prompt holds 257 blocks
    (1,251 without the window), and fusing decode passes changes nothing."""
    window = kv_window(get_model("mistral-7b-v0.1"), 16)
    assert window is not None
    runs = {}
    for bundle in (1, 64):
        peak: list[int] = []

        def check(e: Engine, peak: list[int] = peak) -> None:
            e.pool.check()
            peak.append(e.pool.num_used)

        engine = Engine("m", "mixed", EngineConfig(max_bundle_steps=bundle), 600, affine_time, window=window)
        trace = drive(engine, [make_request(i, prompt=20_000, output=150, arrival_s=0.05 * i) for i in range(2)],
                      check=check)
        assert sorted(trace.finish_s) == ["0", "1"] and trace.preempted == 0
        assert max(peak) == 2 * 257 and engine.pool.num_used == 0
        runs[bundle] = trace
    assert len(runs[64].steps) < len(runs[1].steps)
    for rid, t in runs[1].finish_s.items():
        assert runs[64].finish_s[rid] == pytest.approx(t, rel=1e-12)
