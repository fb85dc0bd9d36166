"""Writing results: JSON that never carries NaN or Infinity, files written atomically, and output
paths checked before any work (one line naming the flag when a path cannot be written)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError, quote


def jsonable(obj: Any) -> Any:
    """A copy of `obj` that strict JSON can hold: non-finite floats become None, tuples lists,
    mapping keys strings (numpy scalars and arrays via their `tolist`)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    if isinstance(obj, Iterable) and not isinstance(obj, (bytes, bytearray)):
        return [jsonable(v) for v in obj]
    return obj


def strict_json_dumps(obj: Any, indent: int | None = 2, **kwargs: Any) -> str:
    """JSON text of `obj` with NaN/Infinity written as null, so any JSON parser accepts it."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False, **kwargs)


def write_json(path: str | Path, obj: Any, indent: int | None = 2, **kwargs: Any) -> Path:
    """Write `obj` to `path` as strict JSON (`strict_json_dumps`) in UTF-8 with a final newline:
    the one writer of every JSON file the tools produce, so none holds NaN or Infinity. A regular
    file is replaced atomically (written beside it, then renamed), so a reader polling it (a test
    waiting for a fleet's endpoints file) never sees half of it."""
    p = Path(path)
    text = strict_json_dumps(obj, indent=indent, **kwargs) + "\n"
    if p.exists() and not p.is_file():  # a device or pipe (/dev/stdout): written in place
        p.write_text(text, encoding="utf-8")
        return p
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return p


def check_writable_dir(path: str | Path, what: str = "--out") -> Path:
    """`path` as a directory that exists or can be created and written; checked before any work."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise SpecError(f"{what}={quote(str(p), 200)}: exists and is not a directory; pick a directory")
        _check_folder_can_hold(p, what, p)
    except (OSError, ValueError) as err:
        raise _unusable(what, p, err) from None
    return p


def check_writable_file(path: str | Path, what: str = "--json", make_folders: bool = False) -> Path:
    """`path` as a file that can be created or overwritten; checked before any work. With
    `make_folders` its folder may be missing if it can be made (the writer makes it)."""
    p = Path(path)
    try:
        if p.is_dir():
            raise SpecError(f"{what}={quote(str(p), 200)}: is a directory; give a file name")
        parent = p.parent if str(p.parent) else Path(".")
        if make_folders:
            _check_folder_can_hold(parent, what, p)
        elif not parent.is_dir():
            raise SpecError(f"{what}={quote(str(p), 200)}: folder {parent} does not exist; create it first")
        if (parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK)) or (p.exists() and not os.access(p, os.W_OK)):
            raise SpecError(f"{what}={quote(str(p), 200)}: not writable; pick another path")
    except (OSError, ValueError) as err:
        raise _unusable(what, p, err) from None
    return p


def _check_folder_can_hold(folder: Path, what: str, shown: Path) -> None:
    """`folder` exists and is writable, or its nearest existing ancestor is a writable directory
    (so it can be made); else a SpecError naming `what`=`shown`."""
    anchor = folder
    while not anchor.exists():
        anchor = anchor.parent
    if not anchor.is_dir():
        raise SpecError(f"{what}={quote(str(shown), 200)}: {anchor} is a file, so the directory cannot be made")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise SpecError(f"{what}={quote(str(shown), 200)}: {anchor} is not writable; pick another directory")


def _unusable(what: str, p: Path, err: OSError | ValueError) -> SpecError:
    """The error of a path the system refused to look at (too long, a NUL byte)."""
    reason = getattr(err, "strerror", None) or str(err)
    return SpecError(f"{what}={quote(str(p), 200)}: not a usable path ({reason})")
