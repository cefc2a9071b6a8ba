"""summary.json's contract: every key the analysis writes, declared once as a TypedDict.

The analysis builds these (kneeswarm.analysis.summary.build), the findings and the reports read
them, and tests/test_contracts.py fails on a key written that none declares.  The lowest floor of
the analysis: it imports nothing of it.
"""

from __future__ import annotations

import math

from typing import Any, TypedDict, cast

from kneeswarm.contracts.rundir import Meta

SUMMARY_VERSION = 1

#: a streaming run's TTFT/ITL/TPOT percentiles: "<metric>_<quantile>_ms" step keys
STREAM_QUANTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}
STREAM_METRICS = ("ttft", "itl", "itl_token", "tpot")
#: the step keys a streaming or token-counting run adds (kneeswarm.analysis.measure.streaming)
STREAMING_STEP_KEYS = ("streaming_requests", "no_text_requests",
                       *(f"{m}_{q}_ms" for m in STREAM_METRICS for q in STREAM_QUANTILES),
                       "itl_gaps", "itl_sampled", "tokens_per_chunk", "tokens_s", "tokens_counted_share",
                       "tokens_compared", "tokens_mismatch_share", "usage_out_median", "pinned_out_median",
                       "tokenizer_out_median", "chunks_out_median", "goodput_rps", "goodput_share")


# -- the contract: every key written to summary.json is declared here (or, for a part that owns its
# keys, in that part: kneeswarm.analysis.measure.streaming.STEP_KEYS); tests/test_contracts.py fails on any other --
class Knee(TypedDict, total=False):
    """``knee`` / ``latency_knee`` / ``tokens_knee`` (kneeswarm.analysis.models.knee) and ``peak``."""

    users: int | float | None
    qps: float | None  # knee, peak
    p99_ms: float | None  # latency_knee
    tokens_s: float | None  # tokens_knee
    method: str  # "saturation", "p99_rise", "kneedle" or "none"
    took_off_users: int | float | None  # latency_knee: the step where P99 took off
    kneedle_users: int | float | None  # Kneedle's own answer, kept beside the rule's
    kneedle_error: str  # only when Kneedle raised (the rule alone decided)
    interval: list[int | float | None] | None  # the resamples' knees, 5th-95th percentile (hi None: beyond the range)
    stability: float  # the share of resamples that found this knee (kneeswarm.analysis.summary.confidence)


class Finding(TypedDict, total=False):
    """One of ``findings[]`` / ``findings_marginal[]`` (kneeswarm.analysis.findings; ids are a contract)."""

    id: str
    severity: str  # "critical", "warning" or "info"
    steps: list[int | float]  # the users of the steps it was seen at
    evidence: dict[str, Any]  # the numbers that say so (names are each rule's own)
    text: str
    advice: str
    support: float  # share of the resampled steps in which it fired (kneeswarm.analysis.summary.confidence)
    at_point: bool  # marginal ones: whether it fired on the measured figures themselves
    rule_severity: str  # marginal ones: the severity the rule gave, where it was above a marginal's
    explained_by: str  # the id of the finding that causes it (kneeswarm.analysis.findings.causes)
    consequences: list[str]  # a cause's: the ids of the findings it explains


class NoiseFacts(TypedDict):
    """``noise``: how the knee and the findings were judged against the run's own noise."""

    resamples: int
    block_s: float
    confirm: float
    notice: float
    knee_quantiles: list[float]


class Verdict(TypedDict):
    """``verdict``: the root causes found (findings no other finding explains) and the sentence."""

    causes: list[str]
    text: str


class Totals(TypedDict):
    requests: int
    errors: int
    steps: int
    valid_steps: int


class SummaryStep(TypedDict, total=False):
    """One of ``steps[]`` (plus kneeswarm.analysis.measure.streaming.STEP_KEYS in a streaming or token-counting run)."""

    index: int | float | None  # STEP_KEYS: stable
    users: int | float | None
    requests: int
    qps: float | None
    rps: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    mean_ms: float | None
    error_rate: float | None
    errors: dict[str, int]
    valid: bool
    reasons: list[str]
    t_ramp: float | None  # STEP_EXTRA_KEYS
    t_steady: float | None
    t_lo: float | None
    t_hi: float | None
    window_s: float | None
    generator_cpu_max: float | None
    in_flight: float | None  # time-average requests in flight over the window (kneeswarm.analysis.measure.requestscan; Little's L)
    t_end: float | None  # t_end, or where a crashed step was cut
    t_end_recorded: bool
    generator: dict[str, Any]  # {"cpu_pct": {worker: %}}
    server: dict[str, Any]  # {host: metrics} (kneeswarm.analysis.measure.serverstats)
    energy_j_per_request: float  # where GPU power was recorded
    energy_j_per_token: float
    rate: float  # open loop (kneeswarm.analysis.measure.loop.step_load_keys)
    items_s: float | None  # batch > 1
    workers: dict[str, Any]  # per worker (kneeswarm.analysis.measure.workers)
    ci: dict[str, list[float]]  # 95 % intervals of qps, mean_ms, p50/p95/p99_ms over resamples of the step's window
    server_ci: dict[str, dict[str, list[float]]]  # {host: {metric: [lo, hi]}}, the same for the server's figures
    resent: int  # requests sent again after the server closed a kept-alive connection cleanly (only when > 0)


