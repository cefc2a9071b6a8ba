"""A run history (kneeswarm.analysis.runs.history) as markdown and as one offline plotly page: per plan and target,
the percentiles at each users value over time (one line per percentile on one chart), the drift
test of every figure, and at a drifting figure's change point what changed between the runs; a
traffic mix's classes each the same, beside the whole (with their knees run by run and their gaps)."""

from __future__ import annotations

import datetime as dt
import html
import logging
from typing import Any, cast

import plotly.graph_objects as go

from kneeswarm.analysis.schema.history import (HistoryClass, HistoryGroup, HistoryResult, HistorySeries, RepeatEntry,
                                               SoakEntry)
from kneeswarm.analysis.schema.summary import ChangePoint, Trend

logger = logging.getLogger(__name__)

__all__ = ["history_markdown", "history_html"]

MAX_CHANGES_SHOWN = 12  # per change point; the JSON has them all
PERCENTILE_NAMES = {"p50_ms": "P50", "p95_ms": "P95", "p99_ms": "P99", "p999_ms": "P99.9"}


def _f(v: Any, fmt: str = "{:.4g}") -> str:
    return "–" if v is None else fmt.format(v)


def _when(t: float | None) -> str:
    return "–" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _drift_cell(d: Trend) -> str:
    if d.get("p") is None:
        return d.get("reason") or "–"
    verdict = f"**drift {d['direction']}**" if d["drifting"] else "no drift"
    left = f" (left out: {d['reason']})" if d.get("unmeasured") else ""
    return (f"{verdict}: Theil–Sen {d['slope']:+.3g}/run ({_f(d['rel_change'], '{:+.1%}')} over the window), "
            f"Mann–Kendall S {d['s']}, p {d['p']:.3g}{left}")


def _changed_lines(cp: ChangePoint) -> list[str]:
    ch = cp.get("changes") or []
    whats = sorted({c["what"] for c in ch}, key=["input length", "versions", "host facts", "plan keys"].index)
    lines = [f"  - change point at run `{cp['run']}` (after `{cp['previous_run']}`): mean {cp['before']:.4g} → "
             f"{cp['after']:.4g} ({cp['explained']:.0%} of the variance); "
             f"changed: {', '.join(whats) if whats else 'nothing recorded'}"]
    lines += [f"    - {c['what']}: `{c['key']}` {c['before']!r} → {c['after']!r}" for c in ch[:MAX_CHANGES_SHOWN]]
    if len(ch) > MAX_CHANGES_SHOWN:
        lines.append(f"    - … {len(ch) - MAX_CHANGES_SHOWN} more in history.json")
    return lines


def _soak_lines(g: HistoryGroup) -> list[str]:
    """A soak group's runs: windows, and what crept in each (its soak findings and trends)."""
    lines = ["", "Soaks: each figure is the median over the run's windows; what crept within each run:", ""]
    for r in g["runs"]:
        soak = r.get("soak") or cast(SoakEntry, {})
        found = ", ".join(f"{f['id']}" + (f" ({f['host']})" if f.get("host") else "") for f in soak.get("findings") or [])
        moved = "; ".join(f"{k} {slope * 60:+.3g}/min (p {t['p']:.2g})" for k, t in (soak.get("trends") or {}).items()
                          if (slope := t.get("slope")) is not None and t.get("p") is not None)
        lines.append(f"- `{r['run_id']}`: {soak.get('valid_windows')} of {soak.get('windows')} windows of "
                     f"{_f(soak.get('window_s'))} s valid; {found or 'nothing crept'}" + (f"; {moved}" if moved else ""))
    return lines


def _repeat_lines(g: HistoryGroup) -> list[str]:
    """The group's repeated runs: each one point, the mean of its runs with the interval between them."""
    rep = [r for r in g["runs"] if r.get("repeat")]
    if not rep:
        return []
    lines = ["", "Repeated runs, each one point (the mean of its runs; [the interval between them]):", ""]
    for r in rep:
        x = cast(RepeatEntry, r.get("repeat"))  # rep: the runs with one
        moved = [f"`{f['id']}` {f['label']}" for f in x.get("findings") or [] if not f.get("stable")]
        lines.append(f"- `{r['run_id']}`: {x['runs']} of {x['planned']} runs merged; {x['knee']['text']}"
                     + (f"; findings that did not repeat: {', '.join(moved)}" if moved else ""))
    return lines


