"""A child process that ends with its parent: Linux's parent-death signal (prctl PR_SET_PDEATHSIG).

The signal follows the *thread* that started the child: a child started from a pool thread gets
it when that thread ends. Elsewhere than Linux this does nothing (children may then outlive a
killed parent).
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def set_parent_death_signal(sig: int) -> None:
    """Ask the kernel to send `sig` to this process when the thread that started it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass
