"""The failure-domain decisions (`FailureDomainSpec`) enforced in the simulator, and what they cost.

Owns, per request: the KV lease between a prefill's hand-off and the decode side's ack, the
re-prefill and migration counts, the tokens already streamed (a migration continues from
them), and the run's accounting (`report()`). The runner calls `lost(...)` whenever an attempt
of a request cannot go on (a replica lost, a transfer failed, a lease expired, a decode replica
refused the KV); this module decides: prefill again, migrate, or fail.

Cost model (modelled, not measured; all GPU-seconds are the perf model's time of a lone prefill
of the attempt's context on the replica concerned, times its GPUs and its slowdown):
- `recovery_gpu_s`: the prefills of re-prefill and migration attempts (prompt, or prompt +
  streamed tokens for a migration), charged when the attempt is routed;
- `wasted_gpu_s`: prefills whose KV was thrown away (the attempt had finished its prefill when
  it was lost; work lost in the middle of a prefill is not counted, so this is a lower bound);
- `orphaned_kv_byte_s`: KV bytes held by a prefill replica under a lease that ended without an
  ack, times the seconds from hand-off until they were freed.
Queueing of a recovery attempt is not priced here: it happens in the engines, where it shows up
in TTFT and end-to-end latency.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fleetwise.core.request import Request
from fleetwise.ledger.usage import Usage, billed
from fleetwise.perf.types import BatchShape, SeqWork
from fleetwise.sim.network import TRANSFER_END
from fleetwise.spec.failure_domains import FailureDomainSpec

if TYPE_CHECKING:
    from fleetwise.sim.columns import Records
    from fleetwise.sim.events import EventLoop
    from fleetwise.sim.faults import FaultInjector
    from fleetwise.sim.fleet import Replica
    from fleetwise.sim.network import KvNetwork


class RecoveryTarget(Protocol):
    """What recovery acts on: the simulation's loop, network, replicas, requests, records and faults,
    and three calls (the runner satisfies it, so this module never imports the runner)."""

    loop: EventLoop
    net: KvNetwork
    reps: list[Replica]
    reqs: list[Request]
    rec: Records
    faults: FaultInjector

    def route_and_dispatch(self, i: int, now_s: float) -> None:
        """Route request `i` again and send it to the chosen replica(s)."""
        ...

    def release_prefill(self, rep: Replica, i: int, now_s: float) -> None:
        """Free request `i`'s KV on prefill replica `rep`."""
        ...

    def fail(self, i: int, now_s: float, reason: str, rep: Replica | None) -> None:
        """End request `i` as failed for `reason`."""
        ...


@dataclass(slots=True, init=False)
class Lease:
    """KV held by prefill replica `replica` for request attempt `attempt` since `start_s`
    (one per hand-off: its own `__init__`, as a compiled dataclass's generated one runs interpreted)."""

    attempt: int
    replica: int
    start_s: float
    nbytes: float
    transfer: int = -1

    def __init__(self, attempt: int, replica: int, start_s: float, nbytes: float, transfer: int = -1) -> None:
        self.attempt, self.replica, self.start_s, self.nbytes, self.transfer = attempt, replica, start_s, nbytes, transfer


