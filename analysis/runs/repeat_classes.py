"""A repeated run's traffic mix merged class by class (repeat.json's ``classes``).

Each class of the merged runs' ``mix`` (kneeswarm.analysis.summary.classes) over the runs, as
kneeswarm.analysis.runs.repeat merges the whole: each step (matched by users) with its QPS and
P50/P95/P99 per run and, over the runs, their mean with Student's t interval (between); its peak
QPS the same; its QPS knee and the users where its P99 took off per repetition, each with that
run's own interval at its own noise, and their spread ("knee 2 users in 3 of 3 runs").  A class's
steps carry no within-run interval (its rows are resampled for its knees, not for each figure).
A run whose mix lacks a class counts as a run without it (``runs``; its values None).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, cast

from kneeswarm.analysis.models.knee import find_peak
from kneeswarm.analysis.runs.repeat import figure, merge_steps, spread
from kneeswarm.analysis.schema.repetition import RepeatClass
from kneeswarm.analysis.schema.summary import ClassFigures, Summary, num

logger = logging.getLogger(__name__)

__all__ = ["merge_classes"]


def _classes(summary: Summary) -> dict[str, ClassFigures]:
    mix = summary.get("mix")
    got = mix.get("classes") if isinstance(mix, dict) else None
    return {str(c["name"]): c for c in got if isinstance(c, dict) and c.get("name")} if isinstance(got, list) else {}


def _interval(knee: Mapping[str, Any], key: str) -> list[float | None] | None:
    v = knee.get(key)
    if isinstance(v, list) and len(v) == 2 and num(v[0]) is not None and (v[1] is None or num(v[1]) is not None):
        return [num(v[0]), num(v[1])]
    return None


def _peak(c: ClassFigures | None) -> tuple[float | None, float | None]:
    """(users, QPS) of the class's valid step of the highest QPS (the whole's rule: find_peak)."""
    pts = [(u, q) for s in (c or {}).get("steps") or [] if isinstance(s, dict) and s.get("valid")
           and (u := num(s.get("users"))) is not None and (q := num(s.get("qps"))) is not None]
    peak = find_peak([u for u, _ in pts], [q for _, q in pts])
    return num(peak.get("users")), num(peak.get("qps"))


def merge_classes(summaries: list[Summary]) -> list[RepeatClass]:
    """Each class any of the merged runs' mixes has, over those runs (in run order)."""
    per_run = [_classes(s) for s in summaries]
    out: list[RepeatClass] = []
    for name in sorted({n for c in per_run for n in c}):
        mine = [c.get(name) for c in per_run]
        # a class's steps carry the keys merge_steps reads (users, valid, requests, qps, the percentiles)
        steps = merge_steps([cast(Summary, {"steps": (c or {}).get("steps") or []}) for c in mine], [{} for _ in mine])
        knees = [cast(Mapping[str, Any], (c or {}).get("knee") or {}) for c in mine]
        latency = [cast(Mapping[str, Any], (c or {}).get("latency_knee") or {}) for c in mine]
        peaks = [_peak(c) if c is not None else (None, None) for c in mine]
        out.append({"name": name, "runs": sum(c is not None for c in mine),
                    "share": figure([num(c.get("share")) if c is not None else None for c in mine]),
                    "steps": steps, "peak": {"users": [u for u, _ in peaks], "qps": figure([q for _, q in peaks])},
                    "knee": spread([num(k.get("users")) for k in knees], [_interval(k, "interval") for k in knees]),
                    "latency_knee": spread([num(k.get("took_off_users")) for k in latency],
                                           [_interval(k, "took_off_interval") for k in latency],
                                           said="P99 took off at", none="P99 took off in none of {n} runs")})
    return out
