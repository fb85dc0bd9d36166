"""The shared engine driver: per-request step outputs, KV events through `StepOutput`, and the
driver on the simulator's clock giving the engine test harness's exact times."""

from __future__ import annotations

from collections import Counter

from engine_factories import drive, make_engine, make_request

from fleetwise.engine.driver import DOWN, EngineDriver
from fleetwise.sim.events import EventLoop


def requests(n: int = 12):
    return [make_request(i, prompt=200 + 37 * i, output=5 + 3 * i, arrival_s=0.002 * i) for i in range(n)]


def test_per_request_tokens_add_up_to_each_output_and_to_every_step_total():
    for bundle in (1, 64):
        eng = make_engine(max_bundle_steps=bundle)
        eng.per_request_outputs = True
        tr = drive(eng, requests())
        got: Counter[int] = Counter()
        for out in tr.outputs:
            assert out.tokens is not None
            assert sum(n for _, n in out.tokens) == out.tokens_generated
            got.update(dict(out.tokens))
        assert got == {r.request_id: r.output_tokens for r in requests()}


def test_per_request_tokens_are_off_by_default_and_fused_steps_still_form():
    tr = drive(make_engine(max_bundle_steps=64), requests())
    assert all(out.tokens is None and out.kv_events is None for out in tr.outputs)
    assert any(s.num_passes > 1 for s in tr.steps)


def test_kv_events_come_out_with_the_step_that_cached_the_prompt():
    eng = make_engine(num_blocks=200, block_size=16)
    eng.enable_kv_events()
    reqs = [make_request(0, prompt=1100, output=3, hashes=(5, 6, 7)),
            make_request(1, prompt=1100, output=3, hashes=(5, 6, 9), arrival_s=1.0)]
    tr = drive(eng, reqs)
    stored = [h for out in tr.outputs for ok, h in (out.kv_events or []) if ok]
    # Full 16-token blocks are cached: 5, 6 and the first 64 tokens of 7 (1024..1087); the second
    # request reuses 5 and 6 and stores only 9.
    assert stored == [5, 6, 7, 9]


def test_a_stopped_driver_ignores_its_step_end_and_counts_busy_time_to_the_stop():
    loop = EventLoop()
    seen = []
    eng = make_engine()
    drv = EngineDriver(eng, loop, lambda d, now, start, out: seen.append(now))
    eng.add_request(make_request(0, prompt=4000, output=4))
    drv.kick(0.0)
    loop.run(until_s=0.0)
    assert drv.busy and drv.step is not None
    end = drv.step_end_s()
    drv.stop(end / 2)
    drv.state = DOWN
    eng.abort_all()
    loop.run()
    assert seen == [] and drv.busy_s == end / 2 and not drv.busy
