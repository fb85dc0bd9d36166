"""A request against a model's context window: whether prompt plus output fits, and what each
`over_context` policy (reject, truncate, skip) does with one that does not."""

from __future__ import annotations

from fleetwise.errors import SpecError

OVER_CONTEXT_POLICIES = ("reject", "truncate", "skip")
"""What a run does with a request whose prompt plus output exceeds the model's context: `reject`
the run with the first such request named (vLLM answers such a request with HTTP 400), `truncate`
the prompt (then the output) to fit, or `skip` the request; truncated and skipped requests are
counted in the run's summary."""


PREFILL_LEG_OUTPUT_TOKENS = 1
"""Tokens a P/D prefill leg generates after the prompt: vLLM's disaggregated prefill instance runs
the request with `max_tokens=1` and hands the KV over, so its context bounds prompt + 1."""


def leg_tokens(prompt_tokens: int, output_tokens: int, prefill_leg: bool) -> int:
    """Tokens (prompt + output) a request needs of one replica's context: prompt + 1 on a P/D
    prefill replica, prompt + output on one that decodes."""
    return prompt_tokens + (PREFILL_LEG_OUTPUT_TOKENS if prefill_leg else output_tokens)


def request_tokens_problem(prompt_tokens: int, output_tokens: int, max_context_tokens: int) -> str | None:
    """Why a request cannot be served by a model with this context (None when it can)."""
    if prompt_tokens < 1:
        return f"prompt of {prompt_tokens} tokens: a request needs at least 1 prompt token"
    if output_tokens < 1:
        return f"output of {output_tokens} tokens: a request generates at least 1 token"
    if prompt_tokens + output_tokens > max_context_tokens:
        return (f"prompt {prompt_tokens:,} + output {output_tokens:,} tokens exceeds the model's context of "
                f"{max_context_tokens:,} tokens")
    return None


def check_request_tokens(prompt_tokens: int, output_tokens: int, max_context_tokens: int, where: str) -> None:
    """SpecError (HTTP 400 on a server) when a request's lengths cannot be served by the model."""
    problem = request_tokens_problem(prompt_tokens, output_tokens, max_context_tokens)
    if problem:
        raise SpecError(f"{where}: {problem}; shorten the prompt or lower the output length")


def fit_to_context(prompt_tokens: int, output_tokens: int, max_context_tokens: int) -> tuple[int, int]:
    """(prompt, output) cut to fit the context: the prompt keeps at most context - 1 tokens and
    loses what the output needs (vLLM's `truncate_prompt_tokens` cuts the prompt), then the output
    is cut to what is left. Lengths below 1 become 1."""
    prompt = max(1, min(prompt_tokens, max_context_tokens - min(max(output_tokens, 1), max_context_tokens - 1)))
    return prompt, max(1, min(output_tokens, max_context_tokens - prompt))
