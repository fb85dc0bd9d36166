"""Regression tests: each bad input named in the hostile-input report gives exit 2 and one line
naming the field (or, where the input is valid, a correct result), never a traceback."""

from __future__ import annotations

import json

import pytest
from hostile_cli import ALIAS_BOMB, PLANS, assert_user_error, finite_nonneg_times, load_strict_json, run_cli

COLOCATED = PLANS / "colocated-8b.yaml"
PD = PLANS / "pd-70b.yaml"


def workload(tmp_path, body: str, name: str = "w.yaml"):
    p = tmp_path / name
    p.write_text(body)
    return p


def small_workload(tmp_path, prompt: int = 100, output: int = 8, n: int = 6, extra: str = ""):
    return workload(tmp_path, f"arrival: {{kind: poisson, rate_rps: 4}}\nlengths:\n  kind: independent\n"
                              f"  input: {{kind: fixed, tokens: {prompt}}}\n  output: {{kind: fixed, tokens: {output}}}\n"
                              f"num_requests: {n}\n{extra}")


def simulate(capsys, tmp_path, *args):
    return run_cli(capsys, ["simulate", *args, "--out", tmp_path / "out", "--no-progress"])


# ---- files that are not what they claim ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["plan", "workload", "faults", "profile", "groundtruth", "planning", "model"])
@pytest.mark.parametrize("content,needle", [
    ("pools: []\n".encode("utf-16"), "UTF-16"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", "binary data"),
    (b"name: \xc3\x28\n", "not UTF-8"),
], ids=["utf16", "binary", "bad-utf8"])
def test_binary_and_utf16_files_are_one_line(capsys, tmp_path, kind, content, needle):
    bad = tmp_path / ("bad.json" if kind in ("profile", "groundtruth") else "bad.yaml")
    bad.write_bytes(content)
    wl = small_workload(tmp_path)
    argv = {
        "plan": ["simulate", bad, "--workload", wl, "--out", tmp_path / "o"],
        "workload": ["simulate", COLOCATED, "--workload", bad, "--out", tmp_path / "o"],
        "faults": ["simulate", COLOCATED, "--workload", wl, "--faults", bad, "--out", tmp_path / "o"],
        "profile": ["predict", "--profile", bad, "--against", bad],
        "groundtruth": ["calibrate", bad, "-o", tmp_path / "p.json"],
        "planning": ["plan", bad],
        "model": ["fit", "--model", bad, "--gpu", "h100-sxm"],
    }[kind]
    assert_user_error(run_cli(capsys, argv), str(bad), needle)


@pytest.mark.parametrize("kind", ["plan", "workload", "faults", "planning", "model", "gpu", "gateway", "up"])
def test_an_empty_file_says_it_is_empty(capsys, tmp_path, kind):
    # it was "expected a mapping at the top level, got NoneType", with no fix
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    wl = small_workload(tmp_path)
    argv = {
        "plan": ["simulate", empty, "--workload", wl, "--out", tmp_path / "o"],
        "workload": ["simulate", COLOCATED, "--workload", empty, "--out", tmp_path / "o"],
        "faults": ["simulate", COLOCATED, "--workload", wl, "--faults", empty, "--out", tmp_path / "o"],
        "planning": ["plan", empty],
        "model": ["fit", "--model", empty, "--gpu", "h100-sxm"],
        "gpu": ["fit", "--model", "llama-3.1-8b", "--gpu", empty],
        "gateway": ["gateway", "--config", empty],
        "up": ["up", empty],
    }[kind]
    assert_user_error(run_cli(capsys, argv), f"{empty}: expected a mapping", "the file is empty; write its fields")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_documents_nested_thousands_deep(capsys, tmp_path, suffix):
    p = tmp_path / f"deep{suffix}"
    p.write_text('{"pools": ' + "[" * 5000 + "]" * 5000 + "}")
    assert_user_error(simulate(capsys, tmp_path, p, "--workload", small_workload(tmp_path)), "nested", "deep")


def test_yaml_alias_bomb_is_refused_quickly(capsys, tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(ALIAS_BOMB + "pools: *i\n")
    assert p.stat().st_size < 500
    assert_user_error(simulate(capsys, tmp_path, p, "--workload", small_workload(tmp_path)), "expands to more than")


def test_duplicate_model_key_does_not_silently_keep_the_last(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\nmodel: llama-3.1-405b\naccelerators: [{name: h100-sxm}]\n"
                    "workload: {rate_rps: 1, preset: sharegpt}\nslo: {ttft_s: 2, tpot_s: 0.05}\n")
    assert_user_error(run_cli(capsys, ["plan", spec]), "duplicate key 'model'")


# ---- numbers that are not numbers ---------------------------------------------------------------


@pytest.mark.parametrize("field,value", [
    ("arrival", "{kind: poisson, rate_rps: .inf}"),
    ("arrival", "{kind: poisson, rate_rps: .nan}"),
    ("arrival", "{kind: trace, path: t.csv, time_scale: .nan}"),
])
def test_non_finite_workload_numbers(capsys, tmp_path, field, value):
    wl = workload(tmp_path, f"{field}: {value}\nlengths: {{kind: independent, input: {{kind: fixed, tokens: 10}}, "
                            "output: {kind: fixed, tokens: 5}}\nnum_requests: 3\n")
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "not a finite number")


@pytest.mark.parametrize("plan_body,field", [
    ("pools: [{name: m, accelerator: h100-sxm, model: llama-3.1-8b, price_per_gpu_hour_usd: .inf}]", "price_per_gpu_hour_usd"),
    ("pools: [{name: m, accelerator: h100-sxm, model: llama-3.1-8b}]\nkv_link: {gbps: .inf}", "gbps"),
])
def test_non_finite_plan_numbers(capsys, tmp_path, plan_body, field):
    plan = workload(tmp_path, plan_body + "\n", "plan.yaml")
    assert_user_error(simulate(capsys, tmp_path, plan, "--workload", small_workload(tmp_path)), field, "finite")


def test_non_finite_fault_time(capsys, tmp_path):
    faults = workload(tmp_path, "faults: [{kind: crash, replica: mixed-0, at_s: .nan}]\n", "f.yaml")
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--faults", faults)
    assert_user_error(o, "faults.0", "finite")


def test_non_finite_price_in_an_accelerator_file(capsys, tmp_path):
    gpu = workload(tmp_path, "name: x\nvendor: v\nhbm_bytes: 8.0e10\nhbm_bytes_per_s: .inf\n", "gpu.yaml")
    assert_user_error(run_cli(capsys, ["fit", "--model", "llama-3.1-8b", "--gpu", gpu]), "gpu.yaml")


@pytest.mark.parametrize("flag,value,needle", [
    ("--rate", "-3", "--rate"), ("--rate", "nan", "--rate"), ("--rate", "inf", "--rate"),
    ("--arrival-stretch", "-1", "--arrival-stretch"), ("--arrival-stretch", "nan", "--arrival-stretch"),
    ("--arrival-stretch", "1e-300", "--arrival-stretch"),
    ("--feedback-delay", "-1", "--feedback-delay"), ("--feedback-delay", "inf", "--feedback-delay"),
    ("--requests", "-5", "--requests"), ("--requests", "0", "--requests"),
    ("--ttft-slo", "-1", "--ttft-slo"), ("--tpot-slo", "nan", "--tpot-slo"), ("--e2e-slo", "inf", "--e2e-slo"),
    ("--seed", "-1", "--seed"), ("--replicas", "0", "--replicas"), ("--replicas", "1000000000", "--replicas"),
])
def test_bad_numeric_flags_are_refused_before_work(capsys, tmp_path, flag, value, needle):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00.0,100,10\n"
                     "2023-11-16 18:15:01.0,100,10\n")
    o = run_cli(capsys, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", trace,
                         f"{flag}={value}", "--out", tmp_path / "o"])
    assert_user_error(o, needle)
    assert not (tmp_path / "o").exists()


