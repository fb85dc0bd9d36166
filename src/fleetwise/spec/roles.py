"""`Role`: what a replica does — the one definition every layer uses."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["mixed", "prefill", "decode"]
"""`mixed` = colocated prefill and decode; `prefill`/`decode` = the disaggregated halves."""

ROLES: tuple[Role, ...] = get_args(Role)
