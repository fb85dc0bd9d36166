"""From a fleet document to files a team deploys: vLLM command lines, Kubernetes manifests, a compose file.

Owns the deploy targets (a registry: each target is one small module decorated `@target("name")`
that maps a `PlanSpec` and `DeployOptions` to `{relative path: text}`), the recorded `vllm serve`
argument list every emitted vLLM flag is checked against (`vllm_serve_args.json`, its source and
version in `VLLM_ARGS.md`), and the `fleetwise emulate` arguments of one emulated replica (shared
by `emulate --plan`, `up` and the compose target). It reads specs and the gateway's config
document and imports nothing that runs a fleet.
"""

from __future__ import annotations

import importlib

from fleetwise.deploy.base import TARGETS, DeployOptions, render, target, write_files

__all__ = ["TARGETS", "DeployOptions", "render", "target", "write_files"]

_TARGET_MODULES = ("vllm", "k8s", "compose")
for _m in _TARGET_MODULES:
    importlib.import_module(f"{__name__}.{_m}")
