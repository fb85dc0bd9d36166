"""Tokenizer, generated text and output lengths: deterministic, prefix-preserving, resumable."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fleetwise.emulator.generation import OutputLengthModel, text_of, token_at
from fleetwise.emulator.tokenizer import (
    NUM_WORDS,
    WORDS,
    block_hashes,
    decode,
    digest,
    encode,
    words_text,
)
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


def test_generated_text_is_a_function_of_prompt_and_position():
    d = digest(encode("a prompt"))
    full = text_of(d, 0, 50)
    assert text_of(d, 0, 20) + text_of(d, 20, 50) == full  # resumable at any position
    assert encode(full) == [token_at(d, i) for i in range(50)]  # checkable token by token
    assert text_of(digest(encode("another prompt")), 0, 50) != full


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
