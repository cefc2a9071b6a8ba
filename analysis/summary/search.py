"""summary.json ``search`` (and what searching saved): what a ``[load] mode = "search"`` run probed, in order, and why.

The master records each decision in generator/search.json (kneeswarm.launch.search); the probes' figures
here are the analysis' own (summary ``steps``: the steady window's QPS, P99, validity), so the
search section and the step table never disagree.  ``grid_equivalent_s`` is the load time the
doubling grid from ``start`` to ``max`` would have taken with the same hold rule: each of its steps
at the mean probe duration (ramp + hold as measured).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kneeswarm.analysis.schema.summary import JsonValue, Knee, PlanTable, SearchSummary, Summary, SummaryStep
from kneeswarm.contracts.plan import LoadPlan
from kneeswarm.contracts.rundir import SEARCH_FILE, RunDir


def read_search(run_dir: RunDir) -> dict[str, Any] | None:  # search.json: untyped JSON from disk
    """generator/search.json, or None when it is missing or unreadable."""
    try:
        data = json.loads((run_dir.generator_dir / SEARCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def doubling_steps(start: float, top: float) -> int:
    """The number of steps of the doubling grid start, 2·start, … up to top."""
    if start <= 0 or top < start:
        return 0
    return int(math.floor(math.log2(top / start) + 1e-9)) + 1


def search_section(plan: PlanTable, steps: list[SummaryStep], decided: dict[str, Any] | None,
                   loop: str) -> SearchSummary | None:
    """The ``search`` section, or None for a run that did not search."""
    raw = plan.get("load")
    load = raw if isinstance(raw, dict) else {}
    if load.get("mode") != "search":
        return None
    decided = decided or {}
    unit = float(load.get("source_rate", LoadPlan().source_rate)) if loop == "open" else 1.0
    key = "rate" if loop == "open" else "users"
    records = {int(r["index"]): r for r in decided.get("probes") or [] if isinstance(r, dict) and "index" in r}
    probes: list[dict[str, JsonValue]] = []
    for st in steps:
        rec = records.get(int(st.get("index") or 0), {})  # index: every step has one
        t_start, t_end = st.get("t_ramp"), st.get("t_end")
        duration = (t_end - t_start) if isinstance(t_start, (int, float)) and isinstance(t_end, (int, float)) else None
        users = st.get("users")
        probes.append({key: users * unit if unit != 1.0 and users is not None else users, "why": rec.get("why"),
                       "t_start": t_start, "duration_s": duration, "qps": st.get("qps"), "p99_ms": st.get("p99_ms"),
                       "valid": bool(st.get("valid")), "steady": rec.get("steady")})
    durations = [d for p in probes if isinstance(d := p["duration_s"], (int, float))]
    start = float(load.get("start", LoadPlan().start))
    top = float(load.get("max", LoadPlan().max))
    scale = lambda b: b if b is None or unit == 1.0 else [None if v is None else v * unit for v in b]  # noqa: E731
    return {"mode": loop, "probes": probes, "knee_bracket": scale(decided.get("knee_bracket")),
            "sla_bracket": scale(decided.get("sla_bracket")),
            "stopped_because": decided.get("stopped_because") or ("no search decisions recorded (generator/"
                                                                  f"{SEARCH_FILE} missing)" if not decided else None),
            "load_s": sum(durations) if durations else None,
            "grid_equivalent_s": (doubling_steps(start, top) * sum(durations) / len(durations)) if durations else None}


def bracket_at_noise(search: SearchSummary, knee: Knee) -> None:
    """Set ``knee_at_noise`` (the knee's interval over resamples of the probes: summary.confidence)
    and ``bracket_holds``: whether the search's bracket holds that interval.  A bracket narrower
    than the run's noise is a claim the probes cannot make (seen: probes 1, 2, 4, 8, 16, 12 of an
    11-slot target gave [12, 13], and 11 was never probed), and the report says so."""
    interval, bracket = knee.get("interval"), search.get("knee_bracket")
    search["knee_at_noise"] = interval
    if not (isinstance(interval, list) and isinstance(bracket, list) and len(bracket) == 2) or \
            search.get("mode") == "open":
        search["bracket_holds"] = None  # nothing to hold against (an open loop's bracket is in rate)
        return
    lo, hi = interval
    b_lo, b_hi = bracket
    holds = (b_lo is None or (lo is not None and lo >= b_lo)) and (b_hi is None or (hi is not None and hi <= b_hi))
    search["bracket_holds"] = bool(holds)


def search_lines(summary: Summary) -> list[str]:
    """Markdown lines of the ``search`` section (none for a grid run)."""
    s = summary.get("search")
    if not isinstance(s, dict):
        return []
    key = "rate" if s.get("mode") == "open" else "users"
    lines = ["## Search", "", f"Stopped because: {s.get('stopped_because') or 'the run was stopped before the search ended'}."]
    if s.get("knee_bracket"):
        lines.append(f"Knee bracket ({key}): {s['knee_bracket']}.")
        noise = s.get("knee_at_noise")
        if s.get("bracket_holds") is False and isinstance(noise, list):
            hi = "past the tested range" if noise[1] is None else f"{noise[1]:g}"
            lines.append(f"**The bracket is narrower than this run's noise:** resampling the probes puts the knee "
                         f"between {noise[0]:g} and {hi} {key}; longer holds (or a tighter `ci`) narrow it.")
    if s.get("sla_bracket"):
        lines.append(f"SLA boundary bracket ({key}): {s['sla_bracket']}.")
    if s.get("load_s") is not None and s.get("grid_equivalent_s"):
        lines.append(f"Load time {s['load_s']:.0f} s; the doubling grid over the same range with the same hold rule: "
                     f"~{s['grid_equivalent_s']:.0f} s.")
    lines += ["", f"| # | {key} | QPS | P99 ms | valid | why |", "|---:|---:|---:|---:|---|---|"]
    for i, p in enumerate(s.get("probes") or []):
        qps = f"{p['qps']:.1f}" if isinstance(p.get("qps"), (int, float)) else "–"
        p99 = f"{p['p99_ms']:.1f}" if isinstance(p.get("p99_ms"), (int, float)) else "–"
        lines.append(f"| {i + 1} | {p.get(key):g} | {qps} | {p99} | {'yes' if p.get('valid') else 'no'} | "
                     f"{str(p.get('why') or '').replace('|', '/')} |")
    return lines + [""]
