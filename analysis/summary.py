"""The summary: one dict that becomes report/summary.json and report/summary.md.

Where the summary lives in a run directory: the README's "What a run directory holds" section.
Stable keys: run_id, complete, steps[] (index, users, requests, qps, p50_ms, p95_ms, p99_ms,
p999_ms, mean_ms, error_rate, errors, valid, reasons[]), knee {users, qps, method}, peak {users,
qps}; ``warnings`` [one line each] and ``lost`` {what: count} (analysis.problems: meta.json's,
each host's, and analysis's own; ``complete`` is false when anything was lost).  Also written:
latency_knee, totals, ended, analysis settings, per-step window/rps/generator/server facts
(``server[host]``: vmstat, process incl. ``sy_share`` and ``wait_pct`` (its threads' run delay,
issue 16), threads, GPU means and ``fb_peak_mb`` (the window's largest sample), and ``target``
{key: value} from the server's /metrics), ``hosts`` {host: facts} (analysis.hostfacts),
``target_series`` {host: {key: series used}} (analysis.target).  Issue 7: ``findings`` [{id,
severity, steps, evidence, text, advice}] and ``usl`` {sigma, kappa, lambda, n_star, peak,
peak_kind, r2, points, caution, curve {users, qps}, text} (analysis.findings.explain over the
valid steps), ``findings_unchecked`` [one line per LLM-engine rule the server's metrics could not feed,
issue 19]; per step ``energy_j_per_request`` (and ``energy_j_per_token`` when output tokens were
recorded) where GPU power was recorded, and Little's-law /
clock-offset reasons (analysis.trust).  Issue 6: ``load`` {loop, batch, arrival, source_rate}
and per step ``rate`` (open loop) and ``items_s`` (batch > 1) (analysis.loop); per step
``tokens_s`` where output tokens were recorded, ``goodput_rps``/``goodput_share`` when ``[sla]``
limits a request (``goodput`` {limits}), and in a streaming run the TTFT/ITL/TPOT percentiles and
token-count keys of analysis.streaming.STEP_KEYS; ``tokens_knee`` {users, tokens_s, method} in an
LLM run.  Issue 15: ``itl_columns`` {itl, itl_token} in a streaming run says what each ITL column is
(per chunk, per token: analysis.streaming.ITL_COLUMNS).  NaN and infinities are written as null.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, TypedDict, cast

import numpy as np
import pandas as pd

from analysis.hostfacts import host_lines, skipped_lines
from analysis.loop import loop_line, step_load_keys
from analysis.problems import Problems, collect
from analysis.sections import findings_section, plan_lines, usl_lines, verdict
from analysis.serverstats import energy_per_request
from analysis.search import search_lines
from analysis.soak import held_line, trend_rows, window_rows
from analysis.streaming import STEP_KEYS as STREAMING_STEP_KEYS
from analysis.streaming import step_keys as streaming_keys, streaming_lines, streaming_table, tokens_knee_line
from analysis.target import TARGET_METRICS, target_source_note
from analysis.workers import worker_tables
from kneeswarm.outcome import Ended
from kneeswarm.rundir import Meta

logger = logging.getLogger(__name__)

SUMMARY_VERSION = 1


# -- the contract: every key written to summary.json is declared here (or, for a part that owns its
# keys, in that part: analysis.streaming.STEP_KEYS); tests/test_contracts.py fails on any other --
class Knee(TypedDict, total=False):
    """``knee`` / ``latency_knee`` / ``tokens_knee`` (analysis.knee) and ``peak``."""

    users: int | float | None
    qps: float | None  # knee, peak
    p99_ms: float | None  # latency_knee
    tokens_s: float | None  # tokens_knee
    method: str  # "saturation", "p99_rise", "kneedle" or "none"
    took_off_users: int | float | None  # latency_knee: the step where P99 took off
    kneedle_users: int | float | None  # Kneedle's own answer, kept beside the rule's
    kneedle_error: str  # only when Kneedle raised (the rule alone decided)


class Totals(TypedDict):
    requests: int
    errors: int
    steps: int
    valid_steps: int


class SummaryStep(TypedDict, total=False):
    """One of ``steps[]`` (plus analysis.streaming.STEP_KEYS in a streaming or token-counting run)."""

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
    in_flight: float | None  # time-average requests in flight over the window (analysis.requestscan; Little's L)
    t_end: float | None  # t_end, or where a crashed step was cut
    t_end_recorded: bool
    generator: dict[str, Any]  # {"cpu_pct": {worker: %}}
    server: dict[str, Any]  # {host: metrics} (analysis.serverstats)
    energy_j_per_request: float  # where GPU power was recorded
    energy_j_per_token: float
    rate: float  # open loop (analysis.loop.step_load_keys)
    items_s: float | None  # batch > 1
    workers: dict[str, Any]  # per worker (analysis.workers)
    resent: int  # requests sent again after the server closed a kept-alive connection cleanly (only when > 0)


class SearchSummary(TypedDict, total=False):
    """``search`` ([load] mode = "search", issue 18; analysis.search.search_section)."""

    mode: str  # the loop: "closed" (probes in users) or "open" (probes in rate, requests/s)
    probes: list[dict[str, Any]]  # in the order run: {users|rate, why, t_start, duration_s, qps, p99_ms, valid, steady}
    knee_bracket: list[Any] | None  # [last scaling probe, first saturated probe or, closed by the bounds, their bound]
    sla_bracket: list[Any] | None  # [most users meeting the SLA, fewest failing it]; None without [sla]
    stopped_because: str | None  # None: the run was stopped before the search ended
    load_s: float | None  # seconds of load of all probes (ramps and holds)
    grid_equivalent_s: float | None  # the doubling grid start..max with the same hold rule, at the mean probe duration


class LlmWorkload(TypedDict, total=False):
    """analysis.llmworkload: what the LLM workload was, from the rows (issue 19)."""

    prefix: dict[str, Any]  # tokens, count, share, rows_share, expected_hit_pct, per_step {step index: pct}
    turns: list[dict[str, Any]]  # per turn number: turn, requests, tokens_in_mean, ttft_p50_ms, ttft_mean_ms
    trace: dict[str, Any]  # a Mooncake trace: path, block_tokens, requests, expected_hit_pct (one pass)


class SummaryMeta(TypedDict, total=False):
    """``meta``: the run's own facts, copied from meta.json (kneeswarm.rundir.Meta) where it has them."""

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


class Summary(TypedDict, total=False):
    """report/summary.json (SUMMARY_VERSION); stable keys: run_id, complete, steps[], knee, peak,
    findings ids, usl, sla, capacity."""

    summary_version: int
    run_id: str
    complete: bool
    warnings: list[str]
    lost: dict[str, int]
    ended: str | None  # kneeswarm.outcome.Ended, or None when meta.json does not say
    meta: SummaryMeta
    analysis: dict[str, Any]  # settle, min_requests, generator_cpu_max
    steps: list[SummaryStep]
    knee: Knee
    latency_knee: Knee
    peak: Knee
    totals: Totals
    hosts: dict[str, dict[str, Any]]  # analysis.hostfacts
    target_series: dict[str, Any]  # analysis.target
    workers: dict[str, Any]  # analysis.workers
    load: dict[str, Any]  # analysis.loop.load_facts
    workload: dict[str, Any]  # workload_facts
    llm_workload: LlmWorkload  # analysis.llmworkload: shared prefixes and conversation turns (issue 19)
    endpoint: dict[str, Any]  # endpoint_facts: scheme, tls (verified|unverified|None), headers named, base_path
    itl_columns: dict[str, str]  # streaming runs: what each ITL column is (analysis.streaming.ITL_COLUMNS)
    tokens_knee: Knee  # runs that recorded output tokens
    goodput: dict[str, Any]  # {"limits": {...}} when [sla] limits a request
    findings: list[dict[str, Any]]  # analysis.findings: {id, severity, steps, evidence, text, advice}
    findings_unchecked: list[str]  # what the server's metrics could not feed (analysis.findings.llm_engine)
    usl: dict[str, Any]  # analysis.usl.fit_usl + curve, text
    sla: dict[str, Any]  # analysis.gates / capacity
    capacity: dict[str, Any]
    soak: dict[str, Any]  # issue 20, mode = "soak": analysis.soak.soak_section (users, rate, duration_s,
    #                       window_s, windows, series {t, client, errors, hosts}, trends, thresholds)
    search: SearchSummary  # [load] mode = "search" only


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
    return out


STEP_KEYS = ("index", "users", "requests", "qps", "rps", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms",
             "error_rate", "errors", "valid", "reasons")
