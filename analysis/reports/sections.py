"""The explaining sections of the report, as Markdown lines shared by summary.md and index.html.

Top-down, the answer first: the verdict in one sentence, then the findings (each with its evidence and
advice), then the scalability model (USL), then the SLA and capacity plan when the summary has
them.  Lines use only ``**bold**`` and ``code`` so that report.py can turn them into HTML.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, cast

from kneeswarm.analysis.schema.summary import Finding, Knee, Summary, SummaryStep

from kneeswarm.analysis.summary.gates import CAPACITY_TITLE, gate_sections
from kneeswarm.analysis.summary.soak import soak_verdict

logger = logging.getLogger(__name__)

SEVERITY_ORDER = ("critical", "warning", "info")  # findings are listed in this order
SEVERITY_MARK = {"critical": "**CRITICAL**", "warning": "**WARNING**", "info": "**info**"}
MAX_CAUSES = 3  # findings named in the verdict


def _n(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _users(v: Any) -> str:
    f = _n(v)
    if f is None:
        return "?"
    text = f"{f:g}"
    return f"{text} user" if f == 1 else f"{text} users"


def _qps(v: Any) -> str:
    f = _n(v)
    return "?" if f is None else f"{f:,.1f} QPS"


def _valid_steps(summary: Summary) -> list[SummaryStep]:
    steps = [s for s in summary.get("steps") or [] if s.get("valid") and _n(s.get("users")) is not None]
    return sorted(steps, key=lambda s: _n(s.get("users")) or 0.0)  # each with numeric users (above)


def noise_text(knee: Knee) -> str:
    """" (2-8 users at this run's noise)" from a knee's resampled interval; "" without one."""
    interval = knee.get("interval")
    if not isinstance(interval, list) or len(interval) != 2 or _n(interval[0]) is None:
        return ""
    lo, hi = interval
    if _n(hi) is None:
        return f" ({_users(lo)} or past the tested range at this run's noise)"
    if lo == hi == knee.get("users"):
        share = _n(knee.get("stability"))
        return f" (the same knee in {share:.0%} of resamples of its steps)" if share is not None else ""
    return f" ({lo:g}–{_users(hi)} at this run's noise)"


def _main_cause(summary: Summary) -> str:
    told = summary.get("verdict")
    if isinstance(told, dict) and "causes" in told:  # the causal chain (kneeswarm.analysis.findings.causes)
        return f" **{told['text']}**" if told.get("text") else ""
    causes = [f for f in summary.get("findings") or [] if f.get("severity") in ("critical", "warning")]
    if not causes:
        return ""
    causes.sort(key=lambda f: SEVERITY_ORDER.index(f["severity"]))
    ids = list(dict.fromkeys(f["id"] for f in causes))  # one id once, even when several hosts show it
    names = ", ".join(f"`{i}`" for i in ids[:MAX_CAUSES])
    more = f" and {len(ids) - MAX_CAUSES} more" if len(ids) > MAX_CAUSES else ""
    return f" Findings: {names}{more} (below)."


def verdict(summary: Summary) -> str:
    """The result in one sentence (Markdown): where the service stopped scaling and what P99 did
    (a soak: what crept, kneeswarm.analysis.summary.soak)."""
    if summary.get("soak"):
        return soak_verdict(summary)
    valid = _valid_steps(summary)
    if not valid:
        return "**Verdict:** no valid step, so nothing can be concluded about scaling (see the warnings and each step's reasons)."
    knee, peak = summary.get("knee") or {}, summary.get("peak") or {}
    lo, hi = valid[0], valid[-1]
    p99 = lambda s: "?" if _n(s.get("p99_ms")) is None else f"{s['p99_ms']:,.1f} ms"  # noqa: E731
    if knee.get("users") is None:
        text = (f"**Verdict:** still scaling: QPS rose over the whole tested range ({_users(lo['users'])} → "
                f"{_users(hi['users'])}, up to {_qps(peak.get('qps'))}), so no knee was found; P99 went from "
                f"{p99(lo)} to {p99(hi)}.")
    else:
        at = next((s for s in valid if s["users"] == knee["users"]), lo)
        peak_text = ("its peak" if peak.get("users") == knee["users"]
                     else f"peak {_qps(peak.get('qps'))} at {_users(peak.get('users'))}")
        text = (f"**Verdict:** throughput stopped scaling at {_users(knee['users'])}{noise_text(knee)}: "
                f"{_qps(knee.get('qps'))}, {peak_text}; P99 {p99(at)}; at {_users(hi['users'])} P99 was {p99(hi)}.")
    return text + _main_cause(summary)


