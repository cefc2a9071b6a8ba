"""A merged result of repeated runs (kneeswarm.analysis.runs.repeat) as markdown and as one offline
HTML page: the knee of each run and their spread, the findings counted over the runs (those that did
not repeat marked), each step's figures with the interval within each run beside the one between
the runs, and a chart of every run's curve under the mean's band."""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kneeswarm.analysis.schema.repetition import (Figure, FindingCount, KneeSpread, RepeatClass, Repetition, RepeatRun,
                                                  RepeatStep)
from kneeswarm.contracts.rundir import REPORT_HTML

logger = logging.getLogger(__name__)

__all__ = ["repeat_markdown", "repeat_html", "finding_mark", "figure_cell"]

UNSTABLE = "did not repeat"
STABLE = "repeats"
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MEAN_COLOUR = "#d62728"
STEP_METRICS = (("qps", "QPS"), ("p50_ms", "P50 ms"), ("p99_ms", "P99 ms"))


def _f(v: Any, fmt: str = "{:.4g}") -> str:
    return "–" if v is None else fmt.format(v)


def _iv(iv: list[float] | list[float | None] | None) -> str:
    """"[lo, hi]"; a knee interval open above (hi None) is "[lo, beyond]"."""
    return "–" if not iv else f"[{_f(iv[0])}, {_f(iv[1]) if iv[1] is not None else 'beyond'}]"


def finding_mark(c: FindingCount) -> str:
    """"3 of 3: repeats", "1 of 3: did not repeat", with the marginal count apart."""
    n = c["runs"]
    if c["stable"]:
        head = f"{c['label']}: {STABLE}"
    elif c["confirmed"]:
        head = f"{c['label']}: **{UNSTABLE}**"
    else:
        head = f"0 of {n} confirmed"
    if c["marginal"]:
        head += f"; marginal in {c['marginal']} of {n}"
        if not c["confirmed"]:
            head += f" ({UNSTABLE} as a confirmed finding)" if c["marginal"] < n else ""
    return head


def figure_cell(fig: Figure) -> str:
    """"mean [between lo, hi] (±x %)"."""
    if fig["mean"] is None:
        return "–"
    iv = fig["between"]
    rel = f", ±{(iv[1] - iv[0]) / 2 / fig['mean']:.1%}" if iv and fig["mean"] else ""
    return f"{fig['mean']:.4g} {_iv(iv)}{rel}" if iv else f"{fig['mean']:.4g} (one run)"


def _run_values(fig: Figure) -> str:
    """Each run's value with its own interval: "1: 80.1 [78.0, 82.3]; 2: ..."."""
    parts = []
    for i, (v, w) in enumerate(zip(fig["values"], fig["within"]), 1):
        parts.append(f"{i}: {_f(v)}" + (f" {_iv(w)}" if w else ""))
    return "; ".join(parts)


def runs_table(rep: Repetition) -> list[str]:
    lines = ["| run | knee (users) | knee interval | peak QPS | findings | marginal | complete |",
             "|---:|---:|---|---:|---|---|---|"]
    for r in rep["runs"]:
        done = "yes" if r["merged"] else f"no: {r['left_out']}"
        lines.append(f"| {r['index']} `{r['run_id']}` | {_f(r['knee_users'], '{:g}')} | {_iv(r['knee_interval'])} | "
                     f"{_f(r['peak_qps'])} | {', '.join(f'`{x}`' for x in r['findings']) or '–'} | "
                     f"{', '.join(f'`{x}`' for x in r['findings_marginal']) or '–'} | {done} |")
    return lines


def findings_table(rep: Repetition) -> list[str]:
    if not rep["findings"]:
        return ["No finding in any run."]
    lines = ["| finding | severity | confirmed | over the runs |", "|---|---|---:|---|"]
    for c in rep["findings"]:
        lines.append(f"| `{c['id']}` | {c['severity'] or '–'} | {c['confirmed']} of {c['runs']} | {finding_mark(c)} |")
    return lines


