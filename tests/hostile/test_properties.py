"""Property-based hostile input: mutated specs, workloads, fault files, traces, raw bytes and flags
for every command. Whatever hypothesis generates, the command either succeeds with a valid result
(strict JSON, finite non-negative times) or exits 2 with one line under 300 characters naming the
file, flag or field; it never raises, never exits with an internal error and never hangs.

Examples run the CLI in-process (`fleetwise.cli.main.main`) with bounded example counts, seeded
by hypothesis's database-free derandomised mode so a run is reproducible;
FLEETWISE_HOSTILE_SCALE=20 runs twenty times the examples with fresh random draws (a bug hunt).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_cli import PLANS, Outcome, finite_nonneg_times, load_strict_json, run_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetwise.perf.groundtruth import shipped

HANG_LIMIT_S = 60
"""An example still running after this long has hung (a hang detector, not a speed check)."""

SCALE = float(os.environ.get("FLEETWISE_HOSTILE_SCALE", "1"))
"""Multiply every example count (CI runs 1x, derandomised; a bug hunt sets e.g. 20 and gets fresh draws)."""
PROFILE = settings(max_examples=int(25 * SCALE), deadline=None, derandomize=SCALE == 1, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def examples(n: int) -> int:
    """`n` examples at the configured scale."""
    return max(1, int(n * SCALE))

# ---- values a careless or hostile user might write -----------------------------------------------

HOSTILE_SCALARS: list[Any] = [
    math.nan, math.inf, -math.inf, -1, -0.5, 0, 0.0, 1e-300, 1e300, 10**9, 10**30, True, False,
    "100", "abc", "", None, [], {}, "x" * 3000, 2.5, 3, "h100-sxm", "llama-3.1-8b", "mixed-0", [1, "a"],
]
HOSTILE = st.sampled_from(HOSTILE_SCALARS).map(copy.deepcopy)  # a fresh copy: later mutations never alias
FLAG_VALUES = ["nan", "inf", "-inf", "-1", "0", "-0", "1e-300", "1e300", "1000000000", "abc", "", "0.5", "3",
               "1e999", "x" * 3000, "--", "1_000", " 7 ", "0x10"]

BASE_PLAN = {"name": "p", "routing": "round-robin",
             "pools": [{"name": "mixed", "replicas": 2, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}]}
BASE_PD_PLAN = yaml.safe_load((PLANS / "pd-70b.yaml").read_text())
BASE_WORKLOAD = {"arrival": {"kind": "poisson", "rate_rps": 5},
                 "lengths": {"kind": "independent", "input": {"kind": "lognormal", "median_tokens": 200, "sigma": 1,
                                                              "max_tokens": 2000},
                             "output": {"kind": "uniform", "low_tokens": 4, "high_tokens": 16}},
                 "num_requests": 12,
                 "prefix": {"system_prompts": {"count": 2, "tokens": 64, "fraction": 0.5},
                            "sessions": {"mean_turns": 2, "think_time_s": 1}},
                 "tenants": [{"name": "a", "weight": 1}, {"name": "b", "weight": 2, "prefix_tokens": 32}]}
BASE_FAULTS = {"faults": [{"kind": "crash", "replica": "mixed-0", "at_s": 0.5, "restart_after_s": 1},
                          {"kind": "slowdown", "replica": "mixed-1", "start_s": 0, "end_s": 2, "factor": 2},
                          {"kind": "stale_view", "start_s": 0.1, "end_s": 0.4}]}
BASE_PLANNING = {"model": "llama-3.1-8b", "accelerators": [{"name": "h100-sxm"}],
                 "workload": {"rate_rps": 0.2, "prompt_tokens": {"kind": "fixed", "tokens": 256},
                              "output_tokens": {"kind": "fixed", "tokens": 64}},
                 "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "weight_dtypes": ["bf16"], "headroom": {"burst_factor": 1.0},
                 "search": {"max_gpus": 2, "top_k": 1, "refine_top": 1, "seeds": 1, "sample_requests": 50,
                            "disaggregation": "off", "bisect_steps": 1}}


def paths_of(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in a document (the document itself excluded)."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(paths_of(v, (*prefix, k)))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`base` with one to three values replaced, removed, or given an unknown sibling, and the
    names an error may cite for it: every key on a touched path (`bogus_field` for an unknown one)."""
    doc = copy.deepcopy(base)
    touched: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        paths = paths_of(doc)
        if not paths:  # an earlier step replaced the whole tree with a scalar
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "replace", "replace", "remove", "unknown", "scale", "scale"]))
        value = parent[path[-1]]
        if action == "scale" and isinstance(value, int | float) and not isinstance(value, bool):
            # a plausible edit (often still valid), so the success path is exercised too
            parent[path[-1]] = type(value)(value * draw(st.sampled_from([0.5, 2, 3])))
        elif action == "replace":
            parent[path[-1]] = draw(HOSTILE)
        elif action == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent["bogus_field"] = 1
            touched.append("bogus_field")
        touched.extend(str(k) for k in path if isinstance(k, str))
    return doc, touched


def fresh(tmp: Path) -> Path:
    """A new directory per example (hypothesis runs every example in the same `tmp_path`)."""
    return Path(tempfile.mkdtemp(dir=tmp))


def write_doc(tmp: Path, name: str, doc: Any, as_json: bool) -> Path:
    p = tmp / (name + (".json" if as_json else ".yaml"))
    p.write_text(json.dumps(doc) if as_json else yaml.safe_dump(doc, width=10**6), encoding="utf-8")
    return p


# ---- the property -----------------------------------------------------------------------------


@contextmanager
def hang_guard() -> Iterator[None]:
    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the command ran past {HANG_LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def names_one_of(line: str, names: Sequence[str]) -> bool:
    """Whether `line` cites one of `names` as a whole word: a flag (`--rate`, `-o`), a field name
    (`rate_rps` in `arrival.rate_rps: ...`) or a file name."""
    return any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w])", line) for n in names)


def check(capsys: pytest.CaptureFixture[str], argv: list[Any], outputs: Sequence[Path] = (),
          json_stdout: bool = False, ok_codes: tuple[int, ...] = (0,), names: Sequence[str] = ()) -> Outcome:
    """Run `argv` and assert the hostile-input contract: exit 2 with one line under 300 characters
    citing one of `names` (the touched fields, the flags given, the file), or a valid result."""
    with hang_guard():
        o = run_cli(capsys, argv)
    event(f"exit {o.rc}")  # `--hypothesis-show-statistics` shows how often each outcome was reached
    if o.rc == 2:
        lines = o.err.strip().splitlines()
        assert len(lines) == 1, o.err[:2000]
        assert len(lines[0]) < 300, lines[0]
        assert ": error: " in lines[0], lines[0]
        assert "Traceback" not in o.err and "internal error" not in o.err
        assert names_one_of(lines[0], names), f"the error names none of {sorted(set(names))}: {lines[0]}"
        return o
    assert o.rc in ok_codes, (o.rc, o.err[-2000:])
    for p in outputs:
        if p.is_file():
            finite_nonneg_times(load_strict_json(p.read_text()))
    if json_stdout:
        load_strict_json(o.out)
    return o


class _Unbound:
    """What the stubbed `listening_socket` gives: a socket's name and nothing bound."""

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)


