"""Engine scheduling with exact expectations: chunking, sharing, caching, preemption, roles."""

from __future__ import annotations

import pytest
from engine_factories import affine_time, check_engine, drive, make_engine, make_request

from fleetwise.engine.api import EngineConfig
from fleetwise.engine.records import NO_ENTRIES
from fleetwise.errors import InfeasibleError, SpecError
from fleetwise.perf.types import BatchShape, SeqWork


def test_long_prompt_takes_four_chunked_steps_then_decodes():
    eng = make_engine(max_num_batched_tokens=512)
    eng.add_request(make_request(0, prompt=2048, output=3))
    for i in range(4):
        step = eng.schedule()
        assert step is not None
        assert (step.prefill_tokens, step.decode_tokens, step.num_passes) == (512, 0, 1)
        assert step.duration_s == affine_time(BatchShape.of([SeqWork(512, 512 * i)]))
        out = eng.complete()
        assert out.first_tokens == ([("0", step.duration_s)] if i == 3 else [])
        check_engine(eng)
    step = eng.schedule()
    assert step is not None and (step.num_passes, step.decode_tokens) == (2, 2)
    expected = affine_time(BatchShape.of([SeqWork(1, 2048)])) + affine_time(BatchShape.of([SeqWork(1, 2049)]))
    assert step.duration_s == pytest.approx(expected, rel=1e-12)
    out = eng.complete()
    assert (out.finished, out.tokens_generated, out.itl_samples) == (["0"], 2, [(step.duration_s / 2, 2)])
    assert eng.schedule() is None and not eng.has_work and eng.kv_usage == 0.0


def test_decodes_share_steps_with_a_prefill_chunk():
    eng = make_engine(max_num_batched_tokens=512)
    eng.add_request(make_request(0, prompt=16, output=50))
    assert eng.schedule() is not None
    eng.complete()
    eng.add_request(make_request(1, prompt=2048, output=5))
    step = eng.schedule()
    assert step is not None
    assert (step.num_seqs, step.decode_tokens, step.prefill_tokens, step.num_passes) == (2, 1, 511, 1)
    assert step.duration_s == affine_time(BatchShape.of([SeqWork(1, 16), SeqWork(511, 0)]))
    assert step.duration_s > 2 * affine_time(BatchShape.of([SeqWork(1, 16)]))
    out = eng.complete()
    assert (out.tokens_generated, out.itl_samples) == (1, [(step.duration_s, 1)])


def test_equal_block_hashes_share_blocks_and_hit_the_cache():
    eng = make_engine(num_blocks=200)
    eng.add_request(make_request(0, prompt=1024, output=20, hashes=(7, 8)))
    assert eng.schedule() is not None and eng.complete().prefix_hit_tokens == 0
    assert eng.kv_usage == 64 / 200
    twin = make_request(1, prompt=1024, output=20, hashes=(7, 8))
    assert eng.cached_prefix_tokens(twin) == 1008  # all but the last block: one token is recomputed
    assert eng.cached_prefix_tokens(make_request(2, prompt=1024, hashes=(7, 9))) == 512
    assert eng.cached_prefix_tokens(make_request(3, prompt=1024)) == 0
    eng.add_request(twin)
    step = eng.schedule()
    assert step is not None and step.prefill_tokens == 16
    out = eng.complete()
    assert out.prefix_hit_tokens == 1008
    assert eng.pool.num_used == 64 + 1 + 1  # shared spans + each one's private block
    assert eng.prefix_hit_rate == 1008 / 2048
    check_engine(eng)


def test_lru_evicts_the_least_recently_finished_prefix_first():
    eng = make_engine(num_blocks=100)
    for rid, h in ((0, 1), (1, 2)):
        eng.add_request(make_request(rid, prompt=512, output=1, hashes=(h,)))
        assert eng.schedule() is not None
        assert eng.complete().finished == [str(rid)]
    assert eng.pool.num_cached == 64 and eng.kv_usage == 0.0
    eng.add_request(make_request(2, prompt=800, output=1))  # 50 blocks: 36 free + 14 evicted
    assert eng.schedule() is not None
    eng.complete()
    assert eng.cached_prefix_tokens(make_request(3, prompt=512, hashes=(1,))) == 18 * 16
    assert eng.cached_prefix_tokens(make_request(4, prompt=512, hashes=(2,))) == 31 * 16
    check_engine(eng)


