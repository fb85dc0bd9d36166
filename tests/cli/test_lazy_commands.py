"""A run of one command loads that command's module alone: `fleetwise simulate` does not import
the live stacks (gateway, emulator, deploy), the report's plotting, or scipy."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from fleetwise.cli.main import SUBCOMMAND_MODULES, build_parser

NOT_ON_THE_SIMULATE_PATH = ("matplotlib", "scipy", "starlette", "uvicorn", "aiohttp", "zmq", "prometheus_client",
                            "sqlite3", "fleetwise.gateway", "fleetwise.emulator", "fleetwise.deploy",
                            "fleetwise.report", "fleetwise.planner", "fleetwise.sim.scenarios")
"""Packages `fleetwise simulate` never uses (a plan file and a trace, no faults, no report)."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _loaded_by(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, env=env, check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(h for h in NOT_ON_THE_SIMULATE_PATH if any(m == h or m.startswith(h + ".") for m in modules))


def test_simulate_imports_none_of_the_other_stacks() -> None:
    loaded = _loaded_by("from fleetwise.cli.main import build_parser\nbuild_parser('simulate')\n"
                        "from fleetwise.cli import simulate_cmd\nfrom fleetwise.sim.runner import simulate")
    assert _heavy(loaded) == []
    every = _loaded_by("from fleetwise.cli.main import build_parser\nbuild_parser()")
    assert len(_heavy(every)) >= 5  # the full parser does load them: the check above can fail


@pytest.mark.parametrize("command", ["simulate", "plan", "catalog", "scenarios"])
def test_one_command_parser_equals_its_part_of_the_full_parser(command: str) -> None:
    alone, full = _subparsers(build_parser(command)), _subparsers(build_parser())
    assert list(alone) == [command]
    assert alone[command].format_help() == full[command].format_help()


@pytest.mark.parametrize("command", ["calibrate", "cli-doc", "nonsense", "--version", None])
def test_a_command_of_another_module_or_none_gets_every_command(command: str | None) -> None:
    assert list(_subparsers(build_parser(command))) == list(_subparsers(build_parser()))
    assert len(SUBCOMMAND_MODULES) < len(_subparsers(build_parser()))  # calibrate, predict, measure: perf_cmd


def test_python_dash_m_fleetwise_runs_the_cli() -> None:
    """`python -m fleetwise` is the `fleetwise` command (for an environment without the script on PATH)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-m", "fleetwise", "fit", "--model", "llama-3.1-8b"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("fleetwise fit: error: the following arguments are required: "
                                                     "--gpu; see `fleetwise fit --help`")