def test_json_outputs_are_strict(capsys, tmp_path):
    for argv in (["catalog", "models", "--json"], ["catalog", "gpus", "--json"],
                 ["fit", "--model", "llama-3.1-405b", "--gpu", "h100-sxm", "--json"]):
        o = run_cli(capsys, argv)
        assert o.rc == 0
        load_strict_json(o.out)


# Spec files are read strictly: a count written "100", 100.7 or true, a rate written "5" or true,
# is an error naming the field, never coerced (the trace-row rule, for every spec file).

_PLAN = "name: p\npools: [{name: mixed, accelerator: h100-sxm, model: llama-3.1-8b, replicas: %s}]\n"
_WL = ("arrival: {kind: poisson, rate_rps: %s}\nlengths: {kind: independent, input: {kind: fixed, tokens: 50}, "
       "output: {kind: fixed, tokens: 4}}\nnum_requests: %s\n")


@pytest.mark.parametrize("value,fix", [('"2"', "without quotes"), ("2.5", "whole number"), ("true", "true/false"),
                                       ("2.0", "whole number")])
def test_plan_counts_are_not_coerced(capsys, tmp_path, value, fix):
    plan = workload(tmp_path, _PLAN % value, "plan.yaml")
    line = assert_user_error(simulate(capsys, tmp_path, plan, "--workload", small_workload(tmp_path)),
                             "plan.yaml", "pools.0.replicas", "valid integer", fix)
    assert f"(got {value.strip(chr(34))}" in line.replace("'", "").lower()  # the value as read, quoted


