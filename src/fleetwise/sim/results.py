"""Simulation results: per-request records (columnar), the summary document, CSV/Parquet output.

Owns what is recorded and how it is summarised; the runner fills the columns (`Records`, laid
out in `sim/columns.py`: one array per field indexed by request position, times in virtual
seconds, NaN = never happened) as events happen.

Metric definitions (per completed request):
- TTFT = first_token_s - arrival_s + network_s; E2E = finish_s - arrival_s + network_s (network_s:
  the round trip to a replica outside the client's region, `PlanSpec.regions`; 0 within one);
- TPOT = (finish_s - first_token_s) / (output_tokens - 1); undefined (NaN in the records, an empty
  cell) for a one-token output, which no TPOT target can fail; the summary's TPOT percentiles are
  over multi-token outputs and null when there is none;
- ITL: gaps between consecutive tokens of a request, as weighted samples from the engine;
- queue = first scheduled (prefill start) - arrival (NaN when the engine does not report it);
- goodput_rps = completed requests meeting every SLO target / span, where span = last finish -
  first arrival; slo_attainment = those requests / all requests (failed ones count as missed).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.errors import SpecError
from fleetwise.sim.columns import NAN, TIME_COLUMNS, Records, ReplicaStats
from fleetwise.spec.slo import SLOSpec

SCHEMA_VERSION = "fleetwise-sim-summary/1"
CSV_COLUMNS = (
    "request_id", "arrival_s", "tenant", "prompt_tokens", "output_tokens", "prefill_worker", "worker",
    "queue_s", *TIME_COLUMNS, "ttft_s", "tpot_s", "e2e_s", "tokens_generated", "retries", "failure",
    "decision", "decision_scores",
)


@dataclass
class SimResult:
    """A finished run: the summary document, the per-request records and the replicas by name."""

    summary: dict[str, Any]
    records: Records
    replica_names: list[str]
    engine_steps: int = 0
    """Steps the engines ran (a fused step counts once); the cost unit of `benchmarks/sim_speed.py`."""
    engine_passes: int = 0
    """Forward passes those steps stood for."""

    def write(self, out_dir: Any, records_format: str = "csv") -> dict[str, str]:
        """Write summary.json and requests.csv (or .parquet) into `out_dir`."""
        from fleetwise.spec.output import write_json

        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        write_json(d / "summary.json", self.summary, indent=2)
        rec_path = write_records(self.records, self.replica_names, d / f"requests.{records_format}")
        return {"summary": str(d / "summary.json"), "records": str(rec_path)}


def pct(values: np.ndarray) -> dict[str, float]:
    """{p50, p90, p99, mean} of `values` (all 0.0 when empty), rounded to ns."""
    if values.size == 0:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    p = np.percentile(values, [50, 90, 99])
    return {"p50": _r(p[0]), "p90": _r(p[1]), "p99": _r(p[2]), "mean": _r(values.mean())}


def pct_or_null(values: np.ndarray) -> dict[str, float | None]:
    """`pct` of `values`, every figure None (JSON null) when there is none: an undefined statistic."""
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    return dict(pct(values))


def weighted_pct(gaps: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Percentiles of samples `gaps[i]` each repeated `counts[i]` times."""
    if gaps.size == 0 or counts.sum() == 0:
        return pct(np.empty(0))
    order = np.argsort(gaps, kind="stable")
    g, c = gaps[order], np.cumsum(counts[order])
    total = c[-1]
    out = {f"p{q}": _r(g[min(np.searchsorted(c, q / 100 * total), g.size - 1)]) for q in (50, 90, 99)}
    out["mean"] = _r(float((gaps * counts).sum() / total))
    return out


def _r(x: float) -> float:
    return round(float(x), 9)


