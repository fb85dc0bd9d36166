"""`fleetwise simulate`: plan + workload/trace + faults, the quick start, and user errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fleetwise.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "examples" / "plans"
WORKLOAD = ROOT / "examples" / "workloads" / "poisson-chat.yaml"


def write_azure_slice(path: Path, n: int = 40) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{i:02d}.0000000,{200 + 10 * i},{20 + i}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plan_with_workload_and_faults_writes_summary_and_records(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", str(PLANS / "pd-70b.yaml"), "--workload", str(WORKLOAD), "--faults",
               str(PLANS / "pd-70b.faults.yaml"), "--requests", "200", "--seed", "3", "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_total"] == 200 and s["seed"] == 3 and s["disaggregated"] is True
    assert s["requests_completed"] + s["requests_failed"] == 200
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 200 and rows[0]["prefill_worker"].startswith("prefill-")
    assert "completed" in capsys.readouterr().out


def test_a_run_where_no_request_completes_prints_no_latency_or_cost(tmp_path, capsys):
    """A KV link of 1 kbit/s: every hand-off outlives its lease, so nothing completes; the report
    says so instead of latencies and a cost of 0 (the summary's empty statistics)."""
    plan = tmp_path / "slow-link.yaml"
    plan.write_text((PLANS / "pd-70b.yaml").read_text().replace("gbps: 400 ", "gbps: 0.000001 "))
    rc = main(["simulate", str(plan), "--workload", str(WORKLOAD), "--requests", "5", "--out", str(tmp_path / "o")])
    assert rc == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert (s["requests_completed"], s["failure_reasons"]) == (0, {"lease_expired": 5})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pd-70b: 0/5 completed, 5 failed"
    assert out[1] == "  no request completed (lease_expired: 5): no latency, throughput or cost figures"
    assert not any(" ms " in line or "per 1M" in line for line in out)


def test_quick_start_with_a_trace(tmp_path):
    trace = write_azure_slice(tmp_path / "azure.csv")
    out = tmp_path / "q"
    rc = main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--replicas", "2", "--tp", "1",
               "--trace", str(trace), "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_completed"] == 40
    assert [r["name"] for r in s["per_replica"]] == ["mixed-0", "mixed-1"]
    assert [r["requests"] for r in s["per_replica"]] == [20, 20]


def test_quick_start_takes_a_policy_and_a_plan_file_is_overridden(tmp_path):
    trace = write_azure_slice(tmp_path / "azure.csv")
    quick = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--replicas", "2"]
    rc = main(["simulate", *quick, "--policy", "least-outstanding", "--trace", str(trace), "--out", str(tmp_path / "q")])
    assert rc == 0
    router = json.loads((tmp_path / "q" / "summary.json").read_text())["router"]
    assert router["policy"] == "least-outstanding" and router["decisions"] == 40
    assert "round-robin" not in router["by_reason"]
    rc = main(["simulate", str(PLANS / "pd-70b.yaml"), "--workload", str(WORKLOAD), "--requests", "30",
               "--policy", "fleetwise-default", "--out", str(tmp_path / "p")])
    assert rc == 0
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["router"]["policy"] == "fleetwise-default"


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--policy", "fastest"], "--policy='fastest': unknown routing"),
    (["--model", "llama-3.1-8b", "--gpu", "h100"], "unknown gpu 'h100'"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "3"], "tp=3 does not divide"),
    ([], "no plan"),
    (["plan.yaml"], "unknown field"),
], ids=["policy", "gpu", "tp", "no-plan", "bad-plan"])
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.yaml").write_text("pools:\n  - {name: m, accelerator: h100-sxm, model: llama-3.1-8b, tpp: 2}\n")
    trace = write_azure_slice(tmp_path / "t.csv", 3)
    rc = main(["simulate", *args, "--trace", str(trace), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_quick_start_from_files_names_the_plan_by_the_model_and_card(tmp_path):
    """`--model`/`--gpu` given as files name the run by what the files hold, not by their paths."""
    from fleetwise.spec.catalog import get_gpu

    card = tmp_path / "cards" / "my-card.json"
    card.parent.mkdir()
    card.write_text(json.dumps(get_gpu("h100-sxm").model_dump(mode="json") | {"name": "my-card"}))
    cfg = tmp_path / "Llama-3.1-8B" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                               "vocab_size": 128256, "max_position_embeddings": 131072}))
    out = tmp_path / "q"
    assert main(["simulate", "--model", str(cfg), "--gpu", str(card), "--trace",
                 str(write_azure_slice(tmp_path / "azure.csv", 4)), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["plan"] == "Llama-3.1-8B-my-card-x1"


def test_tpot_of_a_run_of_one_token_outputs_prints_as_not_applicable(tmp_path, capsys):
    trace = tmp_path / "one.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:{i:02d}.0000000,300,1\n" for i in range(5)))
    out = tmp_path / "o"
    assert main(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(trace),
                 "--tpot-slo", "0.001", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "tpot  n/a (every completed output is 1 token)" in text and "SLO attainment 100.0%" in text
    s = json.loads((out / "summary.json").read_text())
    assert s["tpot_s"] == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_a_one_sided_pd_upgrade_is_warned_before_the_run(tmp_path, capsys):
    faults = tmp_path / "f.yaml"
    faults.write_text("faults:\n  - {kind: rolling_upgrade, pool: decode, start_s: 1, new_model_version: v2}\n")
    rc = main(["simulate", str(PLANS / "pd-70b.yaml"), "--workload", str(WORKLOAD), "--faults", str(faults),
               "--requests", "20", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and err.startswith(f"warning: {faults}: faults.0 (rolling_upgrade): pool 'decode' is the decode side")
    assert "add matched_with: prefill" in err


def test_requests_over_max_model_len_are_counted_and_the_run_completes(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text("pools:\n  - {name: m, accelerator: h100-sxm, model: llama-3.1-8b, engine: {max_model_len: 400}}\n")
    out = tmp_path / "o"  # the azure slice's requests i hold 220 + 11 i tokens: i >= 17 exceed 400
    assert main(["simulate", str(plan), "--trace", str(write_azure_slice(tmp_path / "t.csv", 20)), "--out", str(out),
                 "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_completed"] == 17 and s["failure_reasons"] == {"rejected_max_model_len": 3}
    assert s["over_context"]["rejected_max_model_len"] == 3
    assert "3 rejected on arrival: longer than a replica's max_model_len" in capsys.readouterr().out
