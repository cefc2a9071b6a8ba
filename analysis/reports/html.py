"""report/index.html: one self-contained, offline plotly page.

(a) QPS and P50/P95/P99 against users (x = log2 users, ticks labelled with users), the knee
    marked; (b) a timeline on one shared time axis (seconds since the run started) with each
    step as a shaded band: QPS and P99 per second (from the request rows, binned by completion
    time), host CPU us/sy, context switches and run queue, the monitored process's %CPU and RSS,
    GPU SM%, and the load generator's CPU per worker; then the steps table.  Everything is
    downsampled to 1-s bins; raw request points are never embedded.
"""

from __future__ import annotations

import html
import logging
from typing import Any, Mapping, cast

from kneeswarm.analysis.schema.summary import Summary

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kneeswarm.analysis.measure.hostfacts import host_lines
from kneeswarm.analysis.measure.serverstats import ACTIVE_THREAD_CPU_PCT, active_threads
from kneeswarm.analysis.measure.requestscan import BIN_S, Chunk, Timeline
from kneeswarm.analysis.reports.sections import (MARGINAL_NOTE, MARGINAL_TITLE, SEVERITY_MARK, findings_section, marginal_section, plan_lines,
                                                 usl_lines, verdict)
from kneeswarm.analysis.summary.search import search_lines
from kneeswarm.analysis.measure.streaming import streaming_lines, streaming_table
from kneeswarm.analysis.reports.markdown import (VALID_HEADER, knee_lines, malformed_lines, n_users, resent_lines, status_line, table_groups, table_rows, warning_lines, workload_lines)
from kneeswarm.analysis.measure.target import (PROMETHEUS_STREAM, TARGET_METRICS, target_source_note, target_timeline)
from kneeswarm.analysis.measure.workers import worker_tables
from kneeswarm.analysis.reports.mix_report import mix_html

logger = logging.getLogger(__name__)

BAND_COLORS = ("rgba(99,110,250,0.08)", "rgba(239,85,59,0.08)")
KNEE_COLOR = "firebrick"
LATENCY_KNEE_COLOR = "darkorange"
PLOT_HEIGHT_PER_ROW = 190
# the target panels, each titled by the traces present: [(target key, secondary axis)]
TARGET_PANELS = (
    (("queue_length", False), ("in_flight", False), ("rejected_s", True), ("preempted_s", True)),
    (("kv_cache_usage_pct", False), ("queue_wait_ms", False), ("queue_time_ms", False), ("queue_time_us_s", True),
     ("requests_s", True)),
)
TARGET_LABELS = {m.key: m.label for m in TARGET_METRICS}


def per_second(requests: pd.DataFrame, t0: float, bin_s: float = BIN_S) -> pd.DataFrame:
    """Per bin of completion time: t (s since t0), qps (ok/s), errors_s, p99_ms (ok rows), from rows
    in memory (a run directory's timeline comes from kneeswarm.analysis.measure.requestscan.scan_parts)."""
    timeline = Timeline(t0, bin_s)
    if requests is not None and len(requests):
        timeline.add(Chunk.of(requests))
    return timeline.frame()


def _binned(df: pd.DataFrame, t0: float, cols: list[str], how: str = "mean", by: str | None = None,
            bin_s: float = BIN_S) -> pd.DataFrame:
    """Samples -> 1-s bins (time since t0); with ``by``, samples at one t are first summed."""
    cols = [c for c in cols if c in df.columns]
    data = df[["t", *cols] + ([by] if by and by in df.columns else [])].copy()
    for c in cols:
        data[c] = pd.to_numeric(data[c], errors="coerce")
    if by and by in data.columns:
        data = data.groupby("t", sort=True)[cols].agg(how).reset_index()
    data["bin"] = np.floor((data["t"] - t0) / bin_s).astype(np.int64)
    out = data.groupby("bin")[cols].mean().reset_index()
    out["t"] = out["bin"] * bin_s
    return out


