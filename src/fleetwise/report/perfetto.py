"""Chrome trace-event JSON of a simulation (opens in Perfetto UI and chrome://tracing).

Tracks (JSON Object Format, times in microseconds of simulated time):
- process "replicas": one thread per replica; each engine step is a complete event (`ph: X`)
  named by its batch (`prefill 1024 + 12 decodes`, `decode x8`) with args `prefill_tokens`,
  `decodes` (per pass), `passes`, `preempted`, `tokens`; and a counter track per replica
  (`<name> load`: waiting, running, KV usage %, at the summary's sample times);
- process "KV links": one thread per prefill -> decode pair (more lanes where transfers on a
  pair overlap, so slices never overlap on a thread); each transfer a complete event with its
  bytes, queueing and outcome;
- process "requests": one thread per request, a `request` span from arrival to its end with the
  phases nested inside: `queue` (arrival -> first scheduled), `prefill`, `transfer` (PD) and
  `decode` (to the last token).
A window keeps the file small: requests by position (`requests=(first, last)`, arrival order)
or by arrival time (`time_s=(start, end)`); steps and transfers are kept while they overlap
the time the selected requests span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.sim.recording import StepRecorder
from fleetwise.sim.runner import SimResult
from fleetwise.spec.output import write_json

US = 1e6
"""Trace-event timestamps are microseconds."""
PID_REPLICAS, PID_LINKS, PID_REQUESTS = 1, 2, 3
DEFAULT_REQUESTS = 1000
"""Requests traced when no window is given (the first ones by arrival)."""


@dataclass(frozen=True)
class Window:
    """Which requests to trace: by position in arrival order [first, last), or by arrival time."""

    requests: tuple[int, int] | None = None
    time_s: tuple[float, float] | None = None

    @staticmethod
    def parse(requests: str | None, time_s: str | None) -> Window:
        """From `--trace-events-requests A:B` and `--trace-events-window T0:T1` (one of them; default the first 1000)."""
        if requests and time_s:
            raise SpecError("--trace-events-requests and --trace-events-window: give one window, not both")
        if time_s:
            a, b = _pair(time_s, "--trace-events-window", float)
            return Window(time_s=(a, b))
        if requests:
            i, j = _pair(requests, "--trace-events-requests", int)
            return Window(requests=(int(i), int(j)))
        return Window(requests=(0, DEFAULT_REQUESTS))

    def recorder(self, arrivals: list[float]) -> StepRecorder:
        """A recorder bounded to this window's start (and end, for a time window)."""
        if self.time_s is not None:
            return StepRecorder(self.time_s[0], self.time_s[1])
        assert self.requests is not None
        i = min(self.requests[0], max(len(arrivals) - 1, 0))
        return StepRecorder(arrivals[i] if arrivals else 0.0, requests=self.requests)


def _pair(text: str, flag: str, kind: Any) -> tuple[float, float]:
    try:
        a, b = (kind(x) for x in text.split(":"))
    except ValueError:
        raise SpecError(f"{flag}={text!r}: expected START:END, e.g. {flag} 0:500") from None
    if not (0 <= a < b):
        raise SpecError(f"{flag}={text!r}: need 0 <= START < END")
    return a, b


def _selected(res: SimResult, w: Window) -> list[int]:
    reqs = res.records.requests
    if w.requests is not None:
        return list(range(min(w.requests[0], len(reqs)), min(w.requests[1], len(reqs))))
    assert w.time_s is not None
    t0, t1 = w.time_s
    return [i for i, r in enumerate(reqs) if t0 <= r.arrival_s < t1]


def _end_of(res: SimResult, i: int) -> float:
    rec = res.records
    times = [rec.requests[i].arrival_s] + [getattr(rec, c)[i] for c in (
        "dispatch_s", "prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s", "first_token_s", "finish_s")]
    return max(t for t in times if not math.isnan(t))


def trace_events(res: SimResult, rec: StepRecorder, window: Window) -> dict[str, Any]:
    """The trace document (`{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`)."""
    sel = _selected(res, window)
    records = res.records
    if window.time_s is not None:
        t0, t1 = window.time_s
    elif sel:
        t0, t1 = records.requests[sel[0]].arrival_s, max(_end_of(res, i) for i in sel)
    else:
        t0 = t1 = 0.0
    names = res.replica_names
    ev: list[dict[str, Any]] = [_meta(PID_REPLICAS, "process_name", "replicas"),
                                _meta(PID_LINKS, "process_name", "KV links"),
                                _meta(PID_REQUESTS, "process_name", "requests")]
    for idx, name in enumerate(names):
        ev.append(_meta(PID_REPLICAS, "thread_name", name, idx + 1))
    for s in rec.steps:
        if s.end_s < t0 or s.start_s > t1:
            continue
        ev.append({"name": _step_name(s.prefill_tokens, s.decodes, s.passes), "cat": "step", "ph": "X",
                   "pid": PID_REPLICAS, "tid": s.replica + 1, **_span(s.start_s, s.end_s),
                   "args": {"prefill_tokens": s.prefill_tokens, "decodes": s.decodes, "passes": s.passes,
                            "preempted": s.preempted, "tokens": s.tokens}})
    ev.extend(_counters(res, t0, t1))
    ev.extend(_transfers(res, rec, t0, t1))
    for i in sel:
        ev.extend(_request(res, i))
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": "fleetwise simulate", "plan": res.summary.get("plan", ""),
                          "seed": res.summary.get("seed", 0), "window_s": [t0, t1], "requests_traced": len(sel)}}


