"""summary.json's contract: every key the analysis writes, declared once as a TypedDict.

The analysis builds these (kneeswarm.analysis.summary.build), the findings and the reports read
them, and tests/test_contracts.py fails on a key written that none declares.  The lowest floor of
the analysis: it imports nothing of it.
"""

from __future__ import annotations

import math

from typing import Any, NotRequired, TypedDict, cast

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
#: a finding's evidence: each rule's own figures by name (numbers, a host, a pid, a role, lists of
#: them); a reader tests each value's type before it uses it
Evidence = dict[str, object]
#: ``steps[].server[host]``: the server's figures over the step's window by name
#: (kneeswarm.analysis.measure.serverstats), with its /metrics figures under ``target``, its processes
#: under ``procs`` (StepProcess by pid) and how many there were under ``processes``
ServerMetrics = dict[str, object]
#: a JSON value written as it was computed (numbers, text, lists of them: a figure's inputs, a chart's points)
JsonValue = float | int | str | bool | list[Any] | None

#: kneeswarm.analysis.findings.context.process_growth: the service's process whose figure rose most
ProcessGrowth = TypedDict("ProcessGrowth", {"pid": int, "from": float, "to": float, "rise": float, "name": str,
                                            "role": str}, total=False)


class UslCurve(TypedDict):
    users: list[float]
    qps: list[float]


#: ``usl`` (kneeswarm.analysis.models.usl.fit_usl, plus ``curve`` and ``text`` from the findings)
UslFit = TypedDict("UslFit", {"sigma": float | None, "kappa": float | None, "lambda": float | None,
                              "n_star": float | None, "peak": float | None, "peak_kind": str | None,
                              "r2": float | None, "points": int, "caution": str | None, "curve": UslCurve,
                              "text": str | None}, total=False)


class Trend(TypedDict, total=False):
    """kneeswarm.analysis.models.trend.drift: the Mann-Kendall test and Theil-Sen slope of a series."""

    n: int
    s: int | None
    tau: float | None
    p: float | None
    slope: float | None
    slope_ci: list[float] | None
    change: float | None
    rel_change: float | None
    median: float | None
    drifting: bool
    direction: str | None  # "worse" or "better" when drifting
    alpha: float
    min_relative_drift: float
    reason: str | None
    unmeasured: int  # history: runs with too few requests beyond the percentile (kneeswarm.analysis.runs.history)


class RunChange(TypedDict):
    """What differs between two runs (kneeswarm.analysis.runs.history.changes)."""

    what: str  # "input length", "versions", "host facts" or "plan keys"
    key: str
    before: JsonValue
    after: JsonValue


class ChangePoint(TypedDict):
    """kneeswarm.analysis.models.trend.change_point: the single least-squares change point."""

    index: int
    before: float
    after: float
    shift: float
    explained: float
    method: str
    run: NotRequired[str]  # history: the run where the series changed and the one before it, what differs
    previous_run: NotRequired[str]
    changes: NotRequired[list[RunChange]]


class SlaStepCheck(TypedDict):
    value: float | None
    limit: float
    passed: bool


class SlaCheck(TypedDict, total=False):
    """``sla.checks[]``: one limit, read at the best step (or the lowest valid one)."""

    name: str
    limit: float
    value: float | None
    passed: bool
    users: int | float | None
    highest_users_alone: int | float | None
    bound: str  # min_qps: "lower" (every other limit is an upper bound)


class SlaStep(TypedDict, total=False):
    """``sla.steps[]``: one valid step against every limit."""

    users: int | float | None
    qps: float
    checks: dict[str, SlaStepCheck]
    meets: bool


class SlaBest(TypedDict):
    users: int | float | None
    qps: float


class SlaResult(TypedDict, total=False):
    """``sla`` (kneeswarm.analysis.models.capacity.sla_check; ``set`` from kneeswarm.analysis.summary.gates)."""

    set: bool
    passed: bool | None
    best: SlaBest | None
    limits: dict[str, float]
    checks: list[SlaCheck]
    steps: list[SlaStep]
    skipped: list[str]
    problems: list[str]
    below_best_failed: list[int | float | None]
    text: str
    classes: dict[str, SlaResult]  # a traffic mix with [sla.classes.NAME]: each class's own check


