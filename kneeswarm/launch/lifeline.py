"""Children that die with the process that started them (floor 4; standard library only).

A process started in a session of its own (``start_new_session=True``, so that the terminal's
Ctrl-C reaches only its parent) outlives a parent killed with SIGKILL.  Linux's
``prctl(PR_SET_PDEATHSIG, sig)`` asks the kernel to send ``sig`` to the child when its parent
dies; pass :func:`die_with_parent` as ``preexec_fn`` to ``subprocess.Popen``.

The signal fires when the *thread* that forked the child exits, not the whole process: start
such children from the main thread (or from a thread that lives as long as the process).
The setting survives ``execve`` (so wrappers like ``env`` or ``taskset`` keep it) but not a
further fork: a grandchild needs its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PARENT_DEATH_SIGNAL = signal.SIGTERM  # lets Locust's master flush its last rows before it quits

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) if sys.platform == "linux" else None


def die_with_parent(sig: int = PARENT_DEATH_SIGNAL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties the child's life to this process (None where Linux's prctl
    is missing: the child then runs on as before)."""
    if _libc is None:
        return None
    parent = os.getpid()
    prctl = _libc.prctl

    def preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