def test_newest_running_request_is_preempted_when_blocks_run_out():
    eng = make_engine(num_blocks=10)
    a, b = make_request(0, prompt=64, output=60), make_request(1, prompt=64, output=60)
    tr = drive(eng, [a, b], check=check_engine)
    preempting = [i for i, out in enumerate(tr.outputs) if out.preempted]
    assert [tr.outputs[i].preempted for i in preempting] == [["1"]]
    # step 1 prefills both, step 2 fuses the 16 passes of contexts 64..79, step 3 needs 2 blocks
    assert preempting == [2] and tr.steps[1].num_passes == 16
    assert tr.tokens == 120 and tr.preempted == 1
    assert tr.finish_s["0"] < tr.finish_s["1"]
    assert eng.pool.num_used == 0


def test_preempted_request_is_requeued_at_the_front():
    eng = make_engine(num_blocks=10)
    for rid in range(2):
        eng.add_request(make_request(rid, prompt=64, output=60))
    eng.add_request(make_request(2, prompt=64, output=1))  # no blocks for it, then behind 1
    for _ in range(3):
        assert eng.schedule() is not None
        eng.complete()
    assert [st.req.request_id for st in eng._waiting] == ["1", "2"]  # noqa: SLF001


def test_prefill_role_hands_off_and_holds_blocks_until_release():
    eng = make_engine("prefill", num_blocks=100)
    eng.add_request(make_request(5, prompt=100, output=7))
    step = eng.schedule()
    assert step is not None and step.prefill_tokens == 100
    out = eng.complete()
    assert (out.handoffs, out.first_tokens, out.finished, out.tokens_generated) == (["5"], [], [], 0)
    assert (eng.num_running, eng.pool.num_used, eng.has_work) == (0, 7, False)
    eng.release("5")
    assert eng.pool.num_used == 0
    with pytest.raises(SpecError):
        eng.add_transferred(make_request(6))


def test_decode_role_admits_after_transfer_once_blocks_allow():
    eng = make_engine("decode", num_blocks=10)
    a, b = make_request(0, prompt=100, output=4), make_request(1, prompt=100, output=4)
    tr = drive(eng, [a, b], check=check_engine)
    d = [affine_time(BatchShape.of([SeqWork(1, 100 + i)])) for i in range(4)]
    assert tr.first_token_s["0"] == d[0]
    assert tr.finish_s["0"] == pytest.approx(sum(d), rel=1e-12)
    assert tr.first_token_s["1"] == pytest.approx(sum(d) + d[0], rel=1e-12)  # waited for A's blocks
    assert tr.finish_s["1"] == pytest.approx(2 * sum(d), rel=1e-12)
    assert tr.tokens == 8
    with pytest.raises(SpecError):
        eng.add_request(a)


def test_abort_all_drops_everything():
    eng = make_engine(num_blocks=40, max_num_batched_tokens=256)
    reqs = [make_request(i, prompt=200, output=30, hashes=(i,)) for i in range(4)]
    for r in reqs:
        eng.add_request(r)
    for _ in range(3):
        assert eng.schedule() is not None
        eng.complete()
    assert eng.schedule() is not None  # one in flight
    dropped = eng.abort_all()
    assert sorted(r.request_id for r in dropped) == ["0", "1", "2", "3"]
    assert (eng.num_waiting, eng.num_running, eng.busy, eng.has_work) == (0, 0, False, False)
    assert (eng.pool.num_free, eng.pool.num_cached) == (40, 0)
    assert eng.cached_prefix_tokens(reqs[0]) == 0
    assert eng.schedule() is None


def test_snapshot_fields():
    eng = make_engine(max_num_batched_tokens=512)
    eng.add_request(make_request(0, prompt=2048, output=10))
    eng.add_request(make_request(1, prompt=300, output=5))
    assert eng.schedule() is not None
    eng.complete()
    view = eng.snapshot(12.5)
    assert (view.name, view.role, view.queued_requests, view.running_requests) == ("e0", "mixed", 1, 1)
    # What vLLM's /metrics reports: no token loads (the decode tokens left need the true outputs).
    assert (view.queued_prefill_tokens, view.running_decode_tokens) == (None, None)
    full = eng.snapshot(12.5, token_loads=True)
    assert (full.queued_prefill_tokens, full.running_decode_tokens) == (2048 - 512 + 300, 10)
    assert (view.kv_usage, view.kv_capacity_tokens, view.block_size, view.reported_at_s) == (
        32 / 1000, 16000, 16, 12.5)


