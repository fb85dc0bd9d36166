"""What the emulated model "says": generated tokens and, when the client sets no limit, how many.

Owns two deterministic functions:
- `next_token(context)`: the next token id (a vocabulary word) as a function of the last
  `CONTEXT_TOKENS` ids of the context (prompt, then the tokens generated so far), as a greedy
  model's next token is a function of its context. Any server given the same prompt produces
  the same text, and a request whose prompt is the original prompt + the text already streamed
  continues with exactly the tokens the uninterrupted stream would have produced (live decode
  migration, checked token by token); `TokenStream` generates them incrementally;
- `OutputLengthModel.draw(prompt_digest)`: the output length when the client gives no
  `max_tokens`, drawn from a `LengthDist` with a generator seeded by (seed, prompt). Nothing a
  client or router can read (metrics, views, responses) shows it before the last token; the
  engine model uses it to end the request and, at admission, to check that the request's KV
  footprint fits (where vLLM checks the prompt against max_model_len).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetwise.core.tokens import NUM_SPECIAL, NUM_WORDS, decode_token
from fleetwise.spec.workload import FixedLength, LengthDist, LognormalLength
from fleetwise.workload.sample import draw_lengths

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
"""SplitMix64 increment (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014)."""


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


CONTEXT_TOKENS = 8
"""Context ids the next emulated token depends on: long enough that distinct prompts give
distinct streams (8000**8 windows), short enough to cost a few hashes per token."""


def next_token(context: Sequence[int]) -> int:
    """Id of the token generated after `context` (uses its last CONTEXT_TOKENS ids)."""
    h = len(context) if len(context) < CONTEXT_TOKENS else CONTEXT_TOKENS
    for t in context[-CONTEXT_TOKENS:]:
        h = _splitmix64((h ^ t) & _MASK64)
    return NUM_SPECIAL + h % NUM_WORDS


class TokenStream:
    """The generated tokens after one prompt, produced on demand (each from its context window)."""

    __slots__ = ("ids", "_window")

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids: list[int] = []
        self._window = list(prompt_ids[-CONTEXT_TOKENS:])

    def _extend(self, stop: int) -> None:
        ids, w = self.ids, self._window
        while len(ids) < stop:
            t = next_token(w)
            ids.append(t)
            w.append(t)
            if len(w) > CONTEXT_TOKENS:
                del w[0]

    def token(self, position: int) -> int:
        """Id of the generated token at `position` (0-based)."""
        self._extend(position + 1)
        return self.ids[position]

    def text(self, start: int, stop: int) -> str:
        """Generated text of positions [start, stop)."""
        self._extend(stop)
        return "".join(decode_token(t) for t in self.ids[start:stop])


def text_of(prompt_ids: Sequence[int], start: int, stop: int) -> str:
    """Generated text of positions [start, stop) after a prompt (the reference: whole context)."""
    ctx = list(prompt_ids)
    for _ in range(stop):
        ctx.append(next_token(ctx))
    return "".join(decode_token(t) for t in ctx[len(prompt_ids) + start:len(prompt_ids) + stop])


DEFAULT_OUTPUT_LENGTHS = LognormalLength(median_tokens=200, p99_tokens=2000, max_tokens=8192)
"""Output lengths when a client sets no max_tokens: log-normal, median 200 and p99 2000 tokens,
the shape of ShareGPT conversation replies (the public sharegpt_8k length statistics: median ~190)."""


class OutputLengthModel:
    """Output length of a request without `max_tokens`: a seeded draw per prompt."""

    def __init__(self, dist: LengthDist = DEFAULT_OUTPUT_LENGTHS, seed: int = 0) -> None:
        self.dist, self.seed = dist, int(seed)

    def draw(self, prompt_digest: int) -> int:
        """Tokens the model will generate for this prompt before its EOS (>= 1): one draw of the
        workload generator's own sampler, from a generator seeded by (seed, prompt)."""
        if isinstance(self.dist, FixedLength):
            return self.dist.tokens
        rng = np.random.default_rng([self.seed, prompt_digest])
        return max(int(draw_lengths(self.dist, rng, 1)[0]), 1)
