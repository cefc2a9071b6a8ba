"""What every part of the agent uses: timed waits that work under libfaketime, the clock, the log."""

import select
import sys
import time


def pause(seconds: float) -> None:
    if seconds > 0:
        select.select([], [], [], seconds)


def wall_time() -> float:
    return time.time()


def log_line(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")
    sys.stderr.flush()
