"""A comparison result (kneeswarm.analysis.runs.compare) as markdown for a pull request and as an offline HTML page."""

from __future__ import annotations

import html
import logging
from typing import Any, Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kneeswarm.analysis.reports.mix_report import classes_lines
from kneeswarm.analysis.schema.comparison import (INTERVAL_BETWEEN_RUNS, Change, CompareSettings, Comparison,
                                                  FindingsChange, Shift, ShiftSide, StepComparison, UslChange)

logger = logging.getLogger(__name__)

BASE_COLOUR, NEW_COLOUR = "#1f77b4", "#d62728"
VERDICT_MARK = {"regressed": "❌", "improved": "✅", "no significant change": "➖", "not comparable": "⚠️",
                "not compared": "–"}


def _f(v: Any, fmt: str = "{:.4g}") -> str:
    return "–" if v is None else fmt.format(v)


def _change(c: Change | None) -> str:
    """"base → new (+x %, CI [lo, hi])", starred when significant."""
    if not c:
        return "–"
    lo_hi = c.get("ci")
    ci = f", CI [{lo_hi[0]:+.3g}, {lo_hi[1]:+.3g}]" if lo_hi else ""
    rel = _f(c.get("rel"), "{:+.1%}")
    star = f" **{c['direction']}**" if c.get("significant") and c.get("direction") else ""
    return f"{_f(c.get('base'))} → {_f(c.get('new'))} ({rel}{ci}){star}"


def step_table(result: Comparison) -> list[str]:
    lines = ["| users | QPS base → new (change, CI of the difference) | P99 ms base → new (change, CI) | step |",
             "|---:|---|---|---|"]
    for s in result.get("steps", []):
        lines.append(f"| {s['users']} | {_change(s.get('qps'))} | {_change(s.get('p99_ms'))} | "
                     f"{VERDICT_MARK.get(s['verdict'], '')} {_verdict(s)} |")
    return lines


def _over_runs(side: ShiftSide) -> str:
    """A repeated run's knee: " (1-4 over 3 runs)"; a single run's: " (2-8 at its noise)" where its
    summary has the interval, else ""."""
    if side.get("runs") is None:
        interval = side.get("interval")  # a single run's knee at its own noise (summary.confidence)
        if isinstance(interval, list) and len(interval) == 2 and interval[0] is not None:
            top = "past the range" if interval[1] is None else f"{interval[1]:g}"
            return f" ({interval[0]:g}-{top} at its noise)"
        return ""
    lo, hi = side.get("lo"), side.get("hi")
    spread = f"{lo:g}-{hi:g}" if lo is not None and hi is not None and lo != hi else "the same"
    return f" ({spread} over {side['runs']} runs)"


def shift_line(label: str, sh: Shift) -> str:
    b, n = sh.get("base") or {}, sh.get("new") or {}
    return (f"**{label}:** {_f(b.get('users'), '{:g}')} users{_over_runs(b)} at {_f(b.get('qps'))} QPS → "
            f"{_f(n.get('users'), '{:g}')} users{_over_runs(n)} at {_f(n.get('qps'))} QPS"
            + (f" (QPS {sh['qps_rel']:+.1%})" if sh.get("qps_rel") is not None else ""))


def _sides(result: Comparison) -> str:
    """base → new, each a run or a repeated run with its count of runs."""
    def one(info: Any) -> str:
        return f"`{info['run_id']}`" + (f" (repeated: {info['runs']} runs merged)" if info.get("runs") else "")
    return f"base {one(result['base'])} → new {one(result['new'])}"


def _interval_text(s: CompareSettings) -> str:
    if s.get("interval") == INTERVAL_BETWEEN_RUNS:
        return f"the {s.get('confidence', 0):.0%} interval of the change between runs (Student's t over the repeated runs)"
    return f"the {s.get('confidence', 0):.0%} bootstrap CI of the change"


def usl_line(usl: UslChange) -> str:
    b, n = usl.get("base") or {}, usl.get("new") or {}
    if b.get("sigma") is None or n.get("sigma") is None:
        return "**USL:** no fit on one of the runs"
    return (f"**USL:** σ {b['sigma']:.3g} → {n['sigma']:.3g} (contention), κ {b['kappa']:.3g} → {n['kappa']:.3g} "
            f"(coherency), predicted peak {_f(b.get('peak'))} → {_f(n.get('peak'))} QPS")


def findings_lines(f: FindingsChange) -> list[str]:
    lines = [f"- appeared: `{x['id']}` ({x['severity']}): {x['text']}" for x in f.get("appeared", [])]
    lines += [f"- vanished: `{x['id']}`: {x['text']}" for x in f.get("vanished", [])]
    return lines or ["- no finding appeared or vanished"]