class Figure(TypedDict):
    """One figure of the capacity plan: the value, its formula in words, with the numbers, the inputs."""

    value: float | int | None
    formula: str
    computed: str
    inputs: dict[str, JsonValue]


class CapacitySettings(TypedDict):
    """``capacity.settings``: [capacity] with its defaults."""

    peak_qps: float | None
    spare: int
    queue_tolerance_ms: float
    headroom: float
    safe_fraction: float


class CapacityResult(TypedDict, total=False):
    """``capacity`` (kneeswarm.analysis.models.capacity.capacity_plan)."""

    max_stable_qps: Figure
    recommended_users: Figure
    core_threads: Figure
    max_threads: Figure
    single_inference_ms: Figure
    queue_length: Figure
    safe_qps: Figure
    instances: Figure
    replicas: Figure
    settings: CapacitySettings
    problems: list[str]
    text: list[str]


#: a series of per-window or per-step values (None where not measured)
Series = list[float | None]


class SoakSeries(TypedDict, total=False):
    """``soak.series``: the windows as time series (kneeswarm.analysis.summary.soak.series)."""

    t: Series
    t_lo: Series
    t_hi: Series
    window_s: Series
    client: dict[str, Series]
    errors: list[dict[str, int]]
    hosts: dict[str, dict[str, Series | dict[str, Series]]]  # {host: {name: [...], target: {key: [...]}}}


class SoakTrends(TypedDict, total=False):
    client: dict[str, Trend]
    hosts: dict[str, dict[str, Trend]]


class SoakSection(TypedDict, total=False):
    """``soak`` (mode = "soak", for leaks: kneeswarm.analysis.summary.soak.soak_section)."""

    users: float | None
    rate: float | None
    duration_s: float | None
    window_s: float | None
    windows: int
    series: SoakSeries
    trends: SoakTrends
    thresholds: dict[str, float]


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
    took_off_interval: list[int | float | None] | None  # a class's latency_knee: took_off_users over the resamples,
    #                                                    as ``interval`` (kneeswarm.analysis.summary.classes)


class Finding(TypedDict, total=False):
    """One of ``findings[]`` / ``findings_marginal[]`` (kneeswarm.analysis.findings; ids are a contract)."""

    id: str
    severity: str  # "critical", "warning" or "info"
    steps: list[int | float]  # the users of the steps it was seen at
    evidence: Evidence  # the numbers that say so (names are each rule's own)
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
    suspected: NotRequired[list[str]]  # marginal findings that would explain a root (findings/causes.py)


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
    generator: dict[str, dict[str, float]]  # {"cpu_pct": {worker: %}}
    server: dict[str, ServerMetrics]  # {host: metrics} (kneeswarm.analysis.measure.serverstats)
    energy_j_per_request: float  # where GPU power was recorded
    energy_j_per_token: float
    rate: float  # open loop (kneeswarm.analysis.measure.loop.step_load_keys)
    items_s: float | None  # batch > 1
    workers: dict[str, WorkerStep]  # per worker (kneeswarm.analysis.measure.workers)
    ci: dict[str, list[float]]  # 95 % intervals of qps, mean_ms, p50/p95/p99_ms over resamples of the step's window
    server_ci: dict[str, dict[str, list[float]]]  # {host: {metric: [lo, hi]}}, the same for the server's figures
    resent: int  # requests sent again after the server closed a kept-alive connection cleanly (only when > 0)
    # -- STREAMING_STEP_KEYS: a streaming or token-counting run (kneeswarm.analysis.measure.streaming)
    streaming_requests: int
    no_text_requests: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    itl_p99_ms: float | None
    itl_token_p50_ms: float | None
    itl_token_p95_ms: float | None
    itl_token_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    tpot_p99_ms: float | None
    itl_gaps: int
    itl_sampled: bool
    tokens_per_chunk: float | None
    tokens_s: float | None
    tokens_counted_share: float | None
    tokens_compared: int
    tokens_mismatch_share: float | None
    usage_out_median: float | None
    pinned_out_median: float | None
    tokenizer_out_median: float | None
    chunks_out_median: float | None
    goodput_rps: float | None
    goodput_share: float | None


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


#: plan.toml as the analysis reads it: untyped TOML (a run may be older than this version's Plan, or
#: its plan hand-edited); every reader takes a value with a default, and a bad one is said in the
#: summary's warnings or a gate's problems rather than failing the analysis
PlanTable = dict[str, Any]
#: a table of facts copied from meta.json as the host's agent reported them: untyped JSON from the
#: host (only the keys hostfacts picks), read with each value's type tested
RawFacts = dict[str, Any]


