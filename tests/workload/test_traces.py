"""Trace loaders on small slices written here, their errors, replay options, trace_stats, real files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.workload.traces import (
    detect_format,
    load_trace,
    prefix_reuse_fraction,
    read_trace,
    trace_stats,
)

TRACES_ENV = "FLEETWISE_TRACES_DIR"
TRACES_DIR = os.environ.get(TRACES_ENV)
"""The folder of the public traces these tests check against their published statistics (not shipped
with the project: their own licenses); unset, those tests skip saying so."""

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.2224671,91,16
"""

MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 3000, "input_length": 600, "output_length": 7, "hash_ids": [0, 3]},
    {"timestamp": 3000, "input_length": 1024, "output_length": 9, "hash_ids": [0, 1]},
]

BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
130,ChatGPT,50,5,55,API log
"""

STATS = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
3772,54,3826,69.85
2015,156,2171,12.91
3858,133,3991,29.0
"""


def _put(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _mooncake(tmp_path: Path, rows: list[dict] = MOONCAKE) -> Path:
    return _put(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


# --- loaders ----------------------------------------------------------------------------------


def test_azure_timestamps_are_exact(tmp_path: Path) -> None:
    reqs = load_trace(_put(tmp_path, "a.csv", AZURE))
    assert [r.request_id for r in reqs] == ["0", "1", "2", "3"]
    # 100 ns ticks parsed as integers: 4.3145790 s and 4.5418770 s, then one tick later
    assert [r.arrival_s for r in reqs] == [0.0, 43145790 / 1e7, 45418770 / 1e7, 45418771 / 1e7]
    assert [(r.prompt_tokens, r.output_tokens, r.block_hashes) for r in reqs] == [
        (374, 44, ()), (396, 109, ()), (879, 55, ()), (91, 16, ())]


def test_azure_unsorted_rows_and_utc_offset(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:02.5000000+00:00,2,3\n"
            "2024-05-10 00:00:00.0000000+00:00,1,1\n")
    reqs = load_trace(_put(tmp_path, "a.csv", text))
    assert [(r.arrival_s, r.prompt_tokens) for r in reqs] == [(0.0, 1), (2.5, 2)]


def test_timestamps_with_different_utc_offsets_are_the_instants_they_name(tmp_path: Path) -> None:
    # a local-time log across a daylight-saving change: 01:59:59+01:00 and 03:00:01+02:00 are 2 s apart
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-03-31 01:59:59.0000000+01:00,1,1\n"
            "2024-03-31 03:00:01.0000000+02:00,2,3\n2024-03-31T01:00:00Z,3,3\n2024-03-30 19:00:03-05:00,4,4\n")
    reqs = load_trace(_put(tmp_path, "a.csv", text))
    assert [(r.arrival_s, r.prompt_tokens) for r in reqs] == [(0.0, 4), (3596.0, 1), (3597.0, 3), (3598.0, 2)]


def test_mooncake_fields_and_hash_ids(tmp_path: Path) -> None:
    reqs = load_trace(_mooncake(tmp_path))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.block_hashes) for r in reqs] == [
        (0.0, 1100, 5, (0, 1, 2)), (3.0, 600, 7, (0, 3)), (3.0, 1024, 9, (0, 1))]
    assert all(r.hash_block_tokens == 512 for r in reqs)


def test_burstgpt_skips_failed_rows(tmp_path: Path) -> None:
    p = _put(tmp_path, "b.csv", BURST)
    table = read_trace(p)
    assert table.format == "burstgpt" and table.skipped_failed == 1
    reqs = load_trace(p)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 472, 18), (113.0, 417, 276), (125.0, 50, 5)]


def test_length_stats_need_a_rate_and_get_seeded_poisson_arrivals(tmp_path: Path) -> None:
    p = _put(tmp_path, "s.csv", STATS)
    with pytest.raises(SpecError, match="no timestamps; give rate_rps"):
        load_trace(p)
    a = load_trace(p, rate_rps=2.0, seed=7)
    assert a == load_trace(p, rate_rps=2.0, seed=7)
    assert a != load_trace(p, rate_rps=2.0, seed=8)
    assert [(r.prompt_tokens, r.output_tokens) for r in a] == [(3772, 54), (2015, 156), (3858, 133)]
    assert a[0].arrival_s == 0.0 and a[0].arrival_s < a[1].arrival_s < a[2].arrival_s


