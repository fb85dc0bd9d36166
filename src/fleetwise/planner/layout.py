"""The planner's shared vocabulary: what every phase speaks of, and nothing any phase computes.

Owns the `Layout` value (accelerator x weight precision x TP/PP/EP), a dropped candidate with its
reason (`Rejection`), the resolved hardware (`Hardware`: the model and the allowed cards with the
spec's overrides), the fit phase's `Enumeration`, the KV hand-off link of a layout (`kv_link`) and
a layout as the simulator's pool (`pool_spec`). Imports no other planner module, so every phase
(fit, latency, goodput, sizing, refinement, disaggregation) and the state depend on it downward.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwise.perf.expert_load import planned_imbalance
from fleetwise.perf.memory import FitOptions, LayoutFit
from fleetwise.perf.types import Deployment, pool_deployment
from fleetwise.spec.hardware import AcceleratorSpec, LinkSpec
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.parallel import ParallelismSpec
from fleetwise.spec.plan import PoolSpec
from fleetwise.spec.planning import PlanningSpec


@dataclass(frozen=True)
class Layout:
    """One replica shape: `tp*pp` cards of `accelerator`, weights at `weight_dtype`."""

    accelerator: str
    weight_dtype: str
    tp: int
    pp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def parallelism(self) -> ParallelismSpec:
        return ParallelismSpec(tp=self.tp, pp=self.pp, ep=self.ep)

    @property
    def label(self) -> str:
        ep = f" EP={self.ep}" if self.ep > 1 else ""
        return f"{self.accelerator} {self.weight_dtype} TP={self.tp} PP={self.pp}{ep}"


@dataclass(frozen=True)
class Rejection:
    """A candidate dropped, and why (plain words with numbers)."""

    candidate: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"candidate": self.candidate, "reason": self.reason}


@dataclass
class Hardware:
    """The model and the allowed accelerators with the spec's overrides applied."""

    model: ModelSpec
    gpus: dict[str, AcceleratorSpec]
    max_gpus: dict[str, int]
    context_tokens: int
    """KV the fit must hold for one request: the longest prompt+output of the workload sample."""
    fit_options: FitOptions
    imbalance: float = 1.0
    expert_load: str | None = None
    """Measured expert-load histogram (spec `moe.expert_load`): each layout's imbalance comes from it."""

    def imbalance_for(self, layout: Layout) -> float:
        """`layout_imbalance` with the histogram checked against the model's expert count."""
        experts = self.model.moe.num_experts if self.model.moe is not None else None
        return layout_imbalance(self.imbalance, self.expert_load, layout, experts)

    def price(self, accelerator: str) -> float:
        return self.gpus[accelerator].price_per_hour_usd

    def deployment(self, layout: Layout, kv_dtype: str) -> Deployment:
        """The layout's deployment, built as the simulator builds a pool's (`pool_deployment`)."""
        pool = pool_spec(layout, self.model.name, kv_dtype, self.imbalance_for(layout))
        return pool_deployment(self.model, self.gpus[layout.accelerator], pool)


def layout_imbalance(assumed: float, expert_load: str | None, layout: Layout, experts: int | None = None) -> float:
    """Expert load imbalance (busiest EP rank over the mean) over the EP ranks one MoE layer of
    `layout` runs on, its pipeline stage's: from the measured histogram `expert_load`, else `assumed`
    (the planner's one rule, for its estimates and its simulations)."""
    return planned_imbalance(assumed, expert_load, layout.parallelism.ep_stage, experts)


def pool_spec(layout: Layout, model: str, kv_dtype: str, imbalance: float, role: str = "mixed",
              replicas: int = 1, price: float | None = None) -> PoolSpec:
    """The simulator's pool for `replicas` replicas of a layout (the planner's only pool builder)."""
    return PoolSpec(name=role, role=role, replicas=replicas, accelerator=layout.accelerator,  # type: ignore[arg-type]
                    model=model, parallelism=layout.parallelism, weight_dtype=layout.weight_dtype,  # type: ignore[arg-type]
                    kv_dtype=kv_dtype, price_per_gpu_hour_usd=price, expert_imbalance=imbalance)  # type: ignore[arg-type]


def kv_link(spec: PlanningSpec, gpu: AcceleratorSpec, layout: Layout) -> LinkSpec:
    """KV hand-off link per GPU NIC: the spec's, or the card's scale-out NIC. A replica moves its
    KV shards over one NIC each (`perf.kv.kv_shards`), in the estimate and in the simulator."""
    if spec.kv_link is not None:
        return LinkSpec(name="kv_link", bandwidth_bytes_per_s=spec.kv_link.bandwidth_bytes_per_s,
                        latency_s=spec.kv_link.latency_s)
    return LinkSpec(name=gpu.network.name, bandwidth_bytes_per_s=gpu.network.bandwidth_bytes_per_s,
                    latency_s=gpu.network.latency_s)


@dataclass
class Enumeration:
    """Layouts that fit (with their KV capacity) and the ones dropped."""

    fitting: list[tuple[Layout, LayoutFit]]
    rejected: list[Rejection]
