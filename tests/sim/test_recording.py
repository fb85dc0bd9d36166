"""The optional step recorder: results unchanged, steps inside the window, transfers all kept."""

from __future__ import annotations

from fleetwise.core.request import Request
from fleetwise.sim.recording import StepRecorder
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec


def _plan() -> PlanSpec:
    return PlanSpec(kv_link={"gbps": 100.0, "latency_s": 1e-3}, pools=[
        {"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 1},
        {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}])


REQS = [Request(str(i), i * 0.05, 512 + 64 * (i % 5), 40) for i in range(60)]


def test_recording_leaves_results_identical_and_counts_every_pass_and_token():
    plain = simulate(_plan(), REQS)
    rec = StepRecorder()
    recorded = simulate(_plan(), REQS, options=SimOptions(recorder=rec))
    plain.summary.pop("sim_wall_s")
    recorded.summary.pop("sim_wall_s")
    assert recorded.summary == plain.summary
    assert list(recorded.records.finish_s) == list(plain.records.finish_s)
    # Every prompt token is prefilled once on p-0; every output token after the first comes from a decode step.
    assert sum(s.prefill_tokens for s in rec.steps if s.replica == 0) == sum(r.prompt_tokens for r in REQS)
    assert sum(s.tokens for s in rec.steps if s.replica > 0) == sum(r.output_tokens for r in REQS)
    assert len(rec.transfers) == len(REQS) and all(t.ok for t in rec.transfers)
    for s in rec.steps:
        assert s.start_s < s.end_s and s.passes >= 1
    by_rep: dict[int, list] = {}
    for s in rec.steps:
        by_rep.setdefault(s.replica, []).append(s)
    for steps in by_rep.values():  # a replica runs one step at a time
        assert all(a.end_s <= b.start_s for a, b in zip(steps, steps[1:], strict=False))


def test_window_keeps_only_overlapping_steps():
    full, part = StepRecorder(), StepRecorder(start_s=1.0, end_s=2.0)
    simulate(_plan(), REQS, options=SimOptions(recorder=full))
    simulate(_plan(), REQS, options=SimOptions(recorder=part))
    expected = [s for s in full.steps if s.end_s >= 1.0 and s.start_s <= 2.0]
    assert part.steps == expected and 0 < len(expected) < len(full.steps)


def test_request_bounded_recorder_stops_once_its_requests_have_ended(monkeypatch):
    from fleetwise.sim import recording

    monkeypatch.setattr(recording, "CHECK_EVERY_STEPS", 16)
    reqs = [Request(str(i), i * 0.05, 512, 40) for i in range(300)]
    full, part = StepRecorder(), StepRecorder(requests=(0, 10))
    simulate(_plan(), reqs, options=SimOptions(recorder=full))
    res = simulate(_plan(), reqs, options=SimOptions(recorder=part))
    last_end = max(res.records.finish_s[:10])
    assert last_end <= part.end_s < full.steps[-1].end_s
    assert part.steps == [s for s in full.steps if s.start_s <= part.end_s]