@pytest.mark.parametrize("rate,count,field", [("5", '"100"', "num_requests"), ("5", "100.7", "num_requests"),
                                              ("5", "true", "num_requests"), ('"5"', "10", "arrival.poisson.rate_rps"),
                                              ("true", "10", "arrival.poisson.rate_rps")])
def test_workload_numbers_are_not_coerced(capsys, tmp_path, rate, count, field):
    wl = workload(tmp_path, _WL % (rate, count))
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "w.yaml", field)


def test_workload_numbers_in_json_are_not_coerced(capsys, tmp_path):
    wl = workload(tmp_path, json.dumps({"arrival": {"kind": "poisson", "rate_rps": 5},
                                        "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": "50"},
                                                    "output": {"kind": "fixed", "tokens": 4}},
                                        "num_requests": 10}), "w.json")
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "w.json", "lengths", "tokens",
                      "without quotes")


def test_fault_times_and_planning_counts_are_not_coerced(capsys, tmp_path):
    faults = workload(tmp_path, 'faults: [{kind: crash, replica: mixed-0, at_s: "1"}]\n', "f.yaml")
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--faults", faults)
    assert_user_error(o, "f.yaml", "at_s", "without quotes")
    spec = workload(tmp_path, "model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\n"
                              "workload: {rate_rps: 1, preset: sharegpt}\nslo: {ttft_s: 2, tpot_s: 0.05}\n"
                              "search: {seeds: '2'}\n", "s.yaml")
    assert_user_error(run_cli(capsys, ["plan", spec]), "s.yaml", "search.seeds", "without quotes")