def request_metrics(rec: Records, one_token_tpot: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ttft, tpot, e2e, completed mask) arrays over all requests (NaN where not completed); a
    completed one-token output's TPOT is `one_token_tpot`: 0.0 passes any `tpot <= target` test,
    NaN (records, summaries) says it is undefined."""
    arr = rec.arrival()
    first, fin = rec.column("first_token_s"), rec.column("finish_s")
    toks = rec.column("tokens").astype(np.float64)
    net = rec.column("network_s")  # a client in another region sees every token this much later
    ttft, e2e = first - arr + net, fin - arr + net
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(toks > 1, (fin - first) / np.maximum(toks - 1, 1), one_token_tpot)
    done = ~np.isnan(fin)
    return ttft, np.where(done, tpot, NAN), e2e, done


def summarize(
    rec: Records,
    replicas: list[ReplicaStats],
    transfers: list[Any],
    itl: tuple[np.ndarray, np.ndarray],
    slo: SLOSpec,
    router_report: dict[str, Any],
    seed: int,
    extra: dict[str, Any],
    series: bool = True,
) -> dict[str, Any]:
    """The summary document (format in docs/simulator.md); deterministic for fixed inputs.
    `series=False` leaves each replica's time series out (`SimOptions.replica_series`)."""
    ttft, tpot, e2e, done = request_metrics(rec, NAN)
    n = len(rec.requests)
    arr = rec.arrival()
    fin = rec.column("finish_s")
    start = float(arr.min()) if n else 0.0
    end = float(np.nanmax(fin)) if done.any() else start
    span = max(end - start, 1e-9)
    out_tokens = int(rec.column("tokens")[done].sum())
    good = done & slo.met(ttft, tpot, e2e)
    reasons: dict[str, int] = {}
    for r in rec.failure.values():
        key = r.split(":", 1)[0]
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "schema": SCHEMA_VERSION,
        "seed": seed,
        "requests_total": n,
        "requests_completed": int(done.sum()),
        "requests_failed": len(rec.failure),
        "failure_reasons": dict(sorted(reasons.items())),
        "requests_retried": int(np.count_nonzero(rec.column("retries"))),
        "duration_s": _r(span),
        "ttft_s": pct(ttft[done]),
        "tpot_s": pct_or_null(tpot[done & (rec.column("tokens") > 1)]),
        "itl_s": weighted_pct(*itl),
        "e2e_s": pct(e2e[done]),
        "queue_s": pct(_finite(rec.column("prefill_start_s") - arr)),
        "throughput": {"requests_per_s": _r(done.sum() / span), "output_tokens_per_s": _r(out_tokens / span)},
        "goodput_rps": _r(good.sum() / span),
        "slo": slo.model_dump(),
        "slo_attainment": _r(good.sum() / n) if n else 0.0,
        "per_replica": [{**_replica(r, span, series), "decisions": d}
                        for r, d in zip(replicas, decisions_by_replica(rec, len(replicas)), strict=True)],
        "kv_transfer": _transfers(transfers),
        "cost": _cost(replicas, out_tokens, span),
        "router": router_report,
        **extra,
    }


def decisions_by_replica(rec: Records, n_replicas: int) -> list[dict[str, int]]:
    """Per replica, its requests' (last) routing decisions by kind; a PD request counts on its
    prefill and its decode replica."""
    n = len(rec.decision)
    if n == 0 or n_replicas == 0:
        return [{} for _ in range(n_replicas)]
    kinds, code = np.unique(np.asarray(rec.decision, dtype=object).astype(str), return_inverse=True)
    counts = np.zeros((n_replicas, len(kinds)), dtype=np.int64)
    decode = np.frombuffer(rec.worker, dtype=np.int64)
    prefill = np.frombuffer(rec.prefill_worker, dtype=np.int64)
    for w in (decode, np.where(prefill == decode, -1, prefill)):
        ok = (w >= 0) & (w < n_replicas)
        np.add.at(counts, (w[ok], code[ok]), 1)
    return [{str(k): int(c) for k, c in zip(kinds, row, strict=True) if k and c} for row in counts]


def _finite(x: np.ndarray) -> np.ndarray:
    return x[np.isfinite(x)]


def _replica(r: ReplicaStats, span: float, series: bool) -> dict[str, Any]:
    kv = np.asarray(r.kv_usage_samples, dtype=np.float64)
    out: dict[str, Any] = {
        "name": r.name,
        "pool": r.pool,
        "role": r.role,
        "requests": r.requests,
        "prefix_hit_rate": _r(r.prefix_hit_rate),
        "utilization": _r(min(1.0, r.busy_s / span)),
        "preemptions": r.preemptions,
        "kv_usage": {"mean": _r(kv.mean()) if kv.size else 0.0, "max": _r(kv.max()) if kv.size else 0.0},
    }
    if series:
        t_s = [_r(q[0]) for q in r.queue_series]
        out["queue_length"] = {"t_s": t_s, "value": [q[1] for q in r.queue_series]}
        out["running"] = {"t_s": t_s, "value": [q[2] for q in r.queue_series]}
        out["kv_usage_series"] = {"t_s": t_s, "value": [_r(q[3]) for q in r.queue_series]}
    return out


def _transfers(transfers: list[Any]) -> dict[str, Any]:
    ok = [t for t in transfers if t.ok]
    dur = np.array([t.end_s - t.start_s for t in ok], dtype=np.float64)
    q = np.array([t.queue_s for t in ok], dtype=np.float64)
    d = pct(dur)
    return {
        "count": len(ok),
        "failed": len(transfers) - len(ok),
        "p50_s": d["p50"],
        "p99_s": d["p99"],
        "mean_s": d["mean"],
        "mean_queue_s": _r(q.mean()) if q.size else 0.0,
        "p99_queue_s": pct(q)["p99"],
        "bytes_total": float(sum(t.bytes for t in ok)),
    }