def _evidence(ev: Mapping[str, object]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        return str(v)
    return ", ".join(f"{k} = {fmt(v)}" for k, v in ev.items())


def sorted_findings(summary: Summary, key: str = "findings") -> list[Finding]:
    """The findings in the causal order the analysis gave them (root causes first, each followed by
    what it explains); a summary written before that order existed: critical first."""
    raw = summary.get(key) or []  # key: "findings" or "findings_marginal"
    found = [cast(Finding, f) for f in (raw if isinstance(raw, list) else []) if isinstance(f, dict)]
    if isinstance(summary.get("verdict"), dict):
        return found
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    return sorted(found, key=lambda f: rank.get(f.get("severity") or "", len(rank)))  # unknown ones last


def finding_lines(f: Finding) -> list[str]:
    """One finding: a head line, then its evidence and its advice (sub-items)."""
    users = [u for u in f.get("steps") or [] if _n(u) is not None]
    steps = ", ".join(f"{u:g}" for u in users)
    severity = f.get("severity")
    head = f"{SEVERITY_MARK.get(severity or '', severity)} `{f.get('id')}`"
    head += f" (at {steps} {'user' if users == [1] else 'users'})" if users else ""
    if f.get("explained_by"):
        head = f"↳ {head}, explained by `{f['explained_by']}`"
    support = _n(f.get("support"))
    if support is not None and support < 1.0:
        head += f" [fired in {support:.0%} of resamples]"
    if f.get("rule_severity"):
        head += f" [the rule said {f['rule_severity']}]"
    return [f"{head}: {f.get('text', '')}",
            f"evidence: `{_evidence(f.get('evidence') or {})}`",
            f"**advice:** {f.get('advice', '')}"]


def findings_section(summary: Summary) -> list[list[str]]:
    """Each finding's lines; a single line when there is none."""
    found = sorted_findings(summary)
    unchecked = [[f"not checked: {line}"] for line in summary.get("findings_unchecked") or [] if isinstance(line, str)]
    if found:
        return [finding_lines(f) for f in found] + unchecked
    if unchecked and _valid_steps(summary):
        return [["no finding: nothing in the recorded metrics points at a bottleneck over the tested range"],
                *unchecked]
    if not _valid_steps(summary):
        return [["no finding: no valid step to read"]]
    return [["no finding: nothing in the recorded metrics points at a bottleneck over the tested range"]]


def marginal_section(summary: Summary) -> list[list[str]]:
    """The marginal findings (at the run's noise: shown apart, never critical, never a gate)."""
    return [finding_lines(f) for f in sorted_findings(summary, "findings_marginal")]


MARGINAL_TITLE = "Marginal findings (within this run's noise: not confirmed)"
MARGINAL_NOTE = ("each fired in some resamples of the steps and not in others: the statistic's interval straddles "
                 "the rule's threshold, so a repeat of this run may or may not show it")


def usl_lines(summary: Summary) -> list[str]:
    """The USL fit read aloud: σ as contention, κ as coherency, N* and the peak; its caution."""
    usl = got if isinstance(got := summary.get("usl"), dict) else {}
    if not usl:
        return []
    lines = []
    if usl.get("text"):
        lines.append(str(usl["text"]))
    r2, pts = _n(usl.get("r2")), usl.get("points")
    if usl.get("sigma") is not None:
        lines.append(f"fitted over {pts} valid steps" + (f", R² = {r2:.3f}" if r2 is not None else ""))
    if usl.get("caution"):
        lines.append(f"**caution:** {usl['caution']}")
    return lines


def plan_lines(summary: Summary) -> list[tuple[str, list[str]]]:
    """(title, lines) of the SLA and the capacity plan when the summary has them (kneeswarm.analysis.summary.gates);
    a soak's SLA only (a capacity plan reads a step sweep; a soak held one load)."""
    return [(t, lines) for t, lines in gate_sections(summary) if not (summary.get("soak") and t == CAPACITY_TITLE)]
