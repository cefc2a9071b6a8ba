"""The run history's contracts: one row of the index (kneeswarm-history.sqlite) and history.json.

kneeswarm.analysis.runs.history writes them, kneeswarm.analysis.reports.history_report reads them.
A row comes back from SQLite with its JSON columns decoded: it is read as this declaration says
(the index is a cache of this version's rows: one of another version is rebuilt).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from kneeswarm.analysis.schema.summary import ChangePoint, JsonValue, RunChange, Trend

__all__ = ["HistoryStep", "InputTokens", "SoakEntry", "RepeatEntry", "ClassEntry", "HistoryRow", "RunChange",
           "HistorySeries", "HistoryRun", "LeftOut", "ClassGap", "HistoryClass", "HistoryGroup", "Skipped", "IndexUpdate",
           "HistoryResult"]


class HistoryStep(TypedDict, total=False):
    """``steps[]`` of a row: a step's figures (a soak: one step, its windows' medians; a repeated run:
    the means over its runs with the interval between them in ``ci``)."""

    users: float | None
    requests: float | None
    qps: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    valid: bool
    ci: dict[str, list[float] | None]


class InputTokens(TypedDict, total=False):
    """``input_tokens``: the request rows' tokens_in ({"n": 0} when none has one)."""

    n: int
    mean: float
    p50: float
    p95: float
    min: float
    max: float


class SoakEntry(TypedDict):
    """``soak`` of a soak's row: its windows, their trends and its soak findings."""

    windows: int
    valid_windows: int
    window_s: float | None
    duration_s: float | None
    users: float | None
    rate: float | None
    trends: dict[str, Trend]  # {series: its slope, p, direction, drifting, change, median}
    findings: list[dict[str, object]]  # [{id, host}]


class RepeatEntry(TypedDict):
    """``repeat`` of a repeated run's row: its runs, its knee over them, the peak's interval."""

    runs: int
    planned: int
    members: list[str]
    knee: dict[str, JsonValue]  # lo, hi, median, mode, mode_runs, text
    peak_qps: list[float] | None
    findings: list[dict[str, JsonValue]]  # [{id, label, stable}]


class ClassEntry(TypedDict):
    """``classes[NAME]`` of a row of a run with a traffic mix: the class's own figures from the
    summary's ``mix`` (kneeswarm.analysis.summary.classes)."""

    steps: list[HistoryStep]  # its steps: users, its requests, QPS and percentiles, the whole step's verdict
    peak_users: float | None  # its valid step of the highest QPS (the whole's rule: find_peak)
    peak_qps: float | None
    knee_users: float | None  # where its own QPS stopped rising
    knee_qps: float | None
    latency_knee_users: float | None  # where its own P99 took off
    sla_users: float | None  # its own [sla.classes.NAME] boundary, where the plan set one
    share: float | None  # its share of the run's rows
    # its QPS knee's and its P99's took-off interval: a run's at its own noise (the summary's, where it has one);
    # a repeated run's the range of its runs' knees (hi None: a run found none in the range)
    knee_interval: NotRequired[list[float | None] | None]
    latency_knee_interval: NotRequired[list[float | None] | None]
    peak_qps_interval: NotRequired[list[float] | None]  # a repeated run: its peak QPS between its runs
    trends: NotRequired[dict[str, Trend]]  # a soak: its windows' trends (qps, p50_ms, p99_ms), as the whole's


class HistoryRow(TypedDict, total=False):
    """One row of the index (history.COLUMNS; the JSON columns decoded)."""

    path: str
    fingerprint: str
    status: str  # "indexed" or "skipped"
    reason: str | None
    run_id: str
    started: float | None
    plan: str | None
    target: str | None
    complete: bool
    knee_users: float | None
    knee_qps: float | None
    peak_users: float | None
    peak_qps: float | None
    sla_users: float | None
    sla_qps: float | None
    input_tokens: InputTokens
    steps: list[HistoryStep]
    versions: dict[str, str]
    hosts: dict[str, JsonValue]  # {"host.fact": value}
    plan_keys: dict[str, JsonValue]  # {"table.key": value}
    indexed_at: float
    mode: str
    soak: SoakEntry | None
    repeat: RepeatEntry | None
    knee_interval: list[float | None] | None
    classes: dict[str, ClassEntry] | None  # a run with a traffic mix (a soak's: its windows'; a repeated run's:
    #                                        merged over its runs); None without


class HistorySeries(TypedDict):
    """``groups[].series[]``: one figure over the runs, its drift test and change point."""

    figure: str
    users: float | None
    metric: str
    values: list[float | None]
    drift: Trend
    change_point: ChangePoint | None
    intervals: list[list[float] | None]


class HistoryRun(TypedDict, total=False):
    """``groups[].runs[]``."""

    run_id: str
    started: float | None
    path: str
    soak: SoakEntry | None
    repeat: RepeatEntry | None
    knee_users: float | None
    knee_interval: list[float | None] | None


class LeftOut(TypedDict):
    run: str
    reason: str


class ClassGap(TypedDict):
    """A run of the group in which a class has no figures, and why."""

    run: str
    reason: str


class HistoryClass(TypedDict):
    """``groups[].classes[]``: one request class of the group's mixes over the group's runs (one
    value per run in ``runs``, None where the class has a gap)."""

    name: str
    gaps: list[ClassGap]
    share: list[float | None]
    peak_users: list[float | None]
    knee_users: list[float | None]
    knee_qps: list[float | None]
    latency_knee_users: list[float | None]
    knee_interval: list[list[float | None] | None]  # per run, as ClassEntry's
    latency_knee_interval: list[list[float | None] | None]
    series: list[HistorySeries]  # as the whole's: each figure's values, drift test and change point
    trends: NotRequired[list[dict[str, Trend] | None]]  # a soak group: each run's trends of the class's windows


class HistoryGroup(TypedDict):
    """``groups[]``: the runs of one plan name and target (soaks apart)."""

    plan: str
    target: str
    soak: bool
    left_out: list[LeftOut]
    series: list[HistorySeries]
    runs: list[HistoryRun]
    classes: NotRequired[list[HistoryClass]]  # only where a run of the group had a traffic mix


class Skipped(TypedDict):
    path: str
    reason: str | None


class IndexUpdate(TypedDict):
    """What ``update_index`` did."""

    runs: int
    read: int
    unchanged: int
    skipped: list[Skipped]
    paths: list[str]


class HistoryResult(TypedDict, total=False):
    """history.json."""

    groups: list[HistoryGroup]
    drift_worse: list[dict[str, object]]  # {plan, target, soak, [class,] figure, and the drift test's keys}
    skipped: list[Skipped]
    window: int
    figures: list[str]
    thresholds: dict[str, float]
    index: dict[str, JsonValue]  # path, runs, read, unchanged
