"""report/summary.md: the summary as Markdown for a pull-request comment, and the tables and lines
the HTML report shares with it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, cast

from kneeswarm.analysis.schema.summary import ServerMetrics, Summary, SummaryStep, num

from kneeswarm.analysis.measure.hostfacts import host_lines, skipped_lines
from kneeswarm.analysis.measure.loop import loop_line
from kneeswarm.analysis.reports.sections import (MARGINAL_NOTE, MARGINAL_TITLE, findings_section, marginal_section, plan_lines,
                                                 usl_lines, verdict)
from kneeswarm.analysis.summary.search import search_lines
from kneeswarm.analysis.summary.soak import held_line, trend_rows, window_rows
from kneeswarm.analysis.measure.streaming import streaming_lines, streaming_table, tokens_knee_line
from kneeswarm.analysis.measure.target import TARGET_METRICS, target_source_note
from kneeswarm.analysis.measure.workers import worker_tables
from kneeswarm.contracts.outcome import Ended
from kneeswarm.analysis.reports.mix_report import mix_markdown

logger = logging.getLogger(__name__)

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


# -- Markdown -------------------------------------------------------------------------------
def _f(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return fmt.format(v)


def status_line(summary: Summary) -> str:
    if summary.get("complete"):
        return "complete"
    ended = summary.get("ended")
    if ended == Ended.COMPLETED:
        return "INCOMPLETE (the load completed, but see the warnings)"
    return f"INCOMPLETE (ended: {ended})" if ended else "INCOMPLETE (no record of how it ended)"


def warning_lines(summary: Summary) -> list[str]:
    """The run's warnings (kneeswarm.analysis.measure.problems), shown before anything else."""
    return [str(w) for w in summary.get("warnings") or []]


def knee_lines(summary: Summary) -> list[str]:
    if summary.get("soak"):  # one load held: what it held, not a knee (kneeswarm.analysis.summary.soak)
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


def endpoint_lines(summary: Summary) -> list[str]:
    """One line on how the target was reached, when it was over TLS or with [endpoint] settings."""
    e: Mapping[str, object] = summary.get("endpoint") or {}
    if not e or (e.get("tls") is None and not e.get("headers") and not e.get("base_path")):
        return []
    parts = []
    if e.get("tls") == "unverified":
        parts.append("**unverified TLS** (endpoint.verify = false: the server's certificate was not checked)")
    elif e.get("tls") == "verified":
        parts.append(f"TLS verified against {e['ca_bundle'] or 'the system CAs'}")
    if e.get("client_cert"):
        parts.append("client certificate presented")
    if isinstance(headers := e.get("headers"), list) and headers:
        parts.append("headers " + ", ".join(headers))
    if e.get("base_path"):
        parts.append(f"base path {e['base_path']}")
    if e.get("server_name"):
        parts.append(f"server name {e['server_name']}")
    return ["**Endpoint:** " + "; ".join(parts)]


def workload_lines(summary: Summary) -> list[str]:
    w = summary.get("workload") or {}
    inputs = [f"**Inputs:** {w['inputs']}; token counts: {w['token_counts']}"] if w.get("token_counts") else []
    return inputs + llm_workload_lines(summary) + endpoint_lines(summary)