def _knee_lines(g: HistoryGroup) -> list[str]:
    """Each single run's knee with its interval at the run's own noise (where its summary has one)."""
    runs = [r for r in g["runs"] if not r.get("repeat") and isinstance(r.get("knee_interval"), list)]
    if not runs:
        return []
    lines = ["", "Knee of each run [its interval at that run's own noise]:", ""]
    for r in runs:
        lo, hi = r.get("knee_interval") or (None, None)  # runs: the ones with a list
        at = f"{_f(lo)}-{'past the range' if hi is None else _f(hi)}"
        lines.append(f"- `{r['run_id']}`: {_f(r.get('knee_users')) if r.get('knee_users') is not None else 'none'} [{at}]")
    return lines


def group_markdown(g: HistoryGroup) -> list[str]:
    kind = " (soak)" if g.get("soak") else ""
    lines = [f"## {g['plan']} → {g['target']}{kind}", "",
             f"{len(g['runs'])} runs, {_when(g['runs'][0]['started'] if g['runs'] else None)} to "
             f"{_when(g['runs'][-1]['started'] if g['runs'] else None)}"]
    lines += _soak_lines(g) if g.get("soak") else []
    lines += _repeat_lines(g)
    lines += _knee_lines(g)
    lines += [f"- left out: `{x['run']}` ({x['reason']})" for x in g["left_out"]]
    lines += _series_lines(g["series"])
    for c in g.get("classes") or []:
        lines += _class_lines(g, c)
    return lines + [""]


def _series_lines(series: list[HistorySeries]) -> list[str]:
    """The table of figures (last value, drift test) and where the drifting ones moved."""
    lines = ["", "| figure | last | drift test |", "|---|---:|---|"]
    for s in series:
        last = next((i for i in reversed(range(len(s["values"]))) if s["values"][i] is not None), None)
        ivs = s.get("intervals") or []
        iv = ivs[last] if last is not None and last < len(ivs) else None
        value = _f(s["values"][last] if last is not None else None) + (f" [{iv[0]:.4g}, {iv[1]:.4g}]" if iv else "")
        lines.append(f"| {s['figure']} | {value} | {_drift_cell(s['drift'])} |")
    drifting = [(s, cp) for s in series if s["drift"].get("drifting") and (cp := s["change_point"])]
    if drifting:
        lines += ["", "Where the drifting figures moved (single least-squares change point):"]
    for s, cp in drifting:
        lines += [f"- {s['figure']}:", *_changed_lines(cp)]
    return lines


def _class_lines(g: HistoryGroup, c: HistoryClass) -> list[str]:
    """One class of the group's mixes: its share, peak and knees run by run, its gaps, its series."""
    lines = ["", f"### class {c['name']}", "",
             "| run | share | peak QPS (users) | knee users (QPS) [interval] | P99 took off at users [interval] |",
             "|---|---:|---:|---:|---:|"]
    peak = {s["figure"]: s for s in c["series"]}.get("peak QPS")
    knee_iv = c.get("knee_interval") or [None] * len(g["runs"])
    took_iv = c.get("latency_knee_interval") or [None] * len(g["runs"])
    for i, r in enumerate(g["runs"]):
        share = c["share"][i]
        qps = peak["values"][i] if peak else None
        lines.append(f"| `{r['run_id']}` | {_f(share, '{:.1%}')} | {_f(qps)} ({_f(c['peak_users'][i])}) | "
                     f"{_f(c['knee_users'][i])} ({_f(c['knee_qps'][i])}){_knee_iv(knee_iv[i])} | "
                     f"{_f(c['latency_knee_users'][i])}{_knee_iv(took_iv[i])} |")
    lines += [""] + [f"- gap: `{x['run']}` ({x['reason']})" for x in c["gaps"]] if c["gaps"] else []
    for r, tr in zip(g["runs"], c.get("trends") or []):  # a soak: what crept in the class's windows
        moved = "; ".join(f"{k} {slope * 60:+.3g}/min (p {t['p']:.2g}{', drifting ' + str(t.get('direction')) if t.get('drifting') else ''})"
                          for k, t in (tr or {}).items() if (slope := t.get("slope")) is not None and t.get("p") is not None)
        if moved:
            lines.append(f"- `{r['run_id']}` windows: {moved}")
    return lines + _series_lines(c["series"])