def _knee_figure(summary: Summary) -> go.Figure:
    # curves by users: a search's probes go down as well as up (their order: _probe_traces)
    steps = sorted((s for s in summary.get("steps", []) if s.get("users")), key=lambda s: s.get("users") or 0)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if not steps:
        fig.update_layout(title="No steps recorded")
        return fig
    users = np.array([s["users"] for s in steps], dtype=float)
    x = np.log2(users)
    valid = [bool(s.get("valid")) for s in steps]
    val = lambda k: [np.nan if (v := cast(Mapping[str, object], s).get(k)) is None else v for s in steps]  # noqa: E731
    fig.add_trace(go.Scatter(x=x, y=val("qps"), name="QPS", mode="lines+markers", line=dict(width=3),
                             marker=dict(size=10, symbol=["circle" if v else "x" for v in valid]),
                             hovertext=[("valid" if v else "INVALID: " + "; ".join(s.get("reasons") or []))
                                        for v, s in zip(valid, steps)]), secondary_y=False)
    for key, dash in (("p50_ms", "dot"), ("p95_ms", "dash"), ("p99_ms", "solid")):
        fig.add_trace(go.Scatter(x=x, y=val(key), name=key.replace("_ms", "").upper() + " ms", mode="lines+markers",
                                 line=dict(dash=dash)), secondary_y=True)
    _usl_trace(fig, summary)
    _probe_traces(fig, summary)
    knee = summary.get("knee") or {}
    if ku := knee.get("users"):
        fig.add_vline(x=float(np.log2(ku)), line=dict(color=KNEE_COLOR, width=2, dash="dash"),
                      annotation_text=f"knee: {n_users(knee['users'])} ({knee.get('method')})",
                      annotation_position="top left", annotation_font_color=KNEE_COLOR)
    lk = summary.get("latency_knee") or {}
    if (lu := lk.get("users")) and lu != knee.get("users"):
        fig.add_vline(x=float(np.log2(lu)), line=dict(color=LATENCY_KNEE_COLOR, width=1, dash="dot"),
                      annotation_text=f"P99 knee: {n_users(lk['users'])}", annotation_position="bottom right",
                      annotation_font_color=LATENCY_KNEE_COLOR)
    fig.update_xaxes(title_text="users (log2 scale)", tickvals=x, ticktext=[f"{u:g}" for u in users])
    fig.update_yaxes(title_text="QPS (successful/s)", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="latency ms", rangemode="tozero", secondary_y=True)
    fig.update_layout(title="Throughput and latency against users", height=480, hovermode="x unified")
    return fig


def _soak_figure(summary: Summary) -> go.Figure:
    """A soak's windows over time (kneeswarm.analysis.summary.soak): QPS and P50/P95/P99/P999 (one line each), then per
    host the service's RSS and GPU memory, its threads and open fds, and the target's own series."""
    ser = (summary.get("soak") or {}).get("series") or {}
    hosts = ser.get("hosts") or {}
    rows = ["QPS and latency", "memory MB", "threads and open fds", "target series"]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=rows, vertical_spacing=0.06,
                        specs=[[{"secondary_y": True}]] + [[{"secondary_y": False}]] * (len(rows) - 1))
    t, client = ser.get("t") or [], ser.get("client") or {}
    nan = lambda v: [np.nan if x is None else x for x in v or []]  # noqa: E731
    fig.add_trace(go.Scatter(x=t, y=nan(client.get("qps")), name="QPS", mode="lines+markers", line=dict(width=3)),
                  row=1, col=1, secondary_y=False)
    for key, dash in (("p50_ms", "dot"), ("p95_ms", "dash"), ("p99_ms", "solid"), ("p999_ms", "longdash")):
        fig.add_trace(go.Scatter(x=t, y=nan(client.get(key)), name=key.replace("_ms", "").upper() + " ms",
                                 mode="lines+markers", line=dict(dash=dash)), row=1, col=1, secondary_y=True)
    for h, m in hosts.items():
        for key, row in (("rss_mb", 2), ("gpu_mb", 2), ("gpu_peak_mb", 2), ("threads", 3), ("fds", 3)):
            if key in m:
                fig.add_trace(go.Scatter(x=t, y=nan(m[key]), name=f"{h} {key}", mode="lines+markers"), row=row, col=1)
        for key, values in (tg if isinstance(tg := m.get("target"), dict) else {}).items():
            fig.add_trace(go.Scatter(x=t, y=nan(values), name=f"{h} {TARGET_LABELS.get(key, key)}", mode="lines",
                                     visible="legendonly" if key not in ("requests_s", "in_flight", "queue_length") else True),
                          row=4, col=1)
    fig.update_xaxes(title_text="seconds from the first window's start (window middles)", row=len(rows), col=1)
    fig.update_yaxes(title_text="QPS", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="latency ms", rangemode="tozero", row=1, col=1, secondary_y=True)
    fig.update_layout(title="Soak: each window's figures over time", height=PLOT_HEIGHT_PER_ROW * 5, hovermode="x unified")
    return fig


