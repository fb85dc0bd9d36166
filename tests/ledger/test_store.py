"""The ledger store on both backends: once per key, replacement of failed attempts, work kept,
tenants apart, summaries exact, concurrent writers of one key agree."""

from __future__ import annotations

import threading

import pytest

from fleetwise.ledger import Usage, WorkItem, open_ledger
from fleetwise.spec.failure_domains import FailureDomainSpec


def usage(key: str, rid: str, status: str = "completed", tenant: str = "acme", prompt: int = 100,
          cached: int = 20, delivered: int = 10, ended: float = 1000.0, work: tuple[WorkItem, ...] | None = None) -> Usage:
    if work is None:
        work = (WorkItem("prefill", "first", "prefill", "prefill-0", prompt - cached, 0.5),
                WorkItem("decode", "first", "decode", "decode-0", delivered, 2.0))
    return Usage(key, rid, tenant, "llama", "prefill", "decode", status, "" if status == "completed" else "boom",  # type: ignore[arg-type]
                 prompt, cached, delivered, ended - 3.0, ended, work)


def test_a_key_is_billed_once_and_every_attempt_is_work(ledger_url):
    with open_ledger(ledger_url) as led:
        assert led.record(usage("k1", "r1")) == "billed"
        assert led.record(usage("k1", "r2", delivered=12)) == "duplicate"  # client retry of a completed key
        rows = led.rows()
        assert [(r.idempotency_key, r.request_id, r.attempts, r.billed_generated_tokens) for r in rows] == [
            ("k1", "r1", 2, 10)]
        assert [(w[2], w[3], w[7]) for w in led.work()] == [
            ("r1", "prefill", 80), ("r1", "decode", 10), ("r2", "prefill", 80), ("r2", "decode", 12)]


def test_a_failed_attempt_is_replaced_by_the_retry_that_completes(ledger_url):
    with open_ledger(ledger_url) as led:
        assert led.record(usage("k", "r1", status="failed", delivered=3)) == "billed"
        row = led.get("acme", "k")
        assert row is not None and (row.status, row.billed_prompt_tokens, row.billed_generated_tokens) == ("failed", 0, 0)
        assert led.record(usage("k", "r2", delivered=10)) == "replaced"
        assert led.record(usage("k", "r3", status="failed")) == "duplicate"
        row = led.get("acme", "k")
        assert row is not None
        assert (row.request_id, row.status, row.attempts, row.billed_prompt_tokens, row.billed_cached_tokens,
                row.billed_generated_tokens) == ("r2", "completed", 3, 100, 20, 10)
        assert len(led.rows()) == 1 and len(led.work()) == 6


def test_bill_failed_delivered_bills_what_the_client_received(tmp_path):
    with open_ledger(str(tmp_path / "l.db"), FailureDomainSpec(bill_failed="delivered")) as led:
        led.record(usage("k", "r1", status="failed", delivered=3))
        led.record(usage("c", "r2", status="cancelled", delivered=4))
        got = {r.idempotency_key: (r.billed_prompt_tokens, r.billed_generated_tokens) for r in led.rows()}
    assert got == {"k": (100, 3), "c": (100, 4)}


def test_cancelled_is_billed_for_delivered_tokens_by_default(tmp_path):
    with open_ledger(str(tmp_path / "l.db")) as led:
        led.record(usage("c", "r", status="cancelled", delivered=4))
        row = led.get("acme", "c")
    assert row is not None and (row.billed_prompt_tokens, row.billed_cached_tokens, row.billed_generated_tokens) == (100, 20, 4)


def test_equal_keys_of_two_tenants_never_collide(ledger_url):
    with open_ledger(ledger_url) as led:
        assert led.record(usage("k", "r1", tenant="a")) == "billed"
        assert led.record(usage("k", "r2", tenant="b")) == "billed"
        assert sorted((r.tenant, r.request_id) for r in led.rows()) == [("a", "r1"), ("b", "r2")]


def test_summary_per_tenant_and_pool(ledger_url):
    with open_ledger(ledger_url) as led:
        led.record(usage("k1", "r1", tenant="a", ended=100.0))
        led.record(usage("k1", "r1b", tenant="a", ended=101.0))  # duplicate: work only
        led.record(usage("k2", "r2", tenant="b", status="failed", ended=200.0, work=(
            WorkItem("prefill", "first", "prefill", "prefill-0", 80, 0.5),
            WorkItem("reprefill", "kv_transfer_failed", "prefill", "prefill-1", 80, 0.5))))
        s = led.summary()
        since = led.summary(since=150.0)
        only_a = led.summary(tenant="a")
    a, b, tot = s["tenants"]["a"], s["tenants"]["b"], s["total"]
    assert (a["requests"], a["completed"], a["attempts"], a["duplicate_attempts"]) == (1, 1, 2, 1)
    assert (a["billed_prompt_tokens"], a["billed_cached_tokens"], a["billed_generated_tokens"]) == (100, 20, 10)
    assert (a["computed_tokens"], a["gpu_s"], a["recovery_gpu_s"]) == (180, 5.0, 0.0)
    assert (b["requests"], b["failed"], b["billed_prompt_tokens"], b["computed_tokens"], b["recovery_gpu_s"]) == (
        1, 1, 0, 160, 0.5)
    assert (tot["requests"], tot["billed_generated_tokens"], tot["computed_tokens"]) == (2, 10, 340)
    assert s["pools"] == {
        "decode": {"billed_prompt_tokens": 0, "billed_cached_tokens": 0, "billed_generated_tokens": 10,
                   "computed_tokens": 20, "gpu_s": 4.0, "recovery_gpu_s": 0.0},
        "prefill": {"billed_prompt_tokens": 100, "billed_cached_tokens": 20, "billed_generated_tokens": 0,
                    "computed_tokens": 320, "gpu_s": 2.0, "recovery_gpu_s": 0.5},
    }
    assert list(since["tenants"]) == ["b"] and since["total"]["requests"] == 1
    assert list(only_a["tenants"]) == ["a"]


def test_concurrent_writers_of_one_key_bill_it_once(ledger_url):
    """Writers in separate connections (as separate gateway processes would be) race on one key."""
    n = 4
    leds = [open_ledger(ledger_url) for _ in range(n)]
    outcomes: list[str] = []
    barrier = threading.Barrier(n)

    def write(k: int) -> None:
        barrier.wait(timeout=10)
        outcomes.append(leds[k].record(usage("same", f"r{k}")))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    rows = leds[0].rows()
    for led in leds:
        led.close()
    assert sorted(outcomes) == ["billed", "duplicate", "duplicate", "duplicate"]
    assert len(rows) == 1 and rows[0].attempts == n


def test_usage_rejects_impossible_counts():
    with pytest.raises(ValueError, match="cached_tokens=5 exceeds prompt_tokens=4"):
        usage("k", "r", prompt=4, cached=5)
    with pytest.raises(ValueError, match="status='lost'"):
        usage("k", "r", status="lost")