STEP_EXTRA_KEYS = ("t_ramp", "t_steady", "t_lo", "t_hi", "window_s", "generator_cpu_max", "in_flight")
# Markdown/HTML server columns: (header, summary key, format); "target.x" is server[host]["target"]["x"]
SERVER_COLUMNS = (
    ("CPU us%", "us", "{:.0f}"),
    ("CPU sy%", "sy", "{:.0f}"),
    ("cs/s", "cs", "{:,.0f}"),
    ("run queue", "r", "{:.1f}"),
    ("proc CPU%", "cpu_pct", "{:.0f}"),
    ("proc sy share", "sy_share", "{:.0%}"),
    ("threads", "threads", "{:.0f}"),
    ("active threads", "active_threads", "{:.1f}"),
    ("top thread %", "top_thread_cpu_pct", "{:.0f}"),
    ("migrations/s", "migrations_s", "{:,.1f}"),
    ("proc read kB/s", "io_read_kb_s", "{:,.0f}"),  # the service's own disk IO (pidstat -d or /proc/PID/io)
    ("proc write kB/s", "io_write_kb_s", "{:,.0f}"),  # (not io_delay_pct: it reads 0 where delay accounting is off)
    ("RSS MB", "rss_mb", "{:,.0f}"),
    ("open fds", "fds", "{:,.0f}"),
    ("cgroup CPUs", "cgroup_cpus", "{:.2f}"),
    ("throttled", "throttled_share", "{:.0%}"),
    ("GPU SM%", "sm_pct", "{:.0f}"),
    ("GPU mem%", "mem_pct", "{:.0f}"),
    ("GPU FB MB", "fb_used_mb", "{:,.0f}"),
    ("GPU W", "power_w", "{:,.0f}"),
    *((m.label, f"target.{m.key}", "{:,.1f}") for m in TARGET_METRICS),
)


def n_users(n: Any) -> str:
    """"1 user", "4 users"."""
    return f"{n} user" if n == 1 else f"{n} users"


def jsonable(x: Any) -> Any:
    """Plain JSON types; NaN/inf -> None; numpy scalars -> Python; tuples -> lists."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray, pd.Series)):
        return [jsonable(v) for v in list(x)]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if not math.isfinite(f):
            return None
        return f
    if x is None or isinstance(x, str):
        return x
    if x is pd.NA or x is pd.NaT:
        return None
    return str(x)


def _users(v: Any) -> int | float | None:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    f = float(v)
    return int(f) if f.is_integer() else f


def step_records(stats: pd.DataFrame, server: list[dict[str, Any]] | None = None,
                 gen_cpu: list[dict[str, float]] | None = None, load: dict[str, Any] | None = None,
                 streaming: bool = False) -> list[dict[str, Any]]:
    """One summary step per stats row; ``load``: analysis.loop.load_facts (rate, items/s);
    ``streaming``: the run streamed (analysis.streaming keys on every step)."""
    records = []
    for i, row in enumerate(stats.to_dict("records")):
        rec = {k: row.get(k) for k in STEP_KEYS}
        rec["index"] = _users(rec["index"])
        rec["users"] = _users(rec["users"])
        rec["requests"] = int(rec["requests"] or 0)
        rec["errors"] = dict(rec["errors"] or {})
        rec["reasons"] = list(rec["reasons"] or [])
        rec["valid"] = bool(rec["valid"])
        rec.update({k: row.get(k) for k in STEP_EXTRA_KEYS})
        rec["t_end"] = row.get("t_end_used", row.get("t_end"))  # t_end, or where a crashed step was cut
        rec["t_end_recorded"] = row.get("t_end") is not None and math.isfinite(float(row.get("t_end")))
        rec["generator"] = {"cpu_pct": dict(gen_cpu[i])} if gen_cpu and gen_cpu[i] else {}
        rec["server"] = server[i] if server else {}
        for key, count in (("energy_j_per_request", row.get("ok")), ("energy_j_per_token", row.get("tokens_out"))):
            energy = energy_per_request(rec["server"], count, row.get("window_s"))  # J per request (or token)
            if energy is not None:
                rec[key] = energy
        rec.update(step_load_keys(rec["users"], rec.get("qps"), load or {}))
        rec.update(streaming_keys(row, streaming))
        if row.get("resent"):
            rec["resent"] = int(row["resent"])
        records.append(rec)
    return records


def build_summary(*, run_id: str, meta: Meta, settings: dict[str, Any], steps: list[dict[str, Any]],
                  knee: dict[str, Any], latency_knee: dict[str, Any], peak: dict[str, Any],
                  totals: dict[str, Any], hosts: dict[str, dict[str, Any]], workers: dict[str, Any],
                  target_series: dict[str, Any] | None = None, problems: Problems | None = None,
                  **extra: Any) -> dict[str, Any]:
    """The summary dict (JSON-ready).  ``problems`` (analysis.problems.collect) gives ``complete``,
    ``warnings`` and ``lost``; ``extra`` keyword arguments become further top-level keys."""
    problems = problems or collect(meta)
    summary = {
        "summary_version": SUMMARY_VERSION,
        "run_id": run_id,
        "complete": problems.complete,
        "warnings": problems.warnings,
        "lost": problems.lost,
        "ended": meta.get("ended"),
        "meta": summary_meta(meta),
        "analysis": settings,
        "steps": steps,
        "knee": knee,
        "latency_knee": latency_knee,
        "peak": peak,
        "totals": totals,
        "hosts": hosts,
        "target_series": target_series or {},
        "workers": workers,
        **extra,
    }
    return jsonable(summary)


def to_json(summary: dict[str, Any]) -> str:
    """Strict JSON (raises rather than write NaN)."""
    return json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n"


# -- Markdown -------------------------------------------------------------------------------
def _f(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return fmt.format(v)


def status_line(summary: dict[str, Any]) -> str:
    if summary.get("complete"):
        return "complete"
    ended = summary.get("ended")
    if ended == Ended.COMPLETED:
        return "INCOMPLETE (the load completed, but see the warnings)"
    return f"INCOMPLETE (ended: {ended})" if ended else "INCOMPLETE (no record of how it ended)"


def warning_lines(summary: dict[str, Any]) -> list[str]:
    """The run's warnings (analysis.problems), shown before anything else."""
    return [str(w) for w in summary.get("warnings") or []]