class ClockFacts(TypedDict, total=False):
    """``hosts[host].clock``: the clock offsets measured before and after the run (agents/clock.py)."""

    before: dict[str, float]  # offset, error, rtt_min, t
    after: dict[str, float]
    offset_s: float
    error_s: float
    drift_ppm: float
    applied: JsonValue
    errors: list[str]


class ServiceLimits(TypedDict, total=False):
    """``hosts[host].service``: the CPUs and memory the service may use (kneeswarm.analysis.measure.hostfacts)."""

    cpus: float
    bound: str  # "quota", "cpuset" or "host"
    quota_cpus: float
    cpuset_cpus: float
    host_cpus: float
    memory_limit_mb: float
    cgroup_version: int


class ParseCount(TypedDict, total=False):
    lines: int
    skipped: int
    error: str


class HostFacts(TypedDict, total=False):
    """``hosts[host]``: what each monitored host was and how well it was measured
    (kneeswarm.analysis.measure.hostfacts)."""

    hostname: str
    kernel: str
    machine: str
    python: str
    cpu: RawFacts  # model, sockets, physical_cores, threads_per_core, logical_cpus
    memory_total_kb: int
    memory_gib: float
    gpus: list[RawFacts]
    process: RawFacts  # pid, cmdline, by, candidates, error, scope, member_count, cgroup, note
    collectors: dict[str, RawFacts]
    clock: ClockFacts
    parse: dict[str, ParseCount]
    transport: str
    label: str
    warnings: list[str]
    scraper: RawFacts  # url, scrapes, ok, failed, last_error
    service: ServiceLimits
    migrations_counted: str
    tree: ServiceTree


#: ``target_series[host][key]``: which series a target key used {label, kind, server, source, ref,
#: series[, denominator][, step]} (kneeswarm.analysis.measure.target)
TargetSeries = dict[str, JsonValue]


class AnalysisFacts(TypedDict):
    """``analysis``: the settings the analysis used (kneeswarm.analysis.measure.inputs.Settings)."""

    settle: float
    min_requests: int
    generator_cpu_max: float


class WorkerStep(TypedDict, total=False):
    """``steps[].workers[worker]`` (kneeswarm.analysis.measure.workers)."""

    requests: int
    rps: float | None
    cpu_pct: float
    rss_mb: float
    users: float


class WorkerTotals(TypedDict):
    """``workers[worker]`` (kneeswarm.analysis.measure.workers)."""

    requests: int
    share: float | None
    cpu_pct_mean: float | None
    rss_mb_peak: float | None
    lost: dict[str, JsonValue] | None  # as meta.json's lost_workers said: t, t_last_heard, t_last_report, step, ...


class LoadFacts(TypedDict, total=False):
    """``load`` (kneeswarm.analysis.measure.loop.load_facts)."""

    loop: str  # "closed" or "open"
    arrival: str  # open loop
    source_rate: float  # open loop
    batch: int


class WorkloadFacts(TypedDict, total=False):
    """``workload`` (kneeswarm.analysis.summary.build.workload_facts): an OpenAI run's prompts."""

    inputs: str
    token_counts: str


class EndpointFacts(TypedDict):
    """``endpoint`` (kneeswarm.analysis.summary.build.endpoint_facts): how the target was reached."""

    scheme: str
    tls: str | None  # "verified", "unverified" or None (http://)
    ca_bundle: str | None
    client_cert: bool
    headers: list[str]
    base_path: str | None
    server_name: str | None


class Goodput(TypedDict):
    limits: dict[str, float]


class SearchSummary(TypedDict, total=False):
    """``search`` ([load] mode = "search": the probes and why; kneeswarm.analysis.summary.search.search_section)."""

    mode: str  # the loop: "closed" (probes in users) or "open" (probes in rate, requests/s)
    probes: list[dict[str, JsonValue]]  # in the order run: {users|rate, why, t_start, duration_s, qps, p99_ms, valid, steady}
    knee_bracket: list[int | float | None] | None  # [last scaling probe, first saturated probe or, closed by the bounds, their bound]
    sla_bracket: list[int | float | None] | None  # [most users meeting the SLA, fewest failing it]; None without [sla]
    stopped_because: str | None  # None: the run was stopped before the search ended
    load_s: float | None  # seconds of load of all probes (ramps and holds)
    grid_equivalent_s: float | None  # the doubling grid start..max with the same hold rule, at the mean probe duration
    knee_at_noise: list[int | float | None] | None  # the knee's interval over resamples of the probes
    bracket_holds: bool | None  # whether knee_bracket holds that interval (None: nothing to compare)


