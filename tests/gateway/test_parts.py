"""The gateway's parts without sockets: metrics parsing, breaker, token buckets, SSE framing,
prefix hashes, request parsing, the CLI's config building."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwise.core import tokens
from fleetwise.errors import SpecError
from fleetwise.gateway.backends import Backends, Breaker
from fleetwise.gateway.call import usage_tokens
from fleetwise.gateway.config import BackendSpec, BreakerSpec, TenantSpec
from fleetwise.gateway.idempotency import IdempotencyStore
from fleetwise.gateway.limits import TenantLimiter, TokenBucket
from fleetwise.gateway.migration import COUNTED_USAGE
from fleetwise.gateway.openai import (
    ClientError,
    parse_json_body,
    parse_request,
    prompt_blocks,
    with_stream_options,
    with_stream_options_reference,
)
from fleetwise.gateway.prompt_tokens import FleetwiseTokenizer
from fleetwise.gateway.scrape import parse_metrics
from fleetwise.gateway.upstream import SseFramer

VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
vllm:num_requests_waiting{model_name="a"} 7.0
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:gpu_cache_usage_perc{model_name="a"} 0.99
vllm:prefix_cache_queries_total{model_name="a"} 200.0
vllm:prefix_cache_hits_total{model_name="a"} 50.0
vllm:time_to_first_token_seconds_sum{model_name="a"} 3.0
vllm:time_to_first_token_seconds_count{model_name="a"} 6.0
vllm:num_requests_swapped{model_name="a"} NaN
"""


def test_vllm_metrics_page() -> None:
    ld = parse_metrics(VLLM_PAGE)
    assert (ld.running, ld.waiting, ld.kv_usage, ld.prefix_hit_rate, ld.ttft_mean_s) == (5, 7, 0.25, 0.25, 0.5)
    assert ld.itl_mean_s is None


def test_sglang_and_llamacpp_pages() -> None:
    sg = parse_metrics('sglang:num_running_reqs{model_name="x"} 4\nsglang:num_queue_reqs{model_name="x"} 1\n'
                       'sglang:token_usage{model_name="x"} 0.5\nsglang:cache_hit_rate{model_name="x"} 0.75\n')
    assert (sg.running, sg.waiting, sg.kv_usage, sg.prefix_hit_rate) == (4, 1, 0.5, 0.75)
    lc = parse_metrics("llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\n")
    assert (lc.running, lc.waiting) == (2, 3)
    assert parse_metrics("garbage line\n\nfoo{ 1\n").names_seen == 0


def test_breaker_counts_consecutive_faults_then_probes() -> None:
    b = Breaker(BreakerSpec(failures=3, open_s=10))
    for t in (0.0, 1.0):
        b.fault(t)
    assert b.allows(1.0) and b.state(1.0) == "closed"
    b.success()
    for t in (2.0, 3.0, 4.0):
        b.fault(t)
    assert not b.allows(5.0) and b.state(5.0) == "open"
    assert b.allows(14.0) and b.state(14.0) == "half_open"
    b.attempt(14.0)
    assert not b.allows(14.0)  # one probe at a time
    b.fault(14.5)
    assert b.state(20.0) == "open" and b.allows(24.5)
    b.attempt(24.5)
    b.success()
    assert b.state(24.6) == "closed" and b.opens == 2


def test_token_bucket_and_tenant_limits() -> None:
    tb = TokenBucket(rate=2.0, burst_s=1.0)
    assert [tb.take(1, 0.0), tb.take(1, 0.0)] == [0.0, 0.0]
    assert tb.take(1, 0.0) == pytest.approx(0.5)
    assert tb.take(1, 0.5) == 0.0
    lim = TenantLimiter(TenantSpec(name="t", max_concurrency=2, tokens_per_s=100))
    a1 = lim.admit(50, 0.0)
    lim.admit(50, 0.0)
    with pytest.raises(ClientError) as e:
        lim.admit(1, 0.0)
    assert e.value.status == 429 and "in flight" in e.value.message
    a1.release()
    with pytest.raises(ClientError) as e:
        lim.admit(50, 0.1)
    assert e.value.retry_after_s == 1.0 and "tokens/s" in e.value.message
    assert (lim.admitted, lim.refused, lim.active) == (2, 2, 1)


