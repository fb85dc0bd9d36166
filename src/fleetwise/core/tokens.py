"""A deterministic local tokenizer: text <-> token ids without any download.

Owns turning prompt text into token ids, generated token ids back into text, and the chained
hashes of full KV blocks that make prefix caching real (equal text prefixes give equal token
prefixes, hence equal block hashes, hence cache hits).

Pieces: the text is cut into pieces by `PIECE_RE`: an optional single space then a run of
non-space characters; or a run of whitespace, which stops before the space of a following word. A piece that is a vocabulary word (one space plus
a word of `WORDS`) is one token. Any other piece is cut into chunks of `CHUNK_CHARS` characters,
each one token whose id is a hash of the chunk. So English-like text costs about one token per
word, as subword tokenizers do (about 4 characters per token, Llama/GPT BPE on English prose).

Generated text is made of vocabulary words only, so `encode(decode(ids)) == ids` for generated
ids, and since a word's space is never absorbed by the piece before it, `encode(prompt +
decode(ids)) == encode(prompt) + ids` for any prompt: a stream continued elsewhere from prompt +
streamed text sees exactly the token context of the uninterrupted one (tested).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence
from functools import lru_cache
from itertools import islice

VOCAB_SIZE = 32_000
"""Token ids are in [0, VOCAB_SIZE) (the vocabulary size of Llama 2's tokenizer)."""
EOS_TOKEN_ID = 2
"""End-of-sequence id (Llama 2's `</s>`); never emitted as text."""
NUM_SPECIAL = 3
"""Ids 0..2 are special (`<unk>`, `<s>`, `</s>`, as in Llama 2)."""
NUM_WORDS = 8_000
"""Vocabulary words: ids NUM_SPECIAL .. NUM_SPECIAL + NUM_WORDS - 1."""
HASH_BASE = NUM_SPECIAL + NUM_WORDS
"""First id of hashed chunks (pieces that are not vocabulary words)."""
CHUNK_CHARS = 4
"""Characters per token for text outside the vocabulary (about 4 per token, BPE on English)."""
GENERATION_PROMPT = "<|assistant|>\n"
"""What the chat template appends so the model answers as the assistant."""
PIECE_RE = re.compile(r" ?\S+|\s+?(?= \S)|\s+")

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "n", "r", "s", "t", "l", "m", "nd", "st", "rk")