class PrefixFacts(TypedDict):
    """``llm_workload.prefix``: the plan's [request.prefix] and the hit rate its rows imply."""

    tokens: int
    count: int
    share: float
    rows_share: float | None
    expected_hit_pct: float | None
    per_step: dict[str, float]  # {step index: pct}


class TurnFacts(TypedDict):
    """``llm_workload.turns[]``: one turn number of the conversations."""

    turn: int
    requests: int
    tokens_in_mean: float | None
    ttft_p50_ms: float | None
    ttft_mean_ms: float | None


class TraceFacts(TypedDict):
    """``llm_workload.trace``: a Mooncake trace and the hit rate its hash ids imply over one pass."""

    path: str
    block_tokens: int
    requests: int
    expected_hit_pct: float | None


class LlmWorkload(TypedDict, total=False):
    """kneeswarm.analysis.measure.llmworkload: what the LLM workload was, from the rows (it moves the knee)."""

    prefix: PrefixFacts  # tokens, count, share, rows_share, expected_hit_pct, per_step {step index: pct}
    turns: list[TurnFacts]  # per turn number: turn, requests, tokens_in_mean, ttft_p50_ms, ttft_mean_ms
    trace: TraceFacts  # a Mooncake trace: path, block_tokens, requests, expected_hit_pct (one pass)


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
    first_latency_knee_apart: bool  # whether its took-off interval lies below every other class's (absent where the
    #                                 knees carry no interval: a soak, a summary written before they had one)
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
    analysis: AnalysisFacts
    steps: list[SummaryStep]
    knee: Knee
    latency_knee: Knee
    peak: Knee
    totals: Totals
    hosts: dict[str, HostFacts]  # kneeswarm.analysis.measure.hostfacts
    target_series: dict[str, dict[str, TargetSeries]]  # {host: {key: ...}}: kneeswarm.analysis.measure.target
    workers: dict[str, WorkerTotals]  # kneeswarm.analysis.measure.workers
    load: LoadFacts  # kneeswarm.analysis.measure.loop.load_facts
    workload: WorkloadFacts  # workload_facts
    llm_workload: LlmWorkload  # kneeswarm.analysis.measure.llmworkload: shared prefixes and turns (the hit rate to expect)
    endpoint: EndpointFacts
    itl_columns: dict[str, str]  # streaming runs: what each ITL column is (kneeswarm.analysis.measure.streaming.ITL_COLUMNS)
    tokens_knee: Knee  # runs that recorded output tokens
    goodput: Goodput  # when [sla] limits a request
    findings: list[Finding]  # the confirmed findings (kneeswarm.analysis.findings; summary.confidence)
    findings_marginal: list[Finding]  # findings at the run's noise: shown apart, never critical, never a gate
    noise: NoiseFacts
    verdict: Verdict
    findings_unchecked: list[str]  # what the server's metrics could not feed (kneeswarm.analysis.findings.llm_engine)
    usl: UslFit
    sla: SlaResult  # kneeswarm.analysis.summary.gates / capacity
    capacity: CapacityResult
    soak: SoakSection  # mode = "soak", for leaks: kneeswarm.analysis.summary.soak.soak_section (users, rate, duration_s,
    #                       window_s, windows, series {t, client, errors, hosts}, trends, thresholds)
    search: SearchSummary  # [load] mode = "search" only
    mix: MixSummary  # a traffic mix ([[request.classes]]) only: each class's figures and knees


def undeclared_keys(summary: dict[str, Any]) -> list[str]:  # any summary: one read back from disk too
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


def as_dict(x: Any) -> dict[str, Any]:
    """``x`` where it is a dict, else {}: the reader of untyped JSON (meta.json, a summary read back
    from disk or built by a caller, a plan.toml table) whose tables may be missing or malformed."""
    return x if isinstance(x, dict) else {}


def num(x: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and None are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None