def _probe_traces(fig: go.Figure, summary: Summary) -> None:
    """[load] mode = "search": the probes in the order they ran, numbered, on the QPS and P99
    curves, with why each was chosen (hover)."""
    search = got if isinstance(got := summary.get("search"), dict) else {}
    steps = summary.get("steps") or []
    probes = [(s, p) for s, p in zip(steps, search.get("probes") or []) if s.get("users")]
    if not probes:
        return
    x = np.log2([s.get("users") or 0 for s, _ in probes])  # each with users (above)
    text = [str(i + 1) for i in range(len(probes))]
    why = [f"probe {i + 1}: {p.get('why') or ''}" for i, (_, p) in enumerate(probes)]
    for key, name, secondary in (("qps", "probes in order (QPS)", False), ("p99_ms", "probes in order (P99)", True)):
        y = [np.nan if (v := cast(Mapping[str, object], s).get(key)) is None else v for s, _ in probes]
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers+text", text=text, textposition="top center",
                                 hovertext=why, line=dict(color="#888", width=1, dash="dot"),
                                 marker=dict(size=6, color="#888")), secondary_y=secondary)


def _search_html(summary: Summary) -> str:
    """[load] mode = "search": why it stopped, its brackets and its probes in order (kneeswarm.analysis.summary.search)."""
    lines = search_lines(summary)
    if not lines:
        return ""
    text = [line for line in lines[1:] if line and not line.startswith("|")]
    rows = [[html.escape(c.strip()) for c in line.strip("|").split(" | ")] for line in lines if line.startswith("| ")]
    head, body = rows[0], rows[1:]
    return ("<h2>Search</h2>" + "".join(f"<p>{_md_inline(t)}</p>" for t in text)
            + "<table class='steps search'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body) + "</table>")


def _usl_trace(fig: go.Figure, summary: Summary) -> None:
    """The fitted USL curve over the measured points (kneeswarm.analysis.models.usl.usl_curve, valid steps only)."""
    usl = cast(Mapping[str, object], got if isinstance(got := summary.get("usl"), dict) else {})
    curve = cast(Mapping[str, Any], c if isinstance(c := usl.get("curve"), dict) else {})
    users = np.asarray(curve.get("users") or [], dtype=float)
    qps = np.asarray(curve.get("qps") or [], dtype=float)
    measured = [u for s in summary.get("steps", []) if isinstance(u := s.get("users"), (int, float))]
    if measured and len(users) == len(qps):  # over the measured points only, not extrapolated below them
        keep = users >= min(measured)
        users, qps = users[keep], qps[keep]
    if not len(users):
        return
    name = "USL fit" + (f" (N* = {usl['n_star']:.1f})" if usl.get("n_star") else "")
    fig.add_trace(go.Scatter(x=np.log2(users), y=qps, name=name,
                             mode="lines", line=dict(color="gray", dash="dash", width=2), hoverinfo="skip"),
                  secondary_y=False)


Trace = tuple[str, Any, Any, bool]  # name, x, y, on the secondary axis
Panel = tuple[str, list[Trace]]  # title, traces


def _request_panels(ps: pd.DataFrame) -> list[Panel]:
    if not len(ps):
        return []
    return [("QPS per second", [("QPS", ps["t"], ps["qps"], False), ("errors/s", ps["t"], ps["errors_s"], True)]),
            ("P99 per second (ms)", [("P99 ms", ps["t"], ps["p99_ms"], False)])]


def _vmstat_panels(host: str, vm: pd.DataFrame | None, t0: float, bin_s: float = BIN_S) -> list[Panel]:
    if vm is None:
        return []
    b = _binned(vm, t0, ["us", "sy", "wa", "cs", "r"], bin_s=bin_s)
    cpu = [(f"{k} %", b["t"], b[k], False) for k in ("us", "sy", "wa") if k in b]
    sched = [(n, b["t"], b[k], sec) for k, n, sec in (("cs", "cs/s", False), ("r", "run queue", True)) if k in b]
    return [p for p in ((f"{host}: CPU % (vmstat)", cpu), (f"{host}: context switches/s, run queue", sched)) if p[1]]


def _process_panels(host: str, pr: pd.DataFrame | None, th: pd.DataFrame | None, t0: float, bin_s: float = BIN_S) -> list[Panel]:
    out: list[Panel] = []
    if pr is not None:
        b = _binned(pr, t0, ["cpu_pct", "rss_mb"], how="sum", by="pid", bin_s=bin_s)
        tr = [(n, b["t"], b[k], sec) for k, n, sec in (("cpu_pct", "process %CPU", False), ("rss_mb", "RSS MB", True))
              if k in b]
        if tr:
            out.append((f"{host}: monitored process", tr))
    per_t = active_threads(th)
    if per_t is not None:
        b = _binned(per_t, t0, ["active_threads", "top_thread_cpu_pct"], bin_s=bin_s)
        out.append((f"{host}: threads (active >= {ACTIVE_THREAD_CPU_PCT:g}% CPU; busiest thread %CPU)",
                    [("active threads", b["t"], b["active_threads"], False),
                     ("busiest thread %CPU", b["t"], b["top_thread_cpu_pct"], True)]))
    return out


def _gpu_panels(host: str, gpu: pd.DataFrame | None, t0: float, bin_s: float = BIN_S) -> list[Panel]:
    if gpu is None or "gpu" not in gpu.columns or "sm_pct" not in gpu.columns:
        return []
    use, mem = [], []
    for g, gdf in gpu.groupby("gpu"):
        b = _binned(gdf, t0, ["sm_pct", "mem_pct", "fb_used_mb", "power_w"], bin_s=bin_s)
        use.append((f"GPU {g} SM %", b["t"], b["sm_pct"], False))
        if "mem_pct" in b:
            use.append((f"GPU {g} mem %", b["t"], b["mem_pct"], False))
        if "fb_used_mb" in b:
            mem.append((f"GPU {g} FB used MB", b["t"], b["fb_used_mb"], False))
        if "power_w" in b:
            mem.append((f"GPU {g} power W", b["t"], b["power_w"], True))
    return [(f"{host}: GPU", use)] + ([(f"{host}: GPU memory used MB / power W", mem)] if mem else [])


def _target_panels(host: str, prom: pd.DataFrame | None, t0: float, bin_s: float = BIN_S) -> list[Panel]:
    tl = target_timeline(prom, t0, bin_s)
    out: list[Panel] = []
    for keys in TARGET_PANELS:
        tr = [(TARGET_LABELS[k], tl["t"], tl[k], sec) for k, sec in keys if k in tl.columns]
        if tr:
            out.append((f"{host}: target: " + " / ".join(name for name, *_ in tr), tr))
    return out


def _generator_panels(generator: dict[str, pd.DataFrame], t0: float, bin_s: float = BIN_S) -> list[Panel]:
    tr = []
    for w, df in generator.items():
        if "cpu_pct" in df.columns:
            b = _binned(df, t0, ["cpu_pct"], bin_s=bin_s)
            tr.append((f"{w} CPU %", b["t"], b["cpu_pct"], False))
    return [("load generator CPU % per worker", tr)] if tr else []


def _step_bands(fig: go.Figure, summary: Summary, t0: float) -> None:
    """Each step as a shaded band behind all panels, labelled with its users (✗: not valid).

    One full-height shape per step (x on the shared time axis, y on the paper): plotly's
    ``add_vrect(row="all")`` builds one shape per panel and took seconds per step on 20 panels.
    """
    shapes, labels = [], []
    for j, s in enumerate(summary.get("steps", [])):
        t_ramp, t_end = s.get("t_ramp"), s.get("t_end")
        if t_ramp is None or t_end is None or not t_end > t_ramp:
            continue
        lo, hi = t_ramp - t0, t_end - t0
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=lo, x1=hi, y0=0, y1=1,
                           fillcolor=BAND_COLORS[j % 2], line_width=0, layer="below"))
        labels.append(dict(x=(lo + hi) / 2, y=1.0, xref="x", yref="paper", yanchor="bottom", showarrow=False,
                           text=f"{s.get('users')}u" + ("" if s.get("valid") else " ✗"), font=dict(size=10)))
    fig.update_layout(shapes=[*fig.layout.shapes, *shapes], annotations=[*fig.layout.annotations, *labels])