def test_an_integer_is_still_a_valid_float_and_flags_still_parse_text(capsys, tmp_path):
    wl = workload(tmp_path, _WL % ("5", "6"))  # rate_rps: 5 (an integer) is a float field
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", wl, "--requests", "4", "--ttft-slo", "2")
    assert o.rc == 0, o.err
    summary = load_strict_json((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests_total"] == 4


# ---- flags that skip the specs' validation ------------------------------------------------------


@pytest.mark.parametrize("flag", [["--trace-requests", "0"], ["--trace-rate", "0"], ["--trace-rate", "nan"],
                                  ["--seeds", "0"], ["--seeds", "100000"], ["--jobs", "0"],
                                  ["--policy", "fastest"]])
def test_scenario_flags(capsys, tmp_path, flag):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00.0,100,10\n")
    o = run_cli(capsys, ["scenarios", "--small", "--trace", trace, *flag, "--out", tmp_path / "o"])
    assert_user_error(o, flag[0] if flag[0] != "--policy" else "routing policy 'fastest'")


def test_unknown_routing_policy_in_a_plan_names_the_field(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\nworkload: {rate_rps: 1, preset: sharegpt}\n"
                    "slo: {ttft_s: 2, tpot_s: 0.05}\nrouting_policy: fastest\n")
    line = assert_user_error(run_cli(capsys, ["plan", spec]), "routing_policy", "'fastest'")
    assert "catalog" not in line  # no hint to a command that does not exist


def test_bad_output_paths_fail_before_the_run(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    o = run_cli(capsys, ["simulate", COLOCATED, "--workload", small_workload(tmp_path), "--out", tmp_path / "file" / "o"])
    assert_user_error(o, "--out")
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\nworkload: {rate_rps: 1, preset: sharegpt}\n"
                    "slo: {ttft_s: 2, tpot_s: 0.05}\n")
    assert_user_error(run_cli(capsys, ["plan", spec, "-o", tmp_path / "missing" / "x.json"]), "--output")
    o = run_cli(capsys, ["scenarios", "--small", "--out", tmp_path / "file"])
    assert_user_error(o, "--out")


def test_unwritable_report_schema_and_endpoints_paths_fail_before_the_work(capsys, tmp_path):
    # each was an internal error (exit 70) once the run, the plan or the fleet had started
    (tmp_path / "file").write_text("x")
    under_a_file = tmp_path / "file" / "sub"
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\nworkload: {rate_rps: 1, preset: sharegpt}\n"
                    "slo: {ttft_s: 2, tpot_s: 0.05}\n")
    o = run_cli(capsys, ["simulate", COLOCATED, "--workload", small_workload(tmp_path), "--out", tmp_path / "o",
                         "--report", under_a_file / "r.html"])
    assert_user_error(o, "--report=", "is a file, so the directory cannot be made")
    assert not (tmp_path / "o").exists()
    assert_user_error(run_cli(capsys, ["plan", spec, "--report", under_a_file / "r.html"]), "--report=", "is a file")
    assert_user_error(run_cli(capsys, ["scenarios", "--small", "--out", tmp_path / "sc", "--report",
                                       under_a_file / "r.html"]), "--report=", "is a file")
    assert_user_error(run_cli(capsys, ["report", tmp_path / "missing.json", "-o", under_a_file / "r.html"]),
                      "--report=", "is a file")
    assert_user_error(run_cli(capsys, ["plan", "--write-schema", under_a_file / "s.json"]), "--write-schema=",
                      "is a file")
    o = run_cli(capsys, ["emulate", "--plan", COLOCATED, "--port", "1", "--endpoints", under_a_file / "ep.json"])
    assert_user_error(o, "--endpoints=", "does not exist")
    assert run_cli(capsys, ["plan", "--write-schema", tmp_path / "new" / "s.json"]).rc == 0  # its folder is made
    assert json.loads((tmp_path / "new" / "s.json").read_text())["title"]


@pytest.mark.parametrize("doc", [{"schema": "fleetwise-plan/1"}, {"schema": "fleetwise-plan/1", "plans": "x"},
                                 {"schema": "fleetwise-scenarios/1", "scenarios": [1]}],
                         ids=["plan-schema-only", "plans-a-string", "scenarios-of-numbers"])
def test_a_result_cut_short_or_edited_is_one_line_not_an_internal_error(capsys, tmp_path, doc):
    # a plan JSON holding only its schema was "internal error: KeyError: 'workload'", exit 70
    f = tmp_path / "result.json"
    f.write_text(json.dumps(doc))
    assert_user_error(run_cli(capsys, ["report", f, "-o", tmp_path / "r.html"]), f"{f}: not a whole result",
                      "give the file the command wrote")


# ---- physics the tool should know ---------------------------------------------------------------


def test_prompt_beyond_the_model_context_is_rejected_by_default(capsys, tmp_path):
    wl = small_workload(tmp_path, prompt=200_000)
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "131,072", "--over-context")


def test_over_context_truncate_and_skip_are_counted(capsys, tmp_path):
    wl = small_workload(tmp_path, prompt=200_000, n=4)
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", wl, "--over-context", "truncate")
    assert o.rc == 0, o.err
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["over_context"] == {"policy": "truncate", "max_context_tokens": 131072, "truncated": 4, "skipped": 0,
                                 "rejected_max_model_len": 0}
    assert s["requests_completed"] == 4
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", wl, "--over-context", "skip")
    assert_user_error(o, "every request was skipped")


