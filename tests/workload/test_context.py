"""`fleetwise.workload.context`: requests against the model's context, exact outcomes per policy."""

from __future__ import annotations

import numpy as np
import pytest

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.workload.context import apply_context_limit, limit_lengths

PROMPT = np.array([100, 0, 950, 40, 2000])
OUTPUT = np.array([10, 5, 100, 0, 10])
"""Rows: fits; empty prompt; 950 + 100 > 1000; empty output; 2000 + 10 > 1000."""


def test_reject_names_the_first_request_and_counts_the_rest():
    with pytest.raises(SpecError, match=r"^t.csv: request 1 \(of 4 such\): prompt of 0 tokens: .*; fix the workload "
                                        r"or pass --over-context truncate\|skip$"):
        limit_lengths(PROMPT, OUTPUT, 1000, "reject", "t.csv")


def test_truncate_cuts_prompts_then_outputs_and_skips_empty_requests():
    keep, p, o, counts = limit_lengths(PROMPT, OUTPUT, 1000, "truncate", "t.csv")
    assert keep.tolist() == [True, False, True, False, True]
    assert p.tolist() == [100, 900, 990] and o.tolist() == [10, 100, 10]
    assert counts == {"max_context_tokens": 1000, "truncated": 2, "skipped": 2}


def test_skip_drops_every_request_that_does_not_fit():
    keep, p, o, counts = limit_lengths(PROMPT, OUTPUT, 1000, "skip", "t.csv")
    assert keep.tolist() == [True, False, False, False, False]
    assert p.tolist() == [100] and o.tolist() == [10]
    assert counts == {"max_context_tokens": 1000, "truncated": 0, "skipped": 4}


def test_requests_keep_the_block_hashes_of_their_shortened_prompt():
    reqs = [Request("a", 0.0, 100, 10, block_hashes=(1, 2), hash_block_tokens=64),
            Request("b", 1.0, 950, 100, block_hashes=tuple(range(15)), hash_block_tokens=64)]
    out, counts = apply_context_limit(reqs, 1000, "truncate", "w.yaml")
    assert out[0] is reqs[0]
    assert (out[1].prompt_tokens, out[1].output_tokens, len(out[1].block_hashes)) == (900, 100, 15)
    assert counts["truncated"] == 1
    with pytest.raises(SpecError, match=r"^w.yaml: request b \(of 1 such\): prompt 950 \+ output 100 tokens exceeds"):
        apply_context_limit(reqs, 1000, "reject", "w.yaml")