def test_sse_framer_forwards_whole_events_only() -> None:
    f = SseFramer(1 << 20)
    assert f.feed(b"data: {\"a\":") == b""
    assert f.feed(b" 1}\n\ndata: {\"b\"") == b"data: {\"a\": 1}\n\n"
    assert f.feed(b": 2}\n\ndata: [DONE]\n\n") == b"data: {\"b\": 2}\n\ndata: [DONE]\n\n"
    assert f.events == 3 and f.buf == b""


def test_sse_framer_relays_crlf_and_cr_streams_as_lf() -> None:
    """SSE lines may end with CRLF (sse-starlette's default) or CR: every split of such a stream
    into two chunks relays the same LF events as the LF stream, never an early boundary."""
    lf = b'data: {"a": 1}\n\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
    crlf, cr = lf.replace(b"\n", b"\r\n"), lf.replace(b"\n", b"\r")
    for cut in range(len(crlf) + 1):
        f = SseFramer(1 << 20)
        out = f.feed(crlf[:cut]) + f.feed(crlf[cut:])
        assert out == lf and f.events == 4 and f.buf == b"", cut
    for cut in range(len(cr) + 1):  # a CR ending the stream may still be half a CRLF: it waits
        f = SseFramer(1 << 20)
        out = f.feed(cr[:cut]) + f.feed(cr[cut:])
        assert out == lf[:-len(b"data: [DONE]\n\n")] and f.buf == b"data: [DONE]\n\r", cut


def test_prompt_blocks_are_chained_and_stable() -> None:
    a = prompt_blocks("x" * 100 + "y" * 100, 50)
    b = prompt_blocks("x" * 100 + "z" * 100, 50)
    assert len(a) == 4 and a[:2] == b[:2] and a[2] != b[2]
    assert prompt_blocks("x" * 49, 50) == ()
    assert a == prompt_blocks("x" * 100 + "y" * 100, 50)
    assert prompt_blocks("\ud800" * 60, 50)  # a lone surrogate from a JSON escape still hashes