def test_ten_million_token_prompt_names_the_context(capsys, tmp_path):
    wl = small_workload(tmp_path, prompt=10_000_000)
    line = assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "context")
    assert "fits()" not in line


def test_planning_workload_beyond_the_context(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\nslo: {ttft_s: 2, tpot_s: 0.05}\n"
                    "workload: {rate_rps: 1, prompt_tokens: {kind: fixed, tokens: 200000}, "
                    "output_tokens: {kind: fixed, tokens: 10}}\n")
    assert_user_error(run_cli(capsys, ["plan", spec]), "workload", "131,072")


def test_slowdown_factor_that_would_speed_up_is_refused(capsys, tmp_path):
    faults = workload(tmp_path, "faults: [{kind: slowdown, replica: mixed-0, start_s: 0, end_s: 5, factor: 1.0e-300}]\n",
                      "f.yaml")
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--faults", faults)
    assert_user_error(o, "factor")


def test_kv_link_fault_on_a_colocated_plan_is_refused(capsys, tmp_path):
    faults = workload(tmp_path, "faults: [{kind: kv_link, start_s: 0, end_s: 5, bandwidth_factor: 0}]\n", "f.yaml")
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--faults", faults)
    assert_user_error(o, "faults.0 (kv_link)", "colocated")


def test_fault_on_a_replica_the_plan_lacks(capsys, tmp_path):
    faults = workload(tmp_path, "faults: [{kind: crash, replica: mixed-7, at_s: 1}]\n", "f.yaml")
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--faults", faults)
    assert_user_error(o, "replica='mixed-7' is not in the plan")


def _long_trace(tmp_path, prompts=(120, 200_000, 90, 300_000, 80)):
    """A Mooncake trace whose 2nd and 4th prompts exceed the 131,072-token context of llama-3.1-8b."""
    rows = [json.dumps({"timestamp": 1000 * i, "input_length": p, "output_length": 8}) for i, p in enumerate(prompts)]
    return workload(tmp_path, "\n".join(rows) + "\n", "long.jsonl")


def test_scenarios_trace_beyond_the_context_is_rejected_before_any_run(capsys, tmp_path):
    o = run_cli(capsys, ["scenarios", "--small", "--scenario", "heterogeneous", "--seeds", "1",
                         "--trace", _long_trace(tmp_path), "--out", tmp_path / "o"])
    assert_user_error(o, "long.jsonl", "seed 0", "request 1 (of 2 such)", "prompt 200,000 + output 8",
                      "131,072", "--over-context truncate|skip")
    assert not (tmp_path / "o" / "scenarios.json").exists()


@pytest.mark.parametrize("policy,truncated,skipped", [("truncate", 2, 0), ("skip", 0, 2)])
def test_scenarios_trace_over_context_is_counted(capsys, tmp_path, policy, truncated, skipped):
    o = run_cli(capsys, ["scenarios", "--small", "--scenario", "heterogeneous", "--seeds", "1", "--no-fail",
                         "--trace", _long_trace(tmp_path), "--over-context", policy, "--out", tmp_path / "o"])
    assert o.rc == 0, o.err
    doc = load_strict_json((tmp_path / "o" / "scenarios.json").read_text())
    assert doc["info"]["heterogeneous"]["over_context"] == policy
    for runs in doc["scenarios"]["heterogeneous"].values():
        assert runs[0]["over_context"] == {"truncated": truncated, "skipped": skipped}
        assert runs[0]["requests"] == 5 - skipped


def _trace_planning_spec(tmp_path, over_context=None):
    extra = f", over_context: {over_context}" if over_context else ""
    trace = _long_trace(tmp_path, (120, 200_000, 90, 300_000) + (80,) * 50)  # >= sample_requests once 2 are skipped
    return workload(tmp_path, "model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\n"
                              f"workload: {{rate_rps: 0.2, arrival: {{kind: trace, path: {trace}}}{extra}}}\n"
                              "slo: {ttft_s: 5.0, tpot_s: 0.2}\nweight_dtypes: [bf16]\nheadroom: {burst_factor: 1.0}\n"
                              "search: {max_gpus: 1, top_k: 1, refine_top: 1, seeds: 1, sample_requests: 50, "
                              "disaggregation: 'off', bisect_steps: 1}\n", "spec.yaml")