@pytest.fixture(autouse=True)
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Relative paths a flag names (`--json 3`) land in the test's folder, never the checkout; a
    valid `emulate`/`gateway` command line would serve forever: each stops where it would bind
    its port, noted in the returned list (a refused flag must come before that point)."""
    import uvicorn

    import fleetwise.gateway
    import fleetwise.gateway.server
    import fleetwise.live.http

    calls: list[str] = []
    monkeypatch.chdir(tmp_path)
    for module in (fleetwise.live.http, fleetwise.gateway.server):  # the servers bind first, then print the port
        monkeypatch.setattr(module, "listening_socket", lambda *a, **k: _Unbound())
    monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: calls.append("emulate"))
    monkeypatch.setattr(fleetwise.gateway, "serve", lambda *a, **k: calls.append("gateway"))
    return calls


# ---- simulate: plan, workload and fault documents ------------------------------------------------


@PROFILE
@given(data=st.data(), as_json=st.booleans())
def test_simulate_with_a_mutated_plan(capsys, tmp_path, data, as_json):
    tmp_path = fresh(tmp_path)
    base = data.draw(st.sampled_from([BASE_PLAN, BASE_PD_PLAN]))
    doc, touched = data.draw(mutated(base))
    plan = write_doc(tmp_path, "plan", doc, as_json)
    wl = write_doc(tmp_path, "w", {**BASE_WORKLOAD, "num_requests": 6}, False)
    out = tmp_path / "out"
    check(capsys, ["simulate", plan, "--workload", wl, "--out", out, "--no-progress"], [out / "summary.json"],
          names=touched)


@PROFILE
@given(data=st.data(), as_json=st.booleans())
def test_simulate_with_a_mutated_workload(capsys, tmp_path, data, as_json):
    tmp_path = fresh(tmp_path)
    doc, touched = data.draw(mutated(BASE_WORKLOAD))
    wl = write_doc(tmp_path, "w", doc, as_json)
    out = tmp_path / "out"
    over = data.draw(st.sampled_from(["reject", "truncate", "skip"]))
    check(capsys, ["simulate", PLANS / "colocated-8b.yaml", "--workload", wl, "--requests", "30",
                   "--over-context", over, "--out", out, "--no-progress"], [out / "summary.json"], names=touched)


@PROFILE
@given(data=st.data(), as_json=st.booleans())
def test_simulate_with_mutated_faults(capsys, tmp_path, data, as_json):
    tmp_path = fresh(tmp_path)
    doc, touched = data.draw(mutated(BASE_FAULTS))
    faults = write_doc(tmp_path, "f", doc, as_json)
    plan = write_doc(tmp_path, "plan", BASE_PLAN, False)
    wl = write_doc(tmp_path, "w", {**BASE_WORKLOAD, "num_requests": 8}, False)
    out = tmp_path / "out"
    check(capsys, ["simulate", plan, "--workload", wl, "--faults", faults, "--out", out, "--no-progress"],
          [out / "summary.json"], names=touched)


# ---- plan: the planning spec --------------------------------------------------------------------


@settings(PROFILE, max_examples=examples(15))
@given(data=st.data())
def test_plan_with_a_mutated_spec(capsys, tmp_path, data):
    tmp_path = fresh(tmp_path)
    doc, touched = data.draw(mutated(BASE_PLANNING))
    spec = write_doc(tmp_path, "spec", doc, data.draw(st.booleans()))
    out = tmp_path / "plan.json"
    check(capsys, ["plan", spec, "--workers", "1", "-o", out], [out], ok_codes=(0, 1), names=touched)


# ---- traces -------------------------------------------------------------------------------------

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
REQUEST_FIELDS = ("prompt", "output")
"""What a trace error may name besides a column: a request's prompt or output (the context check)."""
TRACE_VALUES = st.one_of(HOSTILE, st.integers(-5, 3000), st.floats(allow_nan=True))


@PROFILE
@given(rows=st.lists(st.fixed_dictionaries(
    {"timestamp": TRACE_VALUES, "input_length": TRACE_VALUES, "output_length": TRACE_VALUES},
    optional={"hash_ids": st.one_of(HOSTILE, st.lists(TRACE_VALUES, max_size=4))}),
    min_size=1, max_size=6))
def test_simulate_with_a_hostile_mooncake_trace(capsys, tmp_path, rows):
    tmp_path = fresh(tmp_path)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    check(capsys, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", trace,
                   "--out", out, "--no-progress"], [out / "summary.json"], names=(*MOONCAKE_FIELDS, *REQUEST_FIELDS))


CSV_CELLS = st.one_of(st.sampled_from(["2023-11-16 18:15:00.0000000", "2300-01-01 00:00:00", "NaT", "1677-01-01",
                                       "2023-11-16T18:15:01Z", "", "nan", "inf", "-1", "0", "100", "100.7", "true",
                                       "1e30", "\x00", '"1,2"']),
                      st.integers(0, 5000).map(str))


@PROFILE
@given(rows=st.lists(st.tuples(CSV_CELLS, CSV_CELLS, CSV_CELLS), min_size=1, max_size=6),
       fmt=st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens",
                            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                            "num_prefill_tokens,num_decode_tokens"]))
def test_simulate_with_a_hostile_csv_trace(capsys, tmp_path, rows, fmt):
    tmp_path = fresh(tmp_path)
    width = fmt.count(",") + 1
    lines = [fmt]
    for a, b, c in rows:
        cells = {3: [a, b, c], 6: [a, "m", b, c, "0", "x"], 2: [b, c]}[width]
        lines.append(",".join(cells))
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    extra = ["--rate", "2"] if width == 2 else []
    check(capsys, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", trace, *extra,
                   "--out", out, "--no-progress"], [out / "summary.json"], names=(*fmt.split(","), *REQUEST_FIELDS))


# ---- raw bytes in place of any file --------------------------------------------------------------