def test_parse_request_fields() -> None:
    known = frozenset({"m"})
    pr = parse_request({"model": "m", "prompt": [1, 2, 3], "max_tokens": 7}, False, known, 100, 4.0)
    assert (pr.prompt_tokens, pr.max_tokens, pr.stream) == (3, 7, False)
    pr = parse_request({"model": "m", "prompt": "abcdefgh", "max_completion_tokens": 2, "stream": True,
                        "stream_options": {"include_usage": True}}, False, known, 100, 4.0)
    assert (pr.prompt_tokens, pr.max_tokens, pr.stream, pr.include_usage) == (2, 2, True, True)
    pr = parse_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
                       True, known, 100, 4.0)
    assert pr.prompt_text == tokens.chat_text([("user", "hi")]) and pr.max_tokens is None
    for body, param in [({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
                        ({"model": "m", "prompt": "x", "max_tokens": 101}, "max_tokens"),
                        ({"model": "m", "prompt": "x", "n": 2}, "n"),
                        ({"model": "m", "prompt": [1, "a"]}, "prompt"),
                        ({"model": "m", "prompt": []}, "prompt"),
                        ({"model": "m", "prompt": "x", "max_tokens": 7.0}, "max_tokens"),
                        ({"model": "m", "prompt": ["a", "b"]}, "prompt")]:
        with pytest.raises(ClientError) as e:
            parse_request(body, False, known, 100, 4.0)
        assert e.value.status == 400 and e.value.param == param


def test_parse_json_body_bounds() -> None:
    assert parse_json_body(b'{"a": [[1]]}', 100) == {"a": [[1]]}
    assert parse_json_body(b'{"s": "[[[[[[[["}', 100) == {"s": "[[[[[[[["}
    for raw, status in [(b"x" * 101, 413), (b"", 400), (b"NaN", 400), (b'{"a": NaN}', 400),
                        (b"[" * 65 + b"]" * 65, 400), (b'"str"', 400), (b"\xc3\x28", 400)]:
        with pytest.raises(ClientError) as e:
            parse_json_body(raw, 100 if status == 413 else 10_000)
        assert e.value.status == status, raw[:20]


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"config": None, "backend": [], "prefill": [], "decode": [], "policy": None,
                               "served_model_name": [], "host": None, "port": None, "backends_file": None}
    return argparse.Namespace(**{**base, **kw})


def test_cli_builds_config_from_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fleetwise.cli.gateway_cmd import build_config

    cfg = build_config(_args(prefill=["http://127.0.0.1:1"], decode=["http://127.0.0.1:2"], policy="round-robin",
                             port=9000))
    assert [(b.key, b.role) for b in cfg.backends] == [("127.0.0.1:1", "prefill"), ("127.0.0.1:2", "decode")]
    assert (cfg.routing.policy, cfg.port) == ("round-robin", 9000)
    path = tmp_path / "g.yaml"
    path.write_text("backends: [{url: 'http://127.0.0.1:3', name: a}]\nport: 1234\n")
    cfg = build_config(_args(config=str(path), backend=["http://127.0.0.1:4"]))
    assert [b.key for b in cfg.backends] == ["a", "127.0.0.1:4"] and cfg.port == 1234
    with pytest.raises(SpecError, match="no backends"):
        build_config(_args())
    path.write_text("backends: [{url: 'http://h:1', name: a}, {url: 'http://h:2', name: a}]\n")
    with pytest.raises(SpecError, match="duplicate name"):
        build_config(_args(config=str(path)))
    cfg = build_config(_args(backend=["http://127.0.0.1:5"], tokenizer="fleetwise", hash_block_tokens=16))
    assert (cfg.tokenizer, cfg.backends[0].kv_events, cfg.limits.hash_block_tokens) == ("fleetwise", None, 16)



def test_view_carries_the_gateways_own_tokens_as_of_the_scrape() -> None:
    from fleetwise.gateway.backends import Backend
    from fleetwise.gateway.config import BackendSpec
    from fleetwise.gateway.scrape import EngineLoad

    b = Backend(spec=BackendSpec(url="http://h:1"), breaker=Breaker(BreakerSpec()))
    first = b.work(100, 20)
    b.scraped(EngineLoad(running=1, waiting=2), 5.0)
    b.work(50, 10)  # sent after the scrape: the policy's own ledger counts it, not the view
    v = b.view(6.0)
    assert (v.queued_prefill_tokens, v.running_decode_tokens, v.queued_requests, v.reported_at_s) == (100, 20, 2, 5.0)
    b.done(first[0], 0)  # first token
    b.scraped(EngineLoad(running=2), 7.0)
    assert (b.view(7.0).queued_prefill_tokens, b.view(7.0).running_decode_tokens) == (50, 30)
    d = Backend(spec=BackendSpec(url="http://h:2", role="decode"), breaker=Breaker(BreakerSpec()))
    assert d.work(100, 20) == (0, 20)


STREAM_OPTION_BODIES = [
    b'{"model": "m", "prompt": "hi", "stream": true}',
    b'{"model":"m","prompt":"h\\u00e9 \\"q\\" }","stream":true}  \r\n\t ',
    '{"model": "m", "messages": [{"role": "user", "content": "caf\u00e9 {x}"}], "stream": true}'.encode(),
    b'{"model": "m", "prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": false}}',
    b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": false, "k": 1}}',
    b'{}',
]


@pytest.mark.parametrize("raw", STREAM_OPTION_BODIES)
def test_stream_options_spliced_equal_the_reference(raw: bytes) -> None:
    """Splicing `stream_options` into the client's bytes gives the same document as encoding the
    merged body again (the client's own options kept, ours winning on the keys we set)."""
    body = parse_json_body(raw, 1 << 20)
    for opts in (COUNTED_USAGE, {"include_usage": True}):
        fast = with_stream_options(raw, body, opts)
        assert parse_json_body(fast, 1 << 20) == parse_json_body(with_stream_options_reference(body, opts), 1 << 20)
        assert parse_json_body(fast, 1 << 20)["stream_options"] == {**(body.get("stream_options") or {}), **opts}
    if "stream_options" not in body:  # spliced: the client's bytes are kept as they were
        assert with_stream_options(raw, body, {"include_usage": True}).startswith(raw.rstrip()[:-1])


TURN_TEXT = st.lists(st.sampled_from([" ", "\n", "\t", "a", "b", "<", "|", ">", "é", "\u3000", "\r", "  ",
                                      *(" " + w for w in tokens.WORDS[:20])]), max_size=30).map("".join)
"""Turn contents: vocabulary words, other characters and whitespace runs of every kind."""


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "system", "my role"]), TURN_TEXT), max_size=6),
       st.booleans(), st.booleans())
