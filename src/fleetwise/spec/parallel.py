"""`ParallelismSpec`: how one replica splits a model over GPUs (TP x PP, EP for MoE experts)."""

from __future__ import annotations

from pydantic import Field

from fleetwise.errors import SpecError
from fleetwise.spec.base import Spec
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.model import ModelSpec


class ParallelismSpec(Spec):
    """Parallel layout of one replica. GPUs per replica = tp * pp; EP reuses the TP x PP GPUs."""

    tp: int = Field(default=1, gt=0)
    """Tensor parallel degree: stays inside a node's scale-up link."""
    pp: int = Field(default=1, gt=0)
    """Pipeline parallel degree: stages may cross nodes."""
    ep: int = Field(default=1, gt=0)
    """Expert parallel degree for MoE layers (experts spread over `ep` GPUs of the replica)."""

    @property
    def gpus(self) -> int:
        """GPUs of one replica: TP x PP."""
        return self.tp * self.pp

    @property
    def ep_stage(self) -> int:
        """EP ranks one MoE layer's experts are spread over: those of the pipeline stage that runs the
        layer. An `ep` above `tp` counts the experts' GPUs over every stage (a card holds the same
        expert bytes either way), but a layer runs on its own stage only: vLLM's
        `--enable-expert-parallel` spreads each layer's experts over its stage's TP ranks, so the
        all-to-all stays inside the stage and its node."""
        return max(1, self.ep // self.pp) if self.ep > self.tp else self.ep

    def check(self, model: ModelSpec, gpu: AcceleratorSpec) -> None:
        """Raise SpecError when the layout cannot run this model on this card."""
        if self.tp > gpu.gpus_per_node:
            raise SpecError(
                f"parallelism.tp={self.tp} exceeds {gpu.name}'s {gpu.gpus_per_node} GPUs per node; "
                "TP must stay inside a node: lower tp and raise pp"
            )
        heads = model.num_attention_heads
        if heads % self.tp:
            raise SpecError(f"parallelism.tp={self.tp} does not divide {model.name}'s {heads} attention heads")
        if self.pp > model.num_layers:
            raise SpecError(f"parallelism.pp={self.pp} exceeds {model.name}'s {model.num_layers} layers")
        if self.ep > 1:
            if model.moe is None:
                raise SpecError(f"parallelism.ep={self.ep} needs an MoE model; {model.name} is dense: use ep=1")
            if self.ep > self.gpus or model.moe.num_experts % self.ep:
                raise SpecError(
                    f"parallelism.ep={self.ep} must divide {model.name}'s {model.moe.num_experts} experts "
                    f"and be at most tp*pp={self.gpus}"
                )