BYTES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"\xff\xfe" + "a: 1\n".encode("utf-16-le"), b"\x00" * 64, b"[" * 5000, b"{" * 5000,
                     b"a: &a [*a]\n", b"- - - - - - - - - - - - - - - - - - -" * 50, b"\xef\xbb\xbf{}", b"null",
                     b"42", b'"s"', b"[]", b"a: 1\na: 2\n", b"!!python/object:os.system {}\n"]),
    st.text(max_size=200).map(lambda t: t.encode("utf-8")),
)


@settings(PROFILE, max_examples=examples(40))
@given(content=BYTES, slot=st.sampled_from(["plan", "workload", "faults", "trace", "spec", "model", "gpu",
                                            "profile", "groundtruth", "scenario-dir", "records", "gateway-config"]),
       suffix=st.sampled_from([".yaml", ".json", ".csv", ".jsonl"]))
def test_any_bytes_in_any_file_slot(capsys, tmp_path, content, slot, suffix):
    tmp_path = fresh(tmp_path)
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(content)
    wl = write_doc(tmp_path, "w", {**BASE_WORKLOAD, "num_requests": 4}, False)
    out = tmp_path / "out"
    if slot == "scenario-dir":
        d = tmp_path / "scen"
        d.mkdir()
        (d / "s.yaml").write_bytes(content)
    argv = {
        "plan": ["simulate", bad, "--workload", wl, "--out", out],
        "workload": ["simulate", PLANS / "colocated-8b.yaml", "--workload", bad, "--out", out],
        "faults": ["simulate", PLANS / "colocated-8b.yaml", "--workload", wl, "--faults", bad, "--out", out],
        "trace": ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", bad, "--out", out],
        "spec": ["plan", bad, "--workers", "1"],
        "model": ["fit", "--model", bad, "--gpu", "h100-sxm", "--json"],
        "gpu": ["fit", "--model", "llama-3.1-8b", "--gpu", bad, "--json"],
        "profile": ["predict", "--profile", bad, "--against", shipped("h200_dense.json")],
        "groundtruth": ["calibrate", bad, "-o", tmp_path / "p.json"],
        "scenario-dir": ["scenarios", "--dir", tmp_path / "scen", "--scenario", "s", "--small", "--seeds", "1",
                         "--out", out],
        "records": ["ledger", "verify", "--ledger", _ledger(tmp_path), "--records", bad, "--json"],
        "gateway-config": ["gateway", "--config", bad, "--port", "0"],
    }[slot]
    check(capsys, [*argv, "--no-progress"] if argv[0] == "simulate" else argv, [out / "summary.json"],
          json_stdout=slot in ("model", "gpu", "records"), ok_codes=(0, 1), names=[bad.name, "s.yaml"])


# ---- flags of every command ----------------------------------------------------------------------


def _ledger(tmp: Path) -> Path:
    """A small ledger a gateway could have written: two tenants' requests."""
    from fleetwise.ledger import Usage, open_ledger

    db = tmp / "ledger.db"
    with open_ledger(str(db)) as led:
        for i in range(3):
            led.record(Usage(f"k{i}", f"r{i}", ("acme", "beta")[i % 2], "m", "p", "d", "completed", "", 10, 0, 4,
                             1_700_000_000.0 + i, 1_700_000_001.0 + i))
    return db


