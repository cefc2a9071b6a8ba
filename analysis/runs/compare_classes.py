"""Two runs of a traffic mix compared class by class (compare.json's ``classes``).

For each class in both runs' ``mix`` (kneeswarm.analysis.summary.classes): at every step valid in
both, its QPS and P99 of each run and their relative change, and where its knees lay, each with
its interval at its own run's noise (the class's rows resampled by the analysis) and whether the
two intervals are apart (``knee_moved``, ``latency_knee_moved``: the knee moved beyond both runs'
noise).  The step figures are point figures: the class's rows are not resampled here (the whole's
steps carry the bootstrap interval and decide the verdict: kneeswarm.analysis.runs.compare), so a
class's change is shown, not gated.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

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


def _interval(knee: Mapping[str, Any], key: str) -> list[int | float | None] | None:
    v = knee.get(key)
    return v if isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float)) else None


def _bounds(knee: Mapping[str, Any], key: str) -> tuple[float, float]:
    """(lo, hi) of a knee's interval: hi past the range where it is open, both past it where the
    resamples found no knee (an interval of None)."""
    iv = _interval(knee, key)
    if iv is None:
        return math.inf, math.inf
    return float(iv[0] or 0.0), math.inf if iv[1] is None else float(iv[1])


def moved(base: Mapping[str, Any], new: Mapping[str, Any], key: str) -> bool | None:
    """Whether the two knees' intervals (``key``: "interval" or "took_off_interval") are apart;
    None where either summary has no interval (written before classes' knees had one)."""
    if key not in base or key not in new:
        return None
    (lo_b, hi_b), (lo_n, hi_n) = _bounds(base, key), _bounds(new, key)
    return hi_b < lo_n or hi_n < lo_b


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
        lk = [b[name].get("latency_knee") or {}, n[name].get("latency_knee") or {}]
        k = [b[name].get("knee") or {}, n[name].get("knee") or {}]
        out.append({"name": name, "steps": steps,
                    "latency_knee": [x.get("took_off_users") for x in lk], "knee": [x.get("users") for x in k],
                    "latency_knee_interval": [_interval(x, "took_off_interval") for x in lk],
                    "knee_interval": [_interval(x, "interval") for x in k],
                    "latency_knee_moved": moved(lk[0], lk[1], "took_off_interval"),
                    "knee_moved": moved(k[0], k[1], "interval")})
    return out

