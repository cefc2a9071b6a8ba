"""The run history per request class of a traffic mix (kneeswarm.analysis.runs.history).

``class_entries(summary)``: what the index keeps of each class of a run's ``mix``
(kneeswarm.analysis.summary.classes): its steps (users, its requests, QPS and percentiles, the
whole step's verdict), its peak (its valid step of the highest QPS, by the whole's own rule
``find_peak``), its knee and latency knee with their intervals at the run's own noise, and its own
SLA boundary where the plan set ``[sla.classes.NAME]``.  As the whole is:

* a **repeated run** (``repeated_class_entries``, from repeat.json's ``classes``:
  kneeswarm.analysis.runs.repeat_classes) is one point: each figure the mean over its runs with
  the interval between them (steps' ``ci``, ``peak_qps_interval``), its knees the median of its
  runs' with the range of its runs' knees as their interval;
* a **soak** (``soak_class_entries``) is one step of the load it held: each figure the median over
  the class's valid windows, the requests those of its smallest one, no knee (one load held), and
  beside them the trend of its windows' QPS, P50 and P99 (the whole's soak test:
  kneeswarm.analysis.summary.soak's alpha, over the windows' mid times).

``class_history(rows, figures)``: each class of a group's runs over those runs, with the whole's
own series (kneeswarm.analysis.runs.history.series: the percentiles at each users value and at its
SLA boundary, its peak QPS; the same drift test, the same rule of requests beyond a percentile, the
same change point and what changed between the runs on either side, and a repeated run's interval
beside its value), and beside them its knees over the runs with their intervals (shown, not tested:
the whole's knees are not tested either).  A run of the group in which a class has no figures (a
mix without that class, a run without a mix, a repeated run merged before its classes were) is a
gap in that class's series, said in ``gaps``.

``class_drift_worse(group)``: the entries of history.json's ``drift_worse`` for the group's classes,
named as the whole's are (``figure``: "class NAME" before the figure, and ``class`` beside).
"""

from __future__ import annotations

from statistics import median
from typing import Any, Mapping, cast

from kneeswarm.analysis.schema.history import (ClassEntry, ClassGap, HistoryClass, HistoryGroup, HistoryRow, HistoryStep,
                                               RepeatEntry)
from kneeswarm.analysis.schema.repetition import KneeSpread, Repetition
from kneeswarm.analysis.schema.summary import ClassFigures, Summary, Trend, num

__all__ = ["class_entries", "repeated_class_entries", "soak_class_entries", "class_history", "class_drift_worse"]

CLASS_KEYS = ("users", "requests", "qps", "p50_ms", "p95_ms", "p99_ms")  # a class step has no P99.9
ROW_FACTS = ("run_id", "started", "path", "input_tokens", "versions", "hosts", "plan_keys",  # for "what changed"
             "mode")  # a soak's figures are its windows' medians
SOAK_CLASS_TRENDS = ("qps", "p50_ms", "p99_ms")  # a class's window series whose trend a soak's row keeps


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
                               "sla_users": num(best.get("users")), "share": num(c.get("share")),
                               "knee_interval": _pair(knee.get("interval")),
                               "latency_knee_interval": _pair(took.get("took_off_interval"))}
    return out


def _pair(x: object) -> list[float | None] | None:
    """A knee's [lo, hi] as summary.json wrote it (hi None: past the range); None where it has none
    (a summary written before class knees had intervals)."""
    if isinstance(x, list) and len(x) == 2 and num(x[0]) is not None and (x[1] is None or num(x[1]) is not None):
        return [num(x[0]), num(x[1])]
    return None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(median(known)) if known else None


def _range(k: KneeSpread) -> list[float | None] | None:
    """A repeated run's knee interval: the range of its runs' knees (hi None: a run found none)."""
    if k.get("lo") is None:
        return None
    return [k["lo"], k["hi"] if k.get("found") == k.get("runs") else None]


def repeated_class_entries(rep: Repetition) -> dict[str, ClassEntry] | None:
    """{class: its figures as one point} of a repeated run's repeat.json ``classes``; None when it has
    none (no mix, or merged before its classes were)."""
    classes = rep.get("classes")
    if not isinstance(classes, list):
        return None
    out: dict[str, ClassEntry] = {}
    for c in classes:
        steps = [cast(HistoryStep, {"users": float(s["users"]), "requests": num(s.get("requests")),
                  **{k: s[k]["mean"] for k in CLASS_KEYS[2:]},  # type: ignore[literal-required]
                  "valid": s["valid"] >= 2 and 2 * s["valid"] >= s["ran"],
                  "ci": {k: s[k]["between"] for k in CLASS_KEYS[2:]}}) for s in c["steps"]]  # type: ignore[literal-required]
        out[c["name"]] = {"steps": steps, "peak_users": _median(c["peak"]["users"]), "peak_qps": c["peak"]["qps"]["mean"],
                          "peak_qps_interval": c["peak"]["qps"]["between"],
                          "knee_users": c["knee"]["median"], "knee_qps": None,
                          "latency_knee_users": c["latency_knee"]["median"], "sla_users": None,
                          "share": c["share"]["mean"], "knee_interval": _range(c["knee"]),
                          "latency_knee_interval": _range(c["latency_knee"])}
    return out