class StepProcess(TypedDict, total=False):
    """``steps[].server[host].procs[pid]``: one process of the monitored service over the step's
    window, its own figures (kneeswarm.analysis.measure.serverstats.tree_metrics); beside it
    ``steps[].server[host].processes``, how many processes the service had at once."""

    cpu_pct: float
    rss_mb: float
    threads: float


class TreeProcess(TypedDict, total=False):
    """``hosts[host].tree.processes[]``: one process of the monitored service over the run
    (kneeswarm.analysis.measure.hostfacts.service_tree)."""

    pid: int
    ppid: int
    name: str  # its command name (comm)
    role: str  # "listener", "worker" or "engine", where it could be told
    cmdline: str
    cpu_pct: float  # the mean of its samples (its own CPU, not its children's)
    cpu_pct_max: float
    rss_mb: float  # its largest
    threads: float  # its largest
    t_first: float  # its first and last sample (master's clock)
    t_last: float


class ServiceTree(TypedDict, total=False):
    """``hosts[host].tree``: which processes were the monitored service (the process found and its
    descendants, or its cgroup's: agents/remote/tree.py); how they were found is
    ``hosts[host].process`` {pid, by, scope, member_count, cgroup, note}."""

    scope: str  # "tree", "cgroup" or "process"
    count: int  # processes seen over the run
    at_once: int  # the most at one sample
    t_first: float
    t_last: float
    processes: list[TreeProcess]  # the busiest first, at most hostfacts.TREE_LISTED


class SearchSummary(TypedDict, total=False):
    """``search`` ([load] mode = "search": the probes and why; kneeswarm.analysis.summary.search.search_section)."""

    mode: str  # the loop: "closed" (probes in users) or "open" (probes in rate, requests/s)
    probes: list[dict[str, Any]]  # in the order run: {users|rate, why, t_start, duration_s, qps, p99_ms, valid, steady}
    knee_bracket: list[Any] | None  # [last scaling probe, first saturated probe or, closed by the bounds, their bound]
    sla_bracket: list[Any] | None  # [most users meeting the SLA, fewest failing it]; None without [sla]
    stopped_because: str | None  # None: the run was stopped before the search ended
    load_s: float | None  # seconds of load of all probes (ramps and holds)
    grid_equivalent_s: float | None  # the doubling grid start..max with the same hold rule, at the mean probe duration
    knee_at_noise: list[int | float | None] | None  # the knee's interval over resamples of the probes
    bracket_holds: bool | None  # whether knee_bracket holds that interval (None: nothing to compare)


class LlmWorkload(TypedDict, total=False):
    """kneeswarm.analysis.measure.llmworkload: what the LLM workload was, from the rows (it moves the knee)."""

    prefix: dict[str, Any]  # tokens, count, share, rows_share, expected_hit_pct, per_step {step index: pct}
    turns: list[dict[str, Any]]  # per turn number: turn, requests, tokens_in_mean, ttft_p50_ms, ttft_mean_ms
    trace: dict[str, Any]  # a Mooncake trace: path, block_tokens, requests, expected_hit_pct (one pass)


class SummaryMeta(TypedDict, total=False):
    """``meta``: the run's own facts, copied from meta.json (kneeswarm.contracts.rundir.Meta) where it has them."""

    started: float
    finished: float
    launcher: str
    load_host: str
    target: str
    versions: dict[str, str]


def summary_meta(meta: Meta) -> SummaryMeta:
    """The :class:`SummaryMeta` of a run's meta.json: its keys that meta.json has (each declared in
    Meta with the same type: tests/test_contracts.py checks it)."""
    return cast(SummaryMeta, {k: v for k, v in meta.items() if k in SummaryMeta.__optional_keys__})


class ClassStep(TypedDict, total=False):
    """One step of one class of a traffic mix (kneeswarm.analysis.measure.classes)."""

    index: int
    users: int | float
    valid: bool  # the whole step's verdict (its window, its generator, its losses)
    requests: int  # rows of the class started in the step's steady window
    ok: int
    qps: float | None  # answered requests/s
    share_sent: float | None  # the class's share of the step's requests
    share_answered: float | None  # its share of the step's answered requests
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    error_rate: float | None
    errors: dict[str, int]
    ttft_p99_ms: float | None  # streamed answers only
    itl_p99_ms: float | None
    tpot_p99_ms: float | None
    tokens_s: float | None  # output tokens/s of its answered requests, where counted
    goodput_rps: float | None  # answered within the plan's [sla] p99_ms / ttft_ms (set limits only)
    server_rps: float | None  # the server's own count of its model's requests per second (Triton's, TorchServe's,
    #                           vLLM's per-model counters scraped from metrics_url), beside its QPS


