"""Processes by (pid, start time): /proc/PID/stat read in one place, and a process group signalled
only while its leader is still the process that was started (a reused pid is never signalled)."""

import os
import signal
import time

from .common import pause
from .defaults import STOP_GRACE, STOP_SIGNALS
from .files import read_text


class Stat:
    """/proc/PID/stat (or /proc/PID/task/TID/stat) split once. ``field(n)`` is man proc(5)'s
    field number n (1-based: 3 state, 4 ppid, 5 pgrp, 10 minflt, 12 majflt, 14 utime, 15 stime,
    20 num_threads, 22 starttime, 23 vsize, 24 rss, 39 processor)."""

    def __init__(self, text: str):
        self.comm = text[text.find("(") + 1 : text.rfind(")")]
        self._rest = text[text.rfind(")") + 2 :].split()  # from field 3 (state) on

    def field(self, n: int) -> str:
        return self._rest[n - 3]

    def int(self, n: int) -> int:
        return int(self._rest[n - 3])

    @property
    def zombie(self) -> bool:
        return self.field(3) == "Z"


def read_stat(path: str) -> "Stat | None":
    """Stat of a /proc/.../stat file, None when it is gone or unreadable."""
    try:
        st = Stat(read_text(path))
        st.field(3)
        return st
    except (OSError, IndexError):
        return None


def proc_start_time(pid: int) -> "int | None":
    """Start time of ``pid`` in clock ticks since boot (field 22), None if gone or a zombie."""
    st = read_stat(f"/proc/{pid}/stat")
    try:
        return None if st is None or st.zombie else st.int(22)
    except (IndexError, ValueError):
        return None


def parent_pid(pid: int) -> "int | None":
    st = read_stat(f"/proc/{pid}/stat")
    try:
        return None if st is None else st.int(4)
    except (IndexError, ValueError):
        return None


def is_ours(pid: "int | None", start_time: "int | None") -> bool:
    return bool(pid) and start_time is not None and proc_start_time(pid) == start_time


def _signal_group(pid: int, start_time: "int | None", sig: int) -> bool:
    """Signal the process group led by ``pid`` (started with setsid) if it is still ours."""
    if not is_ours(pid, start_time):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        try:
            os.kill(pid, sig)
            return True
        except OSError:
            return False


def stop_groups(groups: "list[tuple[int, int | None]]", grace: float = STOP_GRACE) -> None:
    """SIGINT, then SIGTERM, then SIGKILL each (pid, start time) process group still ours, waiting
    up to ``grace`` seconds after each signal; then SIGKILL anything left in those groups."""
    pending = [(p, s) for p, s in groups if is_ours(p, s)]
    for sig in STOP_SIGNALS:
        if not pending:
            break
        for pid, start in pending:
            _signal_group(pid, start, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(is_ours(p, s) for p, s in pending):
            pause(0.05)
        pending = [(p, s) for p, s in pending if is_ours(p, s)]
    for pid, _ in groups:  # leftovers in a collector's own process group (a child it forked)
        for member in _group_members(pid):
            if member != os.getpid():
                try:
                    os.kill(member, signal.SIGKILL)
                except OSError:
                    pass


def _group_members(pgid: int) -> "list[int]":
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = read_stat(f"/proc/{name}/stat")
        try:
            if st is not None and not st.zombie and st.int(5) == pgid:
                out.append(int(name))
        except (IndexError, ValueError):
            continue
    return out


def child_setup():
    """A preexec_fn for collectors: SIGINT back to default (a controller started as a background
    job in a script has it ignored, and an ignored signal is inherited), and SIGTERM to the child
    when the agent dies (Linux prctl PR_SET_PDEATHSIG, where ctypes can reach it)."""
    prctl = None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        pass

    def _set() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return _set
