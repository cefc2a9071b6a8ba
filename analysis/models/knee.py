"""The knee: the last step at which adding users still bought throughput (and kept P99 flat).

Two detectors, both on x = log2(users) because the steps 1, 2, 4, 8 … are uneven:

* **Kneedle** (Satopaa et al. 2011, package ``kneed``): QPS vs users is concave increasing,
  P99 vs users is convex increasing.  LLM runs also get the throughput knee on output tokens/s
  (``find_tokens_knee``).
* A **saturation rule**, because Kneedle on 5–7 points is fragile (measured here: with 3 %
  noise on a retrograde curve it picks the wrong step half the time; on a straight line it
  reports a spurious knee at the first step; a plateau that starts at the last-but-one step
  or at the first step it misses).  Throughput: the knee is the first step after which no
  later step gained ``SATURATION_GAIN`` (20 %) or more QPS per doubling of users.  Latency:
  the last step before the first one whose P99 exceeded ``LATENCY_KNEE_FACTOR`` x the first
  valid step's P99.

Policy: when both detectors name a step and agree, ``method`` is ``"kneedle"``; when the
rule finds a knee and Kneedle disagrees or finds none, the rule wins (``"saturation"`` /
``"p99_rise"``) and Kneedle's answer is kept as ``kneedle_users``; when only Kneedle finds one,
it is accepted if the curve really bends there (next doubling gains < ``KNEEDLE_CONFIRM_GAIN``
QPS, or P99 rises by >= ``KNEEDLE_CONFIRM_RISE``), else ``method`` is ``"none"`` and ``users``
is null (the service still scaled over the tested range).  One function holds that policy for
both curves (:func:`decide`).  Kneedle raising is not "no knee": the knee says ``kneedle_error``
and the run's warnings name it (:func:`kneedle_warnings`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from kneeswarm.analysis.schema.summary import Knee

logger = logging.getLogger(__name__)

SATURATION_GAIN = 0.20  # QPS gain per doubling of users below which scaling has stopped
KNEEDLE_CONFIRM_GAIN = 0.50  # Kneedle's throughput knee alone is believed if the next doubling gains less
KNEEDLE_MIN_POINTS = 4  # Kneedle is not run on fewer points
KNEEDLE_S = 1.0  # Kneedle sensitivity
LATENCY_KNEE_FACTOR = 1.5  # P99 above this x the first valid step's P99: latency has taken off
KNEEDLE_CONFIRM_RISE = 1.3  # Kneedle's latency knee alone is believed if P99 rises this much after it


def _clean(users: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(users, dtype=float)
    v = np.asarray(y, dtype=float)
    keep = np.isfinite(u) & np.isfinite(v) & (u > 0)
    u, v = u[keep], v[keep]
    order = np.argsort(u, kind="stable")
    return u[order], v[order]


def kneedle(users: np.ndarray, y: np.ndarray, curve: str,
            direction: str = "increasing") -> tuple[float | None, str | None]:
    """Kneedle on (log2 users, y): (the users at the knee or None, None), or (None, why) when
    kneed raised -- a failure the caller records (``kneedle_error``), never a silent "no knee"."""
    if len(users) < KNEEDLE_MIN_POINTS or np.ptp(y) <= 0:
        return None, None
    from kneed import KneeLocator

    x = np.log2(users)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # kneed warns "No knee/elbow found"
            knee = KneeLocator(x, y, curve=curve, direction=direction, S=KNEEDLE_S).knee
    except Exception as e:  # a degenerate curve must not stop the analysis; it is said instead
        why = f"{type(e).__name__}: {' '.join(str(e).split())}".rstrip(": ")
        logger.warning("kneedle failed on %s: %s", list(y), why)
        return None, why
    if knee is None:
        return None, None
    return float(users[int(np.argmin(np.abs(x - knee)))]), None


def gain_per_doubling(u0: float, q0: float, u1: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """Relative QPS gain per doubling of users from (u0, q0) to each (u1, q1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        doublings = np.log2(u1 / u0)
        return np.where(q0 > 0, np.power(np.maximum(q1, 0) / q0, 1.0 / doublings) - 1.0, np.inf)


def saturation_knee(users: np.ndarray, qps: np.ndarray) -> float | None:
    """First step after which no later step gained SATURATION_GAIN QPS per doubling."""
    for i in range(len(users) - 1):  # a handful of steps
        if np.all(gain_per_doubling(users[i], qps[i], users[i + 1:], qps[i + 1:]) < SATURATION_GAIN):
            return float(users[i])
    return None


def decide(u: np.ndarray, rule: float | None, kn: float | None, rule_method: str,
           bends_after: Callable[[int], bool]) -> tuple[float | None, str]:
    """The policy of the module docstring, for either curve: (users at the knee or None, method).
    The rule wins (``"kneedle"`` when Kneedle agrees, else ``rule_method``); Kneedle alone is
    believed only when ``bends_after(i)`` says the curve really bends after its step i."""
    if rule is not None:
        return rule, ("kneedle" if kn == rule else rule_method)
    if kn is not None:
        i = int(np.flatnonzero(u == kn)[0])
        if i + 1 < len(u) and bends_after(i):
            return kn, "kneedle"
    return None, "none"


def _with_kneedle(result: Knee, kn: float | None, error: str | None) -> None:
    result["kneedle_users"] = kn
    if error is not None:
        result["kneedle_error"] = error


def find_knee(users: Sequence[float], qps: Sequence[float]) -> Knee:
    """{users, qps, method, kneedle_users[, kneedle_error]} for the throughput curve (valid steps
    only); ``kneedle_error``: why Kneedle failed, when it did (the rule alone decided)."""
    u, q = _clean(users, qps)
    result: Knee = {"users": None, "qps": None, "method": "none", "kneedle_users": None}
    if len(u) < 2:
        return result
    kn, error = kneedle(u, q, curve="concave")
    _with_kneedle(result, kn, error)
    chosen, method = decide(u, saturation_knee(u, q), kn, "saturation", lambda i: gain_per_doubling(
        u[i], q[i], u[i + 1:i + 2], q[i + 1:i + 2])[0] < KNEEDLE_CONFIRM_GAIN)
    if chosen is not None:
        i = int(np.flatnonzero(u == chosen)[0])
        result.update({"users": _num(chosen), "qps": float(q[i]), "method": method})
    return result


def find_tokens_knee(users: Sequence[float], tokens_s: Sequence[float]) -> Knee:
    """{users, tokens_s, method, kneedle_users}: the throughput knee of an LLM run read on output
    tokens/s instead of requests/s (the same rules: a server that batches longer answers may keep
    gaining tokens/s after its requests/s flattened, or the reverse)."""
    knee = find_knee(users, tokens_s)
    out: Knee = {"users": knee["users"], "tokens_s": knee["qps"], "method": knee["method"],
                 "kneedle_users": knee["kneedle_users"]}
    if "kneedle_error" in knee:
        out["kneedle_error"] = knee["kneedle_error"]
    return out


def p99_rise_knee(users: np.ndarray, p99: np.ndarray) -> tuple[float | None, float | None]:
    """(last step before P99 took off, the step where it took off), by LATENCY_KNEE_FACTOR."""
    above = np.flatnonzero(p99 > LATENCY_KNEE_FACTOR * p99[0])
    if not above.size:
        return None, None
    j = int(above[0])
    return (float(users[j - 1]) if j > 0 else None), float(users[j])


def find_latency_knee(users: Sequence[float], p99_ms: Sequence[float]) -> Knee:
    """{users, p99_ms, method, took_off_users, kneedle_users[, kneedle_error]}: the last step
    before P99 took off."""
    u, p = _clean(users, p99_ms)
    result: Knee = {"users": None, "p99_ms": None, "method": "none", "took_off_users": None,
                    "kneedle_users": None}
    if len(u) < 2:
        return result
    kn, error = kneedle(u, p, curve="convex")
    _with_kneedle(result, kn, error)
    rule, took_off = p99_rise_knee(u, p)
    result["took_off_users"] = _num(took_off)
    chosen, method = decide(u, rule, kn, "p99_rise",
                            lambda i: took_off is None and p[i + 1] >= KNEEDLE_CONFIRM_RISE * p[i])
    if chosen is not None:
        i = int(np.flatnonzero(u == chosen)[0])
        result.update({"users": _num(chosen), "p99_ms": float(p[i]), "method": method})
    return result


def kneedle_warnings(**knees: Knee | None) -> list[str]:
    """One line per knee (by its summary key) whose Kneedle failed: for the run's warnings."""
    return [f"{name}: Kneedle failed ({knee['kneedle_error']}); the rule alone decided (method "
            f"{knee.get('method')})" for name, knee in knees.items() if knee and knee.get("kneedle_error")]


def find_peak(users: Sequence[float], qps: Sequence[float]) -> Knee:
    """{users, qps} of the step with the highest QPS."""
    u, q = _clean(users, qps)
    if not len(u):
        return {"users": None, "qps": None}
    i = int(np.argmax(q))
    return {"users": _num(u[i]), "qps": float(q[i])}


def _num(x: float | None) -> int | float | None:
    if x is None:
        return None
    return int(x) if float(x).is_integer() else float(x)