def steps_table(rep: Repetition) -> list[str]:
    lines = ["| users | valid | " + " | ".join(f"{t}: mean [between the runs]" for _, t in STEP_METRICS)
             + " | " + " | ".join(f"{t} per run [within the run]" for _, t in STEP_METRICS) + " |",
             "|---:|---:|" + "---|" * (2 * len(STEP_METRICS))]
    for s in rep["steps"]:
        lines.append(f"| {s['users']:g} | {s['valid']} of {rep['merged']} | "
                     + " | ".join(figure_cell(_fig(s, k)) for k, _ in STEP_METRICS) + " | "
                     + " | ".join(_run_values(_fig(s, k)) for k, _ in STEP_METRICS) + " |")
    return lines


def _fig(step: RepeatStep, key: str) -> Figure:
    fig: Figure = step[key]  # type: ignore[literal-required]  # key is one of STEP_METRICS
    return fig


def headline(rep: Repetition) -> list[str]:
    unstable = [c["id"] for c in rep["findings"] if not c["stable"] and c["confirmed"]]
    stable = [c["id"] for c in rep["findings"] if c["stable"]]
    lines = [f"**Knee:** {rep['knee']['text']}."]
    if (ov := rep["knee"]["overlap"]) and ov[0] is not None:
        lines.append(f"Every run's knee interval holds {ov[0]:g}" + (f"-{ov[1]:g} users." if ov[1] is not None
                                                                    else " users and beyond."))
    peak = rep["peak"]["qps"]
    lines.append(f"**Peak QPS:** {figure_cell(peak)} over {peak['n']} runs.")
    lines.append("**Findings that repeat** (confirmed in every run): " + (", ".join(f"`{x}`" for x in stable) or "none"))
    if unstable:
        lines.append(f"**Findings that did not repeat:** " + ", ".join(
            f"`{c['id']}` ({c['label']})" for c in rep["findings"] if not c["stable"] and c["confirmed"]))
    if rep["causes"]:
        lines.append("**Root cause named:** " + ", ".join(f"`{c['id']}` in {c['label']} runs" for c in rep["causes"]))
    if rep["sla"]["set"]:
        lines.append(f"**SLA:** {'PASSED' if rep['sla']['passed'] else 'FAILED'}: {rep['sla']['text']}.")
    return lines


def _holds(k: KneeSpread, what: str) -> str:
    ov = k["overlap"]
    if not ov or ov[0] is None:
        return ""
    return f"; every run's {what} interval holds {ov[0]:g}" + (f"-{ov[1]:g} users" if ov[1] is not None else " users and beyond")


def class_line(c: RepeatClass) -> str:
    """One class over the runs: its knees per repetition and their spread, its peak QPS."""
    k, lk = c["knee"], c["latency_knee"]
    per_run = ", ".join(f"{_f(a, '{:g}')}/{_f(b, '{:g}')}" for a, b in zip(k["users"], lk["users"]))
    return (f"**class {c['name']}** ({c['runs']} runs): {k['text']}{_holds(k, 'knee')}; {lk['text']}"
            f"{_holds(lk, 'took-off')} (QPS knee/took off, run by run: {per_run}); peak QPS "
            f"{figure_cell(c['peak']['qps'])}")


def classes_markdown(rep: Repetition) -> list[str]:
    """"### Each class over the runs": a line and a steps table per class (a traffic mix only)."""
    classes = rep.get("classes") or []
    if not classes:
        return []
    out = ["", "### Each class over the runs", ""]
    for c in classes:
        out += [class_line(c), ""] + steps_table({**rep, "steps": c["steps"]}) + [""]
    return out


