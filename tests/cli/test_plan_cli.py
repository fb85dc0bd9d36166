"""`fleetwise plan`: bad specs are one line and exit 2; infeasible questions explain and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from fleetwise.cli.main import main
from fleetwise.spec.planning import planning_schema_text

SMALL = """\
model: llama-3.1-8b
accelerators: [{name: h100-sxm}]
workload: {rate_rps: 0.2, prompt_tokens: {kind: fixed, tokens: 256}, output_tokens: {kind: fixed, tokens: 64}}
slo: {ttft_s: 1.0, tpot_s: 0.05}
weight_dtypes: [bf16]
headroom: {burst_factor: 1.0}
search: {max_gpus: 8, top_k: 1, refine_top: 1, seeds: 2, sample_requests: 200, disaggregation: "off", bisect_steps: 3}
"""


def test_bad_field_is_one_line_and_exit_2(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL.replace("tpot_s: 0.05", "tpot_s: 0.05, tpot_percentile: 99"), encoding="utf-8")
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "slo.tpot_percentile: unknown field" in err[0]


def test_unknown_accelerator_is_one_line(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL.replace("h100-sxm", "h300"), encoding="utf-8")
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown gpu 'h300'" in err[0]


def test_json_out_and_exit_0(tmp_path, capsys):
    spec, out = tmp_path / "spec.yaml", tmp_path / "plan.json"
    spec.write_text(SMALL, encoding="utf-8")
    assert main(["plan", str(spec), "--json", str(out), "--workers", "1"]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [(p["role"], p["replicas"], p["tp"]) for p in doc["plans"][0]["pools"]] == [("mixed", 2, 1)]
    assert "ranked plans" in capsys.readouterr().out


def test_infeasible_explains_and_exits_1(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL.replace("ttft_s: 1.0", "ttft_s: 0.0001"), encoding="utf-8")
    assert main(["plan", str(spec), "--json", "-"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["plans"] == [] and "below the physical minimum" in doc["infeasible"]


def test_write_schema(tmp_path):
    path = tmp_path / "schema.json"
    assert main(["plan", "--write-schema", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == planning_schema_text()


def test_an_unknown_model_or_card_names_the_spec_and_the_field(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SMALL.replace("model: llama-3.1-8b", "model: llama-9b"), encoding="utf-8")
    assert main(["plan", str(spec)]) == 2
    assert capsys.readouterr().err == (
        f"fleetwise plan: error: {spec}: model: unknown model 'llama-9b'; closest known: llama-3.1-8b, "
        "llama-3.1-70b, llama-3.1-405b, gemma-3-27b (see `fleetwise catalog models`)\n")
    spec.write_text(SMALL.replace("model: llama-3.1-8b", f"model: {tmp_path / 'nothing' / 'config.json'}"))
    assert main(["plan", str(spec)]) == 2
    assert capsys.readouterr().err.startswith(f"fleetwise plan: error: {spec}: model: ")
    spec.write_text(SMALL.replace("[{name: h100-sxm}]", "[{name: h100-sxm}, {name: h300}]"), encoding="utf-8")
    assert main(["plan", str(spec)]) == 2
    assert capsys.readouterr().err.startswith(f"fleetwise plan: error: {spec}: accelerators.1.name: unknown gpu 'h300'")


def test_a_card_from_a_file_is_planned_and_its_fleet_simulates(tmp_path, capsys):
    """An accelerator given as a file (a card not in the catalog) names the pools by its path, as a
    model given as a config.json does, so the simulations and the fleet document find it again."""
    from fleetwise.spec.catalog import get_gpu
    from fleetwise.spec.plan import PlanSpec

    card = tmp_path / "my-card.json"
    card.write_text(json.dumps(get_gpu("h100-sxm").model_dump(mode="json") | {"name": "my-card"}), encoding="utf-8")
    spec, out = tmp_path / "spec.yaml", tmp_path / "plan.json"
    spec.write_text(SMALL.replace("name: h100-sxm", f"name: {card}"), encoding="utf-8")
    assert main(["plan", str(spec), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    fleet = PlanSpec.load(out)
    assert {p.accelerator for p in fleet.pools} == {str(card)}
    assert json.loads(out.read_text())["prices"] == {str(card): {
        "usd_per_gpu_hour": 3.0, "source": f"accelerator file {card}: price_per_hour_usd"}}
    workload = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "poisson-chat.yaml"
    capsys.readouterr()
    assert main(["simulate", str(out), "--workload", str(workload), "--requests", "20", "--out", str(tmp_path / "s")]) == 0
    assert "20/20 completed" in capsys.readouterr().out


def test_a_trace_whose_requests_arrive_at_once_names_the_spec_rate(tmp_path, capsys):
    """The planner rescales the trace's gaps to workload.rate_rps; the error quotes that field and
    its value, not the unit rate the planner rescales through."""
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.0,100,10\n" * 3)
    spec = tmp_path / "spec.yaml"
    lines = [f"workload: {{rate_rps: 0.2, arrival: {{kind: trace, path: {trace}}}, lengths: {{kind: trace}}}}"
             if line.startswith("workload:") else line for line in SMALL.splitlines()]
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["plan", str(spec), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"fleetwise plan: error: {trace}: workload.rate_rps=0.2: the kept requests all arrive at the same time, so "
        "there is no rate to rescale; use time_scale or more requests\n")


def test_a_preset_longer_than_the_context_says_how_to_fix_a_preset(tmp_path, capsys):
    """A preset has no max_tokens to cap, so the fix is independent lengths (or a longer context)."""
    cfg = tmp_path / "short-context" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                               "vocab_size": 128256, "max_position_embeddings": 8192}))
    lines = ["workload: {rate_rps: 0.2, lengths: {kind: preset, name: sharegpt}}" if line.startswith("workload:")
             else f"model: {cfg}" if line.startswith("model:") else line for line in SMALL.splitlines()]
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["plan", str(spec), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"fleetwise plan: error: {spec}: workload: sharegpt preset: prompt 8,141 + output 1,024 tokens exceeds the "
        "model's context of 8,192 tokens; presets have no cap: use independent lengths\n")
