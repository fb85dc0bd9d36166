"""Throwaway virtual environments for peer tools (Vidur, aiconfigurator) that the benchmarks run
side by side with fleetwise. They live outside the repo and are never project dependencies.
Stdlib only: a benchmark's child process may import this from a peer's own venv.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def find_python(explicit: str | None, versions: tuple[str, ...], flag: str) -> str:
    """`explicit`, else the newest pyenv CPython of the first listed minor version present, else
    one on PATH; exits naming `flag` when none is found."""
    if explicit:
        return explicit
    pyenv = Path.home() / ".pyenv" / "versions"
    for v in versions:
        for p in sorted(pyenv.glob(f"{v}*"), reverse=True):
            if (p / "bin" / "python").exists():
                return str(p / "bin" / "python")
    for v in versions:
        found = shutil.which(f"python{v}")
        if found:
            return found
    sys.exit(f"no CPython {'/'.join(versions)} found for the peer venv; pass {flag}")


def ensure_venv(venv: Path, package: str, version: str, python: str, note: str = "") -> Path:
    """Create (once) a venv at `venv` with `package==version` and return its python."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]
    if py.exists():
        r = subprocess.run(check, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == version:
            return py
    if not py.exists():
        print(f"creating {package} venv at {venv}", file=sys.stderr)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    print(f"installing {package}=={version} into {venv}{note}", file=sys.stderr)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"{package}=={version}"], check=True)
    subprocess.run(check, check=True, capture_output=True)
    return py
