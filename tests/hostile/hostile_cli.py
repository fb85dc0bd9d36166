"""Helpers of the hostile-input suite: run the CLI in-process and classify its outcome."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetwise.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "examples" / "plans"
MAX_MESSAGE_CHARS = 300
# A "billion laughs" YAML: under 500 bytes, 9**9 nodes once every alias is expanded.
ALIAS_BOMB = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
    for p, c in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)


@dataclass
class Outcome:
    rc: int
    out: str
    err: str

    @property
    def line(self) -> str:
        return self.err.strip()


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Outcome:
    """Call `fleetwise` in-process; a raised exception (a traceback) fails the test."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return Outcome(rc, cap.out, cap.err)


def assert_user_error(o: Outcome, *needles: str) -> str:
    """Exit 2 with exactly one stderr line under 300 characters containing every needle."""
    assert o.rc == 2, (o.rc, o.err[-500:], o.out[-300:])
    lines = o.err.strip().splitlines()
    assert len(lines) == 1, o.err[:1000]
    assert len(lines[0]) < MAX_MESSAGE_CHARS, lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def finite_nonneg_times(doc: object, path: str = "") -> None:
    """Every number under a key naming a time (`*_s`, p50/p90/p99 of a latency) is finite and >= 0."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            finite_nonneg_times(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            finite_nonneg_times(v, f"{path}.{i}")
    elif isinstance(doc, float | int) and not isinstance(doc, bool):
        assert math.isfinite(doc), f"{path} = {doc}"
        if _is_time(path):
            assert doc >= 0, f"{path} = {doc}"


def _is_time(path: str) -> bool:
    parts = path.split(".")
    signed = ("vs_", "delta", "diff", "error", "ci_")  # paired differences and errors may be negative
    return any(p.endswith("_s") for p in parts) and not any(m in path for m in signed)


def load_strict_json(text: str) -> object:
    """Parse JSON refusing NaN and Infinity (what a strict parser in another language does)."""
    def refuse(name: str) -> None:
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)