def test_chat_turns_tokenized_apart_equal_the_whole_prompt(turns: list[tuple[str, str]], gen: bool,
                                                           cont: bool) -> None:
    """No piece of the encoder straddles two turns of the template, so the per-turn cache gives
    exactly the ids of the whole rendered prompt (and the same ids again from the cache)."""
    tok = FleetwiseTokenizer(cache_chars=64)  # small: turns are evicted and encoded again
    parts = tokens.chat_parts(turns, gen, cont)
    want = tokens.encode(tokens.chat_text(turns, gen, cont))
    assert tok.chat_parts_ids(parts) == want
    assert tok.chat_parts_ids(parts) == want
    assert tok.chat_ids("".join(parts)) == want


def test_turn_cache_is_bounded_in_characters_and_keeps_the_recent() -> None:
    tok = FleetwiseTokenizer(cache_chars=100)
    a, b, c = "<|user|>\n" + "x" * 40 + "\n", "<|user|>\n" + "y" * 40 + "\n", "<|user|>\n" + "z" * 40 + "\n"
    tok.chat_parts_ids([a, b])
    tok.chat_parts_ids([a])  # a is the most recent now
    tok.chat_parts_ids([c])  # 150 characters: b, the least recent, goes
    assert list(tok._turns._ids) == [a, c] and tok._turns.chars == 100


def test_usage_tokens_reads_the_last_count_and_refuses_impossible_ones() -> None:
    assert usage_tokens(b'data: {"usage": {"prompt_tokens": 8, "completion_tokens": 12}}\n\n') == 12
    assert usage_tokens(b'{"usage": {"completion_tokens": 2147483647}}') == 2147483647
    assert usage_tokens(b'{"usage": {"completion_tokens": 2147483648}}') == 0  # no request has that many
    assert usage_tokens(b'{"usage": {"completion_tokens": ' + b"9" * 5000 + b"}}") == 0
    assert usage_tokens(b'{"choices": []}') == 0


def test_a_backend_removed_re_added_and_removed_again_stays_listed_while_it_drains() -> None:
    """The first removal's last request ending used to drop the second removal's draining entry
    (same name), hiding a backend with a request in flight from /admin/fleet and the metrics."""
    bs = Backends(BreakerSpec(), 4)
    spec = BackendSpec(url="http://127.0.0.1:1", name="b0")  # type: ignore[call-arg]
    old, _ = bs.upsert(spec)
    old.in_flight = 1
    bs.remove("b0")
    new, added = bs.upsert(spec)
    assert added and new is not old
    new.in_flight = 1
    bs.remove("b0")
    old.in_flight = 0
    bs.released(old)
    assert bs.get("b0") is new and list(bs.draining) == ["b0"]
    new.in_flight = 0
    bs.released(new)
    assert bs.get("b0") is None and not bs.draining


def test_the_byte_budget_evicts_kept_answers_never_a_key_still_in_flight() -> None:
    store = IdempotencyStore(ttl_s=60.0, max_bytes=10)
    assert store.begin("t", "slow", b"p", 0.0) is None  # in flight throughout
    for key in ("a", "b", "c"):
        assert store.begin("t", key, b"p", 1.0) is None
        store.finish("t", key, 200, b"application/json", b"x" * 8, keep=True)
    with pytest.raises(ClientError) as err:  # still running: the same key again waits, never runs twice
        store.begin("t", "slow", b"p", 2.0)
    assert err.value.status == 409
    assert store.begin("t", "b", b"p", 2.0) is None  # evicted for "c": claimable again
    assert store.begin("t", "c", b"p", 2.0).body == b"x" * 8  # type: ignore[union-attr]
