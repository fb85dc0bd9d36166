"""Tokenizer, generated text and output lengths: deterministic, prefix-preserving, resumable."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fleetwise.core.tokens import (
    CHUNK_CHARS,
    HASH_BASE,
    NUM_SPECIAL,
    NUM_WORDS,
    PIECE_RE,
    VOCAB_SIZE,
    WORDS,
    block_hashes,
    decode,
    encode,
    words_text,
)
from fleetwise.emulator.generation import OutputLengthModel, TokenStream, text_of
from fleetwise.spec.workload import FixedLength, LognormalLength, UniformLength


def test_vocabulary_words_are_distinct_tokens():
    assert len(set(WORDS)) == NUM_WORDS
    ids = encode(words_text(list(range(NUM_WORDS))))
    assert len(ids) == NUM_WORDS and len(set(ids)) == NUM_WORDS


@given(st.lists(st.integers(0, NUM_WORDS - 1), min_size=0, max_size=60))
def test_words_text_has_one_token_per_word_and_round_trips(words):
    ids = encode(words_text(words))
    assert len(ids) == len(words)
    assert decode(ids) == words_text(words)


@given(st.text(max_size=200), st.text(max_size=200), st.text(max_size=200))
def test_equal_text_prefix_gives_equal_token_prefix(a, b, c):
    # Everything before the last piece of the shared text is tokenized identically.
    shared = a + " end"
    x, y = encode(shared + b), encode(shared + c)
    head = encode(a)
    assert x[:len(head) - 1] == y[:len(head) - 1] or not head


def test_block_hashes_chain_equal_prefixes_only():
    bs = 16
    p = encode(words_text(list(range(100))))
    q = encode(words_text(list(range(64)) + [999] * 36))
    hp, hq = block_hashes(p, bs), block_hashes(q, bs)
    assert len(hp) == 100 // bs and len(hq) == 100 // bs
    assert hp[:4] == hq[:4] and hp[4] != hq[4]
    assert all(h >= 0 for h in hp)
    assert block_hashes(p[:15], bs) == ()


def test_generated_text_is_a_function_of_the_context():
    p = encode("a prompt")
    full = text_of(p, 0, 50)
    s = TokenStream(p)
    assert s.text(0, 20) + s.text(20, 50) == full  # the incremental stream equals the reference
    assert encode(full) == [s.token(i) for i in range(50)]  # checkable token by token
    assert text_of(encode("another prompt"), 0, 50) != full
    assert len(set(encode(full))) > 40  # no short cycle


@given(st.text(max_size=40), st.integers(0, 30), st.integers(1, 20))
def test_a_continuation_from_prompt_plus_streamed_text_continues_the_same_stream(prompt, cut, more):
    p = encode(prompt)
    if not p:
        p = encode("x")
        prompt = "x"
    done = text_of(p, 0, cut)
    assert encode(prompt + done) == p + encode(done)  # the context is the same token sequence
    assert text_of(encode(prompt + done), 0, more) == text_of(p, cut, cut + more)


def test_output_lengths_are_seeded_per_prompt():
    dist = LognormalLength(median_tokens=100, sigma=0.5, max_tokens=400)
    m0, m1 = OutputLengthModel(dist, 0), OutputLengthModel(dist, 1)
    draws = [m0.draw(d) for d in range(2000)]
    assert draws == [OutputLengthModel(dist, 0).draw(d) for d in range(2000)]
    assert draws != [m1.draw(d) for d in range(2000)]
    assert 1 <= min(draws) and max(draws) <= 400
    assert abs(float(np.median(draws)) - 100) < 8
    assert OutputLengthModel(FixedLength(tokens=7)).draw(5) == 7
    u = [OutputLengthModel(UniformLength(low_tokens=3, high_tokens=5)).draw(d) for d in range(200)]
    assert set(u) == {3, 4, 5}


def test_encode_fast_path_equals_piecewise():
    text = words_text(list(range(300)))
    mixed = text + " not-a-word" + text
    ids = encode(mixed)
    assert ids[:300] == encode(text) and ids[-300:] == encode(text)
    assert len(ids) == 600 + len(encode(" not-a-word"))


_SEPARATORS = (" ", " ", " ", "  ", "\n", " \n", "\t", "\xa0", "")
_ODD_WORDS = ("not-a-word", "<|user|>", "Zz", "ünï", "")


@given(st.lists(st.tuples(st.sampled_from(_SEPARATORS), st.one_of(
    st.integers(0, NUM_WORDS - 1).map(lambda i: WORDS[i]), st.sampled_from(_ODD_WORDS))), max_size=40),
    st.sampled_from(("", " ", "\n")))
def test_encode_equals_the_piecewise_reference(parts, tail):
    text = "".join(sep + word for sep, word in parts) + tail
    assert encode(text) == reference_encode(text)


def test_encode_takes_the_word_fast_path_on_vocabulary_text_and_gives_its_ids():
    idx = np.random.default_rng(7).integers(0, NUM_WORDS, 1000).tolist()
    text = words_text(idx)
    assert encode(text) == [NUM_SPECIAL + i for i in idx] == reference_encode(text)
    assert encode(" " + text) == reference_encode(" " + text) and encode(text + " ") == reference_encode(text + " ")


def reference_encode(text: str) -> list[int]:
    """The tokenizer as its module docstring defines it, piece by piece (the reference `encode`'s
    fast paths must equal)."""
    ids: list[int] = []
    for piece in PIECE_RE.findall(text):
        if piece[:1] == " " and piece[1:] in _WORD_INDEX:
            ids.append(NUM_SPECIAL + _WORD_INDEX[piece[1:]])
            continue
        for k in range(0, len(piece), CHUNK_CHARS):
            d = hashlib.blake2b(piece[k:k + CHUNK_CHARS].encode("utf-8", "surrogatepass"), digest_size=8).digest()
            ids.append(HASH_BASE + int.from_bytes(d, "little") % (VOCAB_SIZE - HASH_BASE))
    return ids


_WORD_INDEX = {w: i for i, w in enumerate(WORDS)}
