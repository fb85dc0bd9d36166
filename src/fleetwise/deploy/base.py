"""The deploy target registry, the options every target reads, and writing a target's files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetwise.errors import SpecError, UnknownNameError
from fleetwise.registry import Registry
from fleetwise.spec.catalog import resolve_model
from fleetwise.spec.plan import PlanSpec, PoolSpec

ENGINE_PORT = 8000
"""Port every engine server listens on in a deployed fleet: `vllm serve`'s default
(`FrontendArgs.port` in vllm/entrypoints/openai/cli_args.py); the emulator takes the same."""
GATEWAY_PORT = 8000
"""Port the gateway listens on in a deployed fleet (`GatewayConfig.port`'s default)."""
HF_CONFIG_URL_PREFIX = "https://huggingface.co/"
"""How catalog models cite their source (`spec/catalog_models.py`): the Hugging Face repository's URL."""
FLEETWISE_IMAGE = "fleetwise:0.1.0"
"""Default image of the gateway and the emulated replicas: built by the team from this package
(docs/deploy.md says how); no public image is published."""
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
"""Default engine image: vLLM's OpenAI server of the release series the recorded arguments come from."""


@dataclass(frozen=True)
class DeployOptions:
    """What a team chooses beyond the plan: images, where the weights are, the namespace."""

    vllm_image: str = VLLM_IMAGE
    fleetwise_image: str = FLEETWISE_IMAGE
    model_path: str | None = None
    """Weights location passed to `vllm serve` (a local path or a Hugging Face repository); None:
    the catalog model's Hugging Face repository."""
    namespace: str = "fleetwise"
    """Kubernetes namespace of every object."""


Renderer = Callable[[PlanSpec, DeployOptions], dict[str, str]]
TARGETS: Registry[str, Renderer] = Registry("deploy target")


def target(name: str) -> Callable[[Renderer], Renderer]:
    """Register a deploy target's renderer under `name` (once)."""
    return TARGETS.register(name)


def render(plan: PlanSpec, name: str, opts: DeployOptions) -> dict[str, str]:
    """The files (relative path -> text) of target `name` for fleet `plan`."""
    if name not in TARGETS:
        raise SpecError(str(UnknownNameError("--target", name, TARGETS)))
    return TARGETS[name](plan, opts)


def write_files(files: dict[str, str], out_dir: str | Path) -> list[Path]:
    """Write `files` under `out_dir` (created); returns the paths written, in order."""
    root = Path(out_dir)
    out = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


def weights_of(pool: PoolSpec, opts: DeployOptions) -> str:
    """What `vllm serve` loads for a pool: `--model-path`, else the catalog model's HF repository."""
    if opts.model_path:
        return opts.model_path
    source = resolve_model(pool.model).source
    if source.startswith(HF_CONFIG_URL_PREFIX):
        return "/".join(source.removeprefix(HF_CONFIG_URL_PREFIX).split("/")[:2])
    raise SpecError(f"pool {pool.name}: model {pool.model!r} names no Hugging Face repository; pass "
                    "--model-path (a local path or an HF repository) for its weights")


def replica_names(pool: PoolSpec) -> list[str]:
    """`<pool>-<index>` of every replica of a pool (the simulator's and the gateway's names)."""
    return [f"{pool.name}-{i}" for i in range(pool.replicas)]


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases (`&id001`), which some tools and readers reject."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def yaml_text(*docs: Any) -> str:
    """`docs` as YAML (several documents separated by `---`), keys in insertion order, no aliases."""
    return yaml.dump_all(list(docs), Dumper=_PlainDumper, sort_keys=False)
