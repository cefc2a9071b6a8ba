"""The report's section of a traffic mix: each class's knee, its steps, and a P99 chart per class.

summary.json's ``mix`` (kneeswarm.analysis.summary.classes) as Markdown lines (summary.md) and as
HTML with a plotly chart of each class's P99 and QPS against users (index.html); nothing when the
run had no mix.
"""

from __future__ import annotations

import html
import logging
import math
from typing import Any

import plotly.graph_objects as go

from kneeswarm.analysis.measure.bootstrap import MIN_ROWS_CLASS_P99
from kneeswarm.analysis.schema.comparison import Change, ClassChange
from kneeswarm.analysis.schema.summary import ClassFigures, ClassStep, Summary

logger = logging.getLogger(__name__)

TITLE = "Traffic mix: each class's figures"
HEADER = ["class", "users", "requests", "share sent", "share answered", "QPS", "P50 ms", "P95 ms", "P99 ms",
          "errors", "TTFT P99 ms", "TPOT P99 ms", "tokens/s", "goodput/s", "server req/s", "valid"]


def _f(v: Any, fmt: str = "{:,.1f}") -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "–"
    return fmt.format(v)


def _classes(summary: Summary) -> list[ClassFigures]:
    mix = summary.get("mix")
    return list(mix.get("classes") or []) if isinstance(mix, dict) else []


def at_noise(interval: Any) -> str:
    """" (2–4 at this run's noise)" of a knee's interval over the resamples of its steps; "" without one
    (a summary written before class knees had one, a soak)."""
    if not isinstance(interval, list) or len(interval) != 2 or not isinstance(interval[0], (int, float)):
        return ""
    lo, hi = interval
    if not isinstance(hi, (int, float)):
        return f" ({lo:g} users or past the tested range at this run's noise)"
    return " (the same at this run's noise)" if lo == hi else f" ({lo:g}–{hi:g} at this run's noise)"


def knee_line(c: ClassFigures) -> str:
    """One class: its weight's share, its share of the rows, where its QPS and its P99 bent (each with
    its interval at the run's noise, where the summary has one)."""
    lk, k = c.get("latency_knee") or {}, c.get("knee") or {}
    took = lk.get("took_off_users")
    p99 = (f"P99 took off at {took:g} users" if isinstance(took, (int, float)) else "P99 held over the steps") \
        + at_noise(lk.get("took_off_interval"))
    qps = (f"QPS stopped rising after {k['users']:g} users" if isinstance(k.get("users"), (int, float))
           else "no QPS knee") + at_noise(k.get("interval"))
    return (f"`{c.get('name')}`: {_f(c.get('share'), '{:.1%}')} of the requests (weight's share "
            f"{_f(c.get('weight_share'), '{:.1%}')}); {p99}; {qps}")


def rows(c: ClassFigures) -> list[list[str]]:
    out = []
    for s in c.get("steps") or []:
        st: ClassStep = s
        out.append([str(c.get("name")), _f(st.get("users"), "{:g}"), _f(st.get("requests"), "{:,}"),
                    _f(st.get("share_sent"), "{:.1%}"), _f(st.get("share_answered"), "{:.1%}"), _f(st.get("qps")),
                    _f(st.get("p50_ms")), _f(st.get("p95_ms")), _f(st.get("p99_ms")),
                    _f(st.get("error_rate"), "{:.1%}"), _f(st.get("ttft_p99_ms")), _f(st.get("tpot_p99_ms")),
                    _f(st.get("tokens_s")), _f(st.get("goodput_rps")), _f(st.get("server_rps")), "yes" if st.get("valid") else "no"])
    return out


def sla_line(summary: Summary) -> list[str]:
    """The classes' own SLAs ([sla.classes.NAME]), when the plan gave any."""
    sla = summary.get("sla")
    per = sla.get("classes") if isinstance(sla, dict) else None
    if not isinstance(per, dict) or not per:
        return []
    said = "; ".join(f"{name}: {'passed' if r.get('passed') else 'FAILED'}"
                     + (f" (best {best['users']:g} users)" if isinstance(best := r.get("best"), dict) else "")
                     for name, r in per.items())
    return [f"Each class's own SLA: {said}"]