def _make_words() -> tuple[str, ...]:
    """NUM_WORDS distinct pronounceable words (syllable products, a fixed order)."""
    syll = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]  # 2400 syllables
    words: list[str] = []
    seen: set[str] = set()
    for s in syll:
        if s not in seen:
            seen.add(s)
            words.append(s)
    i = 0
    while len(words) < NUM_WORDS:
        n = len(syll)
        w = syll[i % n] + syll[(i * 7 + 3 + i // n) % n]  # distinct (a, b) pairs for i < n*n
        if w not in seen:
            seen.add(w)
            words.append(w)
        i += 1
    return tuple(words[:NUM_WORDS])


WORDS = _make_words()
_PIECE_OF_ID = {NUM_SPECIAL + i: " " + w for i, w in enumerate(WORDS)}
_ID_OF_PIECE = {p: i for i, p in _PIECE_OF_ID.items()}
_ID_OF_WORD = {w: NUM_SPECIAL + i for i, w in enumerate(WORDS)}
"""Vocabulary word (without its leading space) -> token id: `encode`'s fast path."""


@lru_cache(maxsize=65_536)
def _chunk_id(chunk: str) -> int:
    d = hashlib.blake2b(chunk.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return HASH_BASE + int.from_bytes(d, "little") % (VOCAB_SIZE - HASH_BASE)


def encode(text: str) -> list[int]:
    """Token ids of `text` (deterministic; equal text prefixes give equal id prefixes up to the
    piece that straddles the end of the shorter text).

    Text made only of vocabulary words each after one space (what load generators send and
    streams continue with) takes one split and a dict lookup per word: about half the CPU of
    the piece regex for a 1000-token prompt (87 vs 167 us on the development VM). Anything else
    goes through the pieces; tests check both give the piecewise reference's ids."""
    if text[:1] == " ":
        words = list(map(_ID_OF_WORD.get, islice(text.split(" "), 1, None)))
        if None not in words:
            return words  # type: ignore[return-value]
    pieces = PIECE_RE.findall(text)
    found = list(map(_ID_OF_PIECE.get, pieces))
    if None not in found:  # all vocabulary words (generated text, load-generator prompts)
        return found  # type: ignore[return-value]
    ids: list[int] = []
    for piece, tid in zip(pieces, found, strict=True):
        if tid is not None:
            ids.append(tid)
            continue
        for k in range(0, len(piece), CHUNK_CHARS):
            ids.append(_chunk_id(piece[k:k + CHUNK_CHARS]))
    return ids


def decode_token(token_id: int) -> str:
    """Text of one generated token (a vocabulary word with its leading space; '' for specials)."""
    return _PIECE_OF_ID.get(token_id, "")


def decode(ids: list[int]) -> str:
    """Text of generated ids (vocabulary words; other ids decode to '')."""
    get = _PIECE_OF_ID.get
    return "".join(get(i, "") for i in ids)


def words_text(word_indices: list[int]) -> str:
    """Text of exactly len(word_indices) tokens: the vocabulary words at those indices (mod
    NUM_WORDS), each with its leading space. Load generators build prompts of known length with it."""
    return "".join(" " + WORDS[i % NUM_WORDS] for i in word_indices)


def chat_text(turns: Sequence[tuple[str, str]], add_generation_prompt: bool = True,
              continue_final: bool = False) -> str:
    """The chat template over validated `(role, content)` turns: `<|role|>\\n content \\n` per
    turn, then `<|assistant|>\\n` (the generation prompt); with `continue_final` the last turn is
    left open instead, so the model continues it (vLLM's `continue_final_message`)."""
    return "".join(chat_parts(turns, add_generation_prompt, continue_final))


def chat_parts(turns: Sequence[tuple[str, str]], add_generation_prompt: bool = True,
               continue_final: bool = False) -> list[str]:
    """`chat_text` cut into its turns (and the generation prompt). Every part but the last ends in
    a newline and every part starts with `<|`, so no piece of `encode` straddles two parts:
    `encode(chat_text(...))` is the concatenation of `encode(part)` (tested), and a router may
    tokenize each turn once per conversation."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in turns]
    if continue_final and parts:
        parts[-1] = parts[-1][:-1]
    elif add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return parts


def block_hashes(ids: list[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full `block_size`-token blocks of `ids`: hash i names blocks 0..i
    (as vLLM's prefix-cache block hashes do), as non-negative 63-bit ints."""
    from_bytes = int.from_bytes
    return tuple(from_bytes(d, "little") >> 1 for d in block_digests(ids, block_size))


def block_digests(ids: list[int], block_size: int, parent: bytes = b"") -> list[bytes]:
    """The chain digests behind `block_hashes`, continuing the chain after the block whose digest
    is `parent` (b"": the first block of a sequence); `block_id` turns one into its hash."""
    out: list[bytes] = []
    data = array("I", ids).tobytes()
    step = 4 * block_size
    blake2b = hashlib.blake2b
    for start in range(0, len(data) - step + 1, step):
        parent = blake2b(parent + data[start:start + step], digest_size=8).digest()
        out.append(parent)
    return out


def block_id(chain_digest: bytes) -> int:
    """The block hash (`block_hashes` value) named by one chain digest of `block_digests`."""
    return int.from_bytes(chain_digest, "little") >> 1


def digest(ids: list[int]) -> int:
    """A 63-bit digest of a whole token sequence (seeds generated text and lengths)."""
    d = hashlib.blake2b(array("I", ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(d, "little") >> 1