def repeat_markdown(rep: Repetition) -> str:
    """The merged result as markdown (repeat.md; a pull-request comment)."""
    st = rep["settings"]
    done = "" if rep["complete"] else " (**incomplete**)"
    out = [f"## kneeswarm repeat: {rep['name']}, {rep['merged']} of {rep['planned']} runs merged{done}", ""]
    out += [line + "  " for line in headline(rep)] + [""]
    out += ["### Runs", ""] + runs_table(rep) + ["", "### Findings over the runs", ""] + findings_table(rep)
    out += ["", "### Steps", "",
            f"Between the runs: Student's t {st.get('confidence', 0):.0%} interval of the mean over the runs' "
            f"values. Within a run: the step's own bootstrap interval over its rows ({st.get('resamples')} "
            "resamples).", ""] + steps_table(rep)
    out += classes_markdown(rep)
    out += [f"\n**Warning:** {w}" for w in rep["warnings"]]
    return "\n".join(out) + "\n"


# -- the page ----------------------------------------------------------------------------------------
def _run_trace(fig: go.Figure, rep: Repetition, run_pos: int, run: RepeatRun, key: str, row: int) -> None:
    pts = [(s["users"], _fig(s, key)["values"][run_pos], _fig(s, key)["within"][run_pos]) for s in rep["steps"]]
    pts = [p for p in pts if p[1] is not None]
    colour = RUN_COLOURS[run_pos % len(RUN_COLOURS)]
    bars = [w for _, _, w in pts]
    error = None
    if pts and all(w is not None for w in bars):
        error = dict(type="data", symmetric=False, array=[w[1] - v for (_, v, w) in pts if w and v is not None],
                     arrayminus=[v - w[0] for (_, v, w) in pts if w and v is not None], thickness=1)
    fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", error_y=error,
                             name=f"run {run['index']}", legendgroup=f"run{run['index']}", showlegend=row == 1,
                             line=dict(color=colour, width=1), opacity=0.8), row=row, col=1)


def _mean_trace(fig: go.Figure, rep: Repetition, key: str, row: int) -> None:
    pts = [(s["users"], _fig(s, key)) for s in rep["steps"] if _fig(s, key)["mean"] is not None]
    lo = [f["between"][0] if f["between"] else f["mean"] for _, f in pts]
    hi = [f["between"][1] if f["between"] else f["mean"] for _, f in pts]
    x = [u for u, _ in pts]
    fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", fillcolor="rgba(214,39,40,0.15)",
                             line=dict(width=0), name="between the runs", legendgroup="band", showlegend=row == 1,
                             hoverinfo="skip"), row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=[f["mean"] for _, f in pts], mode="lines+markers", name="mean",
                             legendgroup="mean", showlegend=row == 1, line=dict(color=MEAN_COLOUR, width=3)),
                  row=row, col=1)


