"""The run history per request class of a traffic mix (kneeswarm.analysis.runs.history).

``class_entries(summary)``: what the index keeps of each class of a run's ``mix``
(kneeswarm.analysis.summary.classes): its steps (users, its requests, QPS and percentiles, the
whole step's verdict), its peak (its valid step of the highest QPS, by the whole's own rule
``find_peak``), its knee and latency knee, and its own SLA boundary where the plan set
``[sla.classes.NAME]``.

``class_history(rows, figures)``: each class of a group's runs over those runs, with the whole's
own series (kneeswarm.analysis.runs.history.series: the percentiles at each users value and at its
SLA boundary, its peak QPS; the same drift test, the same rule of requests beyond a percentile, the
same change point and what changed between the runs on either side), and beside them its knees over
the runs (shown, not tested: the whole's knees are not tested either).  A run of the group in which
a class has no figures (a mix without that class, a run without a mix, a repeated run whose classes
are not merged over its runs) is a gap in that class's series, said in ``gaps``.

``class_drift_worse(group)``: the entries of history.json's ``drift_worse`` for the group's classes,
named as the whole's are (``figure``: "class NAME" before the figure, and ``class`` beside).
"""

from __future__ import annotations

from typing import Mapping, cast

from kneeswarm.analysis.schema.history import ClassEntry, ClassGap, HistoryClass, HistoryGroup, HistoryRow, HistoryStep
from kneeswarm.analysis.schema.summary import ClassFigures, Summary, num

__all__ = ["class_entries", "class_history", "class_drift_worse"]

CLASS_KEYS = ("users", "requests", "qps", "p50_ms", "p95_ms", "p99_ms")  # a class step has no P99.9
ROW_FACTS = ("run_id", "started", "path", "input_tokens", "versions", "hosts", "plan_keys")  # for "what changed"


def _steps(c: ClassFigures) -> list[HistoryStep]:
    steps = c.get("steps")
    return [cast(HistoryStep, {**{k: num(s.get(k)) for k in CLASS_KEYS}, "valid": bool(s.get("valid"))})
            for s in (steps if isinstance(steps, list) else []) if isinstance(s, dict) and num(s.get("users")) is not None]


def _dict(x: object) -> Mapping[str, object]:
    """``x`` where summary.json has a table, else {} (a hand-edited summary: read what is there)."""
    return cast(Mapping[str, object], x) if isinstance(x, dict) else {}


def class_entries(summary: Summary) -> dict[str, ClassEntry] | None:
    """{class name: its figures} of the summary's ``mix``; None when the run had no mix."""
    from kneeswarm.analysis.models.knee import find_peak

    mix = summary.get("mix")
    if not isinstance(mix, dict):
        return None
    sla_classes = _dict(_dict(summary.get("sla")).get("classes"))
    classes = mix.get("classes")
    out: dict[str, ClassEntry] = {}
    for c in classes if isinstance(classes, list) else []:
        if not isinstance(c, dict) or not c.get("name"):
            continue
        steps = _steps(c)
        valid = [(s["users"], s["qps"]) for s in steps if s["valid"] and s["users"] is not None and s["qps"] is not None]
        peak = find_peak([u for u, _ in valid], [q for _, q in valid])
        knee, took = _dict(c.get("knee")), _dict(c.get("latency_knee"))
        best = _dict(_dict(sla_classes.get(str(c["name"]))).get("best"))
        out[str(c["name"])] = {"steps": steps, "peak_users": num(peak.get("users")), "peak_qps": num(peak.get("qps")),
                               "knee_users": num(knee.get("users")), "knee_qps": num(knee.get("qps")),
                               "latency_knee_users": num(took.get("took_off_users")),
                               "sla_users": num(best.get("users")), "share": num(c.get("share"))}
    return out


def _gap(row: HistoryRow, name: str) -> str | None:
    """Why ``name`` has no figures in ``row`` (None: it has)."""
    classes = row.get("classes")
    if classes and name in classes:
        return None
    if row.get("repeat"):
        return "a repeated run: its classes are not merged over its runs"
    if classes is None:
        return "no traffic mix in this run"
    return f"the run's mix had no class {name}"


def _class_row(row: HistoryRow, name: str) -> HistoryRow:
    """The row as the whole's series read it, its figures those of class ``name`` (none in a gap)."""
    c = (row.get("classes") or {}).get(name)
    facts = cast(HistoryRow, {k: row.get(k) for k in ROW_FACTS})
    if c is None:
        return {**facts, "steps": [], "peak_qps": None, "sla_users": None}
    return {**facts, "steps": c["steps"], "peak_qps": c["peak_qps"], "sla_users": c["sla_users"]}


def class_history(rows: list[HistoryRow], figures: tuple[str, ...]) -> list[HistoryClass]:
    """Each class named in any of ``rows`` (a group's runs, in order) over those runs."""
    from kneeswarm.analysis.runs.history import series

    names = sorted({n for r in rows for n in (r.get("classes") or {})})
    out: list[HistoryClass] = []
    for name in names:
        entries = [(r.get("classes") or {}).get(name) for r in rows]
        gaps: list[ClassGap] = [{"run": r["run_id"], "reason": why} for r in rows if (why := _gap(r, name))]
        out.append({"name": name, "gaps": gaps,
                    "share": [e["share"] if e else None for e in entries],
                    "peak_users": [e["peak_users"] if e else None for e in entries],
                    "knee_users": [e["knee_users"] if e else None for e in entries],
                    "knee_qps": [e["knee_qps"] if e else None for e in entries],
                    "latency_knee_users": [e["latency_knee_users"] if e else None for e in entries],
                    "series": series([_class_row(r, name) for r in rows], figures)})
    return out


def class_drift_worse(g: HistoryGroup) -> list[dict[str, object]]:
    """history.json's ``drift_worse`` entries of the group's classes."""
    return [{"plan": g["plan"], "target": g["target"], "soak": g["soak"], "class": c["name"],
             "figure": f"class {c['name']} {s['figure']}", **s["drift"]}
            for c in g.get("classes") or [] for s in c["series"] if s["drift"]["direction"] == "worse"]
