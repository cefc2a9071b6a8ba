"""The knee and every finding judged against the run's own noise.

A rule compares a statistic with a threshold (a drop beyond 5 %, a run queue above the cores);
near the threshold the same server gives the finding in one run and not in the next.  Here every
step's figures are resampled from its own window (kneeswarm.analysis.measure.resample: blocks of
rows and of host samples drawn together), and on each of the ``RESAMPLES`` resampled summaries the
knee is found again and every rule runs again.  The share of resamples in which a finding fires is
its ``support``:

* **confirmed** (``findings``): support >= ``CONFIRM``.  The rule's statistic clears its
  threshold by more than the run's noise: its one-sided 95 % bound is past the threshold.
* **marginal** (``findings_marginal``): support between ``NOTICE`` and ``CONFIRM``, whether or not
  it fired on the measured figures themselves: the statistic's 90 % interval straddles the
  threshold.  Shown apart, never critical (``rule_severity`` keeps what the rule would have said),
  never in a gate.
* support <= ``NOTICE``: not reported (a finding that fired on the measured figures alone, at a
  support this low, is said in the run's warnings).

The knee gets ``interval`` [lo, hi]: the 5th and 95th percentiles of the resamples' knees (hi
null where more than 5 % of them found none in the tested range), and ``stability``: the share
that found the same knee as the measured figures.  What the resampling cannot see is what
changes between runs (the server warmed up, another tenant on the host): that is what a repeated
run measures (``kneeswarm run --repeat``).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, cast

import numpy as np

from kneeswarm.analysis.findings import Context, findings
from kneeswarm.analysis.measure.resample import BLOCK_S, Replicates
from kneeswarm.analysis.models.knee import find_knee, find_latency_knee
from kneeswarm.analysis.schema.summary import (Finding, Knee, NoiseFacts, PlanTable, ServerMetrics, Summary,
                                               SummaryStep, num)

logger = logging.getLogger(__name__)

CONFIRM = 0.95  # support at or above: confirmed (a one-sided 95 % bound clears the threshold)
NOTICE = 0.05  # support above, and below CONFIRM: marginal (the 90 % interval straddles the threshold)
KNEE_QUANTILES = (0.05, 0.95)  # the knee's interval: these quantiles of the resamples' knees
MARGINAL_SEVERITY = "warning"  # the most a marginal finding may say
LEVELS = ("info", "warning", "critical")

FindingKey = tuple[str, Any]


def key_of(f: Finding) -> FindingKey:
    """A finding's identity across resamples: its id and the host it names (None for the load's)."""
    evidence = f.get("evidence")
    return str(f.get("id")), evidence.get("host") if isinstance(evidence, dict) else None


def _set(metrics: ServerMetrics, key: str, dev: float) -> None:
    """Add a deviation to one of a host's metrics (``target.<key>`` in its nested target dict)."""
    if key.startswith("target."):
        target = metrics.get("target")
        name = key[len("target."):]
        if isinstance(target, dict) and num(target.get(name)) is not None:
            metrics["target"] = {**target, name: target[name] + dev}
    elif num(metrics.get(key)) is not None:
        metrics[key] = cast(float, metrics[key]) + dev  # a number (num above)


def resampled_step(step: SummaryStep, client: dict[str, np.ndarray], server: dict[str, dict[str, np.ndarray]],
                   b: int) -> SummaryStep:
    """``step`` with its figures of resample ``b`` (the step itself where it has none)."""
    if not client and not server:
        return step
    new: SummaryStep = {**step}
    for key, values in client.items():
        new[key] = float(values[b])  # type: ignore[literal-required]  # the keys of resample.QUANTILES, qps, mean_ms
    qps, rps = num(step.get("qps")), num(step.get("rps"))
    if "qps" in client and qps and rps is not None:
        new["rps"] = rps * new["qps"] / qps  # type: ignore[operator]
    if server:
        hosts: dict[str, ServerMetrics] = {}
        for host, metrics in (step.get("server") or {}).items():
            m: ServerMetrics = dict(metrics) if isinstance(metrics, dict) else {}
            for key, devs in server.get(host, {}).items():
                if math.isfinite(devs[b]):
                    _set(m, key, float(devs[b]))
            hosts[host] = m
        new["server"] = hosts
    return new


def _knee_users(steps: list[SummaryStep]) -> tuple[float | None, float | None]:
    """(throughput knee, latency knee) users of resampled steps (their valid ones)."""
    good = [s for s in steps if s.get("valid") and num(s.get("users")) is not None]
    users = [float(s["users"]) for s in good]  # type: ignore[arg-type]
    qps = [_or_nan(s.get("qps")) for s in good]
    p99 = [_or_nan(s.get("p99_ms")) for s in good]
    return find_knee(users, qps)["users"], find_latency_knee(users, p99)["users"]


def _or_nan(v: Any) -> float:
    x = num(v)
    return math.nan if x is None else x


