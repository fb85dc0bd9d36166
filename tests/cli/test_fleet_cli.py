"""One fleet document from `plan` to every command that runs a fleet: `plan --json` carries it as
`fleet`, `--fleet-out` writes it alone, `simulate` runs either file with the plan's SLO, and
`gateway --plan` takes the fleet's routing and failure-domain decisions."""

from __future__ import annotations

import json

import pytest

from fleetwise.cli.gateway_cmd import build_config
from fleetwise.cli.main import build_parser, main
from fleetwise.spec.plan import FLEET_SCHEMA

from .test_plan_cli import SMALL


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    spec = d / "spec.yaml"
    spec.write_text(SMALL.replace("search:", "routing_policy: least-outstanding\nsearch:"), encoding="utf-8")
    assert main(["plan", str(spec), "--json", str(d / "p.json"), "--fleet-out", str(d / "fleet.json"),
                 "--workers", "1", "--quiet"]) == 0
    return d


def test_plan_writes_the_fleet_document_both_ways(planned):
    search = json.loads((planned / "p.json").read_text(encoding="utf-8"))
    fleet = json.loads((planned / "fleet.json").read_text(encoding="utf-8"))
    assert fleet == search["fleet"] and fleet["schema"] == FLEET_SCHEMA
    ranked = search["plans"][0]
    pool = fleet["pools"][0]
    assert (pool["role"], pool["replicas"], pool["parallelism"]["tp"]) == ("mixed", ranked["pools"][0]["replicas"], 1)
    assert pool["spare_replicas"] == ranked["pools"][0]["replicas"] - ranked["pools"][0]["serving_replicas"] == 1
    assert fleet["routing"] == ranked["routing_policy"] == "least-outstanding"
    assert fleet["slo"] == {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9}


@pytest.mark.parametrize("name", ["p.json", "fleet.json"])
def test_simulate_runs_the_plan_with_its_slo(planned, name, capsys):
    out = planned / f"sim-{name}"
    assert main(["simulate", str(planned / name), "--workload", "examples/workloads/poisson-chat.yaml",
                 "--requests", "40", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["slo"] == {"ttft_max_s": 1.0, "tpot_max_s": 0.05, "e2e_max_s": None}


def test_gateway_takes_the_fleets_routing(planned):
    args = build_parser().parse_args(["gateway", "--plan", str(planned / "p.json"),
                                      "--backend", "http://127.0.0.1:9"])
    cfg = build_config(args)
    assert cfg.routing.policy == "least-outstanding"
    args = build_parser().parse_args(["gateway", "--plan", str(planned / "p.json"), "--policy", "round-robin",
                                      "--backend", "http://127.0.0.1:9"])
    assert build_config(args).routing.policy == "round-robin"  # a flag overrides the document


def test_gateway_plan_without_backends_names_the_endpoints_file(planned, capsys):
    assert main(["gateway", "--plan", str(planned / "fleet.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backends-file FILE (`fleetwise emulate --plan PLAN --endpoints FILE`" in err[0]


@pytest.mark.parametrize("target", ["vllm", "k8s", "compose"])
def test_deploy_writes_the_plans_fleet(planned, target, capsys):
    out = planned / f"deploy-{target}"
    assert main(["deploy", str(planned / "p.json"), "--target", target, "-o", str(out)]) == 0
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    expected = {"vllm": ["fleet.json", "gateway.yaml", "vllm/mixed.sh"],
                "compose": ["compose.yaml", "fleet.json", "gateway.yaml"],
                "k8s": ["k8s/gateway-secret.yaml", "k8s/gateway.yaml", "k8s/namespace.yaml", "k8s/pool-mixed.yaml",
                        "k8s/servicemonitor.yaml"]}[target]
    assert [w for w in written if w != "k8s/grafana-dashboard.yaml"] == expected
    assert "as " + target in capsys.readouterr().out
    if target == "k8s":  # the acceptance line: plan --json, deploy --target k8s, and the manifests validate
        kv = pytest.importorskip("kubernetes_validate")
        import yaml

        for rel in written:
            for obj in yaml.safe_load_all((out / rel).read_text(encoding="utf-8")):
                if obj["kind"] not in ("ServiceMonitor", "LeaderWorkerSet"):
                    kv.validate(obj, "1.30", strict=True)


def test_deploy_of_an_older_plan_is_one_line(planned, capsys):
    doc = json.loads((planned / "p.json").read_text(encoding="utf-8"))
    del doc["fleet"]
    old = planned / "old.json"
    old.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["deploy", str(old), "--target", "k8s", "-o", str(planned / "old-out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "old.json: fleet: missing" in err[0]
