"""`EmulatorConfig`: everything one emulated replica is started with (the CLI options, as data).

Owns the option values and turning them into the pool spec the engine is built from; the
engine defaults themselves come from `fleetwise.spec.plan.EngineSpec` (declared once there).
"""

from __future__ import annotations

import math
import os
import uuid
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fleetwise.emulator.generation import DEFAULT_OUTPUT_LENGTHS
from fleetwise.emulator.kv_events import KvEventsConfig
from fleetwise.spec.base import Spec, validate
from fleetwise.spec.engine_defaults import GPU_MEMORY_UTILIZATION
from fleetwise.spec.http import HttpLimitsSpec
from fleetwise.spec.limits import MAX_FACTOR, MAX_TCP_PORT, MIN_FACTOR
from fleetwise.spec.plan import KvLinkSpec, PoolSpec
from fleetwise.spec.workload import LengthDist

ADMIN_TOKEN_ENV = "FLEETWISE_EMULATOR_ADMIN_TOKEN"
"""Environment variable read for the admin bearer token when `--admin-token` is not given."""
KV_LEASE_S = 480.0
"""How long a prefill replica keeps a request's KV for the decode side to pull (modelled
seconds): vLLM's NIXL connector frees unclaimed blocks after VLLM_NIXL_ABORT_REQUEST_TIMEOUT=480 s."""


class EmulatorConfig(Spec):
    """One replica: model and hardware, role, clock, identity, admin token, length model
    (validated like every spec: `fleetwise.spec.base.validate` turns a mistake into one line)."""

    model: str
    gpu: str
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    """Expert parallel degree of an MoE model (over the TP x PP GPUs), as the pool's `parallelism.ep`."""
    expert_imbalance: float = Field(default=1.0, ge=1)
    """MoE with ep > 1: the busiest rank's routed tokens over the mean, as the pool's `expert_imbalance`."""
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    model_version: str = "v1"
    time_scale: float = 1.0
    """Modelled seconds per wall second (10 = ten times faster than the modelled hardware)."""
    spin: bool = True
    """Wake before each step deadline by the learned wake-up lateness and spin to it
    (`fleetwise.live.clock`); False sleeps to the deadline (less CPU, later step ends)."""
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=MAX_TCP_PORT)
    served_model_name: str | None = None
    """Name clients send as `model` (default: the catalog model name)."""
    max_model_len: int | None = Field(default=None, ge=2)
    """Longest prompt + output (vLLM's --max-model-len; refused when the KV cache cannot hold it;
    default: the model's context, lowered to what the KV cache holds)."""
    weight_dtype: Literal["bf16", "fp8", "int4"] = "bf16"
    kv_dtype: Literal["bf16", "fp8"] = "bf16"
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    profile: str | None = None
    """Calibrated perf profile JSON (default: the built-in efficiencies)."""
    admin_token: str | None = None
    """Bearer token of /admin (default: the `FLEETWISE_EMULATOR_ADMIN_TOKEN` environment variable)."""
    output_lengths: LengthDist = DEFAULT_OUTPUT_LENGTHS
    kv_link: KvLinkSpec = KvLinkSpec()
    """Per-GPU NIC of the KV path (decode side pulls over it)."""
    kv_lease_s: float = KV_LEASE_S
    step_time_factor: float = 1.0
    """Measured correction of the perf model (a fleet document's `step_time_factor`): every step
    takes this many times the modelled time, before any slowdown fault."""
    engine_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    http: HttpLimitsSpec = HttpLimitsSpec()
    kv_events: KvEventsConfig = KvEventsConfig()
    """Where the replica publishes its KV events (vLLM's `--kv-events-config`; off by default)."""
    """Connection limits and timeouts of the replica's HTTP server (`fleetwise.live.http`)."""

    @field_validator("time_scale")
    @classmethod
    def _time_scale(cls, v: float) -> float:
        if not (math.isfinite(v) and MIN_FACTOR <= v <= MAX_FACTOR):
            raise ValueError(f"--time-scale={v} must be in [{MIN_FACTOR:g}, {MAX_FACTOR:g}]; "
                             "10 runs ten times faster than the modelled hardware")
        return v

    @field_validator("step_time_factor")
    @classmethod
    def _step_time_factor(cls, v: float) -> float:
        if not (math.isfinite(v) and MIN_FACTOR <= v <= MAX_FACTOR):
            raise ValueError(f"--step-time-factor={v} must be in [{MIN_FACTOR:g}, {MAX_FACTOR:g}]")
        return v

    @field_validator("kv_lease_s")
    @classmethod
    def _kv_lease(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"--kv-lease={v} must be a positive number of seconds")
        return v

    @model_validator(mode="after")
    def _admin_token_from_env(self) -> EmulatorConfig:
        if self.admin_token is None and os.environ.get(ADMIN_TOKEN_ENV):
            object.__setattr__(self, "admin_token", os.environ[ADMIN_TOKEN_ENV])
        return self

    @property
    def name(self) -> str:
        """The served model name."""
        return self.served_model_name or self.model

    def pool(self) -> PoolSpec:
        """The one-replica pool this emulator runs (engine knobs default to the project's)."""
        engine: dict[str, object] = {"enable_prefix_caching": self.enable_prefix_caching,
                                     "enable_chunked_prefill": self.enable_chunked_prefill}
        for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            if getattr(self, k) is not None:
                engine[k] = getattr(self, k)
        return validate(PoolSpec, {
            "name": "emulated", "role": self.role, "replicas": 1, "accelerator": self.gpu, "model": self.model,
            "parallelism": {"tp": self.tp, "pp": self.pp, "ep": self.ep}, "expert_imbalance": self.expert_imbalance,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype, "engine": engine, "model_version": self.model_version,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }, "emulator options")
