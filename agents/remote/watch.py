"""The controller's live channels: ``watch`` (its heartbeat; EOF means the controller died) and
``echo`` (time stamps for the clock offset, agents/clock.py)."""

import os
import select
import signal
import time

from .common import log_line, wall_time, pause
from .defaults import ECHO_IDLE_TIMEOUT, HEARTBEAT_FILE, WATCH_BYE, WATCH_EOF_GRACE, WATCH_EOF_MAX_SILENCE, WATCH_POLL
from .files import file_key, touch
from .supervisor import agent_alive


def _read_lines(fd: int, timeout: float) -> "list[bytes] | None":
    """Complete lines read from ``fd`` within ``timeout`` ([] if none); None at EOF."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return []
    chunk = os.read(fd, 4096)
    if not chunk:
        return None
    return chunk.splitlines()


def _controller_gone(run_dir: str, silent_for: float) -> int:
    """After the watch channel's EOF: tell the agent to stop unless a newer heartbeat comes."""
    if silent_for > WATCH_EOF_MAX_SILENCE:
        log_line(f"watch: EOF {silent_for:.1f}s after the last line (a dead link): the heartbeat timeout governs")
        return 0
    beat = file_key(os.path.join(run_dir, HEARTBEAT_FILE))
    deadline = time.monotonic() + WATCH_EOF_GRACE
    while time.monotonic() < deadline:
        pause(0.1)
        if file_key(os.path.join(run_dir, HEARTBEAT_FILE)) != beat:
            return 0  # a reconnected controller renews the heartbeat through a new watch
    alive, pid, _ = agent_alive(run_dir)
    if alive:
        os.kill(pid, signal.SIGUSR1)
    return 0


def cmd_watch(run_dir: str) -> int:
    """The controller's heartbeat channel: each line on stdin renews the heartbeat and is
    answered "ok"; "bye" ends it quietly; EOF (the controller died) stops the agent."""
    run_dir = os.path.abspath(run_dir)
    beat_path = os.path.join(run_dir, HEARTBEAT_FILE)
    last_line = time.monotonic()
    while True:
        lines = _read_lines(0, WATCH_POLL)
        if lines is None:
            return _controller_gone(run_dir, time.monotonic() - last_line)
        if not agent_alive(run_dir)[0]:
            return 0
        for line in lines:
            if line.strip() == WATCH_BYE:
                return 0
            touch(beat_path)
            last_line = time.monotonic()
            try:
                os.write(1, b"ok\n")
            except OSError:
                pass


def cmd_echo() -> int:
    """Answer each line on stdin with 'T2 T3' (receive and send time, epoch seconds)."""
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], ECHO_IDLE_TIMEOUT)
        if not ready:
            return 0
        t2 = wall_time()
        chunk = os.read(0, 4096)
        if not chunk:
            return 0
        buf += chunk
        while b"\n" in buf:
            _, buf = buf.split(b"\n", 1)
            t3 = wall_time()
            os.write(1, f"{t2!r} {t3!r}\n".encode())