def _cost(replicas: list[ReplicaStats], out_tokens: int, span: float) -> dict[str, Any]:
    gpus = sum(r.gpus for r in replicas)
    usd_h = sum(r.gpus * r.price_per_gpu_hour_usd for r in replicas)
    usd_total = usd_h * span / 3600
    per_m = usd_total / out_tokens * 1e6 if out_tokens else 0.0
    return {"gpus": gpus, "usd_per_hour": _r(usd_h), "usd_per_1m_output_tokens": _r(per_m)}


# ---- files ----------------------------------------------------------------------------------
def record_rows(rec: Records, names: list[str], text: bool = False) -> list[list[Any]]:
    """Rows of the per-request table in CSV_COLUMNS order (names: replica index -> name); with
    `text`, the time columns as the CSV text of their rounded values (`_float_text`)."""
    # Built column by column: the columns of Python floats (`tolist`: the same doubles, read
    # without a numpy scalar each) are rounded in one pass each, as `_cell` rounds a float; the
    # others go through `_cell` (the same cells as converting row by row, at about half the cost).
    reqs = rec.requests
    arrival = [r.arrival_s for r in reqs]
    times = [rec.column(c).tolist() for c in TIME_COLUMNS]
    queue = [ps - a for ps, a in zip(times[TIME_COLUMNS.index("prefill_start_s")], arrival, strict=True)]
    floats = [queue, *times, *(m.tolist() for m in request_metrics(rec, NAN)[:3])]
    others_before: list[list[Any]] = [
        [r.request_id for r in reqs], arrival, [r.tenant for r in reqs], [r.prompt_tokens for r in reqs],
        [r.output_tokens for r in reqs], [names[w] if w >= 0 else "" for w in rec.prefill_worker],
        [names[w] if w >= 0 else "" for w in rec.worker]]
    others_after: list[list[Any]] = [
        list(rec.tokens), list(rec.retries), [rec.failure.get(i, "") for i in range(len(reqs))], rec.decision,
        [_scores_cell(s) for s in rec.decision_scores]]
    rounded = [list(map(_float_text if text else _float_cell, c)) for c in floats]
    cols = [*map(_cells, others_before), *rounded, *map(_cells, others_after)]
    return [list(row) for row in zip(*cols, strict=True)]


_AS_IS = frozenset({str, int, bool})
"""Types `_cell` returns unchanged."""


def _cells(column: list[Any]) -> list[Any]:
    return [v if type(v) in _AS_IS else _cell(v) for v in column]


FLOAT_TEXT_RANGE = (1e-4, 8e6)
"""Magnitudes where `repr(round(v, 9))` is the `.9f` text of `v` less its trailing zeros: from
1e-4 (below, repr writes an exponent) to under 2**23 (above, a double's spacing reaches 1e-9, so
a shorter decimal can name the same double)."""


def _float_text(v: float) -> Any:
    """The CSV cell of a float: `""` for NaN, else what csv writes for `round(v, 9)` (its repr),
    with one decimal conversion where FLOAT_TEXT_RANGE allows (round and repr each make one)."""
    if v != v:
        return ""
    if FLOAT_TEXT_RANGE[0] <= abs(v) < FLOAT_TEXT_RANGE[1]:
        digits = f"{v:.9f}".rstrip("0")
        return digits + "0" if digits.endswith(".") else digits
    return round(v, 9)


def _float_cell(v: float) -> Any:
    """The record value of a float: `""` for NaN, else `round(v, 9)` (`_float_text` is its CSV text)."""
    return "" if v != v else round(v, 9)  # v != v: NaN


def _scores_cell(scores: dict[str, float] | None) -> str:
    """`total=1.05;load=1;prefix=0.75` (empty when there was no decision or no score)."""
    return ";".join(f"{k}={v:g}" for k, v in scores.items()) if scores else ""


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return _float_cell(v)
    if isinstance(v, np.floating):
        return _float_cell(float(v))
    return v


RECORDS_FORMATS = ("csv", "parquet")
"""Formats the per-request records can be written in (Parquet needs the `parquet` extra: pyarrow)."""


def require_parquet(where: str) -> None:
    """SpecError naming `where` unless pyarrow (the optional `parquet` extra) can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SpecError(f"{where}: Parquet records need pyarrow, which is not installed; install it with "
                        "`pip install 'fleetwise[parquet]'` (or `pip install pyarrow`), or write CSV") from None


def write_records(rec: Records, names: list[str], path: Path) -> Path:
    """Write the records as CSV, or Parquet when `path` ends in .parquet (SpecError without pyarrow)."""
    parquet = path.suffix == ".parquet"
    rows = record_rows(rec, names, text=not parquet)
    if parquet:
        require_parquet(str(path))
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = {c: [None if row[k] == "" else row[k] for row in rows] for k, c in enumerate(CSV_COLUMNS)}
        pq.write_table(pa.table(cols), path)
        return path
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        w.writerows(rows)
    return path