def _knee_iv(iv: list[float | None] | None) -> str:
    """" [1-4]" of a class's knee interval (a run's at its own noise, a repeated run's over its runs)."""
    if not iv or iv[0] is None:
        return ""
    return f" [{_f(iv[0])}-{'past the range' if iv[1] is None else _f(iv[1])}]"


def history_markdown(result: HistoryResult) -> str:
    th = result["thresholds"]
    lines = ["# Run history", "",
             f"Drift: Mann–Kendall p < {th['alpha']} and the Theil–Sen line moving ≥ {th['min_relative_drift']:.0%} "
             f"of the median over the last {result['window']} runs (at least {th['min_runs']}); a percentile only where "
             f"the step had ≥ {th['min_tail_rows']} requests beyond it.", ""]
    if result["drift_worse"]:
        lines += ["**Drifted worse:** " + "; ".join(f"plan `{d['plan']}`: {d['figure']}" for d in result["drift_worse"]), ""]
    lines += [f"- skipped: `{s['path']}`: {s['reason']}" for s in result["skipped"]]
    lines += [""] if result["skipped"] else []
    for g in result["groups"]:
        lines += group_markdown(g)
    return "\n".join(lines) + "\n"


def _times(g: HistoryGroup) -> list[dt.datetime | None]:
    return [None if r["started"] is None else dt.datetime.fromtimestamp(r["started"], dt.timezone.utc) for r in g["runs"]]


def _chart(g: HistoryGroup, title: str, members: list[HistorySeries], yaxis: str) -> go.Figure:
    """One line per series of ``members`` over the runs' start times, the change point of the first
    drifting one marked."""
    x = _times(g)
    fig = go.Figure()
    for s in members:
        ivs = s.get("intervals") or [None] * len(s["values"])
        error = None
        if any(iv is not None for iv in ivs):  # a repeated run's point: the interval between its runs
            error = dict(type="data", symmetric=False,
                         array=[iv[1] - v if iv and v is not None else 0 for iv, v in zip(ivs, s["values"])],
                         arrayminus=[v - iv[0] if iv and v is not None else 0 for iv, v in zip(ivs, s["values"])])
        fig.add_trace(go.Scatter(x=x, y=s["values"], mode="lines+markers", name=PERCENTILE_NAMES.get(s["metric"], s["figure"]),
                                 text=[r["run_id"] for r in g["runs"]], hovertemplate="%{text}<br>%{y:.4g}", error_y=error))
    cp = next((s["change_point"] for s in members if s["drift"]["drifting"] and s["change_point"]), None)
    if cp is not None and (when := x[cp["index"]]) is not None:
        fig.add_vline(x=when.timestamp() * 1000, line_dash="dash", line_color="grey")
        fig.add_annotation(x=when, y=1, yref="paper", text="change point", showarrow=False)
    fig.update_layout(title=title, xaxis_title="run start (UTC)", yaxis_title=yaxis, height=360)
    return fig


def group_figures(g: HistoryGroup) -> list[go.Figure]:
    by_chart: dict[str, list[HistorySeries]] = {}
    for s in g["series"]:
        key = s["figure"] if s["metric"] == "peak_qps" else s["figure"].split(" ", 1)[1]
        by_chart.setdefault(key, []).append(s)
    return [_chart(g, f"{g['plan']}: {k if members[0]['metric'] == 'peak_qps' else 'latency ' + k}", members,
                   "QPS" if members[0]["metric"] == "peak_qps" else "ms") for k, members in by_chart.items()]


def history_html(result: HistoryResult) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>kneeswarm run history</title>",
             "<style>body{font-family:sans-serif;margin:2em} pre{white-space:pre-wrap}</style>",
             "</head><body>"]
    first = True
    parts.append("<pre>" + html.escape(history_markdown(result)) + "</pre>")  # the tables, as in history.md
    for g in result["groups"]:
        parts.append(f"<h2>{html.escape(g['plan'])} → {html.escape(g['target'])}{' (soak)' if g.get('soak') else ''}</h2>")
        for fig in group_figures(g):
            parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
            first = False
        for c in g.get("classes") or []:  # each class of a mix: its charts beside the whole's
            parts.append(f"<h3>class {html.escape(c['name'])}</h3>")
            for fig in group_figures({**g, "plan": f"{g['plan']} class {c['name']}", "series": c["series"]}):
                parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
                first = False
    return "\n".join(parts) + "</body></html>\n"