def _timeline_figure(summary: Summary, timeline: pd.DataFrame, generator: dict[str, pd.DataFrame],
                     hosts: dict[str, dict[str, pd.DataFrame]], t0: float, bin_s: float = BIN_S) -> go.Figure:
    """All panels on one time axis (seconds since ``t0``, ``bin_s`` bins); ``timeline``: the
    requests per bin (kneeswarm.analysis.measure.requestscan.Timeline.frame)."""
    panels = _request_panels(timeline)
    for host, streams in hosts.items():
        mine = _vmstat_panels(host, streams.get("vmstat"), t0, bin_s)
        mine += _process_panels(host, streams.get("process"), streams.get("threads"), t0, bin_s)
        mine += _gpu_panels(host, streams.get("gpu"), t0, bin_s)
        mine += _target_panels(host, streams.get(PROMETHEUS_STREAM), t0, bin_s)
        if len(hosts) > 1:  # one legend for all panels: say whose "us %" each line is
            mine = [(title, [(f"{host}: {n}", x, y, sec) for n, x, y, sec in traces]) for title, traces in mine]
        panels += mine
    panels += _generator_panels(generator, t0, bin_s)
    if not panels:
        fig = go.Figure()
        fig.update_layout(title="Timeline: no samples recorded", height=200)
        return fig
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[title for title, _ in panels], specs=[[{"secondary_y": True}]] * len(panels))
    for i, (_, traces) in enumerate(panels, start=1):
        # a secondary axis over a subplot with no primary trace breaks the whole figure in
        # plotly.js 3 (every panel drawn empty): such a panel's traces go on its primary axis
        alone = not any(not sec for *_, sec in traces)
        for name, x, y, sec in traces:
            sec = sec and not alone
            fig.add_trace(go.Scatter(x=np.asarray(x, dtype=float), y=np.asarray(y, dtype=float), name=name,
                                     mode="lines", legendgroup=str(i), line=dict(width=1.5)),
                          row=i, col=1, secondary_y=sec)
    _step_bands(fig, summary, t0)
    fig.update_xaxes(title_text="seconds since run start" + (f" ({bin_s:g}-s bins)" if bin_s != BIN_S else ""),
                     row=len(panels), col=1)
    fig.update_yaxes(rangemode="tozero")  # every series here is a count, a rate or a percentage
    fig.update_layout(title=dict(text="Timeline (steps shaded; ✗ = step not valid)", y=0.995),
                      height=max(360, PLOT_HEIGHT_PER_ROW * len(panels) + 120), hovermode="x unified",
                      margin=dict(t=90))
    return fig


