"""Two runs of a traffic mix compared class by class (compare.json's ``classes``).

For each class in both runs' ``mix`` (kneeswarm.analysis.summary.classes): at every step valid in
both, its QPS and P99 of each run and their relative change, and where its knees lay.  Point
figures: the class's rows are not resampled here (the whole's steps carry the bootstrap interval
and decide the verdict: kneeswarm.analysis.runs.compare), so a class's change is shown, not gated.
"""

from __future__ import annotations

import logging
from kneeswarm.analysis.schema.comparison import ClassChange, ClassStepChange
from kneeswarm.analysis.schema.summary import ClassFigures, ClassStep, Summary, num

logger = logging.getLogger(__name__)


def _classes(summary: Summary) -> dict[str, ClassFigures]:
    mix = summary.get("mix")
    return {str(c.get("name")): c for c in (mix.get("classes") or [])} if isinstance(mix, dict) else {}


def _rel(base: float | None, new: float | None) -> float | None:
    return (new - base) / base if base and new is not None else None


def _valid_by_users(c: ClassFigures) -> dict[float, ClassStep]:
    return {float(s["users"]): s for s in c.get("steps") or [] if s.get("valid") and num(s.get("users")) is not None}


def classes_change(base: Summary, new: Summary) -> list[ClassChange]:
    """One ClassChange per class in both mixes (empty when either run had no mix)."""
    b, n = _classes(base), _classes(new)
    out: list[ClassChange] = []
    for name in sorted(set(b) & set(n)):
        sb, sn = _valid_by_users(b[name]), _valid_by_users(n[name])
        steps: list[ClassStepChange] = []
        for u in sorted(set(sb) & set(sn)):
            q = [num(sb[u].get("qps")), num(sn[u].get("qps"))]
            p = [num(sb[u].get("p99_ms")), num(sn[u].get("p99_ms"))]
            steps.append({"users": int(u) if u.is_integer() else u, "qps": q, "p99_ms": p,
                          "qps_rel": _rel(*q), "p99_rel": _rel(*p)})
        out.append({"name": name, "steps": steps,
                    "latency_knee": [(c.get("latency_knee") or {}).get("took_off_users") for c in (b[name], n[name])],
                    "knee": [(c.get("knee") or {}).get("users") for c in (b[name], n[name])]})
    return out