def mix_markdown(summary: Summary) -> list[str]:
    classes = _classes(summary)
    if not classes:
        return []
    lines = [f"### {TITLE}", "", f"**{summary['mix'].get('text', '')}**", ""]
    lines += [f"- {knee_line(c)}" for c in classes] + [f"- {x}" for x in sla_line(summary)] + [""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for c in classes for r in rows(c)]
    return lines + [""]


def _figure(classes: list[ClassFigures]) -> go.Figure:
    fig = go.Figure()
    for c in classes:
        steps = sorted((s for s in c.get("steps") or [] if s.get("valid")), key=lambda s: float(s.get("users", 0)))
        users = [s.get("users") for s in steps]
        fig.add_trace(go.Scatter(x=users, y=[s.get("p99_ms") for s in steps], name=f"{c.get('name')} P99 ms",
                                 mode="lines+markers"))
        fig.add_trace(go.Scatter(x=users, y=[s.get("qps") for s in steps], name=f"{c.get('name')} QPS",
                                 mode="lines+markers", yaxis="y2", line={"dash": "dot"}))
    fig.update_layout(title="P99 and QPS of each class", xaxis={"title": "users", "type": "log"},
                      yaxis={"title": "P99 ms"}, yaxis2={"title": "QPS", "overlaying": "y", "side": "right"},
                      height=380, margin={"t": 40, "b": 40})
    return fig


def mix_html(summary: Summary) -> str:
    classes = _classes(summary)
    if not classes:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for c in classes for r in rows(c))
    return (f"<h2>{html.escape(TITLE)}</h2><p><b>{html.escape(str(summary['mix'].get('text', '')))}</b></p><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in [*map(knee_line, classes), *sla_line(summary)]) + "</ul>"
            + _figure(classes).to_html(full_html=False, include_plotlyjs=False)
            + f'<table class="steps"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def classes_lines(classes: list[ClassChange]) -> list[str]:
    """Markdown for compare.md: one table of every class's steps, and where its P99 took off."""
    if not classes:
        return []
    fmt = lambda v, f="{:,.1f}": "–" if v is None else f.format(v)  # noqa: E731

    def change(rel: float | None, c: Change | None) -> str:
        """"+50.0%", with the interval of new − base where the class's rows were resampled, starred when significant."""
        ci = c.get("ci") if c else None
        text = fmt(rel, "{:+.1%}") + (f", CI [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")
        return text + (f" **{c['direction']}**" if c and c.get("significant") and c.get("direction") else "")

    out = ["**Per class** (each change with the interval of new − base over the class's own rows, judged as the "
           f"whole's steps are, a P99 only from {MIN_ROWS_CLASS_P99:,} rows in the step; a class that regressed "
           "regresses the run):", "",
           "| class | users | QPS base | QPS new | QPS change | P99 base | P99 new | P99 change | step |",
           "|---|---|---|---|---|---|---|---|---|"]
    for c in classes:
        out += [f"| {c['name']} | {s['users']:g} | {fmt(s['qps'][0])} | {fmt(s['qps'][1])} | "
                f"{change(s['qps_rel'], s.get('qps_change'))} | {fmt(s['p99_ms'][0])} | {fmt(s['p99_ms'][1])} | "
                f"{change(s['p99_rel'], s.get('p99_change'))} | {s.get('verdict', '–')} |" for s in c["steps"]]
    out += [""] + [knee_change_line(c) for c in classes]
    return out + [""]


def _moved(flag: bool | None) -> str:
    return "" if flag is None else ("; moved beyond both runs' noise" if flag else "; within the runs' noise")


def knee_change_line(c: ClassChange) -> str:
    """"- class slow: P99 took off at 4 users (4–8 at this run's noise) (base), 2 users (...) (new); moved ..."""
    lk, k = c["latency_knee"], c["knee"]
    lki, ki = c.get("latency_knee_interval") or [None, None], c.get("knee_interval") or [None, None]
    at = lambda v, none: none if v is None else f"{v:g} users"  # noqa: E731
    return (f"- class {c['name']}: P99 took off at {at(lk[0], 'no step')}{at_noise(lki[0])} (base), "
            f"{at(lk[1], 'no step')}{at_noise(lki[1])} (new){_moved(c.get('latency_knee_moved'))}; QPS knee "
            f"{at(k[0], 'none')}{at_noise(ki[0])} (base), {at(k[1], 'none')}{at_noise(ki[1])} (new)"
            f"{_moved(c.get('knee_moved'))}")
