"""`Engine`: continuous batching as vLLM v1 does it (stub: signatures of the contract)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from fleetwise.core.request import Request
from fleetwise.core.views import WorkerView
from fleetwise.engine.records import EngineConfig, Step, StepOutput
from fleetwise.perf.types import BatchShape

StepTimeFn = Callable[[BatchShape], float]


class Engine:
    def __init__(self, name: str, role: Literal["mixed", "prefill", "decode"], config: EngineConfig,
                 num_blocks: int, step_time: StepTimeFn) -> None:
        raise NotImplementedError

    def add_request(self, req: Request) -> None:
        raise NotImplementedError

    def add_transferred(self, req: Request) -> None:
        raise NotImplementedError

    def schedule(self, horizon_s: float = math.inf) -> Step | None:
        raise NotImplementedError

    def complete(self) -> StepOutput:
        raise NotImplementedError

    def release(self, request_id: int) -> None:
        raise NotImplementedError

    def abort_all(self) -> list[Request]:
        raise NotImplementedError

    def snapshot(self, now_s: float) -> WorkerView:
        raise NotImplementedError

    def cached_prefix_tokens(self, req: Request) -> int:
        raise NotImplementedError
