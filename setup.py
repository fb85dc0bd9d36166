"""Build: fleetwise is pure Python; the simulator's hot modules are also compiled with mypyc.

`pip install -e .` (or a wheel build) compiles `COMPILED` with mypyc (the compiler that ships
with mypy and builds black and mypy themselves) into C extensions next to their sources; the
compiled modules run the busy simulation about 1.5x faster (docs/simulator.md, "Compiled
modules"). Everything else in pyproject.toml. The sources stay the reference: the extensions
are built from them unchanged and give identical results (tests/sim/test_compiled.py).

Pure Python is used instead, with nothing compiled, when `FLEETWISE_PURE_PYTHON=1` is set at
install time, or when the compilation fails (no C compiler, mypyc missing or rejecting a
module): the install then goes on and says why. At run time, `FLEETWISE_PURE_PYTHON=1` or a
source edited since the build (`fleetwise.core.compiled`) loads the sources instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PURE_ENV = "FLEETWISE_PURE_PYTHON"
"""Set to 1: install (and run) pure Python only."""
COMPILED = [
    "src/fleetwise/core/feedback.py",
    "src/fleetwise/core/request.py",
    "src/fleetwise/core/views.py",
    "src/fleetwise/engine/blocks.py",
    "src/fleetwise/engine/bundle.py",
    "src/fleetwise/engine/decoders.py",
    "src/fleetwise/engine/driver.py",
    "src/fleetwise/engine/heap.py",
    "src/fleetwise/engine/records.py",
    "src/fleetwise/engine/scheduler.py",
    "src/fleetwise/engine/sequence.py",
    "src/fleetwise/engine/state.py",
    "src/fleetwise/engine/step_state.py",
    "src/fleetwise/engine/window.py",
    "src/fleetwise/perf/kv.py",
    "src/fleetwise/perf/kv_share.py",
    "src/fleetwise/perf/roofline.py",
    "src/fleetwise/routing/incoming.py",
    "src/fleetwise/routing/kernels.py",
    "src/fleetwise/routing/pd_select.py",
    "src/fleetwise/routing/plugins.py",
    "src/fleetwise/routing/policy.py",
    "src/fleetwise/routing/predictor.py",
    "src/fleetwise/routing/prefix_index.py",
    "src/fleetwise/routing/reasons.py",
    "src/fleetwise/routing/safe_mode.py",
    "src/fleetwise/routing/score_rows.py",
    "src/fleetwise/routing/signals.py",
    "src/fleetwise/routing/state.py",
    "src/fleetwise/routing/view_cache.py",
    "src/fleetwise/sim/columns.py",
    "src/fleetwise/sim/events.py",
    "src/fleetwise/sim/faults.py",
    "src/fleetwise/sim/fleet.py",
    "src/fleetwise/sim/network.py",
    "src/fleetwise/sim/recovery.py",
    "src/fleetwise/sim/runner.py",
]
"""The modules the busy simulation spends its time in (profile: docs/simulator.md): the engine,
the simulator's loop, the routing policy with what it calls per decision and the KV network a
P/D run drives per hand-off (`perf/kv.py`, `kv_share.py`, `sim/network.py`); the list is kept to
these so a clean install compiles in about a minute of CPU. `routing/base.py` stays out (its
runtime-checkable `RoutingPolicy` protocol cannot be compiled; the `winning_scores` it exports,
read per decision, is `routing/score_rows.py`'s), and `routing/vector.py` (its `ScoreTable` is a
`Mapping` subclass: compiled, `isinstance(a_dict, ScoreTable)` answered True; its entries are
`score_rows.ScoreRows`)."""
GROUP = "fleetwise_native"
"""Name of the shared library mypyc puts the compiled code of every module in."""
MYPY_CONFIG = "[mypy]\npython_version = 3.11\nignore_missing_imports = True\n"
"""mypy settings of the compilation: the project's, less the pydantic plugin."""
MANIFEST = "src/fleetwise/core/compiled.json"
"""Written by the build: SHA-256 of each compiled source, so a later edit is detected at import."""


def _note(msg: str) -> None:
    print(f"fleetwise setup: {msg}", file=sys.stderr)


def _manifest() -> dict[str, str]:
    """Module name -> SHA-256 of its source, for every compiled module."""
    out = {}
    for path in COMPILED:
        mod = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        out[mod] = hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
    return out


class OptionalBuildExt(build_ext):
    """Builds the compiled modules; on any failure warns and leaves the pure Python install."""

    def run(self) -> None:
        # Beside the extensions: in the source tree when built in place (editable), else in the wheel.
        target = ROOT / MANIFEST if self.inplace else Path(self.build_lib) / MANIFEST.removeprefix("src/")
        if not self.extensions:  # nothing compiled now: extensions of an earlier build must not pass as current
            target.unlink(missing_ok=True)
            return
        try:
            super().run()
        except Exception as e:  # a missing compiler or headers must not stop the install
            _note(f"compiling the simulator failed ({e}); installing pure Python")
            self.extensions = []
            target.unlink(missing_ok=True)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(_manifest(), indent=1, sort_keys=True) + "\n")


def _extensions() -> list:
    """mypyc's extensions for `COMPILED` ([] for a pure Python install, saying why)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _note(f"{PURE_ENV} is set: pure Python, nothing compiled")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        _note(f"mypyc unavailable ({e}); pure Python")
        return []
    # Own mypy config: the project's loads the pydantic plugin, absent from an isolated build.
    config = Path(tempfile.mkdtemp()) / "mypyc.ini"
    config.write_text(MYPY_CONFIG)
    try:
        return mypycify(["--config-file", str(config), *COMPILED], opt_level="3", group_name=GROUP)
    except (Exception, SystemExit) as e:  # mypyc rejected a module: never block the install
        _note(f"mypyc could not compile the simulator ({e!r}); pure Python")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