def compare_markdown(result: Comparison) -> str:
    """The comparison as markdown for a pull-request comment."""
    v = result.get("verdict", "")
    s = result.get("settings", {})
    out = [f"## kneeswarm compare: {VERDICT_MARK.get(v, '')} {v}", "",
           f"{_sides(result)}; significant = {_interval_text(s)} excludes 0 and the change is at least "
           + ", ".join(f"{k} {t:.0%}" for k, t in (s.get("min_relative_change") or {}).items()), ""]
    out += [f"- {r}" for r in result.get("reasons", [])] + ([""] if result.get("reasons") else [])
    out += step_table(result) + [""]
    um = result.get("unmatched", {})
    if um.get("base_only") or um.get("new_only"):
        out += [f"Steps in one run only: base {um.get('base_only')}, new {um.get('new_only')}", ""]
    out += [shift_line("Knee", result.get("knee", {})) + "  ", shift_line("Peak", result.get("peak", {})) + "  ",
            usl_line(result.get("usl", {})), "", "**Findings:**"] + findings_lines(result.get("findings", {}))
    out += [""] + classes_lines(result.get("classes") or [])  # traffic mixes (mix_report.py)
    out += [f"\n**Warning:** {w}" for w in result.get("warnings", [])]
    return "\n".join(out) + "\n"


def _curve(fig: go.Figure, steps: list[StepComparison], side: Literal["base", "new"], metric: Literal["qps", "p99_ms"],
           row: int) -> None:
    pts = [(s["users"], s[side][metric]) for s in steps if s[side].get(metric) is not None]
    colour, name = (BASE_COLOUR, "base") if side == "base" else (NEW_COLOUR, "new")
    error = None
    if side == "new":  # the new run's points carry the interval of the change, placed on the new value
        cis = [s.get(metric) for s in steps if s[side].get(metric) is not None]
        bars = [(lo_hi, d) for c in cis if c and (lo_hi := c.get("ci")) and (d := c.get("delta")) is not None]
        if cis and len(bars) == len(cis):  # every point has its interval, or none is drawn
            error = dict(type="data", symmetric=False, array=[hi - d for (_, hi), d in bars],
                         arrayminus=[d - lo for (lo, _), d in bars])
    fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                             line=dict(color=colour), error_y=error, legendgroup=name, showlegend=row == 1),
                  row=row, col=1)


def compare_figure(result: Comparison) -> go.Figure:
    """QPS and P99 against users, both runs overlaid (log2 users axis)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("QPS (successful requests/s)", "P99 latency (ms)"))
    steps = result.get("steps", [])
    _curve(fig, steps, "base", "qps", 1)
    _curve(fig, steps, "new", "qps", 1)
    _curve(fig, steps, "base", "p99_ms", 2)
    _curve(fig, steps, "new", "p99_ms", 2)
    fig.update_xaxes(type="log", dtick=0.30103, title_text="users", row=2, col=1)
    fig.update_layout(height=650, margin=dict(l=60, r=20, t=40, b=40))
    return fig


def _cell(c: Change | None) -> str:
    text = html.escape(_change(c).replace("**", ""))
    if c and c.get("significant"):
        return f'<td class="{c["direction"]}">{text}</td>'
    return f"<td>{text}</td>"


def _verdict(s: StepComparison) -> str:
    """A step's verdict, and its note in parentheses when it has one."""
    note = s.get("note")
    return s["verdict"] + (f" ({note})" if note else "")


def html_table(result: Comparison) -> str:
    rows = "".join(f"<tr><td>{html.escape(str(s['users']))}</td>{_cell(s.get('qps'))}{_cell(s.get('p99_ms'))}"
                   f"<td>{html.escape(_verdict(s))}</td></tr>"
                   for s in result.get("steps", []))
    return ("<table><tr><th>users</th><th>QPS base → new (change, CI of the difference)</th>"
            f"<th>P99 ms base → new (change, CI)</th><th>step</th></tr>{rows}</table>")


STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:1100px}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:3px 8px}.worse{background:#fdd}.better{background:#dfd}")


def compare_html(result: Comparison) -> str:
    """One self-contained page (plotly.js inlined, so it works offline): verdict, both curves, the table."""
    e = html.escape
    lines = [f"<li>{e(r)}</li>" for r in result.get("reasons", [])]
    extra = [shift_line("Knee", result.get("knee", {})), shift_line("Peak", result.get("peak", {})),
             usl_line(result.get("usl", {}))] + findings_lines(result.get("findings", {}))
    extra += [f"Warning: {w}" for w in result.get("warnings", [])]
    body = (f"<h1>kneeswarm compare: {e(result.get('verdict', ''))}</h1>"
            f"<p>{e(_sides(result).replace('`', ''))}</p>"
            f"<ul>{''.join(lines)}</ul>"
            + compare_figure(result).to_html(full_html=False, include_plotlyjs=True)
            + html_table(result) + "<ul>" + "".join(f"<li>{e(x.replace('**', '').lstrip('- '))}</li>" for x in extra) + "</ul>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kneeswarm compare</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")
