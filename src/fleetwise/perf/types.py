"""Value types of the performance model: the phase-free batch, the deployment, the step cost.

A batch is what the engine runs in one forward pass, as vLLM sees it: per sequence, the new
tokens computed this step and the context tokens already in the KV cache. There is no
prefill/decode flag: a decode is new=1, a prefill chunk is new=chunk, and mixed batches are
natural. `BatchShape` keeps only the aggregates the cost formulas need, so the engine can
maintain it incrementally on hot paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.parallel import ParallelismSpec
from fleetwise.spec.plan import PoolSpec


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step: `new_tokens` computed now on top of `context_tokens` cached."""

    new_tokens: int
    context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BatchShape:
    """Aggregates of a batch that the step cost depends on.

    num_seqs: sequences in the step.
    new_tokens: sum of new tokens (rows of every GEMM).
    kv_read_tokens: sum over sequences of (context + new): KV positions read by attention.
    attn_pairs: sum over sequences of new*(context + (new+1)/2): causal query-key pairs.
    prefill_tokens: new tokens of sequences with new > 1 (prompt chunks).
    max_new_tokens: largest single chunk.
    max_decode_kv_tokens: largest KV a row streams: a decode row's (new == 1) context + 1, a prompt
      chunk's cached context; 0 when unknown. Attention with few rows is bound by its longest row,
      not by the mean.
    """

    num_seqs: int
    new_tokens: int
    kv_read_tokens: int
    attn_pairs: float
    prefill_tokens: int = 0
    max_new_tokens: int = 0
    max_decode_kv_tokens: int = 0

    @staticmethod
    def of(batch: Iterable[SeqWork]) -> BatchShape:
        """The aggregates of a batch of sequences (the reference the engine's incremental sums must equal)."""
        n = t = kv = pre = mx = mdk = 0
        pairs = 0.0
        for s in batch:
            n += 1
            t += s.new_tokens
            kv += s.context_tokens + s.new_tokens
            pairs += s.new_tokens * (s.context_tokens + (s.new_tokens + 1) / 2)
            if s.new_tokens > 1:
                pre += s.new_tokens
                mdk = max(mdk, s.context_tokens)
            elif s.new_tokens == 1:
                mdk = max(mdk, s.context_tokens + 1)
            mx = max(mx, s.new_tokens)
        return BatchShape(n, t, kv, pairs, pre, mx, mdk)

    @staticmethod
    def decode(batch: int, ctx: int) -> BatchShape:
        """`batch` decodes, each attending to `ctx` positions (the new one included)."""
        return BatchShape(batch, batch, batch * ctx, batch * (ctx - 1 + 1.0), 0, 1 if batch else 0,
                          ctx if batch else 0)

    @staticmethod
    def prefill(batch: int, seq: int) -> BatchShape:
        """`batch` fresh prompts of `seq` tokens each, no cached context."""
        return BatchShape(batch, batch * seq, batch * seq, batch * seq * (seq + 1) / 2, batch * seq, seq)

    def __add__(self, other: BatchShape) -> BatchShape:
        return BatchShape(
            self.num_seqs + other.num_seqs,
            self.new_tokens + other.new_tokens,
            self.kv_read_tokens + other.kv_read_tokens,
            self.attn_pairs + other.attn_pairs,
            self.prefill_tokens + other.prefill_tokens,
            max(self.max_new_tokens, other.max_new_tokens),
            max(self.max_decode_kv_tokens, other.max_decode_kv_tokens),
        )


@dataclass(frozen=True)
class Deployment:
    """One replica: a model on `parallelism.gpus` cards of one accelerator, at given dtypes.

    `cuda_graphs` says whether steps replay captured graphs (low launch overhead, as serving
    engines do for decode) or launch kernels eagerly.
    """

    model: ModelSpec
    accelerator: AcceleratorSpec
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    cuda_graphs: bool = True
    expert_load_imbalance: float = 1.0
    """MoE only: max/mean routed tokens per EP rank. 1.0 is even routing (the synthetic calibration
    data, random routers). Real traffic is skewed (hot experts and ranks without balancing:
    TensorRT-LLM's large-scale EP study, tech blog 4), but no public max/mean figure is cited here:
    the planner's 1.3 is an assumption to replace with your own routing statistics. No effect at ep=1."""
    pp_microbatches: int = 0
    """Pipeline parallelism: micro-batches kept in flight (0: one per stage, as vLLM's virtual
    engines do; 1: stages run one batch in series, no overlap)."""

    @property
    def gpus(self) -> int:
        """GPUs of one replica (TP x PP)."""
        return self.parallelism.gpus


def pool_deployment(model: ModelSpec, accelerator: AcceleratorSpec, pool: PoolSpec) -> Deployment:
    """The one way a pool becomes a `Deployment` (planner and simulator alike): its parallelism,
    dtypes and, for MoE with expert parallelism inside a stage (`ep_stage` > 1), its expert load
    imbalance (ignored otherwise)."""
    skew = pool.expert_imbalance if model.moe is not None and pool.parallelism.ep_stage > 1 else 1.0
    return Deployment(model, accelerator, pool.parallelism, pool.weight_dtype, pool.kv_dtype,
                      expert_load_imbalance=skew)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds of one engine step, with the breakdown that explains it.

    `total_s` is not the plain sum: compute and memory traffic of a GEMM overlap (roofline max),
    so the parts say where time goes and `total_s` is what the step takes.
    """

    total_s: float
    gemm_compute_s: float = 0.0
    weight_memory_s: float = 0.0
    kv_memory_s: float = 0.0
    attention_s: float = 0.0
    tp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    overhead_s: float = 0.0
    bound: str = ""
    """What dominates: `compute`, `memory`, `communication` or `overhead`."""

    def as_dict(self) -> dict[str, float | str]:
        """Every field by name: the step's seconds, its parts' seconds and what bounds it."""
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
