"""compare.json's contract: the shape of a comparison of two runs, declared once.

kneeswarm.analysis.runs.compare writes it; the comparison's pages (reports.compare_report), its
JUnit cases (reports.junit) and the command line read it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from kneeswarm.analysis.schema.summary import Finding, UslFit

COMPARE_VERSION = 1  # compare.json's "version": raised when a key changes meaning or goes
#: settings.interval: how a change's interval was found.  Two single runs: each step's rows
#: resampled (kneeswarm.analysis.measure.bootstrap).  A repeated run on either side: Student's t over
#: the runs' step values (Welch's between two repeated runs; against a single run, that run taken to
#: move as much as the repeated one's runs do), the run-to-run noise a single run cannot measure.
INTERVAL_BOOTSTRAP, INTERVAL_BETWEEN_RUNS = "bootstrap over the rows", "between runs (Student's t)"


# -- compare.json: its shape, declared once (readers: compare_report, junit, the command line) ----
class _RunInfo(TypedDict):
    run_id: str
    path: str
    complete: bool | None


class RunInfo(_RunInfo, total=False):
    runs: int  # a repeated run (kneeswarm.analysis.runs.repeat): the runs merged into this side


class _Change(TypedDict):
    base: float | None
    new: float | None
    delta: float | None
    rel: float | None
    ci: list[float] | None  # [lo, hi] of new − base (settings.interval says how it was found)
    significant: bool
    direction: str | None  # "worse", "better", None
    min_relative_change: float


class Change(_Change, total=False):
    """One metric at one step, new − base, with its bootstrap interval."""
    # a traffic mix's class change only: the Holm-adjusted bootstrap p-value of new − base = 0 over every
    # class change of the comparison, which must be under 1 − confidence too (compare.class_step_changes)
    p_holm: float


class _Side(TypedDict):
    valid: bool
    requests: int | None
    qps: float | None
    p99_ms: float | None
    error_rate: float | None
    rows_resampled: int
    rows: int


class Side(_Side, total=False):
    runs: int  # a repeated run: the runs whose valid step gave qps and p99_ms (their mean)
    sd: dict[str, float | None]  # ... and the runs' standard deviation of each


class StepComparison(TypedDict):
    users: Any  # the base summary's users value
    base: Side
    new: Side
    qps: Change | None  # None: not valid in both runs
    p99_ms: Change | None
    verdict: str  # REGRESSED, IMPROVED, NO_CHANGE, NOT_COMPARED
    note: str | None


class ShiftSide(TypedDict, total=False):
    """One run's knee or peak: {users, qps}, a single run's ``interval`` at its own noise, a repeated
    side's knee over its runs (lo, hi, runs, found, text)."""
    users: int | float | None
    qps: float | None
    interval: list[int | float | None]
    lo: float | None
    hi: float | None
    runs: int
    found: int
    text: str


class Shift(TypedDict):
    """A knee or peak: {users, qps} of each run, and how it moved."""
    base: ShiftSide
    new: ShiftSide
    users_ratio: float | None
    qps_rel: float | None


class UslChange(TypedDict):
    """``usl``: kneeswarm.analysis.models.usl.fit_usl's figures of each run and their change."""
    base: UslFit
    new: UslFit
    change: dict[str, float | None]


class FindingsChange(TypedDict):
    """``findings``: by id, those that appeared in the new run, vanished from the base, or stayed."""
    appeared: list[Finding]
    vanished: list[Finding]
    persisted: list[str]
    rule_errors: list[str]


class CompareSettings(TypedDict, total=False):
    """``settings``: how the changes were judged."""
    resamples: int
    seed: int
    confidence: float
    max_rows_per_step: int
    min_relative_change: dict[str, float]
    interval: str  # INTERVAL_BOOTSTRAP (two runs) or INTERVAL_BETWEEN_RUNS (a repeated run on a side)
    runs: list[int]  # a repeated comparison: the runs merged on each side


class SummariesComparison(TypedDict):
    knee: Shift
    peak: Shift
    usl: UslChange
    findings: FindingsChange


class _ClassStepChange(TypedDict):
    users: int | float
    qps: list[float | None]  # [base, new]
    p99_ms: list[float | None]
    qps_rel: float | None
    p99_rel: float | None


class ClassStepChange(_ClassStepChange, total=False):
    """One class at one step valid in both runs: its point figures and their relative change, and
    (``compare.class_step_changes``) its own rows of the step's window bootstrapped as the whole's
    are: each change with its interval and significance, and the step's verdict; absent where a
    class's rows were not read."""
    qps_change: Change
    p99_change: Change
    verdict: str


class _ClassChange(TypedDict):
    name: str
    steps: list[ClassStepChange]
    latency_knee: list[int | float | None]  # [base, new]: the users where its P99 took off
    knee: list[int | float | None]  # [base, new]: its QPS knee's users
    # [base, new]: each run's interval of the users where its P99 took off / of its QPS knee, at that run's
    # noise (None: the run's summary has none, or its resamples found none in the range)
    latency_knee_interval: list[list[int | float | None] | None]
    knee_interval: list[list[int | float | None] | None]
    # whether the two runs' intervals are apart (the knee moved beyond both runs' noise); None: a summary
    # without intervals
    latency_knee_moved: bool | None
    knee_moved: bool | None


class ClassChange(_ClassChange, total=False):
    """One class present in both runs' mix (kneeswarm.analysis.runs.compare_classes)."""
    verdict: str  # regressed where any of its steps did, else improved where any did


class MixComparison(TypedDict, total=False):
    classes: list[ClassChange]  # traffic mixes on both sides: each class's changes


class Comparison(SummariesComparison, MixComparison):
    """compare.json."""
    version: int  # COMPARE_VERSION
    base: RunInfo
    new: RunInfo
    settings: CompareSettings
    steps: list[StepComparison]
    unmatched: dict[str, list[Any]]  # {base_only, new_only}: users of the steps in one run only
    verdict: str  # REGRESSED, IMPROVED, NO_CHANGE, NOT_COMPARABLE
    reasons: list[str]
    warnings: list[str]
