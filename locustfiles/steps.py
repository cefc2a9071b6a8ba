"""The step schedule: 1, 2, 4, 8 ... users, each step ramped, then held.

With ``hold = "auto"`` (steady.AutoHold) a step is held from ``min_hold`` until its rows are steady
and its QPS and P99 known, at most ``max_hold``; ``t_cut`` records where its steady data begin.

Each step's hold is timed from the moment all its users were actually running (Locust's
``spawning_complete``), not from a fixed schedule, so a slow ramp never eats into a step's
steady window.

The last step drains: its window ends (``t_end``) when its hold does, but its load goes on for
``drain()`` seconds more before the test stops, so that the requests it started before ``t_end``
complete and are recorded, as those of any other step do while the next one runs.  Without it
the stop killed them in flight and the last step read low (8 users on 4 slots of 200 ms: 18.6
req/s for a true 20, the 8 requests in flight at the stop missing from a 4.3 s window).  The log of steps as applied is what steps.csv records.  Free of Locust (and
of gevent's monkey-patching), so it can be tested alone; shape.py adapts it to Locust.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from kneeswarm.locustfiles.steady import AutoHold, Verdict

logger = logging.getLogger(__name__)


# the last step's load goes on this many times the slowest request seen (at least DRAIN_MIN_S, at most
# the plan's request.timeout) past its window's end, so that its requests in flight complete
# (kneeswarm.locustfiles.plugin's drain_s)
DRAIN_FACTOR, DRAIN_MIN_S = 1.5, 1.0

#: a chooser's answer "not yet": the step's rows are still on their way, hold it a tick longer
WAIT = -1


@dataclass
class StepRecord:
    index: int
    users: int
    t_ramp: float  # when the step's ramp began
    t_steady: float | None = None  # when all its users were running
    t_end: float | None = None  # when the next step began, or the load stopped
    t_cut: float | None = None  # hold = "auto": where its steady data begin (warm-up cut), else None
    hold_reason: str | None = None  # hold = "auto": why it ended at max_hold unsettled, else None

    def row(self) -> tuple:
        """The step's STEP_COLUMNS."""
        return (self.index, self.users, self.t_ramp, self.t_steady, self.t_end)

    def full_row(self) -> tuple:
        """STEP_COLUMNS + STEP_HOLD_COLUMNS, as steps.csv holds them."""
        return (*self.row(), self.t_cut, self.hold_reason)


