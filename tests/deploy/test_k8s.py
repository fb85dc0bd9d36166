"""Target `k8s`: every built-in object validates offline against the Kubernetes schemas
(`kubernetes-validate`, strict: unknown fields fail), the pod templates of a LeaderWorkerSet too;
GPU requests, probes, scrape annotations, per-replica DNS names and the PodDisruptionBudget follow
the fleet document."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from fleetwise.deploy import DeployOptions, render
from fleetwise.deploy import k8s as k8s_target
from fleetwise.errors import SpecError
from fleetwise.gateway.config import GatewayConfig
from fleetwise.spec.base import validate
from fleetwise.spec.plan import PlanSpec

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBERNETES_VERSION = "1.30"
"""Kubernetes release whose schemas the manifests are validated against (a version platform
teams run; `kubernetes-validate` ships the schemas, no cluster or network needed)."""
CRDS = {"ServiceMonitor", "LeaderWorkerSet"}


def _objects(files):
    return [(rel, obj) for rel, text in files.items() for obj in yaml.safe_load_all(text) if obj]


def _validate_pod_template(template):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **template["metadata"]},
           "spec": template["spec"]}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_manifests_validate_against_the_kubernetes_schemas(fleet):
    objs = _objects(render(fleet, "k8s", DeployOptions()))
    kinds = set()
    for _, obj in objs:
        kinds.add(obj["kind"])
        if obj["kind"] in CRDS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    for _, obj in objs:
        if obj["kind"] == "LeaderWorkerSet":
            t = obj["spec"]["leaderWorkerTemplate"]
            _validate_pod_template(t["leaderTemplate"])
            _validate_pod_template(t["workerTemplate"])
    assert {"Namespace", "Service", "PodDisruptionBudget", "ConfigMap", "Secret", "Deployment",
            "ServiceMonitor"} <= kinds


def test_a_schema_violation_would_fail():
    bad = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"},
           "spec": {"maxUnavailabel": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def _by(objs, kind, name):
    return next(o for _, o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_workloads_follow_the_pools(fleet):
    objs = _objects(render(fleet, "k8s", DeployOptions(namespace="llm")))
    assert {o["metadata"].get("namespace") for _, o in objs if o["kind"] != "Namespace"} == {"llm"}
    for pool in fleet.pools:
        multinode = pool.parallelism.gpus > 8
        kind = "LeaderWorkerSet" if multinode else "StatefulSet"
        w = _by(objs, kind, pool.name)
        assert w["spec"]["replicas"] == pool.replicas
        if multinode:
            t = w["spec"]["leaderWorkerTemplate"]
            assert t["size"] == 2
            pods = [t["leaderTemplate"], t["workerTemplate"]]
            assert "--pipeline-parallel-size 2" in pods[0]["spec"]["containers"][0]["command"][2]
        else:
            assert w["spec"]["serviceName"] == pool.name
            pods = [w["spec"]["template"]]
        for pod in pods:
            c = pod["spec"]["containers"][0]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == min(pool.parallelism.gpus, 8)
            assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
            assert pod["spec"]["nodeSelector"] == {"fleetwise.dev/accelerator": pool.accelerator}
        head = pods[0]["spec"]["containers"][0]
        assert head["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
        lease = [e["value"] for e in head["env"] if e["name"] == "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"]
        assert lease == ([str(math.ceil(fleet.failure_domains.kv_lease_s))] if pool.role == "prefill" else [])
        pdb = _by(objs, "PodDisruptionBudget", pool.name)
        assert pdb["spec"]["maxUnavailable"] == pool.spare_replicas
        assert _by(objs, "Service", pool.name)["spec"]["clusterIP"] == "None"


def test_gateway_config_secret_and_dns_names(fleet):
    objs = _objects(render(fleet, "k8s", DeployOptions()))
    cm = _by(objs, "ConfigMap", "fleetwise-gateway")
    cfg = validate(GatewayConfig, yaml.safe_load(cm["data"]["gateway.yaml"]), "gateway.yaml", strict=True)
    assert [b.url for b in cfg.backends] == [f"http://{p.name}-{i}.{p.name}:8000" for p in fleet.pools
                                             for i in range(p.replicas)]
    dep = _by(objs, "Deployment", "fleetwise-gateway")
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": cfg.admin_token_env,
                    "valueFrom": {"secretKeyRef": {"name": "fleetwise-gateway-admin", "key": "token"}}}]
    assert len(_by(objs, "Secret", "fleetwise-gateway-admin")["stringData"]["token"]) >= 24


def test_grafana_dashboard_is_shipped_when_the_report_package_has_one(fleet, tmp_path, monkeypatch):
    dash = tmp_path / "fleetwise-dashboard.json"
    dash.write_text(json.dumps({"title": "fleetwise", "panels": []}), encoding="utf-8")
    monkeypatch.setattr(k8s_target, "DASHBOARD", dash)
    files = render(fleet, "k8s", DeployOptions())
    cm = _by(_objects(files), "ConfigMap", "fleetwise-grafana-dashboard")
    assert json.loads(cm["data"]["fleetwise-dashboard.json"]) == {"title": "fleetwise", "panels": []}
    kubernetes_validate.validate(cm, KUBERNETES_VERSION, strict=True)
    monkeypatch.setattr(k8s_target, "DASHBOARD", tmp_path / "absent.json")
    assert "k8s/grafana-dashboard.yaml" not in render(fleet, "k8s", DeployOptions())


def test_names_kubernetes_refuses_are_named(fleet):
    from fleetwise.errors import SpecError

    with pytest.raises(SpecError, match=r"--namespace='Bad_NS' is not a Kubernetes name"):
        render(fleet, "k8s", DeployOptions(namespace="Bad_NS"))
    pools = [fleet.pools[0].model_copy(update={"name": "Prefill_A"}), *fleet.pools[1:]]
    with pytest.raises(SpecError, match=r"pools.0.name='Prefill_A' cannot name a Kubernetes workload"):
        render(fleet.model_copy(update={"pools": pools}), "k8s", DeployOptions())
    odd = fleet.model_copy(update={"name": "my plan: 70B / H200 (v2)!"})
    for _, obj in _objects(render(odd, "k8s", DeployOptions())):
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


AMD_FLEET = {"name": "amd", "pools": [{"name": "mixed", "replicas": 2, "accelerator": "mi300x", "model": "llama-3.1-70b",
                                       "parallelism": {"tp": 2}}]}


def test_pods_request_the_device_resource_of_their_vendor():
    """An MI300X pool asks for `amd.com/gpu` (AMD's device plugin), a Gaudi 3 pool for
    `habana.ai/gaudi`, an Ascend pool for `huawei.com/Ascend910`: a `nvidia.com/gpu` request never
    schedules on those nodes. The default image is a CUDA build, so another vendor needs --vllm-image."""
    for card, resource in [("mi300x", "amd.com/gpu"), ("gaudi3", "habana.ai/gaudi"),
                           ("ascend-910c", "huawei.com/Ascend910")]:
        doc = AMD_FLEET | {"pools": [AMD_FLEET["pools"][0] | {"accelerator": card}]}
        plan = validate(PlanSpec, doc, "amd")
        objs = _objects(render(plan, "k8s", DeployOptions(vllm_image="example.com/vllm:for-this-card")))
        c = _by(objs, "StatefulSet", "mixed")["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"] == {"limits": {resource: 2}, "requests": {resource: 2}}
        assert c["image"] == "example.com/vllm:for-this-card"
    with pytest.raises(SpecError) as err:
        render(validate(PlanSpec, AMD_FLEET, "amd"), "k8s", DeployOptions())
    assert str(err.value) == ("pools.0 (mixed): --vllm-image=vllm/vllm-openai:v0.11.0 is built for NVIDIA GPUs and "
                              "this pool runs on mi300x (amd); pass --vllm-image with a vLLM image built for amd")
