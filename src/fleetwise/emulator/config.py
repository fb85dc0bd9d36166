"""`EmulatorConfig`: everything one emulated replica is started with (the CLI options, as data).

Owns the option values and turning them into the pool spec the engine is built from; the
engine defaults themselves come from `fleetwise.spec.plan.EngineSpec` (declared once there).
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field
from typing import Literal

from fleetwise.emulator.generation import DEFAULT_OUTPUT_LENGTHS
from fleetwise.errors import SpecError
from fleetwise.spec.base import validate
from fleetwise.spec.engine_defaults import GPU_MEMORY_UTILIZATION
from fleetwise.spec.inputs import MAX_FACTOR, MIN_FACTOR
from fleetwise.spec.plan import KvLinkSpec, PoolSpec
from fleetwise.spec.workload import LengthDist

ADMIN_TOKEN_ENV = "FLEETWISE_EMULATOR_ADMIN_TOKEN"
"""Environment variable read for the admin bearer token when `--admin-token` is not given."""
KV_LEASE_S = 480.0
"""How long a prefill replica keeps a request's KV for the decode side to pull (modelled
seconds): vLLM's NIXL connector frees unclaimed blocks after VLLM_NIXL_ABORT_REQUEST_TIMEOUT=480 s."""


@dataclass
class EmulatorConfig:
    """One replica: model and hardware, role, clock, identity, admin token, length model."""

    model: str
    gpu: str
    tp: int = 1
    pp: int = 1
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    model_version: str = "v1"
    time_scale: float = 1.0
    """Modelled seconds per wall second (10 = ten times faster than the modelled hardware)."""
    spin: bool = True
    """Wake before each step deadline by the learned wake-up lateness and spin to it
    (`fleetwise.live.clock`); False sleeps to the deadline (less CPU, later step ends)."""
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    """Name clients send as `model` (default: the catalog model name)."""
    max_model_len: int | None = None
    """Longest prompt + output (default: the model's context)."""
    weight_dtype: Literal["bf16", "fp8", "int4"] = "bf16"
    kv_dtype: Literal["bf16", "fp8"] = "bf16"
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool = True
    profile: str | None = None
    """Calibrated perf profile JSON (default: the built-in efficiencies)."""
    admin_token: str | None = None
    output_lengths: LengthDist = DEFAULT_OUTPUT_LENGTHS
    kv_link: KvLinkSpec = field(default_factory=KvLinkSpec)
    """Per-GPU NIC of the KV path (decode side pulls over it)."""
    kv_lease_s: float = KV_LEASE_S
    step_time_factor: float = 1.0
    """Measured correction of the perf model (a fleet document's `step_time_factor`): every step
    takes this many times the modelled time, before any slowdown fault."""
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_scale) and MIN_FACTOR <= self.time_scale <= MAX_FACTOR):
            raise SpecError(f"--time-scale={self.time_scale} must be in [{MIN_FACTOR:g}, {MAX_FACTOR:g}]; "
                            "10 runs ten times faster than the modelled hardware")
        if self.admin_token is None:
            self.admin_token = os.environ.get(ADMIN_TOKEN_ENV) or None
        if not (math.isfinite(self.step_time_factor) and MIN_FACTOR <= self.step_time_factor <= MAX_FACTOR):
            raise SpecError(f"--step-time-factor={self.step_time_factor} must be in [{MIN_FACTOR:g}, {MAX_FACTOR:g}]")
        if not (math.isfinite(self.kv_lease_s) and self.kv_lease_s > 0):
            raise SpecError(f"--kv-lease={self.kv_lease_s} must be a positive number of seconds")

    @property
    def name(self) -> str:
        """The served model name."""
        return self.served_model_name or self.model

    def pool(self) -> PoolSpec:
        """The one-replica pool this emulator runs (engine knobs default to the project's)."""
        engine: dict[str, object] = {"enable_prefix_caching": self.enable_prefix_caching}
        for k in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, k) is not None:
                engine[k] = getattr(self, k)
        return validate(PoolSpec, {
            "name": "emulated", "role": self.role, "replicas": 1, "accelerator": self.gpu, "model": self.model,
            "parallelism": {"tp": self.tp, "pp": self.pp}, "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype, "engine": engine, "model_version": self.model_version,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }, "emulator options")