def test_planning_trace_beyond_the_context_is_rejected(capsys, tmp_path):
    o = run_cli(capsys, ["plan", _trace_planning_spec(tmp_path), "--workers", "1"])
    assert_user_error(o, "workload.arrival.path=", "request 1 (of 2 such)", "prompt 200,000 + output 8",
                      "workload.over_context: truncate|skip")


@pytest.mark.parametrize("policy,truncated,skipped", [("truncate", 2, 0), ("skip", 0, 2)])
def test_planning_trace_over_context_is_counted_in_the_plan(capsys, tmp_path, policy, truncated, skipped):
    out = tmp_path / "plan.json"
    o = run_cli(capsys, ["plan", _trace_planning_spec(tmp_path, policy), "--workers", "1", "-o", out])
    assert o.rc in (0, 1), o.err
    doc = load_strict_json(out.read_text())
    assert doc["workload"]["over_context"] == {"policy": policy, "max_context_tokens": 131_072,
                                               "truncated": truncated, "skipped": skipped}


# ---- sizes that exhaust the machine --------------------------------------------------------------


def test_a_billion_replicas(capsys, tmp_path):
    plan = workload(tmp_path, "pools: [{name: m, accelerator: h100-sxm, model: llama-3.1-8b, replicas: 1000000000}]\n",
                    "plan.yaml")
    assert_user_error(simulate(capsys, tmp_path, plan, "--workload", small_workload(tmp_path)), "replicas", "10000")


def test_a_billion_requests_is_over_the_limit(capsys, tmp_path):
    wl = small_workload(tmp_path, n=1_000_000_000)
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl, "--requests", "200"), "num_requests")


def test_requests_flag_generates_only_what_it_keeps(capsys, tmp_path):
    wl = small_workload(tmp_path, n=5_000_000)
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", wl, "--requests", "20")
    assert o.rc == 0, o.err
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["requests_total"] == 20


def test_a_million_turns(capsys, tmp_path):
    wl = small_workload(tmp_path, extra="prefix: {sessions: {mean_turns: 1000000}}\n")
    assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "mean_turns")


def test_a_hundred_thousand_planning_seeds(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-3.1-8b\naccelerators: [{name: h100-sxm}]\nworkload: {rate_rps: 1, preset: sharegpt}\n"
                    "slo: {ttft_s: 2, tpot_s: 0.05}\nsearch: {seeds: 100000}\n")
    assert_user_error(run_cli(capsys, ["plan", spec]), "search.seeds", "1000")


# ---- messages that mislead -----------------------------------------------------------------------


def test_an_eight_megabyte_name_is_not_echoed(capsys, tmp_path):
    o = run_cli(capsys, ["fit", "--model", "x" * 8_000_000, "--gpu", "h100-sxm"])
    assert_user_error(o, "model")


def test_an_eight_megabyte_field_value_is_not_echoed(capsys, tmp_path):
    plan = workload(tmp_path, "pools: [{name: m, accelerator: h100-sxm, model: llama-3.1-8b, replicas: '"
                    + "9" * 1_000_000 + "'}]\n", "plan.yaml")
    assert_user_error(simulate(capsys, tmp_path, plan, "--workload", small_workload(tmp_path)), "replicas")


def test_zero_token_output_names_the_output(capsys, tmp_path):
    wl = workload(tmp_path, "arrival: {kind: poisson, rate_rps: 4}\nlengths: {kind: independent, input: "
                            "{kind: fixed, tokens: 10}, output: {kind: fixed, tokens: 0}}\nnum_requests: 3\n")
    line = assert_user_error(simulate(capsys, tmp_path, COLOCATED, "--workload", wl), "output")
    assert "memory" not in line


def test_simulate_summary_is_strict_json_with_finite_times(capsys, tmp_path):
    o = simulate(capsys, tmp_path, COLOCATED, "--workload", small_workload(tmp_path), "--ttft-slo", "0.5")
    assert o.rc == 0, o.err
    doc = load_strict_json((tmp_path / "out" / "summary.json").read_text())
    finite_nonneg_times(doc)