def knee_lines(summary: dict[str, Any]) -> list[str]:
    if summary.get("soak"):  # one load held: what it held, not a knee (analysis.soak)
        load = [loop_line(summary["load"])] if isinstance(summary.get("load"), dict) else []
        return [held_line(summary), *load]
    knee, lk, peak = summary.get("knee") or {}, summary.get("latency_knee") or {}, summary.get("peak") or {}
    lines = []
    if knee.get("users") is not None:
        lines.append(f"**Knee:** {n_users(knee['users'])} at {_f(knee.get('qps'))} QPS (method: {knee.get('method')})")
    else:
        lines.append("**Knee:** none found: QPS still rose over the tested range (or too few valid steps)")
    if peak.get("users") is not None:
        lines.append(f"**Peak:** {_f(peak.get('qps'))} QPS at {n_users(peak['users'])}")
    if lk.get("users") is not None:
        took = f"; took off at {n_users(lk['took_off_users'])}" if lk.get("took_off_users") is not None else ""
        lines.append(f"**P99 knee:** {n_users(lk['users'])} at P99 {_f(lk.get('p99_ms'))} ms{took} (method: {lk.get('method')})")
    else:
        lines.append("**P99 knee:** none found")
    if (tokens := tokens_knee_line(summary)) is not None:
        lines.append(tokens)
    if isinstance(summary.get("load"), dict):
        lines.append(loop_line(summary["load"]))
    return lines


def workload_facts(plan: dict[str, Any]) -> dict[str, Any]:
    """``workload`` {inputs, token_counts} of an OpenAI run's plan: where prompts came from and how
    their tokens were counted (a tokenizer file, or the word approximation); {} for other protocols."""
    request = got if isinstance(got := plan.get("request"), dict) else {}
    if plan.get("protocol") != "openai":
        return {}
    inputs = next((f"{k} {request[k]}" for k in ("replay", "dataset") if request.get(k)), None)
    inputs = inputs or ("lengths" if request.get("lengths") else "synthetic prompts")
    tok = request.get("tokenizer")
    return {"inputs": inputs, "token_counts": f"tokenizer {tok}" if tok else "words (approximation)"}