def soak_class_entries(summary: Summary) -> dict[str, ClassEntry] | None:
    """{class: one step of its valid windows' medians and its windows' trends} of a soak's ``mix``."""
    from kneeswarm.analysis.models.trend import drift
    from kneeswarm.analysis.summary.soak import SOAK_ALPHA, WORSE

    entries = class_entries(summary)
    if entries is None:
        return None
    soak = _dict(summary.get("soak"))
    t = _dict(soak.get("series")).get("t")
    at = {s.get("index"): x for s, x in zip(summary.get("steps") or [], t if isinstance(t, list) else [])}
    out: dict[str, ClassEntry] = {}
    for name, e in entries.items():
        windows = e["steps"]
        valid = [w for w in windows if w["valid"]]
        x = [num(at.get(i)) for i in _indices(summary, name)]
        trends: dict[str, Trend] = {}
        if len(x) == len(windows):  # each window placed in time (a soak's steps all carry their index)
            trends = {k: drift([cast(float | None, w.get(k)) if w["valid"] else None for w in windows], WORSE[k],
                               x=[float("nan") if v is None else v for v in x], alpha=SOAK_ALPHA) for k in SOAK_CLASS_TRENDS}
        step = cast(HistoryStep, {"users": valid[0].get("users"), "requests": min(w.get("requests") or 0.0 for w in valid),
                                  **{k: _median([cast(float | None, w.get(k)) for w in valid]) for k in CLASS_KEYS[2:]},
                                  "valid": True}) if valid else None
        out[name] = {"steps": [step] if step else [], "peak_users": None, "peak_qps": step.get("qps") if step else None,
                     "knee_users": None, "knee_qps": None, "latency_knee_users": None, "sla_users": None,
                     "share": e["share"], "knee_interval": None, "latency_knee_interval": None, "trends": trends}
    return out


def _indices(summary: Summary, name: str) -> list[Any]:
    """The step index of each of class ``name``'s steps, as class_entries kept them (its steps with users)."""
    classes = _dict(summary.get("mix")).get("classes")
    c = next((c for c in (classes if isinstance(classes, list) else []) if isinstance(c, dict) and c.get("name") == name), {})
    steps = c.get("steps")
    return [s.get("index") for s in (steps if isinstance(steps, list) else [])
            if isinstance(s, dict) and num(s.get("users")) is not None]


def _gap(row: HistoryRow, name: str) -> str | None:
    """Why ``name`` has no figures in ``row`` (None: it has)."""
    classes = row.get("classes")
    if classes and name in classes:
        return None
    if row.get("repeat"):
        return "a repeated run merged before its classes were (`kneeswarm analyze` on its folder merges them)"
    if classes is None:
        return "no traffic mix in this run"
    return f"the run's mix had no class {name}"


def _class_row(row: HistoryRow, name: str) -> HistoryRow:
    """The row as the whole's series read it, its figures those of class ``name`` (none in a gap)."""
    c = (row.get("classes") or {}).get(name)
    facts = cast(HistoryRow, {k: row.get(k) for k in ROW_FACTS})
    if c is None:
        return {**facts, "steps": [], "peak_qps": None, "sla_users": None}
    out: HistoryRow = {**facts, "steps": c["steps"], "peak_qps": c["peak_qps"], "sla_users": c["sla_users"]}
    if (rep := row.get("repeat")) is not None:  # one point with its interval: the series read it from "repeat"
        out["repeat"] = cast(RepeatEntry, {**rep, "peak_qps": c.get("peak_qps_interval")})
    return out


def class_history(rows: list[HistoryRow], figures: tuple[str, ...]) -> list[HistoryClass]:
    """Each class named in any of ``rows`` (a group's runs, in order) over those runs."""
    from kneeswarm.analysis.runs.history import series

    names = sorted({n for r in rows for n in (r.get("classes") or {})})
    out: list[HistoryClass] = []
    for name in names:
        entries = [(r.get("classes") or {}).get(name) for r in rows]
        gaps: list[ClassGap] = [{"run": r["run_id"], "reason": why} for r in rows if (why := _gap(r, name))]
        entry: HistoryClass = {"name": name, "gaps": gaps,
                    "share": [e["share"] if e else None for e in entries],
                    "peak_users": [e["peak_users"] if e else None for e in entries],
                    "knee_users": [e["knee_users"] if e else None for e in entries],
                    "knee_qps": [e["knee_qps"] if e else None for e in entries],
                    "latency_knee_users": [e["latency_knee_users"] if e else None for e in entries],
                    "knee_interval": [e.get("knee_interval") if e else None for e in entries],
                    "latency_knee_interval": [e.get("latency_knee_interval") if e else None for e in entries],
                    "series": series([_class_row(r, name) for r in rows], figures)}
        if any(e and "trends" in e for e in entries):  # a soak's: what crept in each run's windows
            entry["trends"] = [e.get("trends") if e else None for e in entries]
        out.append(entry)
    return out


def class_drift_worse(g: HistoryGroup) -> list[dict[str, object]]:
    """history.json's ``drift_worse`` entries of the group's classes."""
    return [{"plan": g["plan"], "target": g["target"], "soak": g["soak"], "class": c["name"],
             "figure": f"class {c['name']} {s['figure']}", **s["drift"]}
            for c in g.get("classes") or [] for s in c["series"] if s["drift"]["direction"] == "worse"]
