"""Which engine, perf, routing and simulator modules run compiled (mypyc), and the fallback to their sources.

`setup.py` compiles the simulator's hot modules into C extensions beside their sources and
writes `compiled.json` (module -> SHA-256 of the source it was built from). Python would load
an extension before the source beside it, so `install()` (run by `fleetwise.engine`,
`fleetwise.perf`, `fleetwise.routing` and `fleetwise.sim` before any of their modules loads)
decides once per process, for all of them together (compiled modules call each other natively, so it is all or none):
- the extensions run when each listed module has one and its source is unchanged;
- the sources run when `FLEETWISE_PURE_PYTHON=1` is set, when nothing was compiled, or when a
  source was edited since the build (with a warning naming it: rebuild with `pip install -e .`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["PURE_ENV", "install", "modules", "native"]

PURE_ENV = "FLEETWISE_PURE_PYTHON"
"""Set to 1: run every module from its Python source."""
MANIFEST = Path(__file__).with_name("compiled.json")
_SRC = Path(__file__).resolve().parent.parent.parent
"""The directory holding the `fleetwise` package."""
_PACKAGES = ("core", "engine", "perf", "routing", "sim")

_state: dict[str, Any] = {}


def _path(module: str, suffix: str) -> Path:
    return _SRC.joinpath(*module.split(".")).with_suffix(suffix)


def _extension(module: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = _path(module, suffix)
        if p.exists():
            return p
    return None


def _listed() -> dict[str, str]:
    """The build's manifest, plus any module with an extension the manifest lacks ("": unknown source)."""
    try:
        listed: dict[str, str] = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        listed = {}
    for pkg in _PACKAGES:
        for p in (_SRC / "fleetwise" / pkg).glob("*.py"):
            mod = f"fleetwise.{pkg}.{p.stem}"
            if mod not in listed and _extension(mod) is not None:
                listed[mod] = ""
    return listed


def _stale(listed: dict[str, str]) -> list[str]:
    """Listed modules whose extension is missing or whose source changed since the build."""
    return [mod for mod, digest in listed.items()
            if _extension(mod) is None
            or hashlib.sha256(_path(mod, ".py").read_bytes()).hexdigest() != digest]


class _SourceFinder:
    """Loads the listed modules from their `.py` sources (ahead of the extensions beside them)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, _path(fullname, ".py"))


def install() -> None:
    """Decide, once per process, whether the compiled modules or their sources run (see above)."""
    if _state:
        return
    listed = _listed()
    reason = ""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        reason = f"{PURE_ENV} is set"
    elif not listed:
        reason = "nothing was compiled"
    else:
        stale = _stale(listed)
        if stale:
            reason = f"edited since the build: {', '.join(sorted(stale))}"
            warnings.warn(f"fleetwise: running the simulator's pure Python sources, not its compiled "
                          f"modules ({reason}); rebuild them with `pip install -e .`", stacklevel=2)
    _state.update(native=not reason, reason=reason, modules=sorted(listed))
    if reason and listed:
        sys.meta_path.insert(0, _SourceFinder(set(listed)))  # type: ignore[arg-type]


def native() -> bool:
    """Whether this process runs the compiled modules."""
    install()
    return bool(_state["native"])


def modules() -> list[str]:
    """The modules the build compiled (whether or not they run compiled now)."""
    install()
    return list(_state["modules"])
