"""``kneeswarm run --repeat N`` (``[load] repeat``): the same plan N times against the same server,
``cooldown`` seconds apart, each an ordinary run directory, then their merged result
(kneeswarm.analysis.runs.repeat) in ``<out>/<stamp>-<name>-repeat/``.

The series and its exit code:

* it completes only when every repetition completed; the first that did not (the load failed, no
  request succeeded, the target went away) ends the series with its code, as a later run against a
  server that just failed would mostly measure the failure;
* a Ctrl-C (or SIGTERM) during a run stops that run as a single run's does (its report written,
  marked interrupted); during the cooldown between runs it ends the series at once.  Either way the
  runs so far are kept and merged, and the exit code is 130;
* ``--fail-on-sla`` judges the merged result: the SLA is met only when every merged run met it
  (kneeswarm.analysis.runs.repeat.sla_over says why), exit 3 otherwise;
* bad input found before the first run (the target does not answer, a host is unknown) is exit 2
  with nothing left behind, as for a single run; found before a later run, it ends the series
  (exit 1) and the runs so far are merged.
"""

from __future__ import annotations

import copy
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from kneeswarm.contracts.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_SLA_FAILED, Ended
from kneeswarm.contracts.plan import Plan
from kneeswarm.contracts.rundir import REPEAT_MD, REPORT_HTML
from kneeswarm.launch.conductor import ConductorError, RunResult

logger = logging.getLogger(__name__)

COOLDOWN_POLL_S = 0.1  # how often the cooldown looks whether it was asked to stop


def cooldown(seconds: float, poll: float = COOLDOWN_POLL_S) -> bool:
    """Wait ``seconds``; False when SIGINT or SIGTERM came meanwhile (the series ends)."""
    asked: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: asked.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + seconds
        while not asked and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(poll, left))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return not asked


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(f"kneeswarm: {text}", file=sys.stderr, flush=True)


def run_series(plan: Plan, run_one: Callable[[Plan], RunResult], report_one: Callable[[RunResult], int],
               quiet: bool) -> tuple[list[Path], int, bool]:
    """The repetitions, in order: (their run directories, the first failing code or 0, interrupted)."""
    n, runs, code = plan.load.repeat, list[Path](), EXIT_OK
    for i in range(1, n + 1):
        if i > 1:
            _say(f"cooldown {plan.load.cooldown:g}s before repetition {i} of {n} (Ctrl-C ends the series)", quiet)
            if not cooldown(plan.load.cooldown):
                _say(f"interrupted during the cooldown: {len(runs)} of {n} runs kept", quiet)
                return runs, code, True
        _say(f"repetition {i} of {n}", quiet)
        try:
            result = run_one(copy.deepcopy(plan))
        except KeyboardInterrupt:
            return runs, code, True
        except ConductorError as e:
            if not runs:
                raise  # before anything ran: bad input, nothing left behind (exit 2)
            print(f"kneeswarm: error: repetition {i} of {n} did not start: {e}", file=sys.stderr, flush=True)
            return runs, EXIT_FAILED, False
        runs.append(result.run.path)
        got = report_one(result)
        if result.ended == Ended.INTERRUPTED or got == EXIT_INTERRUPTED:
            return runs, code, True
        if got != EXIT_OK:
            print(f"kneeswarm: error: repetition {i} of {n} did not complete; the series ends here",
                  file=sys.stderr, flush=True)
            return runs, got, False
    return runs, code, False


def run_repeat(plan: Plan, out: str | Path, run_one: Callable[[Plan], RunResult],
               report_one: Callable[[RunResult], int], fail_on_sla: bool, quiet: bool) -> int:
    """The series, its merged result and the exit code (see the module's text)."""
    from kneeswarm.analysis.runs.repeat import repeat_folder, write_repeat

    folder = repeat_folder(out, plan.name)  # named when the series starts, as its runs are
    runs, code, interrupted = run_series(plan, run_one, report_one, quiet)
    if not runs:
        return EXIT_INTERRUPTED if interrupted else code or EXIT_FAILED
    try:
        rep = write_repeat(folder, plan.name, runs, plan.load.repeat)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - the runs stand; the merge's failure is said and is exit 1
        print(f"kneeswarm: error: the merged result could not be written ({type(exc).__name__}: {exc}); "
              f"`kneeswarm merge {' '.join(map(str, runs))}` writes it", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED if interrupted else EXIT_FAILED
    if not quiet:
        print((folder / REPEAT_MD).read_text())
    print(f"repeat report: {folder / REPORT_HTML}")
    return series_code(rep, code, interrupted, fail_on_sla)


def series_code(rep: Any, code: int, interrupted: bool, fail_on_sla: bool) -> int:
    """130 interrupted; the failing run's code; 1 when not every planned run completed and was merged;
    3 with --fail-on-sla when any merged run missed the SLA; else 0."""
    if interrupted:
        return EXIT_INTERRUPTED
    if code != EXIT_OK:
        return code
    if not rep["complete"]:
        print(f"kneeswarm: error: {rep['merged']} of {rep['planned']} runs completed", file=sys.stderr, flush=True)
        return EXIT_FAILED
    sla = rep["sla"]
    if fail_on_sla and sla["set"] and sla["passed"] is not True:
        print(f"kneeswarm: SLA failed: {sla['text']}", file=sys.stderr, flush=True)
        return EXIT_SLA_FAILED
    return EXIT_OK
