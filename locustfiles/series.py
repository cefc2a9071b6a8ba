"""The web UI's repetition: one Start runs the plan's ``[load] repeat`` tests in a row.

Locust's web UI runs one test per Start.  A plan with ``repeat = N`` (or the start form's repeat
field) makes that Start a series, as ``kneeswarm run --repeat N`` does on the command line: each
test an ordinary run directory with its own report, ``cooldown`` seconds between them, the next
one started by the master itself once the last one's report is written, then the merged result
(``kneeswarm merge``, in a process of its own: the merge resamples every run's rows, which must not
hold up the gevent loop that serves the workers' heartbeats).  The Knee tab shows which repetition
is running (:meth:`Series.view`, ``LiveRepeat``) and, at the end, the merged report's link.

The series ends early when a test does not complete (Stop pressed, the load failed) or when Stop
is pressed during the cooldown; the runs so far are merged when at least one completed.  Free of
Locust's event wiring (the plugin's).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import gevent

from kneeswarm.contracts.rundir import REPORT_HTML
from kneeswarm.locustfiles.webui import LiveRepeat

logger = logging.getLogger(__name__)

MERGE_TIMEOUT_S = 600.0  # the merge resamples each run's rows: ~1 s a run here, far less than this
COOLDOWN_POLL_S = 0.25  # how often the cooldown looks whether the series was stopped
RUNNING, COOLDOWN, MERGING, DONE, STOPPED = "running", "cooldown", "merging", "done", "stopped"


class Series:
    """One Start's repetitions: which is running, the runs so far, the merged result once written."""

    def __init__(self, of: int, cooldown: float, run_prefix: str = "/kneeswarm/runs"):
        self.of, self.cooldown = of, cooldown
        self.index = 1
        self.runs: list[Path] = []
        self.completed = 0
        self.state = RUNNING
        self.next_at: float | None = None
        self.continuing = False  # the next test's start is the series' own (not a new Start)
        self.cancelled = False
        self.report: dict[str, str] = {}  # report_url or report_error of the merged result
        self.run_prefix = run_prefix

    def view(self) -> LiveRepeat:
        out: LiveRepeat = {"index": self.index, "of": self.of, "state": self.state,
                           "runs": [p.name for p in self.runs], "text": self.text()}
        if self.state == COOLDOWN and self.next_at is not None:
            out["next_in_s"] = round(max(0.0, self.next_at - time.time()), 1)
        if "report_url" in self.report:
            out["report_url"] = self.report["report_url"]
        if "report_error" in self.report:
            out["report_error"] = self.report["report_error"]
        return out

    def text(self) -> str:
        if self.state == RUNNING:
            return f"Repetition {self.index} of {self.of}"
        if self.state == COOLDOWN:
            return f"Repetition {self.index} of {self.of} done; cooldown before repetition {self.index + 1} of {self.of}"
        if self.state == MERGING:
            return f"{len(self.runs)} of {self.of} repetitions ran; merging them"
        if self.state == DONE:
            return f"{self.completed} of {self.of} repetitions completed; merged report written"
        return f"Series stopped after {len(self.runs)} of {self.of} repetitions ({self.completed} completed)"

    def started_next(self) -> None:
        """The series' own Start of its next test."""
        self.continuing = False
        self.index += 1
        self.state, self.next_at = RUNNING, None

    def cancel(self) -> None:
        """Stop pressed: no further repetition starts."""
        self.cancelled = True

    def ran(self, run_dir: Path, completed: bool) -> bool:
        """A test of the series ended (its report written); whether another one should start."""
        self.runs.append(run_dir)
        self.completed += completed
        return completed and not self.cancelled and self.index < self.of

    def wait_cooldown(self) -> bool:
        """The cooldown before the next test (a greenlet sleeps); False when the series was stopped."""
        self.state, self.next_at = COOLDOWN, time.time() + self.cooldown
        while not self.cancelled and time.time() < self.next_at:
            gevent.sleep(min(COOLDOWN_POLL_S, max(0.0, self.next_at - time.time())))
        return not self.cancelled

    def finish(self, merge: Callable[[list[Path], int], tuple[str | None, str | None]]) -> None:
        """The series is over: merged (``merge(runs, planned)`` gives the folder's name or an error)
        when a run completed."""
        stopped = self.cancelled or self.completed < self.of
        if self.completed:
            self.state = MERGING
            folder, error = merge(self.runs, self.of)
            self.report = {"report_url": f"{self.run_prefix}/{folder}/{REPORT_HTML}"} if folder else \
                {"report_error": error or "the merge wrote nothing"}
        self.state = STOPPED if stopped else DONE


REPORT_LINE = re.compile(r"^repeat report: (?P<path>.+)$", re.M)


def merge_in_child(runs: list[Path], planned: int, timeout: float = MERGE_TIMEOUT_S) -> tuple[str | None, str | None]:
    """``kneeswarm merge RUN_DIR...`` in its own process (beside the first run); (its folder's name,
    None) or (None, one line saying why not)."""
    argv = [sys.executable, "-m", "kneeswarm.launch.cli", "merge", *map(str, runs), "--planned", str(planned), "-q"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"the merge did not run: {e}"
    m = REPORT_LINE.search(done.stdout)
    if m is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the merge failed (exit {done.returncode}): {last}"
    return Path(m.group("path")).parent.name, None


def wants_series(plan: Any, owns_meta: bool, web_ui: Any) -> bool:
    """A Start in the web UI of a plan with repeat > 1, where no conductor drives the test."""
    return owns_meta and web_ui is not None and int(plan.load.repeat) > 1