class Recovery:
    """Leases, re-prefills, migrations and their accounting for one simulation."""

    def __init__(self, sim: RecoveryTarget, decisions: FailureDomainSpec) -> None:
        self.sim = sim
        self.d = decisions
        n = len(sim.reqs)
        self.stride = 1 + decisions.max_reprefills + decisions.max_migrations
        """Transfer tags are `index * stride + attempt` (attempts are bounded by the decisions)."""
        self.base = array("q", [0]) * n
        """Tokens streamed before the current attempt (a migration's continuation starts after them)."""
        self.prefill_token = array("b", [0]) * n
        """1 when the current attempt's prefill replica streamed a token (`pd_first_token: prefill`)."""
        self.reprefills = array("q", [0]) * n
        self.migrations = array("q", [0]) * n
        self.prompt_computed = 0
        """Prompt (context) tokens of every attempt routed: first prefills, re-prefills, migrations."""
        self.leases: dict[int, Lease] = {}
        self.reasons: dict[str, dict[str, int]] = {"reprefill": {}, "migration": {}}
        self.recovery_gpu_s = 0.0
        self.wasted_gpu_s = 0.0
        self.orphaned_kv_byte_s = 0.0
        self.leases_expired = 0
        self.refusing: dict[int, int] = {}
        """Replica index -> faults making it refuse new requests now (`decode_full`, `fail_requests`)."""
        self.lease_s = decisions.kv_lease_s
        """`FailureDomainSpec.kv_lease_s`, read once (a pydantic model's attribute read is not a plain load)."""

    # ---- the request an attempt runs --------------------------------------------------------------
    def request(self, i: int) -> Request:
        """Request i as its current attempt runs it: the original, or a migration's continuation
        (prompt + streamed tokens in, the rest out)."""
        r = self.sim.reqs[i]
        b = self.base[i]
        if not b:
            return r
        return dataclasses.replace(r, prompt_tokens=r.prompt_tokens + b, output_tokens=r.output_tokens - b)

    def attempt(self, i: int) -> int:
        return int(self.sim.rec.retries[i])

    def tag(self, i: int) -> int:
        """Transfer tag of request i's current attempt."""
        return i * self.stride + self.attempt(i)

    def untag(self, tag: int) -> tuple[int, int]:
        return divmod(tag, self.stride)

    def delivered(self, i: int, on_engine: int = 0) -> int:
        """Tokens streamed to the client: earlier attempts, the prefill's token, `on_engine` (the
        decode or mixed engine's outputs in this attempt)."""
        return self.base[i] + self.prefill_token[i] + on_engine

    # ---- leases (decision 1) ----------------------------------------------------------------------
    def open_lease(self, i: int, rep: Replica, now_s: float, nbytes: float) -> None:
        """The prefill replica holds request i's KV from now until the decode side acks it."""
        att = self.attempt(i)
        self.leases[i] = Lease(att, rep.idx, now_s, nbytes)
        # The deadline is a callback on the loop with (index, attempt), no event object: ordered and
        # counted as the lease-end event of the transfer-end priority it stands for.
        self.sim.loop.call_at(now_s + self.lease_s, TRANSFER_END, self._on_lease_end, (i, att))

    def ack(self, i: int) -> None:
        """The decode side holds the KV: the lease ends (the prefill frees its blocks)."""
        self.leases.pop(i, None)

    def end_lease(self, i: int, now_s: float) -> None:
        """The lease ended without an ack: its KV is freed, counted as orphaned bytes x seconds."""
        lease = self.leases.pop(i, None)
        if lease is not None:
            self.orphaned_kv_byte_s += lease.nbytes * (now_s - lease.start_s)

    def _on_lease_end(self, now_s: float, arg: tuple[int, int]) -> None:
        """A lease reaches its deadline (`arg`: the request index and the attempt it was opened for)."""
        i = arg[0]
        lease = self.leases.get(i)
        if lease is None or lease.attempt != arg[1]:
            return  # acked, or ended by a failure, in time
        sim = self.sim
        self.leases_expired += 1
        if lease.transfer >= 0:
            sim.net.cancel(now_s, lease.transfer)
        src = sim.reps[lease.replica]
        sim.release_prefill(src, i, now_s)
        self.end_lease(i, now_s)
        self.lost(i, now_s, "lease_expired")

    # ---- decode admission -------------------------------------------------------------------------
    def refuses(self, rep: Replica) -> bool:
        """Whether replica `rep` refuses new requests now (a decode replica: new KV)."""
        return rep.idx in self.refusing

    def refuse(self, idx: int, refusing: bool) -> None:
        """One more (True) or one fewer fault makes replica `idx` refuse (overlapping faults nest)."""
        n = self.refusing.get(idx, 0) + (1 if refusing else -1)
        if n > 0:
            self.refusing[idx] = n
        else:
            self.refusing.pop(idx, None)

    # ---- losing an attempt (decisions 2 and 3) ----------------------------------------------------
    def lost(self, i: int, now_s: float, reason: str, on_engine: int = 0, kv_ready: bool = True) -> None:
        """Request i's current attempt cannot go on: prefill again, migrate, or fail it.

        `on_engine`: tokens its decode (or mixed) engine had produced in this attempt;
        `kv_ready`: the attempt's prefill had finished (its KV is thrown away: wasted work)."""
        sim, rec = self.sim, self.sim.rec
        if i in rec.failure or not math.isnan(rec.finish_s[i]):
            return
        if i in self.leases:
            self.end_lease(i, now_s)
        if kv_ready and not math.isnan(rec.prefill_end_s[i]):
            first = rec.prefill_worker[i] if rec.prefill_worker[i] >= 0 else rec.worker[i]
            if first >= 0:
                self.wasted_gpu_s += self.prefill_gpu_s(sim.reps[first], self.request(i).prompt_tokens)
        streamed = self.delivered(i, on_engine)
        if streamed == 0 and self.d.may_reprefill(self.reprefills[i], 0):
            self.reprefills[i] += 1
            self._again(i, now_s, "reprefill", reason)
        elif streamed > 0 and streamed < sim.reqs[i].output_tokens and self.d.may_migrate(self.migrations[i]):
            self.migrations[i] += 1
            self.base[i] = streamed
            self._again(i, now_s, "migration", reason)
        else:
            rec.tokens[i] = streamed
            sim.fail(i, now_s, reason, None)

    def _again(self, i: int, now_s: float, kind: str, reason: str) -> None:
        sim, rec = self.sim, self.sim.rec
        by = self.reasons[kind]
        by[reason] = by.get(reason, 0) + 1
        for idx in (rec.worker[i], rec.prefill_worker[i]):
            if idx >= 0:
                sim.reps[idx].inflight.discard(i)
                sim.faults.on_replica_progress(sim.reps[idx], now_s)
        rec.retries[i] += 1
        self.prefill_token[i] = 0
        rec.prefill_end_s[i] = math.nan
        rec.kv_start_s[i] = math.nan
        rec.kv_end_s[i] = math.nan
        sim.route_and_dispatch(i, now_s)
        if i not in rec.failure:
            first = rec.prefill_worker[i] if rec.prefill_worker[i] >= 0 else rec.worker[i]
            self.recovery_gpu_s += self.prefill_gpu_s(sim.reps[first], self.request(i).prompt_tokens)

    def routed(self, i: int) -> None:
        """An attempt of request i was routed: its context will be prefilled."""
        self.prompt_computed += self.request(i).prompt_tokens

    # ---- cost model -------------------------------------------------------------------------------
    def prefill_gpu_s(self, rep: Replica, tokens: int) -> float:
        """GPU-seconds of a lone prefill of `tokens` on `rep` (chunked by its token budget)."""
        perf = rep.perf
        if perf is None or tokens <= 0:
            return 0.0
        budget = rep.pool.engine.max_num_batched_tokens
        t, done = 0.0, 0
        while done < tokens:
            chunk = min(budget, tokens - done)
            t += perf.step_time_s(BatchShape.of([SeqWork(chunk, done)]))
            done += chunk
        return t * rep.slowdown * rep.deployment.gpus

    # ---- report -----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The failure-domain section of the summary (see docs/failure-domains.md)."""
        sim, rec = self.sim, self.sim.rec
        n = len(sim.reqs)
        done = rec.completed_mask()
        failed = np.zeros(n, dtype=bool)
        failed[list(rec.failure)] = True
        tokens = rec.column("tokens")
        prompts = np.fromiter((r.prompt_tokens for r in sim.reqs), dtype=np.int64, count=n)
        delivered = int(tokens.sum())
        # The billing rule is linear in the token counts: apply it once per status to the sums.
        billed_prompt = billed_gen = 0
        for status, mask in (("completed", done), ("failed", failed)):
            u = Usage("", "", "", "", "", "", status, "", int(prompts[mask].sum()), 0,  # type: ignore[arg-type]
                      int(tokens[mask].sum()), 0.0, 0.0)
            b = billed(u, self.d)
            billed_prompt += b.prompt_tokens
            billed_gen += b.generated_tokens
        reprefilled = int(np.count_nonzero(np.frombuffer(self.reprefills, dtype=np.int64)))
        migrated = int(np.count_nonzero(np.frombuffer(self.migrations, dtype=np.int64)))
        return {
            "decisions": self.d.model_dump(),
            "requests": {"completed": int(done.sum()), "reprefilled": reprefilled, "migrated": migrated,
                         "failed": int(failed.sum())},
            "reprefills": {"count": sum(self.reasons["reprefill"].values()),
                           "by_reason": dict(sorted(self.reasons["reprefill"].items()))},
            "migrations": {"count": sum(self.reasons["migration"].values()),
                           "by_reason": dict(sorted(self.reasons["migration"].items()))},
            "leases_expired": self.leases_expired,
            "tokens": {
                "delivered": delivered,
                "billed_generated": billed_gen,
                "billed_prompt": billed_prompt,
                "computed_generated": delivered,
                "computed_prompt": self.prompt_computed,
            },
            "gpu_s": {"recovery": round(self.recovery_gpu_s, 9), "wasted": round(self.wasted_gpu_s, 9)},
            "orphaned_kv_byte_s": round(self.orphaned_kv_byte_s, 3),
        }