# ---- trace rows that lie -------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(tmp_path, rows: list[str]):
    p = tmp_path / "azure.csv"
    p.write_text(AZURE_HEADER + "".join(r + "\n" for r in rows))
    return p


def _mooncake(tmp_path, rows: list[str]):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(r + "\n" for r in rows))
    return p


def _trace_sim(capsys, tmp_path, trace):
    return run_cli(capsys, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", trace,
                            "--out", tmp_path / "o", "--no-progress"])


def test_year_2300_timestamp_does_not_wrap(capsys, tmp_path):
    rows = [f"2023-11-16 18:15:0{i}.0000000,100,10" for i in range(5)] + ["2300-01-01 00:00:00.0000000,100,10"]
    assert_user_error(_trace_sim(capsys, tmp_path, _azure(tmp_path, rows)), "azure.csv:7", "'TIMESTAMP'", "2300")


def test_not_a_time_timestamp_names_the_row(capsys, tmp_path):
    rows = ["2023-11-16 18:15:00.0000000,100,10", "NaT,100,10"]
    assert_user_error(_trace_sim(capsys, tmp_path, _azure(tmp_path, rows)), "azure.csv:3", "NaT")


def test_hash_ids_string_is_not_read_as_digits(capsys, tmp_path):
    rows = ['{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": "123"}']
    assert_user_error(_trace_sim(capsys, tmp_path, _mooncake(tmp_path, rows)), "m.jsonl:1", "hash_ids", "'123'")


@pytest.mark.parametrize("value", ["100.7", "true", '"100"', "-3", "1e400"])
def test_mooncake_lengths_are_not_coerced(capsys, tmp_path, value):
    rows = ['{"timestamp": 0, "input_length": 100, "output_length": 5}',
            f'{{"timestamp": 10, "input_length": {value}, "output_length": 5}}']
    assert_user_error(_trace_sim(capsys, tmp_path, _mooncake(tmp_path, rows)), "m.jsonl:2")


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"5"', "1e300"])
def test_mooncake_timestamps_must_be_finite_numbers(capsys, tmp_path, value):
    rows = ['{"timestamp": 0, "input_length": 100, "output_length": 5}',
            f'{{"timestamp": {value}, "input_length": 100, "output_length": 5}}']
    assert_user_error(_trace_sim(capsys, tmp_path, _mooncake(tmp_path, rows)), "m.jsonl")


@pytest.mark.parametrize("rows", [["2023-11-16 18:15:00.0000000,100.7,10"], ["2023-11-16 18:15:00.0000000,true,10"]])
def test_csv_lengths_are_not_coerced(capsys, tmp_path, rows):
    assert_user_error(_trace_sim(capsys, tmp_path, _azure(tmp_path, rows)), "azure.csv:2", "ContextTokens")


def test_zero_token_prompt_in_a_trace_is_refused(capsys, tmp_path):
    rows = ["2023-11-16 18:15:00.0000000,100,10", "2023-11-16 18:15:01.0000000,0,10"]
    assert_user_error(_trace_sim(capsys, tmp_path, _azure(tmp_path, rows)), "request 1", "prompt of 0 tokens")


@pytest.mark.parametrize("content", ["ts\n".encode("utf-16"), b"TIMESTAMP,ContextTokens\n\x00\x01\x02,\xff\n"])
def test_binary_and_utf16_traces(capsys, tmp_path, content):
    p = tmp_path / "t.csv"
    p.write_bytes(content)
    assert_user_error(_trace_sim(capsys, tmp_path, p), "t.csv")


def test_deeply_nested_trace_row(capsys, tmp_path):
    rows = ['{"timestamp": 0, "input_length": 100, "output_length": 5, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"]
    assert_user_error(_trace_sim(capsys, tmp_path, _mooncake(tmp_path, rows)), "m.jsonl:1")


def test_csv_length_beyond_int64_is_refused_not_wrapped(capsys, tmp_path):
    rows = ["2023-11-16 18:15:00.0000000,1e30,10"]
    assert_user_error(_trace_sim(capsys, tmp_path, _azure(tmp_path, rows)), "azure.csv:2", "ContextTokens", "1e30")