def test_requests_that_never_fit_are_refused():
    eng = make_engine(num_blocks=4)
    assert not eng.fits(make_request(0, prompt=60, output=10))
    with pytest.raises(InfeasibleError, match="never fit"):
        eng.add_request(make_request(0, prompt=60, output=10))
    assert eng.fits(make_request(1, prompt=60, output=5))


def test_config_rejects_budget_below_max_num_seqs():
    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=64, max_num_seqs=128)


def test_schedule_twice_without_complete_is_an_error():
    eng = make_engine()
    eng.add_request(make_request())
    assert eng.schedule() is not None and eng.busy
    with pytest.raises(RuntimeError):
        eng.schedule()


def test_step_shape_carries_the_longest_decode_row():
    """The engine's incremental aggregates equal BatchShape.of on the same rows, longest decode
    row included (decode attention at small batch is bound by it, not by the mean)."""
    shapes: list[BatchShape] = []

    def record(shape: BatchShape) -> float:
        shapes.append(shape)
        return affine_time(shape)

    eng = make_engine(max_num_batched_tokens=4096, step_time=record, max_bundle_steps=1)
    eng.add_request(make_request(0, prompt=3000, output=20))
    eng.add_request(make_request(1, prompt=40, output=20))
    assert eng.schedule() is not None
    eng.complete()
    shapes.clear()
    eng.add_request(make_request(2, prompt=700, output=5))
    assert eng.schedule() is not None
    assert shapes[0] == BatchShape.of([SeqWork(1, 3000), SeqWork(1, 40), SeqWork(700, 0)])
    assert shapes[0].max_decode_kv_tokens == 3001
    eng.complete()
    shapes.clear()
    assert eng.schedule() is not None
    assert shapes[0] == BatchShape.of([SeqWork(1, 3001), SeqWork(1, 41), SeqWork(1, 700)])


def test_preemption_that_empties_the_engine_readmits_at_once():
    """Regression (found by the property test): a request whose prefix hit pins a whole cached
    entry is preempted when its decode needs a block; the engine is then empty. It must be
    readmitted (without the pinning hits if need be) instead of returning None with work left,
    which would stall every request behind it."""
    eng = make_engine(num_blocks=24, block_size=4, max_num_seqs=2, max_num_batched_tokens=300,
                      enable_chunked_prefill=False)
    reqs = [make_request(0, 92, 1, (1, 2), 64), make_request(1, 1, 1, (), 64), make_request(2, 69, 5, (1, 2), 64)]
    reqs += [make_request(i, 1, 1, (), 64) for i in range(3, 12)]
    tr = drive(eng, reqs, check=check_engine)
    assert sorted(tr.finish_s, key=int) == [str(i) for i in range(12)]
    assert tr.tokens == 11 + 5 and tr.preempted == 1


@pytest.mark.parametrize("role", ["mixed", "prefill", "decode"])
def test_step_outputs_share_the_read_only_empty_list_and_never_fill_it(role):
    """Empty `StepOutput` lists are the shared `NO_ENTRIES` (no fresh list per step): over a run
    with chunked prompts, fused decodes, finishes, hand-offs and preemptions it stays empty, and
    every entry a step reports is in a list of that step's own."""
    reqs = [make_request(i, prompt=200 + 37 * i, output=5 + 13 * (i % 7), arrival_s=0.01 * (i // 3))
            for i in range(24)]
    tr = drive(make_engine(role, num_blocks=120, block_size=16, max_num_batched_tokens=512), reqs,
               release_after_s=0.02)
    assert NO_ENTRIES == []
    assert tr.preempted > 0 or role == "prefill"  # the pool is small: decodes outgrow it
    shared = fresh = 0
    for out in tr.outputs:
        for lst in (out.first_tokens, out.finished, out.handoffs, out.preempted, out.itl_samples, out.scheduled):
            if lst is NO_ENTRIES:
                shared += 1
            elif lst:
                fresh += 1
    assert shared > 0 and fresh > 0
    done = tr.handoff_s if role == "prefill" else tr.finish_s
    assert sorted(done) == [str(i) for i in sorted(range(24), key=str)]


def test_a_request_that_never_fits_names_the_engine_and_a_fix_a_user_can_make():
    eng = make_engine(num_blocks=4)
    with pytest.raises(InfeasibleError) as err:
        eng.add_request(make_request(7, prompt=60, output=10))
    assert str(err.value) == (
        f"request 7: 60 prompt + 10 output tokens never fit engine {eng.name!r} (its whole KV cache: 4 blocks of 16 "
        "tokens); give its pool more KV room (tp, pp, fp8, gpu_memory_utilization)")
