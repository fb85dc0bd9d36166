"""Trace formats are a registry: one module per format, found without editing a list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetwise.errors import SpecError
from fleetwise.spec.workload import WorkloadSpec
from fleetwise.workload import formats
from fleetwise.workload.formats import TRACE_FORMATS, get_format, trace_format
from fleetwise.workload.generate import generate
from fleetwise.workload.parse import TraceTable, float_column, int_column, read_csv
from fleetwise.workload.traces import detect_format, load_trace, read_trace

FORMATS_DIR = Path(formats.__file__).parent


def test_every_module_of_the_package_registers_one_format():
    modules = sorted(p.stem for p in FORMATS_DIR.glob("*.py") if p.stem != "__init__")
    assert list(TRACE_FORMATS) == modules == ["azure", "burstgpt", "length_stats", "mooncake"]
    assert [f.json for f in TRACE_FORMATS.values()] == [False, False, False, True]
    assert TRACE_FORMATS["azure"].columns == ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@pytest.fixture
def tsv_format() -> Iterator[str]:
    """A format registered the way a new module would register it, removed afterwards."""

    @trace_format("secs_csv", ("t_s", "in", "out"))
    def read(p: Path) -> TraceTable:
        cols, lines = read_csv(p, ("t_s", "in", "out"), "secs_csv")
        t = float_column(p, "t_s", cols["t_s"], lines)
        return TraceTable(str(p), "secs_csv", t - t.min(), int_column(p, "in", cols["in"], lines),
                          int_column(p, "out", cols["out"], lines))

    yield "secs_csv"
    TRACE_FORMATS.remove("secs_csv")


def test_a_registered_format_is_detected_and_read(tmp_path: Path, tsv_format: str) -> None:
    p = tmp_path / "x.csv"
    p.write_text("t_s,in,out\n10.5,100,7\n10,50,3\n")
    assert detect_format(p) == tsv_format
    table = read_trace(p)
    assert table.format == tsv_format
    assert table.arrival_s.tolist() == [0.0, 0.5] and table.prompt_tokens.tolist() == [50, 100]
    reqs = load_trace(p, rate_rps=4.0)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 50, 3), (0.25, 100, 7)]


def test_registering_a_name_twice_is_refused(tsv_format: str) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        trace_format(tsv_format, ("a",))(lambda p: TraceTable(str(p), "x", None, np.zeros(0), np.zeros(0)))


def test_an_unknown_format_lists_the_registry_and_the_column_mapping(tmp_path: Path, tsv_format: str) -> None:
    with pytest.raises(SpecError) as err:
        get_format("parquet")
    msg = str(err.value)
    assert msg.startswith("format 'parquet' is not a trace format; supported: azure (TIMESTAMP, ContextTokens, "
                          "GeneratedTokens); burstgpt (")
    assert "secs_csv (t_s, in, out)" in msg and "--trace-columns arrival=COL,prompt=COL,output=COL" in msg


def test_a_workload_spec_with_an_unknown_format_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    spec = WorkloadSpec.model_validate({"arrival": {"kind": "trace", "path": str(p), "format": "azur"}})
    with pytest.raises(SpecError, match=r"^arrival.format 'azur' is not a trace format; supported: azure"):
        generate(spec, 0)