def _table_html(summary: Summary, header: list[str], rows: list[list[str]]) -> str:
    """One steps table; the rows of steps that are not valid are greyed."""
    if not rows:
        return "<p><em>No steps recorded.</em></p>"
    cell_class = ["" if h != VALID_HEADER else ' class="valid"' for h in header]
    head = "".join(f"<th{k}>{html.escape(h)}</th>" for k, h in zip(cell_class, header))
    body = "".join(
        "<tr{}>{}</tr>".format("" if step.get("valid") else ' class="invalid"',
                               "".join(f"<td{k}>{html.escape(c)}</td>" for k, c in zip(cell_class, r)))
        for step, r in zip(summary.get("steps", []), rows)
    )
    return f'<table class="steps"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _tables_html(summary: Summary) -> str:
    """The step tables in readable groups: load; what each server did; the target's /metrics."""
    parts = ["<h2>Steps (steady windows; greyed: not valid)</h2>"]
    for title, cols in table_groups(summary):
        header, rows = table_rows(summary, srv=[]) if cols is None else table_rows(summary, cols, load=False)
        parts.append(f"<h3>{_md_inline(title)}</h3>" + _table_html(summary, header, rows))
        parts += [f"<p class='note'>{html.escape(x)}</p>" for x in target_source_note(summary, cols)]
        if not rows:
            break
    stream = streaming_table(summary)
    if stream:  # LLM streaming: TTFT/ITL/TPOT, tokens/s, goodput (kneeswarm.analysis.measure.streaming)
        parts.append("<h3>Streaming (ms; tokens/s of output)</h3><ul>"
                     + "".join(f"<li>{_md_inline(x)}</li>" for x in streaming_lines(summary)) + "</ul>"
                     + _table_html(summary, *stream))
    return "".join(parts)


