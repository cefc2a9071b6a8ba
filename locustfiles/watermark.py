"""The row watermark: the time before which every request row of a source is in.

What judges a step while it runs (``hold = "auto"``: steady.AutoHold; ``mode = "search"``:
kneeswarm.launch.search.SearchDriver) must judge only rows that have all arrived.  A fixed guess of how late
rows come (``lag_s``: the worker's report interval + the master's flush + a margin, 6 s) costs every
step those seconds, and is wrong for a request that lasts longer than the guess.  Instead each source
says how far its rows are complete:

Worker side (``InFlight``, one per process: ``IN_FLIGHT``): the users mark each request's start
before it is sent and unmark it once its row is in the RowBuffer (users.py); open loop marks an
arrival's intended send time as soon as it is drawn, so an arrival the generator sends late
(coordinated omission) holds the watermark at the time its row will carry.  The watermark is the
earliest start still marked, or now when none: a row not yet in the buffer starts at or after it.
It is read in the same step, with no greenlet switch between, as the buffer is taken for the report
to the master (plugin.WorkerListeners.on_report), so every row before it is in that report or an
earlier one.  Free of Locust and gevent.

Master side (``Horizon``): each worker's last watermark, put on the master's clock by the same
offset as its rows and only once those rows were handed to what judges the steps
(clocks.ClockGate.take_watermarks after release); a local runner's own, read as its rows are taken.
The horizon is the minimum over the sources now present: a worker that left is not waited for, a
worker that sent no watermark yet (an old worker, or one whose first report is still on its way)
counts as ``now − lag_s``, the old fixed guess.
"""

from __future__ import annotations

from typing import Final, Iterable

WATERMARK_KEY: Final = "kneeswarm_wm"  # key in the worker report: the worker's watermark (its clock)
LOCAL: Final = "local"  # the source name of a local runner's rows (plugin.Recording)


class InFlight:
    """The starts of this process's requests whose rows are not in the RowBuffer yet, counted by
    start time (two requests may share one).  begin/end are a dict update each: the hot path."""

    def __init__(self) -> None:
        self._starts: dict[float, int] = {}

    def begin(self, t: float) -> None:
        self._starts[t] = self._starts.get(t, 0) + 1

    def end(self, t: float) -> None:
        n = self._starts.get(t, 0) - 1
        if n > 0:
            self._starts[t] = n
        else:
            self._starts.pop(t, None)

    def watermark(self, now: float) -> float:
        """Every row not yet recorded starts at or after this: the earliest open start, else ``now``."""
        return min(min(self._starts, default=now), now)

    def __len__(self) -> int:
        return sum(self._starts.values())


IN_FLIGHT = InFlight()  # this process's requests (users.py marks them; the report reads the watermark)


class Horizon:
    """The master's horizon: up to when the rows of every present source are in (master clock)."""

    def __init__(self, lag_s: float) -> None:
        self.lag_s = lag_s  # the fallback for a source without a watermark: rows trail by at most this
        self._last: dict[str, float] = {}

    def update(self, source: str, watermark: float) -> None:
        """``source``'s watermark, on the master's clock, once the rows sent with it were handed over."""
        self._last[source] = watermark

    def at(self, now: float, sources: Iterable[str]) -> float:
        """The horizon at ``now`` over ``sources`` (the workers present, or LOCAL): never after ``now``;
        ``now − lag_s`` where there is no source (no worker connected)."""
        fallback = now - self.lag_s
        marks = [self._last.get(s, fallback) for s in sources]
        return min(min(marks, default=fallback), now)