def llm_workload_lines(summary: Summary) -> list[str]:
    """Shared prefixes (the hit rate to expect) and per-turn context and TTFT (kneeswarm.analysis.measure.llmworkload)."""
    w = got if isinstance(got := summary.get("llm_workload"), dict) else {}
    out = []
    p = w.get("prefix") if isinstance(w.get("prefix"), dict) else None
    if p:
        out.append(f"**Shared prefixes:** {p.get('count')} of {p.get('tokens')} tokens in "
                   f"{_f(100 * (num(p.get('rows_share')) or 0), '{:.0f}')} % of requests: a prefix cache can serve "
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


def malformed_lines(summary: Summary) -> list[str]:
    """One bold line per host collector that skipped malformed lines (shown at the top)."""
    hosts = got if isinstance(got := summary.get("hosts"), dict) else {}
    return [f"**Malformed lines skipped:** {host} {coll}: {n:,} of {total:,} lines"
            for host, coll, n, total in skipped_lines(hosts)]


def resent_lines(summary: Summary) -> list[str]:
    """One line when requests were sent again (steps[].resent): how many, in which steps, and why."""
    steps = [(s.get("users"), int(s["resent"])) for s in summary.get("steps") or [] if s.get("resent")]
    if not steps:
        return []
    n, per = sum(k for _, k in steps), ", ".join(f"{k:,} at {u} users" for u, k in steps)
    return [f"**Resent:** {n:,} requests in the steady windows ({per}) were sent a second time: the server had "
            "closed their kept-alive connection cleanly before answering (each row is the second attempt)"]


def server_value(metrics: ServerMetrics, key: str) -> object:
    """metrics[key], or metrics["target"][x] for key "target.x"."""
    if key.startswith("target."):
        target = metrics.get("target")
        return target.get(key[len("target."):]) if isinstance(target, dict) else None
    return metrics.get(key)


def server_columns(summary: Summary, prefix_hosts: bool | None = None) -> list[tuple[str, str, str, str]]:
    """(host, header, key, fmt) for each server metric present in at least one step.

    Headers name their host when there are several hosts (or when ``prefix_hosts`` says so).
    """
    present: dict[str, set[str]] = {}
    for s in summary.get("steps", []):
        for host, metrics in (s.get("server") or {}).items():
            present.setdefault(host, set()).update(k for k in metrics if k != "target")
            tg = metrics.get("target")
            present[host].update(f"target.{k}" for k in (tg if isinstance(tg, dict) else {}))
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


def load_header(summary: Summary) -> list[str]:
    """LOAD_HEADER, with the optional columns that any step has (before VALID_HEADER)."""
    extra = [h for h, key, _ in OPTIONAL_COLUMNS if any(s.get(key) is not None for s in summary.get("steps", []))]
    return [*LOAD_HEADER[:-1], *extra, VALID_HEADER]


def _load_cells(s: SummaryStep, header: list[str]) -> list[str]:
    er = s.get("error_rate")
    valid = "yes" if s.get("valid") else "no: " + "; ".join(s.get("reasons") or [])
    cells = [f"{s.get('requests', 0):,}", _f(s.get("qps")), _f(s.get("p50_ms")), _f(s.get("p95_ms")),
             _f(s.get("p99_ms")), _f(s.get("p999_ms")), _f(None if er is None else 100 * er, "{:.2f}")]
    cells += [_f(s.get(key), fmt) for h, key, fmt in OPTIONAL_COLUMNS if h in header]
    return [*cells, valid]


def table_rows(summary: Summary, srv: list[tuple[str, str, str, str]] | None = None,
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


def table_groups(summary: Summary) -> list[tuple[str, list[tuple[str, str, str, str]] | None]]:
    """The step table split for reading (not one 25-column table): (title, server columns) of the load table
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


def _md_explained(summary: Summary) -> list[str]:
    """Findings, the scalability model, and the SLA/capacity plan when present."""
    lines = ["### Findings", ""]
    for f in findings_section(summary):
        lines.append(f"- {f[0]}")
        lines += [f"  - {x}" for x in f[1:]]
    marginal = marginal_section(summary)
    if marginal:
        lines += ["", f"### {MARGINAL_TITLE}", "", f"_{MARGINAL_NOTE}_", ""]
        for f in marginal:
            lines.append(f"- {f[0]}")
            lines += [f"  - {x}" for x in f[1:]]
    usl = usl_lines(summary)
    if usl:
        lines += ["", "### Scalability model (USL)", "", *(f"- {x}" for x in usl)]
    for title, plan in plan_lines(summary):
        lines += ["", f"### {title}", "", *(f"- {x}" for x in plan)]
    return [*lines, ""]


def _md_soak(summary: Summary) -> list[str]:
    """A soak's trend table and windows table (kneeswarm.analysis.summary.soak), in place of the steps tables."""
    lines = ["### Soak: the trend of each series over the windows", ""]
    lines += _md_table(*trend_rows(summary), numeric=5)
    lines += ["", "### Soak windows (t: the window's middle, seconds from the first window's start)", ""]
    header, rows = window_rows(summary)
    return [*lines, *_md_table(header, rows, numeric=len(header)), ""]


def _md_tables(summary: Summary) -> list[str]:
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


def to_markdown(summary: Summary) -> str:
    """summary.md, top-down: status, warnings, verdict and knee, findings, USL, the step tables
    (load; server per host; target), host facts."""
    lines = [f"## kneeswarm run `{summary.get('run_id')}`: {status_line(summary)}", ""]
    warnings = warning_lines(summary)
    if warnings:
        lines += ["**Warnings:**", *(f"- {_md_escape(w)}" for w in warnings), ""]
    lines += [verdict(summary), ""]
    lines += [f"- {line}" for line in knee_lines(summary)]
    tot: Mapping[str, object] = summary.get("totals") or {}
    lines.append(f"- **Requests:** {tot.get('requests', 0):,} ({tot.get('errors', 0):,} errors)")
    lines += [f"- {line}" for line in malformed_lines(summary)]
    lines += [f"- {line}" for line in resent_lines(summary)]
    lines += [f"- {line}" for line in workload_lines(summary)]
    lines.append("")
    lines += _md_explained(summary)
    lines += search_lines(summary)  # [load] mode = "search": the probes in order, with why
    lines += _md_tables(summary)
    lines += mix_markdown(summary)  # a traffic mix: each class's knee and steps (mix_report.py)
    for title, header, rows in worker_tables(summary):  # kneeswarm.analysis.measure.workers
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