@pytest.mark.parametrize("name,text,fmt", [
    ("a.csv", AZURE, "azure"), ("b.csv", BURST, "burstgpt"), ("s.csv", STATS, "length_stats"),
    ("m.jsonl", json.dumps(MOONCAKE[0]) + "\n", "mooncake"),
    ("bom.csv", "\ufeff" + AZURE, "azure"),
    ("reordered.csv", "GeneratedTokens,TIMESTAMP,ContextTokens\n5,2023-11-16 18:15:46.6805900,9\n", "azure"),
], ids=["azure", "burstgpt", "length_stats", "mooncake", "bom", "reordered-columns"])
def test_format_detected_from_header(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    p = _put(tmp_path, name, text)
    assert detect_format(p) == fmt
    assert len(load_trace(p, rate_rps=1.0 if fmt == "length_stats" else None)) >= 1


def test_format_override_reads_lengths_only(tmp_path: Path) -> None:
    # An Azure file read as length statistics is refused: it lacks those columns.
    p = _put(tmp_path, "a.csv", AZURE)
    with pytest.raises(SpecError, match=r"format length_stats needs columns.*missing \['num_prefill_tokens'"):
        load_trace(p, format="length_stats", rate_rps=1.0)
    with pytest.raises(SpecError, match="'parquet' is not a trace format; supported: azure"):
        load_trace(p, format="parquet")


# --- errors -----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="nope.csv: trace file not found"):
        load_trace(tmp_path / "nope.csv")


def test_unknown_format_names_found_and_supported_columns(tmp_path: Path) -> None:
    p = _put(tmp_path, "x.csv", "time,prompt,completion\n1,2,3\n")
    with pytest.raises(SpecError) as err:
        load_trace(p)
    msg = str(err.value)
    assert "found columns ['time', 'prompt', 'completion']" in msg
    assert "azure (TIMESTAMP, ContextTokens, GeneratedTokens)" in msg and "burstgpt (Timestamp" in msg


BAD_ROWS = [
    ("a.csv", AZURE + "2023-11-16 18:15:52.0000000,12x,4\n", ":6: column 'ContextTokens' must be a non-negative"),
    ("a.csv", AZURE + "2023-11-16 18:1x:52.0000000,12,4\n", ":6: column 'TIMESTAMP' must be a timestamp"),
    ("a.csv", AZURE + "2023-11-16 18:15:52.0000000,12\n", ":6: expected 3 columns"),
    ("b.csv", BURST + "x,ChatGPT,1,2,3,API log\n", ":6: column 'Timestamp' must be a number"),
    ("s.csv", STATS + "-5,3,0,0\n", ":5: column 'num_prefill_tokens' must be a non-negative integer, got '-5'"),
    ("m.jsonl", json.dumps(MOONCAKE[0]) + "\n{oops\n", ":2: not valid JSON"),
    ("m.jsonl", json.dumps(MOONCAKE[0]) + '\n{"timestamp": 1, "input_length": 3}\n', ":2: missing field 'output_length'"),
    ("m.jsonl", json.dumps(MOONCAKE[0]) + '\n{"timestamp": 1, "input_length": 3, "output_length": 1, '
     '"hash_ids": ["a"]}\n', ":2: hash_ids[0]: expected a whole number, got 'a'"),
]


@pytest.mark.parametrize("name,text,needle", BAD_ROWS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_ROWS)])
def test_malformed_row_names_file_and_line(tmp_path: Path, name: str, text: str, needle: str) -> None:
    p = _put(tmp_path, name, text)
    with pytest.raises(SpecError) as err:
        load_trace(p, rate_rps=1.0 if name == "s.csv" else None)
    assert str(err.value).startswith(str(p) + needle.split(":")[0] + ":" + needle.split(":")[1]), str(err.value)
    assert needle.split(":", 2)[2].strip() in str(err.value)


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="the file is empty"):
        load_trace(_put(tmp_path, "e.csv", "\n"))


# --- replay options ---------------------------------------------------------------------------


def test_time_scale_start_offset_and_max_requests(tmp_path: Path) -> None:
    p = _put(tmp_path, "b.csv", BURST)
    assert [r.arrival_s for r in load_trace(p, time_scale=0.5)] == [0.0, 56.5, 62.5]
    assert [r.arrival_s for r in load_trace(p, start_s=100)] == [0.0, 12.0]
    assert [r.prompt_tokens for r in load_trace(p, max_requests=2)] == [472, 417]


def test_rate_rps_rescales_mean_interarrival(tmp_path: Path) -> None:
    p = _put(tmp_path, "b.csv", BURST)
    reqs = load_trace(p, rate_rps=0.1)
    # (n-1)/span = 2/125 req/s originally; rescaled so that it is 0.1: span becomes 20 s
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 113 * 20 / 125, 20.0], rel=1e-12)
    assert trace_stats(reqs).rate_rps == pytest.approx(0.1, rel=1e-12)
    with pytest.raises(SpecError, match="not both"):
        load_trace(p, rate_rps=1.0, time_scale=2.0)


