"""`PlanSpec`: the fleet document — pools of replicas, the KV link, routing, headroom, SLOs.

Owns the one document every command that runs a fleet reads (`simulate`, `emulate --plan`,
`gateway --plan`, `up`, `deploy`) and its static checks (role families, catalog names,
parallelism for the model and card). `PlanSpec.load` takes a hand-written plan (YAML/JSON), a
fleet document written by `fleetwise plan --fleet-out` (`schema: fleetwise-fleet/1`) or the whole
search of `fleetwise plan --json` (its `fleet` section). The memory fit (KV capacity > 0) needs
the perf layer and is checked when the simulator builds the fleet (`fleetwise.sim.fleet`), with
the same kind of message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from fleetwise.errors import SpecError, UnknownNameError, quote
from fleetwise.spec import engine_defaults as ed
from fleetwise.spec.base import Spec, read_document, top_mapping, validate
from fleetwise.spec.dtypes import KvDtype, WeightDtype
from fleetwise.spec.failure_domains import FailureDomainSpec
from fleetwise.spec.limits import (
    MAX_BLOCK_TOKENS,
    MAX_DURATION_S,
    MAX_ENGINE_SEQS,
    MAX_FACTOR,
    MAX_REPLICAS,
    MAX_TOKENS,
    MIN_FACTOR,
)
from fleetwise.spec.parallel import ParallelismSpec
from fleetwise.spec.roles import Role
from fleetwise.spec.routing import PRESETS, RoutingSpec
from fleetwise.spec.slo import PlanSLOSpec


class EngineKnobs(Spec):
    """Scheduler settings of one replica (vLLM names; see `fleetwise.engine.EngineConfig`)."""

    max_num_batched_tokens: int = Field(default=ed.MAX_NUM_BATCHED_TOKENS, gt=0, le=MAX_TOKENS)
    """Token budget of one step (prefill chunks plus decodes)."""
    max_num_seqs: int = Field(default=ed.MAX_NUM_SEQS, gt=0, le=MAX_ENGINE_SEQS)
    """Most sequences running at once."""
    block_size: int = Field(default=ed.BLOCK_SIZE, gt=0, le=MAX_BLOCK_TOKENS)
    """Tokens per KV block."""
    enable_prefix_caching: bool = True
    """Share KV blocks of equal prompt prefixes."""
    enable_chunked_prefill: bool = True
    """Split long prompts over steps, mixed with running decodes."""
    max_bundle_steps: int = Field(default=ed.MAX_BUNDLE_STEPS, gt=0)
    """Most decode-only passes the simulator may fuse into one event (no effect on results)."""
    max_model_len: int | None = Field(default=None, ge=2, le=MAX_TOKENS)
    """Longest request a replica serves, prompt plus output tokens (vLLM's `--max-model-len`);
    longer ones are rejected on arrival. It must fit the model's context and one replica's KV
    cache (as vLLM checks at start-up). None: the context, lowered to what the KV cache holds."""


class PoolSpec(Spec):
    """`replicas` identical replicas of one model on one accelerator type."""

    name: str
    """Pool name; replicas are named `<name>-<index>`."""
    role: Role = "mixed"
    """`mixed` = colocated prefill and decode; `prefill`/`decode` = disaggregated halves."""
    replicas: int = Field(default=1, gt=0, le=MAX_REPLICAS)
    accelerator: str
    """Catalog accelerator name (see `fleetwise catalog gpus`)."""
    model: str
    """Catalog model name or a path to a model spec file."""
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KvDtype = "bf16"
    engine: EngineKnobs = Field(default_factory=EngineKnobs)
    model_version: str = "v1"
    """Version label the replicas report (rolling upgrades change it)."""
    region: str = "default"
    price_per_gpu_hour_usd: float | None = Field(default=None, ge=0)
    """Overrides the catalog price of the accelerator."""
    gpu_memory_utilization: float = Field(default=ed.GPU_MEMORY_UTILIZATION, gt=0, le=1)
    """Fraction of HBM the engine may use for weights, activations and KV cache."""
    expert_imbalance: float = Field(default=1.0, ge=1)
    """MoE with ep > 1: busiest expert-parallel rank's routed tokens over the mean (1.0: even)."""
    step_time_factor: float = Field(default=1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    """Measured correction of the perf model: every step of this pool's replicas takes this many
    times the modelled time (`fleetwise calibrate --from-metrics`; 1.0: the model as is)."""
    spare_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    """The k of N+k: replicas beyond what the load needs (failure spares plus the rolling-upgrade
    batch, as the planner sized them); at most this many may be down at once with the SLO kept
    (a Kubernetes PodDisruptionBudget's `maxUnavailable`)."""


DEFAULT_KV_LINK_GBPS = 400.0
"""Per-GPU NIC bandwidth of a KV link that gives none, Gb/s: one NDR InfiniBand (ConnectX-7) NIC."""


class KvLinkSpec(Spec):
    """Prefill-to-decode KV path: each prefill replica's egress and each decode replica's ingress.

    Bandwidth is per GPU NIC, as datasheets and `AcceleratorSpec.network` give it. A replica's
    KV is sharded over its TP ranks and PP stages and each shard moves over its own NIC, so a
    replica's port carries `kv_shards(deployment)` NICs (see `fleetwise.perf.kv`); concurrent
    transfers share a port.
    """

    bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    """Per-GPU NIC bandwidth in bytes/s (give this or `gbps`)."""
    gbps: float | None = Field(default=None, gt=0)
    """Per-GPU NIC bandwidth in gigabits/s (default 400, one NDR InfiniBand NIC)."""
    latency_s: float = Field(default=20e-6, ge=0, le=MAX_DURATION_S)
    """One-way latency added to every transfer."""

    @model_validator(mode="after")
    def _check(self) -> KvLinkSpec:
        if self.bandwidth_bytes_per_s is not None and self.gbps is not None:
            raise ValueError("give either bandwidth_bytes_per_s or gbps, not both")
        return self

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth, bytes/s one direction: `bandwidth_bytes_per_s`, else `gbps`, else `DEFAULT_KV_LINK_GBPS`."""
        if self.bandwidth_bytes_per_s is not None:
            return self.bandwidth_bytes_per_s
        return (self.gbps if self.gbps is not None else DEFAULT_KV_LINK_GBPS) * 1e9 / 8


class RegionsSpec(Spec):
    """Where clients are and what crossing regions costs them (see docs/simulator.md, "Regions")."""

    latency_s: float = Field(default=0.0, ge=0, le=MAX_DURATION_S)
    """One-way network latency between two different regions, in seconds: a request served
    outside its client's region reaches the replica this much later and its tokens come back
    this much later (TTFT and E2E grow by twice this; TPOT is unchanged)."""
    clients: str | None = None
    """Region of the clients of requests that name none (null: the first pool's region)."""


class PlanSpec(Spec):
    """A fleet: one role family of pools (all `mixed`, or `prefill` + `decode`), a KV link, a routing policy."""

    name: str = "plan"
    pools: list[PoolSpec] = Field(min_length=1)
    kv_link: KvLinkSpec = Field(default_factory=KvLinkSpec)
    """Used by prefill/decode plans only."""
    routing: RoutingSpec | str = "round-robin"
    """Routing policy: a preset name (`round-robin`, ...) or a routing spec (see `fleetwise.spec.routing`)."""
    perf_profile: str | None = None
    """Path to a calibrated perf profile (JSON); null = the uncalibrated roofline."""
    failure_domains: FailureDomainSpec = Field(default_factory=FailureDomainSpec)
    """What a lost replica, a failed KV transfer, an expired KV lease or a full decode pool does
    to a request: prefill again, migrate, or fail (see docs/failure-domains.md)."""
    regions: RegionsSpec = Field(default_factory=RegionsSpec)
    """Inter-region latency and where clients without a region are (pools name their `region`)."""
    pd_first_token: Literal["decode", "prefill"] = "decode"
    """Disaggregated plans: who emits the first output token. `decode` (vLLM's disaggregated
    proxy, llm-d): the decode replica's first pass after the KV lands, so TTFT = prefill + KV
    transfer + one decode pass. `prefill` (DistServe, Splitwise): the prefill replica streams it
    when the prompt is done, and the decode replica generates the remaining tokens."""
    slo: PlanSLOSpec | None = None
    """Latency targets the fleet was sized for (written by `fleetwise plan`; null: none declared)."""

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "retry_on_crash" in data:
                raise ValueError("retry_on_crash moved to failure_domains (max_reprefills, on_decode_failure); "
                                 "remove it and set failure_domains instead")
            kv = data.get("kv_link")
            if isinstance(kv, dict) and "on_failure" in kv:
                raise ValueError("kv_link.on_failure moved to failure_domains.max_reprefills (0 = fail); "
                                 "remove it and set failure_domains instead")
        return data

    @model_validator(mode="after")
    def _check_roles(self) -> PlanSpec:
        if isinstance(self.routing, str) and self.routing not in PRESETS:
            raise ValueError(str(UnknownNameError("routing policy", self.routing, PRESETS)))
        total = sum(p.replicas for p in self.pools)
        if total > MAX_REPLICAS:
            raise ValueError(f"pools hold {total:,} replicas in all; at most {MAX_REPLICAS:,} per plan "
                             "(see docs/errors.md); split the fleet into several plans")
        over = [p.name for p in self.pools if p.spare_replicas >= p.replicas]
        if over:
            raise ValueError(f"pools: {over[0]}: spare_replicas must be below replicas (a pool keeps at least "
                             "one replica serving); lower spare_replicas or add replicas")
        names = [p.name for p in self.pools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dup)}")
        roles = {p.role for p in self.pools}
        if "mixed" in roles and len(roles) > 1:
            raise ValueError(
                f"pools mix roles {sorted(roles)}; use all `mixed` (colocated) or `prefill` + `decode` (disaggregated)"
            )
        if roles and roles <= {"prefill", "decode"} and roles != {"prefill", "decode"}:
            missing = ({"prefill", "decode"} - roles).pop()
            raise ValueError(f"a disaggregated plan needs both prefill and decode pools; add a `{missing}` pool")
        return self

    @property
    def disaggregated(self) -> bool:
        """True when the pools are prefill and decode (P/D), not mixed."""
        return self.pools[0].role != "mixed"

    @staticmethod
    def load(path: str | Path) -> PlanSpec:
        """Read, validate and check a fleet document, a plan file or a `plan --json` search's `fleet`
        section (SpecError naming the field on a bad or older one)."""
        section, where = fleet_section(read_document(path), str(path))
        plan = validate(PlanSpec, section, where, strict=True)
        plan.check(where=where)
        return plan

    def document(self) -> dict[str, Any]:
        """The fleet document (JSON-ready, `schema` first) that `PlanSpec.load` reads back."""
        return {"schema": FLEET_SCHEMA, **self.model_dump(mode="json")}

    def check(self, where: str = "plan") -> None:
        """Resolve every pool's model and accelerator, check its parallelism and that every pool serves
        the same model (the same architecture; names and context lengths may differ); raise SpecError."""
        first = None
        for i, pool in enumerate(self.pools):
            model, gpu = resolve_pool(pool, f"{where}: pools.{i}")
            try:
                pool.parallelism.check(model, gpu)
            except SpecError as err:
                raise SpecError(f"{where}: pools.{i} ({pool.name}): {err}") from None
            shape = model.model_dump(exclude=ARCHITECTURE_ASIDE)
            if first is not None and shape != first:
                raise SpecError(
                    f"{where}: pools.{i} ({pool.name}): model {quote(pool.model)} is another model than pools.0's "
                    f"{quote(self.pools[0].model)}; every pool of a plan serves the same model (any pool may take "
                    "a request, a decode pool reads the prefill pool's KV): give each pool the same model")
            first = shape if first is None else first


ARCHITECTURE_ASIDE = {"name", "source", "verified", "max_context_tokens"}
"""ModelSpec fields two pools of one plan may differ in (a catalog name and a config.json of the same
model; the context check takes the smallest window over the pools)."""

FLEET_SCHEMA = "fleetwise-fleet/1"
"""`schema` of a fleet document (`fleetwise plan --fleet-out`, the `fleet` section of `--json`)."""
PLAN_SEARCH_SCHEMA = "fleetwise-plan/1"
"""`schema` of the whole search `fleetwise plan --json` writes (`fleetwise.planner.report.SCHEMA`)."""


def fleet_section(data: Any, where: str) -> tuple[dict[str, Any], str]:
    """The plan mapping inside a document and where it is: the document itself (hand-written, no
    `schema`), a fleet document without its `schema`, or the `fleet` section of a plan search;
    SpecError naming the field."""
    data = top_mapping(data, where)
    schema = data.get("schema")
    if schema is None:
        return data, where
    if schema == FLEET_SCHEMA:
        return {k: v for k, v in data.items() if k != "schema"}, where
    if schema == PLAN_SEARCH_SCHEMA:
        fleet = data.get("fleet")
        if isinstance(fleet, dict):
            return fleet_section(fleet, f"{where}: fleet")
        if "fleet" in data:  # null: the search found no plan
            raise SpecError(f"{where}: fleet: null: this plan search found no feasible fleet (see its "
                            "`infeasible`); relax the spec and rerun `fleetwise plan --json`")
        raise SpecError(f"{where}: fleet: missing: this plan was written by an older fleetwise, before plans "
                        "carried their fleet document; rerun `fleetwise plan --json` (or --fleet-out)")
    raise SpecError(f"{where}: schema: {quote(schema)} is not a fleet document; expected {FLEET_SCHEMA} "
                    f"or {PLAN_SEARCH_SCHEMA} (rerun `fleetwise plan` with this release to rewrite it)")


def resolve_pool(pool: PoolSpec, where: str) -> tuple[Any, Any]:
    """(ModelSpec, AcceleratorSpec) of a pool from the catalog, with the pool named in errors."""
    from fleetwise.spec import catalog

    try:
        model = catalog.resolve_model(pool.model)
        gpu = catalog.resolve_gpu(pool.accelerator)
    except SpecError as err:
        raise SpecError(f"{where} ({pool.name}): {err}") from None
    return model, gpu
