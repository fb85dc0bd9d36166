"""Tokenising prompts for routing: the exact prompt length and token-id prefix hashes.

The gateway's `tokenizer:` option picks how a request's prompt becomes token ids:

- `null` (default): no tokenizer is local. The length is estimated as characters /
  `limits.chars_per_token`, and prefix hashes are of the prompt's bytes (`openai.prompt_blocks`).
- `fleetwise`: the deterministic tokenizer of `fleetwise emulate` (`fleetwise.core.tokens`), with
  its chat template. Lengths are exact for emulated backends, and the chained block hashes are
  the ones the emulator's KV events carry, so the prefix index can be fed from those events.
- a path to a HuggingFace `tokenizer.json` (needs the `tokenizers` package). Lengths are exact for
  completions; chat prompts are counted through fleetwise's chat template, not the model's own
  (a Jinja template needs the model's `transformers` config), so a chat prompt's length is exact
  up to a few template tokens per message.

A token-id prompt needs no tokenizer: its ids are used as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from fleetwise.core import tokens
from fleetwise.core.openai_request import chat_turns
from fleetwise.errors import SpecError
from fleetwise.gateway.config import FLEETWISE_TOKENIZER

__all__ = ["TURN_CACHE_CHARS", "FleetwiseTokenizer", "PromptTokenizer", "make_tokenizer", "request_ids"]



class PromptTokenizer(Protocol):
    """Text -> token ids, the way the backends' engines see it."""

    name: str
    vocab_size: int
    """Token ids are in [0, vocab_size)."""

    def completion_ids(self, text: str) -> list[int]:
        """Token ids of a completion prompt (special tokens as the engine adds them)."""
        ...

    def chat_ids(self, text: str) -> list[int]:
        """Token ids of a chat prompt already rendered by the chat template."""
        ...

    def chat_parts_ids(self, parts: list[str]) -> list[int]:
        """Token ids of a chat prompt given as the template's parts (`tokens.chat_parts`)."""
        ...


TURN_CACHE_CHARS = 1 << 24
"""Characters of rendered chat turns whose token ids `FleetwiseTokenizer` keeps (16 Mi, the
least recently used dropped first): a conversation's earlier turns come back with every new
one, so each is tokenized once while it is in use."""


class _TurnCache:
    """Token ids of rendered chat turns, least recently used first out, bounded in characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._ids: OrderedDict[str, list[int]] = OrderedDict()

    def ids(self, part: str) -> list[int]:
        got = self._ids.get(part)
        if got is not None:
            self._ids.move_to_end(part)
            return got
        got = self._ids[part] = tokens.encode(part)
        self.chars += len(part)
        while self.chars > self.max_chars and self._ids:
            old, _ = self._ids.popitem(last=False)
            self.chars -= len(old)
        return got


class FleetwiseTokenizer:
    """`fleetwise.core.tokens`: what `fleetwise emulate` tokenizes with. Chat turns are
    tokenized once each while they stay in a bounded cache (`TURN_CACHE_CHARS`)."""

    name = FLEETWISE_TOKENIZER
    vocab_size = tokens.VOCAB_SIZE

    def __init__(self, cache_chars: int = TURN_CACHE_CHARS) -> None:
        self._turns = _TurnCache(cache_chars)

    def completion_ids(self, text: str) -> list[int]:
        """`tokens.encode(text)`."""
        return tokens.encode(text)

    def chat_ids(self, text: str) -> list[int]:
        """`tokens.encode(text)` (the emulator adds no special tokens)."""
        return tokens.encode(text)

    def chat_parts_ids(self, parts: list[str]) -> list[int]:
        """`chat_ids("".join(parts))`, each part's ids from the cache (no piece of `encode`
        straddles two parts: `tokens.chat_parts`)."""
        out: list[int] = []
        for part in parts:
            out += self._turns.ids(part)
        return out


class HfTokenizer:
    """A HuggingFace `tokenizer.json`, loaded with the `tokenizers` library (no download)."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SpecError(f"tokenizer: {path!r} needs the `tokenizers` package; pip install tokenizers, "
                            "or set tokenizer: null to estimate lengths from characters") from None
        if not Path(path).is_file():
            raise SpecError(f"tokenizer: {path!r} is not a file; give a HuggingFace tokenizer.json, "
                            f"{FLEETWISE_TOKENIZER!r}, or null")
        try:
            self._tok: Any = Tokenizer.from_file(path)
        except Exception as err:  # the library raises its own exception type for a bad file
            raise SpecError(f"tokenizer: {path!r} is not a tokenizer.json the `tokenizers` library can "
                            f"read ({err}); give a HuggingFace tokenizer.json") from None
        self.name = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def completion_ids(self, text: str) -> list[int]:
        """Ids with the model's special tokens (vLLM's completions add BOS)."""
        return self._encode(text, True)

    def chat_ids(self, text: str) -> list[int]:
        """Ids without special tokens added (a chat template writes its own)."""
        return self._encode(text, False)

    def chat_parts_ids(self, parts: list[str]) -> list[int]:
        """`chat_ids` of the joined parts (a BPE may merge across a part boundary: no cache)."""
        return self._encode("".join(parts), False)

    def _encode(self, text: str, special: bool) -> list[int]:
        try:
            return list(self._tok.encode(text, add_special_tokens=special).ids)
        except Exception as err:  # the library's own errors (e.g. a lone surrogate it cannot take)
            raise ValueError(str(err)) from None


def make_tokenizer(spec: str | None) -> PromptTokenizer | None:
    """The tokenizer the `tokenizer:` option names (None: estimate from characters)."""
    if spec is None:
        return None
    if spec == FLEETWISE_TOKENIZER:
        return FleetwiseTokenizer()
    return HfTokenizer(spec)


def request_ids(tok: PromptTokenizer, body: dict[str, Any], chat: bool) -> list[int]:
    """Token ids of an accepted request's prompt: chat messages through fleetwise's chat template
    (`add_generation_prompt` and `continue_final_message` as vLLM reads them), a completion
    prompt as text, a list of texts, or token ids (kept as they are)."""
    if chat:
        add_gen = body.get("add_generation_prompt", True) is not False
        cont = body.get("continue_final_message", False) is True
        return tok.chat_parts_ids(tokens.chat_parts(chat_turns(body["messages"]), add_gen and not cont, cont))
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return tok.completion_ids(prompt)
    ids: list[int] = []
    for p in prompt:
        if isinstance(p, str):
            ids += tok.completion_ids(p)
        elif isinstance(p, list):
            ids += p
        else:
            ids.append(p)
    return ids