def endpoint_facts(plan: dict[str, Any]) -> dict[str, Any]:
    """``endpoint``: how the target was reached (the plan's [endpoint]).  ``tls`` is "verified"
    (the server's certificate checked, against ``ca_bundle`` or the system's CAs), "unverified"
    (``verify = false``: nothing checked) or None (http://); ``headers`` names the headers sent
    (never their values)."""
    e = got if isinstance(got := plan.get("endpoint"), dict) else {}
    https = str(plan.get("target", "")).startswith("https://")
    return {"scheme": "https" if https else "http",
            "tls": ("verified" if e.get("verify", True) else "unverified") if https else None,
            "ca_bundle": e.get("ca_bundle"), "client_cert": bool(e.get("client_cert")),
            "headers": sorted([*(e.get("headers") or {}), *(e.get("headers_env") or {})]),
            "base_path": e.get("base_path"), "server_name": e.get("server_name")}


def endpoint_lines(summary: dict[str, Any]) -> list[str]:
    """One line on how the target was reached, when it was over TLS or with [endpoint] settings."""
    e = summary.get("endpoint") or {}
    if not e or (e.get("tls") is None and not e.get("headers") and not e.get("base_path")):
        return []
    parts = []
    if e.get("tls") == "unverified":
        parts.append("**unverified TLS** (endpoint.verify = false: the server's certificate was not checked)")
    elif e.get("tls") == "verified":
        parts.append(f"TLS verified against {e['ca_bundle'] or 'the system CAs'}")
    if e.get("client_cert"):
        parts.append("client certificate presented")
    if e.get("headers"):
        parts.append("headers " + ", ".join(e["headers"]))
    if e.get("base_path"):
        parts.append(f"base path {e['base_path']}")
    if e.get("server_name"):
        parts.append(f"server name {e['server_name']}")
    return ["**Endpoint:** " + "; ".join(parts)]


def workload_lines(summary: dict[str, Any]) -> list[str]:
    w = summary.get("workload") or {}
    inputs = [f"**Inputs:** {w['inputs']}; token counts: {w['token_counts']}"] if w.get("token_counts") else []
    return inputs + llm_workload_lines(summary) + endpoint_lines(summary)


def llm_workload_lines(summary: dict[str, Any]) -> list[str]:
    """Shared prefixes (the hit rate to expect) and per-turn context and TTFT (analysis.llmworkload)."""
    w = got if isinstance(got := summary.get("llm_workload"), dict) else {}
    out = []
    p = w.get("prefix") if isinstance(w.get("prefix"), dict) else None
    if p:
        out.append(f"**Shared prefixes:** {p.get('count')} of {p.get('tokens')} tokens in "
                   f"{_f(100 * (p.get('rows_share') or 0), '{:.0f}')} % of requests: a prefix cache can serve "
                   f"{_f(p.get('expected_hit_pct'))} % of prompt tokens (the server's hit rate is in the target table)")
    t = w.get("trace") if isinstance(w.get("trace"), dict) else None
    if t:
        out.append(f"**Trace:** {t.get('requests')} requests; its hash ids imply a prefix-cache hit rate of "
                   f"{_f(t.get('expected_hit_pct'))} % over one pass ({t.get('block_tokens')}-token blocks)")
    turns = [t for t in w.get("turns") or [] if isinstance(t, dict)]
    if turns:
        out.append("**Conversation turns:** " + "; ".join(
            f"turn {t.get('turn')}: {_f(t.get('tokens_in_mean'), '{:.0f}')} tokens in, TTFT P50 "
            f"{_f(t.get('ttft_p50_ms'), '{:.0f}')} ms ({t.get('requests')} requests)" for t in turns))
    return out


def malformed_lines(summary: dict[str, Any]) -> list[str]:
    """One bold line per host collector that skipped malformed lines (shown at the top)."""
    hosts = got if isinstance(got := summary.get("hosts"), dict) else {}
    return [f"**Malformed lines skipped:** {host} {coll}: {n:,} of {total:,} lines"
            for host, coll, n, total in skipped_lines(hosts)]


def resent_lines(summary: dict[str, Any]) -> list[str]:
    """One line when requests were sent again (steps[].resent): how many, in which steps, and why."""
    steps = [(s.get("users"), int(s["resent"])) for s in summary.get("steps") or [] if s.get("resent")]
    if not steps:
        return []
    n, per = sum(k for _, k in steps), ", ".join(f"{k:,} at {u} users" for u, k in steps)
    return [f"**Resent:** {n:,} requests in the steady windows ({per}) were sent a second time: the server had "
            "closed their kept-alive connection cleanly before answering (each row is the second attempt)"]