def test_rate_rps_on_simultaneous_arrivals_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="all arrive at the same time"):
        load_trace(_mooncake(tmp_path, MOONCAKE[1:]), rate_rps=1.0)


# --- stats ------------------------------------------------------------------------------------


def test_trace_stats_by_hand() -> None:
    reqs = [Request("0", 0.0, 100, 10), Request("1", 1.0, 300, 30), Request("2", 3.0, 200, 20)]
    s = trace_stats(reqs)
    assert (s.count, s.duration_s, s.rate_rps) == (3, 3.0, 2 / 3)
    assert s.interarrival_cv == pytest.approx(0.5 / 1.5, rel=1e-12)  # gaps 1 and 2
    assert (s.input_p50, s.output_p50) == (200.0, 20.0)
    assert s.input_p99 == pytest.approx(298.0) and s.prefix_reuse_fraction == 0.0
    assert trace_stats([]).count == 0


def test_prefix_reuse_counts_leading_seen_blocks_only() -> None:
    reqs = [
        Request("0", 0.0, 1100, 1, (0, 1, 2)),
        Request("1", 1.0, 600, 1, (0, 3)),  # block 0 reused: 512 tokens
        Request("2", 2.0, 1024, 1, (0, 1)),  # both blocks reused: 1024 tokens
        Request("3", 3.0, 700, 1, (9, 1)),  # id 1 seen but block 0 not: nothing reused
        Request("4", 4.0, 300, 1, (0,)),  # partial block: min(512, 300) tokens
    ]
    assert prefix_reuse_fraction(reqs) == (512 + 1024 + 300) / (1100 + 600 + 1024 + 700 + 300)


# --- the real files (skipped unless FLEETWISE_TRACES_DIR names them) ------------------------------


def _real(name: str) -> Path:
    if not TRACES_DIR:
        pytest.skip(f"{name}: public traces are not shipped with the project (their own licenses); "
                    f"set {TRACES_ENV} to a folder holding them")
    p = Path(TRACES_DIR) / name
    if not p.is_file():
        pytest.skip(f"{p} not present: set {TRACES_ENV} to the folder holding the public traces")
    return p


def test_real_azure_conversation_matches_published_stats() -> None:
    s = trace_stats(load_trace(_real("AzureLLMInferenceTrace_conv.csv")))
    assert s.count == 19366 and s.duration_s / 3600 == pytest.approx(0.97, abs=0.005)
    assert s.interarrival_cv == pytest.approx(1.09, abs=0.005) and s.rate_rps == pytest.approx(5.5, abs=0.05)
    assert (s.input_p50, s.input_p99, s.output_p50, s.output_p90, s.output_p99) == (1020, 4142, 129, 424, 601)


def test_real_mooncake_conversation_matches_published_stats() -> None:
    reqs = load_trace(_real("conversation_trace.jsonl"))
    s = trace_stats(reqs)
    assert s.count == 12031 and s.duration_s / 3600 == pytest.approx(0.98, abs=0.005)
    assert (s.input_p50, s.input_p90, s.output_p50, s.output_p90) == (6909, 27367, 350, 597)
    assert s.input_p99 == pytest.approx(85400, abs=1) and s.output_p99 == pytest.approx(1119, abs=1)
    assert s.prefix_reuse_fraction == pytest.approx(0.37, abs=0.005)
    assert math.isclose(np.mean([r.prompt_tokens for r in reqs]), 12035, abs_tol=1)
    assert all(len(r.block_hashes) == -(-r.prompt_tokens // 512) for r in reqs)


@pytest.mark.parametrize("name,count,inp,out", [
    ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30731, (1730, 5696), (415, 834, 998)),
    ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28257, (2730, 3702), (167, 372)),
], ids=["sharegpt", "arxiv"])
def test_real_length_stats_match_published_percentiles(name: str, count: int, inp: tuple, out: tuple) -> None:
    s = trace_stats(load_trace(_real(name), rate_rps=5.0, seed=1))
    assert s.count == count and (s.input_p50, s.input_p90) == inp
    assert (s.output_p50, s.output_p90, s.output_p99)[: len(out)] == out


def test_load_trace_refuses_a_rate_that_spreads_it_over_more_than_a_year(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^arrival: the 3 requests span 2e\+09 s, more than a run may"):
        load_trace(_mooncake(tmp_path), rate_rps=1e-9)


def test_a_gzip_compressed_trace_is_named_as_such_with_the_fix(tmp_path: Path) -> None:
    import gzip

    p = tmp_path / "t.csv.gz"
    p.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,1,1\n"))
    with pytest.raises(SpecError, match=rf"^{p}: gzip-compressed; a trace is UTF-8 text \(CSV or JSONL\): "
                                        rf"decompress it first \(gunzip {p}\)$"):
        load_trace(p)
