"""repeat.json's contract: the merged result of one plan run several times, declared once.

kneeswarm.analysis.runs.repeat writes it (``kneeswarm run --repeat N``, ``kneeswarm merge``); its
pages (kneeswarm.analysis.reports.repeat_report), the comparison and the run history
(kneeswarm.analysis.runs.compare, .history) and the command line read it.

Two kinds of interval stand side by side for every step figure: **within** a run, the step's own
bootstrap interval over its request rows (how precisely that one run measured it), and **between**
the runs, Student's t interval of the mean over the runs' values (how far the same plan against the
same server moves from run to run: the noise a single run cannot see).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

REPEAT_VERSION = 1  # repeat.json's "version": raised when a key changes meaning or goes
#: the step figures merged, each a :class:`Figure`; the first three also carry each run's own
#: bootstrap interval (kneeswarm.analysis.measure.bootstrap resamples the rows for them)
FIGURES = ("qps", "p50_ms", "p95_ms", "p99_ms", "p999_ms")
WITHIN_FIGURES = ("qps", "p50_ms", "p99_ms")


class Figure(TypedDict):
    """One figure of one step over the merged runs."""
    values: list[float | None]  # per merged run, in run order; None: no valid step at these users
    within: list[list[float] | None]  # per merged run: its own bootstrap interval [lo, hi] (WITHIN_FIGURES)
    n: int  # runs with a value
    mean: float | None
    sd: float | None  # sample standard deviation over the runs (n - 1 in the denominator)
    between: list[float] | None  # [lo, hi]: Student's t interval of the mean (None with fewer than 2 values)
    spread: float | None  # (largest - smallest) / mean: how far apart the runs landed


class RepeatStep(TypedDict):
    users: float
    ran: int  # merged runs that have a step at these users
    valid: int  # ... of which it is valid
    requests: int | None  # the fewest steady requests of a valid run's step (each percentile rests on its own rows)
    qps: Figure
    p50_ms: Figure
    p95_ms: Figure
    p99_ms: Figure
    p999_ms: Figure


class RepeatRun(TypedDict):
    """One repetition: its run directory and what its own summary said."""
    index: int  # 1 = the first run of the series
    run_id: str
    run_dir: str
    complete: bool
    ended: str | None  # meta.json's ended (kneeswarm.contracts.outcome.Ended)
    merged: bool  # its figures enter the merge (a complete run with a summary)
    left_out: str | None  # why it was not merged
    knee_users: float | None
    knee_qps: float | None
    knee_method: str | None
    knee_interval: list[float | None] | None  # summary knee.interval: the knee rerun on resampled steps, hi None
    # where its resamples found no knee in the tested range often enough (absent before it existed)
    knee_stability: float | None  # summary knee.stability: share of resamples giving the reported knee
    peak_users: float | None
    peak_qps: float | None
    findings: list[str]  # ids of its confirmed findings (summary findings[])
    findings_marginal: list[str]  # ids of its marginal findings (summary findings_marginal[], when written)
    causes: list[str]  # summary verdict.causes, when written
    sla_passed: bool | None  # None: no SLA set


class RepeatSettings(TypedDict):
    confidence: float
    resamples: int
    seed: int
    max_rows_per_step: int


class KneeSpread(TypedDict):
    users: list[float | None]  # each merged run's knee
    found: int  # merged runs that found one
    runs: int  # merged runs
    median: float | None
    lo: float | None  # the smallest and largest knee over the runs
    hi: float | None
    mode: float | None  # the knee most runs found (the smaller one on a tie)
    mode_runs: int  # how many found it
    intervals: list[list[float | None] | None]  # each merged run's knee.interval, where its summary has one
    overlap: list[float | None] | None  # the users every run's interval holds ([lo, hi], hi None: lo and beyond);
    # None when they do not all meet
    text: str


class PeakSpread(TypedDict):
    users: list[float | None]  # each merged run's peak step
    qps: Figure  # each merged run's peak QPS


class FindingCount(TypedDict):
    """One finding id over the merged runs, confirmed and marginal counted apart."""
    id: str
    severity: str | None  # the most severe it had in any run
    runs: int  # merged runs
    confirmed: int  # runs where it was confirmed (summary findings[])
    marginal: int  # runs where it was only marginal (summary findings_marginal[])
    confirmed_in: list[int]  # those runs' indices
    marginal_in: list[int]
    label: str  # "3 of 3"; "1 of 3"
    stable: bool  # confirmed in every merged run
    support: list[float]  # its support (share of resamples it fired in) in the runs that give one
    explained_by: list[str]  # the ids it was explained by in any run
    text: str  # its text in the last run where it fired


class CauseCount(TypedDict):
    """A root cause of a run's verdict (summary verdict.causes), over the merged runs."""
    id: str
    runs: int  # merged runs that named it
    label: str  # "3 of 3"


class RepeatSla(TypedDict):
    set: bool
    passed: bool | None  # every merged run met it (None: no SLA, or no run merged)
    passed_runs: int
    runs: int
    text: str


class RepeatClass(TypedDict):
    """One request class of a traffic mix over the merged runs (kneeswarm.analysis.runs.repeat_classes):
    its steps as the whole's (its own figures in each run's ``mix``; no within-run interval), its
    peak, and its knees per repetition with their spread."""
    name: str
    runs: int  # merged runs whose mix has this class
    share: Figure  # its share of each run's rows
    steps: list[RepeatStep]  # p999_ms: none (a class step has no P99.9)
    peak: PeakSpread
    knee: KneeSpread  # its QPS knee per run, with each run's interval at its own noise
    latency_knee: KneeSpread  # where its P99 took off, per run, with each run's took-off interval


class Repetition(TypedDict):
    """repeat.json."""
    version: int  # REPEAT_VERSION
    name: str  # the plan's name
    planned: int  # runs asked for (load.repeat)
    complete: bool  # every planned run ran, completed and was merged
    merged: int  # runs whose figures are merged
    runs: list[RepeatRun]
    knee: KneeSpread
    peak: PeakSpread
    steps: list[RepeatStep]
    findings: list[FindingCount]  # most often confirmed first
    causes: list[CauseCount]
    sla: RepeatSla
    settings: RepeatSettings
    warnings: list[str]
    classes: NotRequired[list[RepeatClass]]  # only where a merged run had a traffic mix
