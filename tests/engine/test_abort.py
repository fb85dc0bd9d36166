"""`Engine.abort`: one request dropped between steps, wherever it is, its blocks freed."""

from __future__ import annotations

import pytest
from engine_factories import check_engine, make_engine, make_request

from fleetwise.engine.sequence import cdiv


def _step(eng):  # type: ignore[no-untyped-def]
    """One single-pass step (horizons 0: no fused decode passes), as a server runs them."""
    assert eng.schedule(0.0, 0.0) is not None
    out = eng.complete()
    check_engine(eng)
    return out


def test_abort_a_waiting_request_leaves_the_queue():
    eng = make_engine(max_num_seqs=1)
    eng.add_request(make_request("a", prompt=64, output=5))
    eng.add_request(make_request("b", prompt=64, output=5))
    _step(eng)  # a runs, b waits for a seat
    assert (eng.num_running, eng.num_waiting) == (1, 1)
    assert eng.abort("b") is True
    assert (eng.num_running, eng.num_waiting) == (1, 0)
    assert eng.load()[2] == 0  # no queued prefill tokens left
    check_engine(eng)


def test_abort_a_prefilling_request_frees_its_chunk_blocks():
    eng = make_engine(max_num_batched_tokens=512, block_size=16)
    eng.add_request(make_request("a", prompt=2048, output=5))
    _step(eng)  # first 512-token chunk computed
    assert eng.pool.num_used == cdiv(512, 16)
    assert eng.abort("a") is True
    assert eng.pool.num_used == 0 and not eng.has_work and eng.schedule() is None
    check_engine(eng)


def test_abort_a_decoding_request_frees_prompt_and_output_blocks():
    eng = make_engine(block_size=16)
    eng.add_request(make_request("a", prompt=100, output=50))
    eng.add_request(make_request("b", prompt=100, output=50))
    _step(eng)  # both prefilled: first tokens
    _step(eng)  # decoding
    used = eng.pool.num_used
    assert eng.abort("a") is True
    assert eng.num_running == 1 and eng.pool.num_used == used // 2
    out = _step(eng)
    assert out.tokens_generated > 0 and "a" not in out.finished
    check_engine(eng)


def test_abort_a_prefill_roles_kv_awaiting_release():
    eng = make_engine(role="prefill")
    eng.add_request(make_request("a", prompt=100, output=1))
    out = _step(eng)
    assert out.handoffs == ["a"] and eng.pool.num_used > 0
    assert eng.abort("a") is True
    assert eng.pool.num_used == 0
    check_engine(eng)


def test_abort_of_an_unknown_request_is_false_and_in_flight_is_refused():
    eng = make_engine()
    assert eng.abort("nobody") is False
    eng.add_request(make_request("a", prompt=64, output=5))
    assert eng.schedule() is not None
    with pytest.raises(RuntimeError, match="between steps"):
        eng.abort("a")