class ClassFigures(TypedDict, total=False):
    """One class of ``mix.classes``: its weight's share, its steps and its own knees."""

    name: str
    weight_share: float | None  # its weight over the sum of weights (None: not in the plan)
    requests: int  # its rows, all steps
    share: float  # its share of all rows
    steps: list[ClassStep]
    knee: Knee  # where its own QPS stopped rising (find_knee on its series)
    latency_knee: Knee  # where its own P99 took off (find_latency_knee on its series)


class MixSummary(TypedDict, total=False):
    """``mix``: a run with [[request.classes]] (kneeswarm.analysis.measure.classes)."""

    classes: list[ClassFigures]
    first_latency_knee: str | None  # the class whose P99 took off first (None: none took off, or a tie)
    text: str


class Summary(TypedDict, total=False):
    """report/summary.json (SUMMARY_VERSION); stable keys: run_id, complete, steps[], knee, peak,
    findings ids, usl, sla, capacity."""

    summary_version: int
    run_id: str
    complete: bool
    warnings: list[str]
    lost: dict[str, int]
    ended: str | None  # kneeswarm.contracts.outcome.Ended, or None when meta.json does not say
    meta: SummaryMeta
    analysis: dict[str, Any]  # settle, min_requests, generator_cpu_max
    steps: list[SummaryStep]
    knee: Knee
    latency_knee: Knee
    peak: Knee
    totals: Totals
    hosts: dict[str, dict[str, Any]]  # kneeswarm.analysis.measure.hostfacts
    target_series: dict[str, Any]  # kneeswarm.analysis.measure.target
    workers: dict[str, Any]  # kneeswarm.analysis.measure.workers
    load: dict[str, Any]  # kneeswarm.analysis.measure.loop.load_facts
    workload: dict[str, Any]  # workload_facts
    llm_workload: LlmWorkload  # kneeswarm.analysis.measure.llmworkload: shared prefixes and turns (the hit rate to expect)
    endpoint: dict[str, Any]  # endpoint_facts: scheme, tls (verified|unverified|None), headers named, base_path
    itl_columns: dict[str, str]  # streaming runs: what each ITL column is (kneeswarm.analysis.measure.streaming.ITL_COLUMNS)
    tokens_knee: Knee  # runs that recorded output tokens
    goodput: dict[str, Any]  # {"limits": {...}} when [sla] limits a request
    findings: list[Finding]  # the confirmed findings (kneeswarm.analysis.findings; summary.confidence)
    findings_marginal: list[Finding]  # findings at the run's noise: shown apart, never critical, never a gate
    noise: NoiseFacts
    verdict: Verdict
    findings_unchecked: list[str]  # what the server's metrics could not feed (kneeswarm.analysis.findings.llm_engine)
    usl: dict[str, Any]  # kneeswarm.analysis.models.usl.fit_usl + curve, text
    sla: dict[str, Any]  # kneeswarm.analysis.summary.gates / capacity
    capacity: dict[str, Any]
    soak: dict[str, Any]  # mode = "soak", for leaks: kneeswarm.analysis.summary.soak.soak_section (users, rate, duration_s,
    #                       window_s, windows, series {t, client, errors, hosts}, trends, thresholds)
    search: SearchSummary  # [load] mode = "search" only
    mix: MixSummary  # a traffic mix ([[request.classes]]) only: each class's figures and knees


def undeclared_keys(summary: dict[str, Any]) -> list[str]:
    """The keys of a summary (top level, steps[], the knees, totals, meta) that no contract declares."""
    out = [k for k in summary if k not in Summary.__optional_keys__]
    step_keys = SummaryStep.__optional_keys__ | set(STREAMING_STEP_KEYS)
    for i, step in enumerate(summary.get("steps") or []):
        out += [f"steps[{i}].{k}" for k in step if k not in step_keys]
    for name in ("knee", "latency_knee", "peak", "tokens_knee"):
        out += [f"{name}.{k}" for k in summary.get(name) or {} if k not in Knee.__optional_keys__]
    out += [f"totals.{k}" for k in summary.get("totals") or {} if k not in Totals.__required_keys__]
    out += [f"meta.{k}" for k in summary.get("meta") or {} if k not in SummaryMeta.__optional_keys__]
    for host, facts in (summary.get("hosts") or {}).items():
        tree = (facts or {}).get("tree") or {}
        out += [f"hosts.{host}.tree.{k}" for k in tree if k not in ServiceTree.__optional_keys__]
        out += [f"hosts.{host}.tree.processes[].{k}" for m in tree.get("processes") or [] for k in m
                if k not in TreeProcess.__optional_keys__]
    for i, step in enumerate(summary.get("steps") or []):
        for host, m in (step.get("server") or {}).items():
            out += [f"steps[{i}].server.{host}.procs.{pid}.{k}" for pid, figs in ((m or {}).get("procs") or {}).items()
                    for k in figs if k not in StepProcess.__optional_keys__]
    return out


STEP_KEYS = ("index", "users", "requests", "qps", "rps", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms",
             "error_rate", "errors", "valid", "reasons")


STEP_EXTRA_KEYS = ("t_ramp", "t_steady", "t_lo", "t_hi", "window_s", "generator_cpu_max", "in_flight")


def num(x: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and None are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None
