"""What a live process started by a supervisor needs: to stop when that supervisor dies.

`fleetwise up`, `fleetwise emulate --plan` and `fleetwise gateway --workers` start servers as
child processes and stop them on Ctrl-C or SIGTERM; a supervisor killed outright (SIGKILL, the
OOM killer) runs no handler, so each child asks the kernel to send it SIGTERM when its parent
dies (Linux `prctl(PR_SET_PDEATHSIG)`), and the servers shut down as on any SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
"""prctl(2) option (Linux <linux/prctl.h>): the signal a process gets when its parent dies."""


def stop_with_parent(parent_pid: int) -> None:
    """In a child process (after the fork; before the exec, as a `preexec_fn`): be sent SIGTERM
    when its parent `parent_pid` dies, even by SIGKILL; a parent already gone stops it now.
    Where prctl is missing (not Linux) it does nothing."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