def server_value(metrics: dict[str, Any], key: str) -> Any:
    """metrics[key], or metrics["target"][x] for key "target.x"."""
    if key.startswith("target."):
        return (metrics.get("target") or {}).get(key[len("target."):])
    return metrics.get(key)


def server_columns(summary: dict[str, Any], prefix_hosts: bool | None = None) -> list[tuple[str, str, str, str]]:
    """(host, header, key, fmt) for each server metric present in at least one step.

    Headers name their host when there are several hosts (or when ``prefix_hosts`` says so).
    """
    present: dict[str, set[str]] = {}
    for s in summary.get("steps", []):
        for host, metrics in (s.get("server") or {}).items():
            present.setdefault(host, set()).update(k for k in metrics if k != "target")
            present[host].update(f"target.{k}" for k in (metrics.get("target") or {}))
    many = len(present) > 1 if prefix_hosts is None else prefix_hosts
    return [(h, f"{h} {head}" if many else head, key, fmt)
            for h in sorted(present) for head, key, fmt in SERVER_COLUMNS if key in present[h]]


VALID_HEADER = "valid"  # the column saying "yes" or "no: <reasons>"
LOAD_HEADER = ["users", "requests", "QPS", "P50 ms", "P95 ms", "P99 ms", "P999 ms", "errors %", VALID_HEADER]
# (header, step key, format) shown before VALID_HEADER when a step has them: the offered rate (open
# loop), items/s (batch > 1), output tokens/s (LLM runs), energy (GPU power recorded)
OPTIONAL_COLUMNS = (("rate req/s", "rate", "{:,.4g}"), ("items/s", "items_s", "{:,.1f}"),
                  ("tokens/s", "tokens_s", "{:,.1f}"), ("J/request", "energy_j_per_request", "{:,.3g}"),
                  ("J/token", "energy_j_per_token", "{:,.3g}"))


def load_header(summary: dict[str, Any]) -> list[str]:
    """LOAD_HEADER, with the optional columns that any step has (before VALID_HEADER)."""
    extra = [h for h, key, _ in OPTIONAL_COLUMNS if any(s.get(key) is not None for s in summary.get("steps", []))]
    return [*LOAD_HEADER[:-1], *extra, VALID_HEADER]


def _load_cells(s: dict[str, Any], header: list[str]) -> list[str]:
    er = s.get("error_rate")
    valid = "yes" if s.get("valid") else "no: " + "; ".join(s.get("reasons") or [])
    cells = [f"{s.get('requests', 0):,}", _f(s.get("qps")), _f(s.get("p50_ms")), _f(s.get("p95_ms")),
             _f(s.get("p99_ms")), _f(s.get("p999_ms")), _f(None if er is None else 100 * er, "{:.2f}")]
    cells += [_f(s.get(key), fmt) for h, key, fmt in OPTIONAL_COLUMNS if h in header]
    return [*cells, valid]


def table_rows(summary: dict[str, Any], srv: list[tuple[str, str, str, str]] | None = None,
               load: bool = True) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the steps table (shared by Markdown and HTML): the load columns
    (unless ``load`` is false: then users only) and the server columns ``srv`` (default: all)."""
    srv = server_columns(summary) if srv is None else srv
    lh = load_header(summary)
    header = [*(lh if load else lh[:1]), *[h for _, h, _, _ in srv]]
    rows = []
    for s in summary.get("steps", []):
        row = [str(s.get("users"))]
        if load:
            row += _load_cells(s, lh)
        for host, _, key, fmt in srv:
            row.append(_f(server_value((s.get("server") or {}).get(host, {}), key), fmt))
        rows.append(row)
    return header, rows


def table_groups(summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, str, str]] | None]]:
    """The step table split for reading (issue 7 §6): (title, server columns) of the load table
    (None: the load columns), one table per host of what the server was doing, and one per host
    of the target's own /metrics."""
    srv = server_columns(summary, prefix_hosts=False)
    groups: list[tuple[str, list[tuple[str, str, str, str]] | None]] = [("Load", None)]
    hosts = list(dict.fromkeys(h for h, _, _, _ in srv))
    for host in hosts:
        cols = [c for c in srv if c[0] == host and not c[2].startswith("target.")]
        if cols:
            groups.append((f"Server `{host}`", cols))
    for host in hosts:
        cols = [c for c in srv if c[0] == host and c[2].startswith("target.")]
        if cols:
            groups.append((f"Target metrics (`{host}`)", cols))
    return groups


