"""Engine defaults, declared once: every spec, config and CLI flag that has them reads these.

The values are vLLM v1's defaults (`vllm/engine/arg_utils.py`, `EngineArgs`) for the knobs of
the same names, so a plan that says nothing behaves like an engine started without flags.
"""

from __future__ import annotations

MAX_NUM_BATCHED_TOKENS = 8192
"""Token budget of one step (vLLM `max_num_batched_tokens` with chunked prefill on a large GPU)."""
MAX_NUM_SEQS = 256
"""Most sequences running at once (vLLM `max_num_seqs`)."""
BLOCK_SIZE = 16
"""Tokens per KV block (vLLM `block_size` on CUDA)."""
GPU_MEMORY_UTILIZATION = 0.9
"""Fraction of HBM the engine may use for weights, activations and KV cache (vLLM `gpu_memory_utilization`)."""
MAX_BUNDLE_STEPS = 64
"""Most decode-only passes the engine fuses into one step (a simulator speed knob; no effect on results)."""