def _commands(tmp: Path) -> dict[str, tuple[list[Any], list[str]]]:
    """command -> (a valid argv, flags that take a value) for every subcommand."""
    wl = write_doc(tmp, "w", {**BASE_WORKLOAD, "num_requests": 6}, False)
    trace = tmp / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00.0,100,10\n"
                     "2023-11-16 18:15:01.5,120,12\n2023-11-16 18:15:02.0,90,8\n")
    spec = write_doc(tmp, "spec", BASE_PLANNING, False)
    gt = shipped("h200_dense.json")
    records = tmp / "requests.csv"
    records.write_text("request_id,tenant,status\nr0,acme,completed\n")
    return {
        "simulate-workload": (["simulate", PLANS / "colocated-8b.yaml", "--workload", wl, "--no-progress",
                               "--out", tmp / "o"],
                              ["--seed", "--requests", "--feedback-delay", "--ttft-slo", "--tpot-slo", "--e2e-slo",
                               "--over-context", "--records-format", "--rate", "--arrival-stretch", "--policy", "--faults",
                               "--trace-events", "--report"]),
        "simulate-trace": (["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", trace,
                            "--no-progress", "--out", tmp / "o"],
                           ["--seed", "--requests", "--rate", "--arrival-stretch", "--replicas", "--tp", "--model", "--gpu",
                            "--trace-events-requests", "--trace-events-window", "--out", "--trace-columns", "--over-context"]),
        "plan": (["plan", spec, "--workers", "1", "-o", tmp / "p.json"],
                 ["--top", "--workers", "-o", "--profile", "--report"]),
        "fit": (["fit", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--json"],
                ["--max-num-batched-tokens", "--gpu-memory-utilization", "--context-tokens", "--max-gpus",
                 "--weight-dtype", "--kv-dtype", "--model", "--gpu"]),
        "catalog": (["catalog", "models", "--json"], []),
        "emulate": (["emulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--port", "0"],
                    ["--tp", "--max-model-len", "--time-scale", "--seed", "--port", "--gpu-memory-utilization",
                     "--max-num-seqs", "--block-size", "--kv-lease", "--kv-link-gbps", "--output-lengths", "--role",
                     "--host", "--profile", "--max-num-batched-tokens", "--kv-link-latency", "--pp", "--model",
                     "--gpu", "--served-model-name"]),
        "gateway": (["gateway", "--backend", "http://127.0.0.1:9", "--port", "0"],
                    ["--backend", "--prefill", "--decode", "--policy", "--served-model-name", "--host", "--port",
                     "--backends-file", "--ledger", "--config", "--log-level"]),
        "ledger-summary": (["ledger", "summary", "--ledger", _ledger(tmp), "--json"], ["--ledger", "--tenant", "--since"]),
        "ledger-verify": (["ledger", "verify", "--ledger", tmp / "ledger.db", "--records", records, "--json"],
                          ["--ledger", "--records"]),
        "predict": (["predict", "--profile", tmp / "prof.json", "--against", gt, "--json"], ["--gpu", "--profile"]),
        "calibrate": (["calibrate", gt, "-o", tmp / "prof.json", "--json"], ["--gpu", "-o"]),
        "scenarios": (["scenarios", "--small", "--scenario", "heterogeneous", "--seeds", "1", "--out", tmp / "s"],
                      ["--trace-rate", "--trace-requests", "--policy", "--scenario", "--trace", "--jobs", "--seeds",
                       "--over-context", "--dir", "--report"]),
    }


FLAG_ALIASES = {"-o": "--output"}
FILE_FLAGS = {"--profile", "--faults", "--records", "--ledger", "--config", "--trace", "--backends-file", "--dir",
              "--model", "--gpu"}
"""Flags naming an input file (`--model`/`--gpu`: a name or a file): an error in the file's content
names the file (`nan:3: column ...`)."""


def flag_names(flag: str, value: str) -> list[str]:
    """What an error about `flag` may cite: the flag as given, its long form, its field spelling,
    and for an input file its path."""
    long = FLAG_ALIASES.get(flag, flag)
    return [flag, long, long.lstrip("-").replace("-", "_"), *([value] if flag in FILE_FLAGS and value else [])]


@settings(PROFILE, max_examples=examples(90))
@given(data=st.data())
def test_hostile_flags_for_every_command(capsys, tmp_path, data, served):
    """Every command's flags, hostile values included: exit 0, or exit 2 naming a flag given;
    a server command refuses a bad flag before it binds its port."""
    tmp_path = fresh(tmp_path)
    cmds = _commands(tmp_path)
    name = data.draw(st.sampled_from(sorted(cmds)))
    argv, flags = cmds[name]
    if name == "predict":
        run_cli(capsys, cmds["calibrate"][0])  # a valid profile to predict with
    extra: list[Any] = []
    names: list[str] = []
    for _ in range(data.draw(st.integers(1, 2))):
        if flags:
            flag, value = data.draw(st.sampled_from(flags)), data.draw(st.sampled_from(FLAG_VALUES))
            extra += [f"{flag}={value}"] if data.draw(st.booleans()) else [flag, value]
            names += flag_names(flag, value)
    served.clear()
    outputs = [tmp_path / "o" / "summary.json", tmp_path / "p.json", tmp_path / "s" / "scenarios.json"]
    o = check(capsys, [*argv, *extra], outputs, json_stdout=name in ("fit", "catalog") or name.startswith("ledger"),
              ok_codes=(0, 1), names=names or ["(none)"])
    if o.rc == 2:
        assert not served, f"{name} bound its port before refusing a flag: {o.line}"
    elif name in ("emulate", "gateway"):
        assert served == [name], (name, o.rc, o.err[-500:])