def knee_interval(point: Any, knees: list[float | None]) -> tuple[list[float | None] | None, float]:
    """([lo, hi] of the resamples' knees, hi None where more than 5 % found none; None when more
    than 95 % found none) and the share that found ``point``."""
    values = np.array([math.inf if k is None else float(k) for k in knees])
    if not len(values):
        return None, 0.0
    lo, hi = (float(np.quantile(values, q, method="inverted_cdf")) for q in KNEE_QUANTILES)
    same = float(np.mean(values == (math.inf if point is None else float(point))))
    if math.isinf(lo):
        return None, same
    as_users = lambda v: int(v) if float(v).is_integer() else v  # noqa: E731
    return [as_users(lo), None if math.isinf(hi) else as_users(hi)], same


def _marginal(f: Finding, support: float, at_point: bool) -> Finding:
    out: Finding = {**f, "support": round(support, 3), "at_point": at_point}  # type: ignore[typeddict-item]
    severity = str(f.get("severity"))
    if severity in LEVELS and LEVELS.index(severity) > LEVELS.index(MARGINAL_SEVERITY):
        out["rule_severity"] = severity
        out["severity"] = MARGINAL_SEVERITY
    return out


def judge(summary: Summary, plan: PlanTable, reps: Replicates) -> list[str]:
    """Split ``summary["findings"]`` into confirmed and marginal, give each its support and the
    knees their intervals (in place); the lines for the run's warnings."""
    steps = list(summary.get("steps") or [])
    counts: Counter[FindingKey] = Counter()
    seen: dict[FindingKey, Finding] = {}
    knees: list[float | None] = []
    latency_knees: list[float | None] = []
    errors: list[str] = []
    for b in range(reps.resamples):
        drawn = [resampled_step(s, reps.client[i] if i < len(reps.client) else {},
                                reps.server[i] if i < len(reps.server) else {}, b) for i, s in enumerate(steps)]
        knee, latency_knee = _knee_users(drawn)
        knees.append(knee)
        latency_knees.append(latency_knee)
        resampled = {**summary, "steps": drawn, "knee": {"users": knee}, "latency_knee": {"users": latency_knee}}
        fired = {key_of(f): cast(Finding, f) for f in findings(Context.from_summary(resampled, plan), errors)}
        counts.update(fired.keys())
        for k, f in fired.items():
            seen.setdefault(k, f)
    n = max(reps.resamples, 1)
    confirmed: list[Finding] = []
    marginal: list[Finding] = []
    warnings: list[str] = []
    point = {key_of(f): f for f in summary.get("findings") or []}
    for k, f in point.items():
        support = counts[k] / n
        if support >= CONFIRM:
            confirmed.append({**f, "support": round(support, 3)})  # type: ignore[typeddict-item]
        elif support > NOTICE:
            marginal.append(_marginal(f, support, True))
        else:
            warnings.append(f"finding {f.get('id')} fired on the measured figures but in only {support:.0%} of "
                            f"{n} resamples of the steps: left out as noise")
    for k, f in seen.items():
        if k not in point and NOTICE < counts[k] / n:
            marginal.append(_marginal(f, counts[k] / n, False))
    summary["findings"] = confirmed
    summary["findings_marginal"] = sorted(marginal, key=lambda f: -float(f.get("support") or 0.0))
    for name, found in (("knee", knees), ("latency_knee", latency_knees)):
        told: Knee = summary.get(name) or {}  # type: ignore[assignment]
        interval, stability = knee_interval(told.get("users"), found)
        told["interval"], told["stability"] = interval, round(stability, 3)
    for i, step in enumerate(steps):
        step_intervals(step, reps.client[i] if i < len(reps.client) else {},
                       reps.server[i] if i < len(reps.server) else {})
    summary["noise"] = noise_facts(reps)
    return warnings + [f"findings under resampling: {e}" for e in dict.fromkeys(errors)]


STEP_INTERVAL = (2.5, 97.5)  # percentiles of a step's resampled figures: its 95 % interval


def _interval(values: np.ndarray) -> list[float] | None:
    v = values[np.isfinite(values)]
    return [float(x) for x in np.percentile(v, STEP_INTERVAL)] if len(v) else None


def step_intervals(step: SummaryStep, client: dict[str, np.ndarray], server: dict[str, dict[str, np.ndarray]]) -> None:
    """A step's 95 % intervals over its resamples, in place: ``ci`` {qps, mean_ms, p50_ms, ...} and
    ``server_ci`` {host: {metric: [lo, hi]}} (the metric's own figure plus the resampled deviations)."""
    ci = {k: got for k, values in client.items() if (got := _interval(values)) is not None}
    if ci:
        step["ci"] = ci
    out: dict[str, dict[str, list[float]]] = {}
    for host, devs in server.items():
        metrics = (step.get("server") or {}).get(host)
        if not isinstance(metrics, dict):
            continue
        for key, dev in devs.items():
            base = num(metrics.get(key)) if not key.startswith("target.") else \
                num(tg.get(key[len("target."):]) if isinstance(tg := metrics.get("target"), dict) else None)
            if base is not None and (got := _interval(base + dev)) is not None:
                out.setdefault(host, {})[key] = got
    if out:
        step["server_ci"] = out


def noise_facts(reps: Replicates) -> NoiseFacts:
    return {"resamples": reps.resamples, "block_s": BLOCK_S, "confirm": CONFIRM, "notice": NOTICE,
            "knee_quantiles": list(KNEE_QUANTILES)}
