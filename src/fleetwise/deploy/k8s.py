"""Target `k8s`: Kubernetes manifests for a fleet of vLLM replicas behind the fleetwise gateway.

Per pool: a StatefulSet (or a LeaderWorkerSet when one replica spans nodes) whose pods run the
pool's `vllm serve` command, request the replica's GPUs, answer readiness and liveness probes on
vLLM's /health and carry Prometheus scrape annotations; a headless Service, which gives every
replica the stable DNS name `<pool>-<i>.<pool>` the gateway routes to (the gateway picks
replicas, so it needs each one's address, which a Deployment's pods do not have); and a
PodDisruptionBudget whose `maxUnavailable` is the pool's N+k spares. The gateway: a ConfigMap
with its config, a Secret with its admin token, a Deployment and a Service. Optional: a
ServiceMonitor (Prometheus Operator) and the Grafana dashboard as a ConfigMap, when the report
package ships one.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from pathlib import Path
from typing import Any

from fleetwise.deploy.base import ENGINE_PORT, GATEWAY_PORT, VLLM_IMAGE, DeployOptions, target, yaml_text
from fleetwise.deploy.vllm import NIXL_SIDE_CHANNEL_PORT, engine_env, gateway_document, serve_argv
from fleetwise.errors import SpecError
from fleetwise.gateway.config import GatewayConfig
from fleetwise.spec.catalog import resolve_gpu
from fleetwise.spec.output import strict_json_dumps
from fleetwise.spec.plan import PlanSpec, PoolSpec

DEVICE_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "habana.ai/gaudi",
                   "huawei": "huawei.com/Ascend910"}
"""Extended resource each vendor's Kubernetes device plugin advertises, by `AcceleratorSpec.vendor`
(NVIDIA's k8s-device-plugin, ROCm/k8s-device-plugin, the Intel Gaudi device plugin, Ascend's
ascend-device-plugin for the 910 series)."""
ACCELERATOR_LABEL = "fleetwise.dev/accelerator"
"""Node label the engine pods select on (value: the catalog accelerator name); a team labels its
GPU nodes with it or replaces it by its own (e.g. GPU feature discovery's `nvidia.com/gpu.product`)."""
DASHBOARD = Path(__file__).resolve().parents[1] / "report" / "grafana" / "fleetwise-dashboard.json"
"""The Grafana dashboard of the gateway's and engines' metrics, shipped by the report package."""
ENGINE_STARTUP_S = 1800
"""Seconds a replica may take to load weights and warm up before its probes count (a 70B model
from a cold cache takes minutes); the startup probe allows this long."""
PROBE_PERIOD_S = 10
ADMIN_SECRET = "fleetwise-gateway-admin"
ADMIN_TOKEN_ENV = GatewayConfig().admin_token_env
LWS_API = "leaderworkerset.x-k8s.io/v1"
RAY_PORT = 6379
"""Ray head's GCS port (Ray's default), which the workers of a multi-node replica join."""


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes object name that is also a DNS label (RFC 1123): what a Service and its pods' host names need."""
LABEL_VALUE_CHARS = 63


def _check_names(plan: PlanSpec, opts: DeployOptions) -> None:
    """SpecError naming a pool or namespace that cannot be a Kubernetes name."""
    if not DNS_LABEL.fullmatch(opts.namespace):
        raise SpecError(f"--namespace={opts.namespace!r} is not a Kubernetes name (lowercase letters, digits and "
                        "'-', at most 63); pick another")
    for i, pool in enumerate(plan.pools):
        if not DNS_LABEL.fullmatch(pool.name) or len(pool.name) > LABEL_VALUE_CHARS - 6:
            raise SpecError(f"pools.{i}.name={pool.name!r} cannot name a Kubernetes workload (lowercase letters, "
                            f"digits and '-', at most {LABEL_VALUE_CHARS - 6}); rename the pool in the fleet document")


def _check_devices(plan: PlanSpec, opts: DeployOptions) -> None:
    """SpecError for a pool whose card has no known device resource, or that would run the default
    (CUDA) image on another vendor's card."""
    for i, pool in enumerate(plan.pools):
        gpu = resolve_gpu(pool.accelerator)
        if gpu.vendor not in DEVICE_RESOURCE:
            raise SpecError(f"pools.{i} ({pool.name}): {pool.accelerator}'s vendor {gpu.vendor!r} has no known "
                            f"Kubernetes device resource (known: {', '.join(DEVICE_RESOURCE)}); use one of these "
                            "vendors or edit the manifests' resources")
        if gpu.vendor != "nvidia" and opts.vllm_image == VLLM_IMAGE:
            raise SpecError(f"pools.{i} ({pool.name}): --vllm-image={VLLM_IMAGE} is built for NVIDIA GPUs and this "
                            f"pool runs on {pool.accelerator} ({gpu.vendor}); pass --vllm-image with a vLLM image "
                            f"built for {gpu.vendor}")


def _label_value(text: str) -> str:
    """`text` as a label value: letters, digits, `-_.`, at most 63, alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:LABEL_VALUE_CHARS].strip("-_.") or "fleet"


def _meta(name: str, ns: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
    if annotations:
        out["annotations"] = annotations
    return out


def _labels(plan: PlanSpec, component: str, pool: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "fleetwise", "app.kubernetes.io/component": component,
           "fleetwise.dev/fleet": _label_value(plan.name)}
    if pool is not None:
        out["fleetwise.dev/pool"] = pool
    return out


SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics"}


def _probe(path: str, port: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": failures}


def _engine_container(plan: PlanSpec, pool: PoolSpec, opts: DeployOptions, gpus: int,
                      argv: list[str] | None) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": k, "value": v}
                                 for k, v in engine_env(pool, plan.failure_domains.kv_lease_s).items()]
    if pool.role != "mixed":
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                   "optional": True}}})
    device = DEVICE_RESOURCE[resolve_gpu(pool.accelerator).vendor]
    c: dict[str, Any] = {"name": "vllm", "image": opts.vllm_image, "env": env,
                         "resources": {"limits": {device: gpus}, "requests": {device: gpus}},
                         "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    if argv is not None:  # a worker of a multi-node replica runs Ray's worker, set by the LWS template
        c.update({"command": argv[:2], "args": argv[2:],
                  "ports": [{"name": "http", "containerPort": ENGINE_PORT}]
                  + ([{"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT}] if pool.role != "mixed" else []),
                  "startupProbe": _probe("/health", ENGINE_PORT, ENGINE_STARTUP_S // PROBE_PERIOD_S),
                  "readinessProbe": _probe("/health", ENGINE_PORT, 3),
                  "livenessProbe": _probe("/health", ENGINE_PORT, 6)})
    return c


def _pod(plan: PlanSpec, pool: PoolSpec, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"labels": _labels(plan, "engine", pool.name),
                         "annotations": {**SCRAPE, "prometheus.io/port": str(ENGINE_PORT)}},
            "spec": {"containers": containers, "nodeSelector": {ACCELERATOR_LABEL: pool.accelerator},
                     "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}


def _workload(plan: PlanSpec, pool: PoolSpec, opts: DeployOptions) -> dict[str, Any]:
    ns, labels = opts.namespace, _labels(plan, "engine", pool.name)
    per_node = resolve_gpu(pool.accelerator).gpus_per_node
    gpus = pool.parallelism.gpus
    argv = serve_argv(pool, opts)
    if gpus <= per_node:
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(pool.name, ns, labels),
                "spec": {"replicas": pool.replicas, "serviceName": pool.name, "podManagementPolicy": "Parallel",
                         "selector": {"matchLabels": labels},
                         "updateStrategy": {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": max(1, pool.spare_replicas)}},
                         "template": _pod(plan, pool, [_engine_container(plan, pool, opts, gpus, argv)])}}
    nodes = -(-gpus // per_node)
    head = {**_engine_container(plan, pool, opts, per_node, argv), "args": [],
            "command": ["sh", "-c", f"ray start --head --port={RAY_PORT} && exec {shlex.join(argv)}"]}
    worker = {**_engine_container(plan, pool, opts, per_node, None),
              "command": ["ray", "start", "--block", f"--address=$(LWS_LEADER_ADDRESS):{RAY_PORT}"]}
    leader, worker = _pod(plan, pool, [head]), _pod(plan, pool, [worker])
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _meta(pool.name, ns, labels),
            "spec": {"replicas": pool.replicas,
                     "leaderWorkerTemplate": {"size": nodes, "leaderTemplate": leader, "workerTemplate": worker}}}


def _pool_objects(plan: PlanSpec, pool: PoolSpec, opts: DeployOptions) -> list[dict[str, Any]]:
    ns, labels = opts.namespace, _labels(plan, "engine", pool.name)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(pool.name, ns, labels),
           "spec": {"clusterIP": "None", "selector": labels,
                    "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": ENGINE_PORT}]}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(pool.name, ns, labels),
           "spec": {"maxUnavailable": pool.spare_replicas, "selector": {"matchLabels": labels}}}
    return [_workload(plan, pool, opts), svc, pdb]


def _gateway_objects(plan: PlanSpec, opts: DeployOptions) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ns, labels = opts.namespace, _labels(plan, "gateway")
    doc = gateway_document(plan, lambda pool, i: f"http://{pool}-{i}.{pool}:{ENGINE_PORT}",
                           {"admin_token_env": ADMIN_TOKEN_ENV})
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("fleetwise-gateway", ns, labels),
          "data": {"gateway.yaml": yaml_text(doc)}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(ADMIN_SECRET, ns, labels), "type": "Opaque",
              "stringData": {"token": secrets.token_urlsafe(24)}}
    container = {"name": "gateway", "image": opts.fleetwise_image,
                 "command": ["fleetwise", "gateway", "--config", "/etc/fleetwise/gateway.yaml"],
                 "env": [{"name": ADMIN_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": ADMIN_SECRET, "key": "token"}}}],
                 "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
                 "readinessProbe": _probe("/readiness", GATEWAY_PORT, 3),
                 "livenessProbe": _probe("/health", GATEWAY_PORT, 6),
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/fleetwise", "readOnly": True}]}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta("fleetwise-gateway", ns, labels),
           "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels,
                                              "annotations": {**SCRAPE, "prometheus.io/port": str(GATEWAY_PORT)}},
                                 "spec": {"containers": [container],
                                          "volumes": [{"name": "config",
                                                       "configMap": {"name": "fleetwise-gateway"}}]}}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta("fleetwise-gateway", ns, labels),
           "spec": {"selector": labels, "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": GATEWAY_PORT}]}}
    return [cm, dep, svc], secret


def _monitoring(plan: PlanSpec, opts: DeployOptions) -> dict[str, str]:
    ns = opts.namespace
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": _meta("fleetwise", ns, _labels(plan, "monitoring")),
               "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "fleetwise",
                                                     "fleetwise.dev/fleet": _label_value(plan.name)}},
                        "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}}
    out = {"k8s/servicemonitor.yaml": _dump([monitor])}
    if DASHBOARD.is_file():
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": _meta("fleetwise-grafana-dashboard", ns, {**_labels(plan, "monitoring"), "grafana_dashboard": "1"}),
              "data": {DASHBOARD.name: strict_json_dumps(json.loads(DASHBOARD.read_text(encoding="utf-8")), indent=1)}}
        out["k8s/grafana-dashboard.yaml"] = _dump([cm])
    return out


def _dump(objs: list[dict[str, Any]]) -> str:
    return yaml_text(*objs)


@target("k8s")
def render_k8s(plan: PlanSpec, opts: DeployOptions) -> dict[str, str]:
    """Namespace, one file per pool, the gateway, its Secret, and the monitoring objects."""
    _check_names(plan, opts)
    _check_devices(plan, opts)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": opts.namespace}}
    files = {"k8s/namespace.yaml": _dump([ns])}
    for pool in plan.pools:
        files[f"k8s/pool-{pool.name}.yaml"] = _dump(_pool_objects(plan, pool, opts))
    gateway, secret = _gateway_objects(plan, opts)
    files["k8s/gateway.yaml"] = _dump(gateway)
    files["k8s/gateway-secret.yaml"] = _dump([secret])
    files.update(_monitoring(plan, opts))
    return files
