"""`fleetwise deploy PLAN --target vllm|k8s|compose -o DIR`: a fleet document as files a team deploys.

Owns argument handling and the summary printed; the files are rendered by the registered targets
of `fleetwise.deploy` (docs/deploy.md says what each holds and what a team must still fill in).
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetwise.cli.common import input_file
from fleetwise.deploy import TARGETS, DeployOptions, render, write_files
from fleetwise.deploy.base import FLEETWISE_IMAGE, VLLM_IMAGE
from fleetwise.spec.output import check_writable_dir


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "deploy", help="write a plan's fleet as vLLM commands, Kubernetes manifests or a compose rehearsal",
        description="Render the fleet document of PLAN (`fleetwise plan --json/--fleet-out`, or a plan YAML) "
                    "for a target: `vllm` (a `vllm serve` script per pool, flags checked against the recorded "
                    "vLLM arguments, and the gateway config), `k8s` (manifests: engine workloads with GPU "
                    "requests, probes, Services, PodDisruptionBudgets from the N+k spares, the gateway, "
                    "monitoring) or `compose` (emulated replicas and the gateway). See docs/deploy.md.")
    p.add_argument("plan", metavar="PLAN", type=input_file("plan file"), help="fleet document or plan file")
    p.add_argument("--target", required=True, choices=sorted(TARGETS), help="what to write")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--model-path", default=None, metavar="PATH",
                   help="weights `vllm serve` loads (a path in the container or an HF repository; default: the "
                        "catalog model's HF repository)")
    p.add_argument("--vllm-image", default=VLLM_IMAGE, help="engine image (k8s)")
    p.add_argument("--fleetwise-image", default=FLEETWISE_IMAGE, help="gateway and emulator image (k8s, compose)")
    p.add_argument("--namespace", default="fleetwise", help="Kubernetes namespace (k8s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fleetwise.engine.pools import build_pool
    from fleetwise.perf.roofline import PerfModel
    from fleetwise.spec.plan import PlanSpec

    check_writable_dir(args.out, "--out")
    plan = PlanSpec.load(args.plan)
    perf = PerfModel(None)
    for i, pool in enumerate(plan.pools):  # a replica that cannot hold its weights and KV is no fleet to deploy
        build_pool(pool, perf, f"{args.plan}: pools.{i}")
    opts = DeployOptions(vllm_image=args.vllm_image, fleetwise_image=args.fleetwise_image,
                         model_path=args.model_path, namespace=args.namespace)
    paths = write_files(render(plan, args.target, opts), args.out)
    replicas = sum(p.replicas for p in plan.pools)
    print(f"fleetwise deploy: {plan.name} ({replicas} replicas in {len(plan.pools)} pool(s), routing "
          f"{plan.routing if isinstance(plan.routing, str) else plan.routing.policy}) as {args.target}:")
    for path in paths:
        print(f"  {path}")
    return 0