def repeat_figure(rep: Repetition) -> go.Figure:
    """QPS, P50 and P99 against users: each run with its own intervals, the mean with the band
    between the runs (log2 users axis), the knee of each run marked."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t in STEP_METRICS])
    merged = [r for r in rep["runs"] if r["merged"]]
    for row, (key, _) in enumerate(STEP_METRICS, 1):
        _mean_trace(fig, rep, key, row)
        for pos, run in enumerate(merged):
            _run_trace(fig, rep, pos, run, key, row)
    for pos, run in enumerate(merged):
        if run["knee_users"] is not None:
            fig.add_vline(x=run["knee_users"], line_dash="dot", line_color=RUN_COLOURS[pos % len(RUN_COLOURS)])
    fig.update_xaxes(type="log", dtick=0.30103, title_text="users", row=3, col=1)
    fig.update_layout(height=900, margin=dict(l=60, r=20, t=40, b=40), template="plotly_white")
    return fig


STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}.unstable{background:#fde8c8}"
         ".stable{background:#dfd}.left{color:#999}")


def _findings_html(rep: Repetition) -> str:
    rows = []
    for c in rep["findings"]:
        cls = "stable" if c["stable"] else "unstable"
        rows.append(f'<tr class="{cls}" data-finding="{html.escape(c["id"])}"><td><code>{html.escape(c["id"])}</code></td>'
                    f"<td>{html.escape(c['severity'] or '–')}</td><td>{c['confirmed']} of {c['runs']}</td>"
                    f"<td>{c['marginal']} of {c['runs']}</td><td>{html.escape(finding_mark(c).replace('**', ''))}</td>"
                    f"<td>{html.escape(c['text'])}</td></tr>")
    if not rows:
        return "<p>No finding in any run.</p>"
    return ("<table id=\"findings\"><tr><th>finding</th><th>severity</th><th>confirmed</th><th>marginal</th>"
            f"<th>over the runs</th><th>last said</th></tr>{''.join(rows)}</table>")


def _runs_html(rep: Repetition) -> str:
    rows = []
    for r in rep["runs"]:
        folder = html.escape(Path(r["run_dir"]).name)  # a sibling of the merged result's folder
        link = f'<a href="../{folder}/report/{REPORT_HTML}">{html.escape(r["run_id"])}</a>'
        cls = "" if r["merged"] else ' class="left"'
        rows.append(f"<tr{cls}><td>{r['index']}</td><td>{link}</td><td>{_f(r['knee_users'], '{:g}')}</td>"
                    f"<td>{_iv(r['knee_interval'])}</td><td>{_f(r['peak_qps'])}</td>"
                    f"<td>{html.escape(', '.join(r['findings']) or '–')}</td>"
                    f"<td>{html.escape(', '.join(r['findings_marginal']) or '–')}</td>"
                    f"<td>{'yes' if r['merged'] else html.escape('no: ' + str(r['left_out']))}</td></tr>")
    return ("<table id=\"runs\"><tr><th>run</th><th>directory</th><th>knee (users)</th><th>knee interval</th>"
            f"<th>peak QPS</th><th>findings</th><th>marginal</th><th>merged</th></tr>{''.join(rows)}</table>")


def _steps_html(rep: Repetition) -> str:
    head = "".join(f"<th>{t}: mean [between]</th><th>{t} per run [within]</th>" for _, t in STEP_METRICS)
    rows = "".join(f"<tr><td>{s['users']:g}</td><td>{s['valid']} of {rep['merged']}</td>"
                   + "".join(f"<td>{html.escape(figure_cell(_fig(s, k)))}</td><td>{html.escape(_run_values(_fig(s, k)))}</td>"
                             for k, _ in STEP_METRICS) + "</tr>" for s in rep["steps"])
    return f"<table id=\"steps\"><tr><th>users</th><th>valid</th>{head}</tr>{rows}</table>"


def repeat_html(rep: Repetition) -> str:
    """One self-contained page (plotly.js inlined: it works offline)."""
    e = html.escape
    lines = "".join(f"<li>{e(x.replace('**', '').replace('`', ''))}</li>" for x in headline(rep))
    warn = "".join(f"<li>{e(w)}</li>" for w in rep["warnings"])
    body = (f"<h1>kneeswarm repeat: {e(rep['name'])}</h1><p>{rep['merged']} of {rep['planned']} runs merged"
            f"{'' if rep['complete'] else ' (incomplete)'}</p><ul id=\"headline\">{lines}</ul>"
            + (f"<h2>Warnings</h2><ul>{warn}</ul>" if warn else "")
            + "<h2>Runs</h2>" + _runs_html(rep) + "<h2>Findings over the runs</h2>" + _findings_html(rep)
            + "<h2>Steps</h2>" + repeat_figure(rep).to_html(full_html=False, include_plotlyjs=True, div_id="repeat-chart")
            + _steps_html(rep)
            + "".join(f"<h2>class {e(c['name'])}</h2><p>{e(class_line(c).replace('**', ''))}</p>"
                      + _steps_html({**rep, "steps": c["steps"]}) for c in rep.get("classes") or []))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kneeswarm repeat {e(rep['name'])}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")
