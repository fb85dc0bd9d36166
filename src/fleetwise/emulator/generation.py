"""What the emulated model "says": generated tokens and, when the client sets no limit, how many.

Owns two deterministic functions of the prompt:
- `token_at(prompt_digest, i)`: the i-th generated token id (a vocabulary word), so any server
  given the same prompt produces the same text, and a stream resumed elsewhere can be checked
  token by token;
- `OutputLengthModel.draw(prompt_digest)`: the output length when the client gives no
  `max_tokens`, drawn from a `LengthDist` with a generator seeded by (seed, prompt). Nothing a
  client or router can read (metrics, views, responses) shows it before the last token; the
  engine model uses it to end the request and, at admission, to check that the request's KV
  footprint fits (where vLLM checks the prompt against max_model_len).
"""

from __future__ import annotations

import numpy as np

from fleetwise.emulator.tokenizer import NUM_SPECIAL, NUM_WORDS, decode_token
from fleetwise.spec.workload import FixedLength, LengthDist, LognormalLength
from fleetwise.workload.generate import _draw_lengths

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
"""SplitMix64 increment (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014)."""


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def token_at(prompt_digest: int, position: int) -> int:
    """Id of the generated token at `position` (0-based) after a prompt with `prompt_digest`."""
    return NUM_SPECIAL + _splitmix64((prompt_digest + position * _GOLDEN) & _MASK64) % NUM_WORDS


def text_of(prompt_digest: int, start: int, stop: int) -> str:
    """Generated text of positions [start, stop)."""
    return "".join(decode_token(token_at(prompt_digest, i)) for i in range(start, stop))


DEFAULT_OUTPUT_LENGTHS = LognormalLength(median_tokens=200, p99_tokens=2000, max_tokens=8192)
"""Output lengths when a client sets no max_tokens: log-normal, median 200 and p99 2000 tokens,
the shape of ShareGPT conversation replies (sharegpt_8k stats in ../shared/traces: median ~190)."""


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
        return max(int(_draw_lengths(self.dist, rng, 1)[0]), 1)