def _workers_html(summary: Summary) -> str:
    """The per-worker tables (kneeswarm.analysis.measure.workers): requests, req/s, CPU, RSS, users; lost workers."""
    out = []
    for title, header, rows in worker_tables(summary):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        out.append(f"<h2>{html.escape(title)}</h2><table class='steps workers'><thead><tr>{head}</tr></thead>"
                   f"<tbody>{body}</tbody></table>")
    return "".join(out)


def _findings_html(summary: Summary) -> str:
    """Each finding as a card: severity and id, what was seen, the evidence, the advice."""
    cards = []
    for lines in findings_section(summary):
        sev = next((k for k, mark in SEVERITY_MARK.items() if mark in lines[0]), "none") if len(lines) > 1 else "none"
        body = "".join(f"<div>{_md_inline(x)}</div>" for x in lines[1:])
        folded = " consequence" if lines[0].startswith("↳") else ""  # under its cause (findings.causes)
        cards.append(f"<div class='finding {html.escape(sev)}{folded}'><div>{_md_inline(lines[0])}</div>{body}</div>")
    out = "<h2>Findings</h2>" + "".join(cards)
    marginal = marginal_section(summary)
    if marginal:
        out += f"<h2>{html.escape(MARGINAL_TITLE)}</h2><p>{html.escape(MARGINAL_NOTE)}</p>"
        for lines in marginal:
            body = "".join(f"<div>{_md_inline(x)}</div>" for x in lines[1:])
            out += f"<div class='finding marginal'><div>{_md_inline(lines[0])}</div>{body}</div>"
    return out


def _model_html(summary: Summary) -> str:
    """The USL reading, and the SLA/capacity plan when the summary has them."""
    out = []
    usl = usl_lines(summary)
    if usl:
        out.append("<h2>Scalability model (USL)</h2><ul>" + "".join(f"<li>{_md_inline(x)}</li>" for x in usl)
                   + "</ul>")
    for title, lines in plan_lines(summary):
        out.append(f"<h2>{html.escape(title)}</h2><ul>" + "".join(f"<li>{_md_inline(x)}</li>" for x in lines)
                   + "</ul>")
    return "".join(out)