def _us(t: float) -> float:
    return round(t * US, 3)


def _span(start_s: float, end_s: float) -> dict[str, float]:
    """`ts` and `dur` (us) rounded so that nested spans stay nested: end = round(end), not round(dur)."""
    ts = _us(start_s)
    return {"ts": ts, "dur": round(_us(end_s) - ts, 3)}


def _meta(pid: int, kind: str, name: str, tid: int = 0) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _step_name(prefill: int, decodes: int, passes: int) -> str:
    if prefill and decodes:
        return f"prefill {prefill} + {decodes} decodes"
    if prefill:
        return f"prefill {prefill}"
    return f"decode {decodes}" + (f" x{passes}" if passes > 1 else "")


def _counters(res: SimResult, t0: float, t1: float) -> list[dict[str, Any]]:
    """Counter tracks per replica from the summary's samples: waiting, running, KV usage (%)."""
    out: list[dict[str, Any]] = []
    for idx, r in enumerate(res.summary.get("per_replica", [])):
        q, run, kv = r["queue_length"], r.get("running"), r.get("kv_usage_series")
        for k, t in enumerate(q["t_s"]):
            if t0 <= t <= t1:
                args: dict[str, float] = {"waiting": q["value"][k]}
                if run is not None:
                    args["running"] = run["value"][k]
                if kv is not None:
                    args["kv_usage_pct"] = round(100.0 * kv["value"][k], 3)
                out.append({"name": f"{r['name']} load", "ph": "C", "pid": PID_REPLICAS, "tid": idx + 1,
                            "ts": _us(t), "args": args})
    return out


def _transfers(res: SimResult, rec: StepRecorder, t0: float, t1: float) -> list[dict[str, Any]]:
    names = res.replica_names
    lanes: dict[tuple[int, int], list[float]] = {}  # link -> end time of the last slice on each lane
    tids: dict[tuple[int, int, int], int] = {}
    out: list[dict[str, Any]] = []
    for tr in sorted(rec.transfers, key=lambda t: (t.start_s, t.tag)):
        if tr.end_s < t0 or tr.start_s > t1:
            continue
        ends = lanes.setdefault((tr.src, tr.dst), [])
        lane = next((k for k, e in enumerate(ends) if e <= tr.start_s), len(ends))
        if lane == len(ends):
            ends.append(tr.end_s)
        else:
            ends[lane] = tr.end_s
        key = (tr.src, tr.dst, lane)
        if key not in tids:
            tids[key] = len(tids) + 1
            label = f"{names[tr.src]} → {names[tr.dst]}" + (f" #{lane + 1}" if lane else "")
            out.append(_meta(PID_LINKS, "thread_name", label, tids[key]))
        i = tr.tag // 4
        out.append({"name": f"KV req {res.records.requests[i].request_id}", "cat": "kv", "ph": "X", "pid": PID_LINKS,
                    "tid": tids[key], **_span(tr.start_s, tr.end_s),
                    "args": {"bytes": tr.bytes, "queue_ms": round(tr.queue_s * 1e3, 6), "ok": tr.ok,
                             "attempt": tr.tag % 4}})
    return out


def _request(res: SimResult, i: int) -> list[dict[str, Any]]:
    rec, names = res.records, res.replica_names
    r = rec.requests[i]
    tid = i + 1
    w, p = rec.worker[i], rec.prefill_worker[i]
    end = _end_of(res, i)
    args: dict[str, Any] = {"request_id": r.request_id, "tenant": r.tenant, "prompt_tokens": r.prompt_tokens,
                            "output_tokens": r.output_tokens, "worker": names[w] if w >= 0 else "",
                            "retries": rec.retries[i]}
    if p >= 0:
        args["prefill_worker"] = names[p]
    if i in rec.failure:
        args["failure"] = rec.failure[i]
    out = [_meta(PID_REQUESTS, "thread_name", f"req {r.request_id}", tid),
           {"name": "request" if i not in rec.failure else "request (failed)", "cat": "request", "ph": "X",
            "pid": PID_REQUESTS, "tid": tid, **_span(r.arrival_s, end), "args": args}]
    ps, pe = rec.prefill_start_s[i], rec.prefill_end_s[i]
    ks, ke = rec.kv_start_s[i], rec.kv_end_s[i]
    fin = rec.finish_s[i]
    decode_from = ke if not math.isnan(ke) else pe
    phases = (("queue", r.arrival_s, ps), ("prefill", ps, pe), ("transfer", ks, ke), ("decode", decode_from, fin))
    for name, a, b in phases:
        if not (math.isnan(a) or math.isnan(b)) and b >= a:
            out.append({"name": name, "cat": "request", "ph": "X", "pid": PID_REQUESTS, "tid": tid,
                        **_span(a, b)})
    return out


def write_trace(res: SimResult, rec: StepRecorder, window: Window, path: str | Path) -> Path:
    """Write the trace of `res` (recorded by `rec`) for `window` to `path` as JSON."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, trace_events(res, rec, window), indent=None, separators=(",", ":"))
    return out