def _md_escape(text: str) -> str:
    """A plain line that Markdown shows as it is (no emphasis, code or HTML from its characters)."""
    return "".join("\\" + c if c in "\\`*<>|[]" else c for c in text)


def _md_table(header: list[str], rows: list[list[str]], numeric: int) -> list[str]:
    esc = lambda c: c.replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if i < numeric else "---" for i in range(len(header))) + "|",
            *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)]


def _md_explained(summary: dict[str, Any]) -> list[str]:
    """Findings, the scalability model, and the SLA/capacity plan when present."""
    lines = ["### Findings", ""]
    for f in findings_section(summary):
        lines.append(f"- {f[0]}")
        lines += [f"  - {x}" for x in f[1:]]
    usl = usl_lines(summary)
    if usl:
        lines += ["", "### Scalability model (USL)", "", *(f"- {x}" for x in usl)]
    for title, plan in plan_lines(summary):
        lines += ["", f"### {title}", "", *(f"- {x}" for x in plan)]
    return [*lines, ""]


def _md_soak(summary: dict[str, Any]) -> list[str]:
    """A soak's trend table and windows table (analysis.soak), in place of the steps tables."""
    lines = ["### Soak: the trend of each series over the windows", ""]
    lines += _md_table(*trend_rows(summary), numeric=5)
    lines += ["", "### Soak windows (t: the window's middle, seconds from the first window's start)", ""]
    header, rows = window_rows(summary)
    return [*lines, *_md_table(header, rows, numeric=len(header)), ""]


def _md_tables(summary: dict[str, Any]) -> list[str]:
    if summary.get("soak"):
        return _md_soak(summary)
    header, rows = table_rows(summary, srv=[])
    if not rows:
        return ["_No steps recorded._", ""]
    lines = ["### Steps (steady windows)", ""]
    for title, cols in table_groups(summary):
        if cols is None:
            lines += _md_table(header, rows, numeric=header.index(VALID_HEADER))
        else:
            lines += ["", f"**{title}**", ""]
            lines += _md_table(*table_rows(summary, cols, load=False), numeric=99)
            notes = target_source_note(summary, cols)  # which server's names, and from where
            lines += ["", *(f"- {_md_escape(x)}" for x in notes)] if notes else []
    stream = streaming_table(summary)
    if stream:
        lines += ["", "**Streaming (ms; tokens/s of output)**", "", *(f"- {x}" for x in streaming_lines(summary)), ""]
        lines += _md_table(*stream, numeric=len(stream[0]) - 1)
    return [*lines, ""]


def to_markdown(summary: dict[str, Any]) -> str:
    """summary.md, top-down: status, warnings, verdict and knee, findings, USL, the step tables
    (load; server per host; target), host facts."""
    lines = [f"## kneeswarm run `{summary.get('run_id')}`: {status_line(summary)}", ""]
    warnings = warning_lines(summary)
    if warnings:
        lines += ["**Warnings:**", *(f"- {_md_escape(w)}" for w in warnings), ""]
    lines += [verdict(summary), ""]
    lines += [f"- {line}" for line in knee_lines(summary)]
    tot = summary.get("totals") or {}
    lines.append(f"- **Requests:** {tot.get('requests', 0):,} ({tot.get('errors', 0):,} errors)")
    lines += [f"- {line}" for line in malformed_lines(summary)]
    lines += [f"- {line}" for line in resent_lines(summary)]
    lines += [f"- {line}" for line in workload_lines(summary)]
    lines.append("")
    lines += _md_explained(summary)
    lines += search_lines(summary)  # [load] mode = "search": the probes in order, with why
    lines += _md_tables(summary)
    for title, header, rows in worker_tables(summary):  # analysis.workers
        lines += [f"### {title}", "", *_md_table(header, rows, numeric=0), ""]
    hosts = got if isinstance(got := summary.get("hosts"), dict) else {}
    if any(hosts.values()):
        lines.append("### Hosts")
        for host, facts in hosts.items():
            hl = host_lines(host, facts or {})
            lines.append(f"- {hl[0]}")
            lines += [f"  - {x}" for x in hl[1:]]
        lines.append("")
    return "\n".join(lines)