class StepSchedule:
    """The state machine behind StepShape, free of Locust so it can be tested alone."""

    def __init__(self, steps: list[int], ramp: float, hold: float, on_change: Callable[[list[StepRecord]], None] | None = None,
                 auto: AutoHold | None = None, continuous: bool = False,
                 chooser: Callable[[StepRecord, float, float], int | None] | None = None,
                 drain: Callable[[], float] | None = None,
                 early: Callable[[StepRecord, Verdict, float], str | None] | None = None):
        """``auto``: hold each step until it is steady and known (steady.AutoHold), not ``hold`` seconds.
        ``continuous`` (a soak): the steps are windows of one load that never changes: only the first
        ramps; each later one starts steady where the one before ended, and window k ends ``(k + 1) x
        hold`` after the first was steady (a fixed grid: the ~1 s tick never accumulates).
        ``chooser`` (mode = "search"): asked when a step ends, with the step, the time and the
        seconds of load so far, for the next step's users (None: the test ends); the steps grow
        as it answers (users may go down between steps).
        ``drain``: the seconds the last step's load goes on past its ``t_end`` (None: it stops at once).
        ``early`` (mode = "search" with ``auto``): asked, once min_hold has passed, with the step and the
        tick's verdict when the rows are steady and the QPS known but not yet the P99, whether the step
        may end now; its answer (a reason) becomes the step's ``hold_reason`` (kneeswarm.launch.search.SearchDriver.may_end)."""
        self.steps, self.ramp, self.hold, self.auto = list(steps), ramp, hold, auto
        self.continuous = continuous
        self.chooser = chooser
        self.drain = drain
        self.early = early
        self.drain_until: float | None = None  # the last step ended: its load goes on until then
        self.log: list[StepRecord] = []
        self.on_change = on_change or (lambda log: None)
        self.done = False

    def spawn_rate(self, i: int) -> float:
        if self.continuous:
            i = 0  # the same (users, rate) as the first window: Locust sees no change and does nothing
        delta = abs(self.steps[i] - (self.steps[i - 1] if i else 0))
        return max(1.0, delta / self.ramp) if self.ramp > 0 else float(max(delta, 1))

    def _begin(self, i: int, now: float) -> tuple[int, float]:
        if self.log:
            self.log[-1].t_end = now
        self.log.append(StepRecord(i, self.steps[i], now, t_steady=now if self.continuous and i else None))
        if self.auto is not None:
            self.auto.forget_before(now)
        self.on_change(self.log)
        hold = "auto" if self.auto is not None else f"{self.hold:.1f}s"
        logger.info("step %d: %d users (ramp %.1fs, hold %s)", i, self.steps[i], self.ramp, hold)
        return self.steps[i], self.spawn_rate(i)

    def spawned(self, now: float, running_users: int | None = None) -> None:
        """All users of the current step are running.  Going down, not while more than its users still
        run (``running_users``): a Locust master says spawning is complete at most 1 s after its
        ramp-down, whether or not the users it stopped have finished their requests (plugin.STOP_MARGIN_S);
        the tick then starts the step's clock once they have (``_reached``)."""
        if running_users is not None and self.log and not self._reached(self.log[-1], running_users) \
                and running_users > self.log[-1].users:
            return
        if self.log and self.log[-1].t_steady is None:
            self.log[-1].t_steady = now
            self.on_change(self.log)

    def finish(self, now: float) -> None:
        if self.log and self.log[-1].t_end is None:
            self.log[-1].t_end = now
            self.on_change(self.log)
        self.done = True

    def tick(self, now: float, running_users: int) -> tuple[int, float] | None:
        if self.done:
            return None
        if not self.log:
            return self._begin(0, now)
        cur = self.log[-1]
        if self.drain_until is not None:  # the last step's requests still in flight complete
            if now < self.drain_until:
                return cur.users, self.spawn_rate(cur.index)
            self.done = True
            return None
        if cur.t_steady is None and self._reached(cur, running_users):
            self.spawned(now)  # spawning_complete was missed (e.g. a worker joined late)
        if cur.t_steady is not None and self._held(cur, cur.t_steady, now):
            if self.chooser is not None and cur.index + 1 >= len(self.steps):
                nxt = self.chooser(cur, now, sum((s.t_end or now) - s.t_ramp for s in self.log))
                if nxt == WAIT:
                    return cur.users, self.spawn_rate(cur.index)
                if nxt is not None:
                    self.steps.append(int(nxt))
            if cur.index + 1 >= len(self.steps):
                return self._end(cur, now)
            return self._begin(cur.index + 1, now)
        return cur.users, self.spawn_rate(cur.index)

    def _reached(self, cur: StepRecord, running_users: int) -> bool:
        """The running users are the step's: as many or more going up; going down, no more -- the
        users a step down stops finish their request first and count as running until then (a
        slow request would otherwise overlap the new step's window)."""
        before = self.log[-2].users if len(self.log) > 1 else 0
        return running_users >= cur.users if cur.users >= before else running_users <= cur.users

    def _end(self, cur: StepRecord, now: float) -> tuple[int, float] | None:
        """The last step's hold is over: its window ends now; its load drains, then the test stops."""
        tail = self.drain() if self.drain is not None else 0.0
        if tail <= 0:
            self.finish(now)
            return None
        cur.t_end = now
        self.on_change(self.log)
        self.drain_until = now + tail
        logger.info("step %d: window ended; its load goes on %.1fs for the requests in flight", cur.index, tail)
        return cur.users, self.spawn_rate(cur.index)

    def _held(self, cur: StepRecord, steady: float, now: float) -> bool:
        """The current step (all its users running since ``steady``) has been held long enough:
        ``hold`` seconds, or (auto) steady and known, or steady with its QPS known and ``early`` says
        that is all its probe needs."""
        if self.continuous:
            first = self.log[0].t_steady
            # never None here: the first window is the current one (steady, as the caller checked) or
            # it was held before a later one began, and nothing sets a t_steady back to None
            assert first is not None
            return now >= first + (cur.index + 1) * self.hold
        if self.auto is None:
            return now >= steady + self.hold
        end, t_cut, reason = self.auto.decide(steady, now, users=cur.users)
        v = self.auto.last  # this tick's verdict (None before min_hold)
        if not end and self.early is not None and v is not None and v.steady and v.qps_known:
            note = self.early(cur, v, now)
            if note:  # no warning: the step is complete for what the search asks of it
                logger.info("kneeswarm: step %d (%d users): %s", cur.index, cur.users, note)
                cur.t_cut, cur.hold_reason = v.t_cut, note
                return True
        if end:
            cur.t_cut, cur.hold_reason = t_cut, reason
            if reason:
                logger.warning("kneeswarm: step %d (%d users): %s", cur.index, cur.users, reason)
        return end

    def step_starts(self) -> list[tuple[float, int]]:
        return [(s.t_ramp, s.users) for s in self.log]