def _md_inline(line: str) -> str:
    """**bold** and `code` of one Markdown line, as HTML (everything else escaped)."""
    out = []
    for j, chunk in enumerate(line.split("`")):
        if j % 2:
            out.append(f"<code>{html.escape(chunk)}</code>")
            continue
        parts = html.escape(chunk).split("**")
        out.append("".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts)))
    return "".join(out)


def _hosts_html(summary: Summary) -> str:
    hosts = got if isinstance(got := summary.get("hosts"), dict) else {}
    if not any(hosts.values()):
        return ""
    items = []
    for host, facts in hosts.items():
        hl = host_lines(host, facts or {})
        sub = "".join(f"<li>{_md_inline(x)}</li>" for x in hl[1:])
        items.append(f"<li>{_md_inline(hl[0])}" + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
    return "<h2>Hosts</h2><ul class='hosts'>" + "".join(items) + "</ul>"


CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.banner{background:#b00020;color:#fff;padding:.6em 1em;font-weight:bold;border-radius:4px}
table.steps{border-collapse:collapse;font-size:13px;margin:1em 0}
table.steps th,table.steps td{border:1px solid #ccc;padding:3px 8px;text-align:right}
table.steps td.valid,table.steps th.valid{text-align:left}
tr.invalid{background:#fff3f3;color:#777}
.warn{background:#fff4e5;border-left:4px solid #e65100;padding:.4em .8em}
ul.hosts{font-size:14px}
ul.hosts code{font-size:12px;word-break:break-all}
.verdict{font-size:17px;margin:.8em 0}
.finding{border-left:4px solid #999;background:#f7f7f7;padding:.4em .8em;margin:.5em 0;font-size:14px}
.finding div{margin:.15em 0}
.finding.critical{border-color:#b00020;background:#fdecee}
.finding.warning{border-color:#e65100;background:#fff4e5}
.finding.info{border-color:#1565c0;background:#eef4fc}
.finding.consequence{margin-left:2em;opacity:.9}
.finding.marginal{border-style:dashed;background:#fafafa}
.finding code{font-size:12px;white-space:normal}
h3{margin:1.2em 0 .2em;font-size:15px}
"""


def render_html(summary: Summary, timeline: pd.DataFrame, generator: dict[str, pd.DataFrame],
                hosts: dict[str, dict[str, pd.DataFrame]], t0: float, bin_s: float = BIN_S) -> str:
    """index.html; ``timeline``: the requests per ``bin_s`` bin since ``t0`` (requestscan)."""
    title = f"kneeswarm {summary.get('run_id')}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if not summary.get("complete"):
        parts.append(f"<p class='banner'>{html.escape(status_line(summary))}: this report covers only what "
                     "was recorded before the run stopped.</p>")
    warnings = warning_lines(summary)
    if warnings:
        parts.append("<div class='warn warnings'><b>Warnings</b><ul>"
                     + "".join(f"<li>{html.escape(w)}</li>" for w in warnings) + "</ul></div>")
    parts.append(f"<p class='verdict'>{_md_inline(verdict(summary))}</p>")
    parts.append("<ul>" + "".join(f"<li>{_md_inline(line)}</li>"
                                  for line in knee_lines(summary) + workload_lines(summary)
                                  + resent_lines(summary)) + "</ul>")
    for line in malformed_lines(summary):
        parts.append(f"<p class='warn'>{_md_inline(line)}</p>")
    parts.append(_findings_html(summary))
    parts.append(_model_html(summary))
    top = _soak_figure(summary) if summary.get("soak") else _knee_figure(summary)  # a soak has no knee
    parts.append(top.to_html(full_html=False, include_plotlyjs=True))
    parts.append(_search_html(summary))
    parts.append(_timeline_figure(summary, timeline, generator, hosts, t0, bin_s).to_html(full_html=False,
                                                                                          include_plotlyjs=False))
    parts.append(_tables_html(summary))
    parts.append(mix_html(summary))  # a traffic mix: each class's knee, chart and steps (mix_report.py)
    parts.append(_workers_html(summary))
    parts.append(_hosts_html(summary))
    parts.append("</body></html>")
    return "\n".join(parts)
