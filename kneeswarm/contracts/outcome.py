"""How a run ended (floor 1, beside the run directory): meta.json's ``ended`` values and the exit
code of every command, each spelled once.  Standard library only: the command line imports it
before anything heavy.  docs/cli.md "Exit codes" lists the same table (tests/test_contracts.py checks).
"""

from __future__ import annotations

from enum import StrEnum


class Ended(StrEnum):
    """meta.json ``ended``: how the load ended (the strings on disk never change)."""

    RUNNING = "running"  # written at start; still there if the controller was killed
    COMPLETED = "completed"  # every step ran
    STOPPED = "stopped"  # a test without a conductor (web UI Stop, bare Locust) before its last step
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM of `kneeswarm run`
    LOAD_FAILED = "load_failed"  # the Locust master died, overran, or not every step ran


# -- exit codes of every command: the one table ---------------------------------------------
EXIT_OK = 0  # done: the load completed and the report is written
EXIT_FAILED = 1  # the load or the analysis did not complete, nothing succeeded, or a failure was recorded
EXIT_BAD_INPUT = 2  # bad input: one line on stderr, no run directory left behind
EXIT_SLA_FAILED = 3  # --fail-on-sla: the plan's [sla] was not met
EXIT_REGRESSION = 4  # compare --fail-on-regression: the new run regressed
EXIT_DRIFT = 5  # history --fail-on-drift: a figure drifted worse over the runs (kneeswarm.analysis.runs.history)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM
EXIT_CODES = {"ok": EXIT_OK, "failed": EXIT_FAILED, "bad input": EXIT_BAD_INPUT, "SLA failed": EXIT_SLA_FAILED,
              "regression": EXIT_REGRESSION, "drift": EXIT_DRIFT, "interrupted": EXIT_INTERRUPTED}

