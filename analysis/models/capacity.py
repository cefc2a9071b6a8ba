"""The SLA check and the capacity plan: from measured steps to settings a team can deploy.

The rules are the digest's "From measurements to settings" (../shared/seed/DIGEST.md):

* fix the SLA first (``[sla] p99_ms``, ``error_rate``; ``ttft_ms`` / ``itl_ms`` for streaming runs);
* pick the highest tested concurrency that meets the SLA while QPS still has ≥ 30 % headroom;
* thread pool core size = 70–80 % of it, max size = 1.5–2× of it;
* queue length = tolerated queueing time / single-inference time × threads (50 ms, 1 s → 20 × threads);
* safe capacity per instance = 0.7 × max stable QPS (150 → 105); replicas = peak QPS / safe
  capacity, plus failover spares (1000 QPS peak → 10 instances, deploy 12–13).

Two entry points, both pure functions of dicts that never raise on malformed input:

* ``sla_check(summary, sla)``: which valid steps meet every limit, the highest one and its QPS,
  and whether the run passed (``sla`` in summary.json);
* ``capacity_plan(summary, sla_result, capacity)``: every figure as ``{value, formula, computed,
  inputs}`` so that the report shows the arithmetic beside the number (``capacity`` in summary.json).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, cast

from kneeswarm.analysis.schema.summary import (CapacityResult, CapacitySettings, Figure, JsonValue, PlanTable,
                                               SlaCheck, SlaResult, SlaStep, SlaStepCheck, Summary, SummaryStep, num)

logger = logging.getLogger(__name__)

# [sla] key -> where a step carries the value it limits (a dotted path into the step dict; the first
# present wins).  Every limit is an upper bound.  ttft_ms / itl_ms limit the step's P99 of the
# time to first token / of all its inter-token gaps: kneeswarm.analysis.measure.streaming writes them flat
# (``ttft_p99_ms``, ``itl_p99_ms``); the nested spellings are still read.  (Goodput judges each
# request instead: kneeswarm.analysis.measure.streaming.)
SLA_STEP_KEYS: dict[str, tuple[str, ...]] = {
    "p99_ms": ("p99_ms",),
    "error_rate": ("error_rate",),
    "ttft_ms": ("ttft_p99_ms", "ttft.p99_ms", "streaming.ttft_p99_ms"),
    "itl_ms": ("itl_p99_ms", "itl.p99_ms", "streaming.itl_p99_ms"),
}
# Limits checked only when at least one step carries the metric (non-streaming runs have no TTFT).
OPTIONAL_SLA_KEYS = ("ttft_ms", "itl_ms")
MIN_QPS_KEY = "min_qps"  # optional [sla] min_qps: the best step must also deliver this much

HEADROOM_MIN = 0.30  # digest: "the highest tested concurrency ... while QPS still has >= 30% headroom"
SAFE_FRACTION = 0.70  # digest: "Safe capacity per instance = 0.7 x max stable QPS (150 -> 105)"
CORE_FRACTION = (0.70, 0.80)  # digest: "Thread pool core size = 70-80% of that"
CORE_MIDDLE = 0.75  # the core size recommended: the middle of CORE_FRACTION
MAX_FACTOR = (1.5, 2.0)  # digest: "max size = 1.5-2x of it"
QUEUE_TOLERANCE_MS = 1000.0  # digest's example "1 s tolerance"; [capacity] queue_tolerance_ms overrides
DEFAULT_SPARE = 2  # digest: 10 instances -> "deploy 12-13": at least two failover spares


def _users(x: Any) -> int | float | None:
    f = num(x)
    return None if f is None else (int(f) if f.is_integer() else f)


def _u(s: SummaryStep | SlaStep) -> int | float:
    """The users of a valid step (valid_steps: a number)."""
    return s.get("users") or 0


def _q(s: SummaryStep) -> float:
    """The QPS of a valid step (valid_steps: a number)."""
    return s.get("qps") or 0.0


def _get(step: Mapping[str, object], path: str) -> object:
    cur: object = step
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def step_value(step: SummaryStep, key: str) -> float | None:
    """The value a step carries for the SLA key ``key`` (see SLA_STEP_KEYS), or None."""
    for path in SLA_STEP_KEYS.get(key, (key,)):
        v = num(_get(step, path))
        if v is not None:
            return v
    return None


def valid_steps(summary: Summary) -> list[SummaryStep]:
    """The summary's valid steps with numeric users and QPS (as floats), sorted by users; the rest
    left out."""
    steps = summary.get("steps") if isinstance(summary, dict) else None
    out = [cast(SummaryStep, {**s, "users": u, "qps": x}) for s in (steps if isinstance(steps, list) else [])
           if isinstance(s, dict) and s.get("valid") is True
           and (u := num(s.get("users"))) is not None and (x := num(s.get("qps"))) is not None]
    return sorted(out, key=_u)


def _limits(sla: Any) -> tuple[dict[str, float], list[str]]:
    """The numeric limits of ``sla`` and one line per key that is not usable."""
    limits: dict[str, float] = {}
    problems: list[str] = []
    for key, raw in (sla.items() if isinstance(sla, dict) else []):
        v = num(raw)
        if key not in SLA_STEP_KEYS and key != MIN_QPS_KEY:
            problems.append(f"[sla] {key}: unknown key (known: {', '.join([*SLA_STEP_KEYS, MIN_QPS_KEY])})")
        elif v is None or v < 0:
            problems.append(f"[sla] {key} = {raw!r}: not a non-negative number")
        else:
            limits[key] = v
    return limits, problems


def _step_checks(step: SummaryStep, limits: dict[str, float]) -> dict[str, SlaStepCheck]:
    out: dict[str, SlaStepCheck] = {}
    for key, limit in limits.items():
        value = step_value(step, key)
        out[key] = {"value": value, "limit": limit, "passed": value is not None and value <= limit}
    return out


def _decisive_checks(best: SlaStep | None, first: SlaStep | None, rows: list[SlaStep],
                     limits: dict[str, float]) -> list[SlaCheck]:
    """One check per limit, read at the best step (or, when none met the SLA, at the lowest
    valid step, where a limit is easiest to meet), plus the highest step meeting that limit alone."""
    at = best or first
    checks: list[SlaCheck] = []
    for key, limit in limits.items():
        alone = [_u(r) for r in rows if r["checks"][key]["passed"]]
        c: SlaStepCheck = at["checks"][key] if at else {"value": None, "limit": limit, "passed": False}
        checks.append({"name": key, "limit": limit, "value": c["value"], "passed": c["passed"],
                       "users": at["users"] if at else None, "highest_users_alone": max(alone) if alone else None})
    return checks


def _min_qps_check(best: SlaStep | None, min_qps: float) -> SlaCheck:
    value = best["qps"] if best else None
    return {"name": MIN_QPS_KEY, "limit": min_qps, "value": value, "passed": value is not None and value >= min_qps,
            "users": best["users"] if best else None, "highest_users_alone": None, "bound": "lower"}


def sla_check(summary: Summary, sla: PlanTable) -> SlaResult:  # sla: the plan's [sla] table
    """Check the valid steps of ``summary`` against the ``[sla]`` limits; never raises.

    ``sla``: ``{p99_ms, error_rate, ttft_ms, itl_ms, min_qps}`` (any subset).  A step meets the SLA
    when every limit holds (value ≤ limit; a step without the value fails it); ``ttft_ms`` and
    ``itl_ms`` are checked only when some step carries them, else listed in ``skipped``.
    Invalid steps are left out.  The run passes when at least one valid step meets the SLA (and,
    with ``min_qps``, the highest such step delivered at least that QPS).

    Returns ``{passed, best {users, qps} | None, limits, checks[], steps[], skipped[], problems[],
    below_best_failed[], text}``: ``checks``: one per limit ``{name, limit, value, passed, users,
    highest_users_alone}`` read at the best step (or the lowest valid step when none passed);
    ``steps``: ``{users, qps, meets, checks {name: {value, limit, passed}}}`` per valid step;
    ``below_best_failed``: valid steps under the best one that failed (a noisy or odd curve).
    """
    limits, problems = _limits(sla)
    given = dict(limits)
    min_qps = limits.pop(MIN_QPS_KEY, None)
    steps = valid_steps(summary)
    skipped = [k for k in OPTIONAL_SLA_KEYS if k in limits and all(step_value(s, k) is None for s in steps)]
    for k in skipped:
        limits.pop(k)
    rows: list[SlaStep] = [{"users": _users(_u(s)), "qps": _q(s), "checks": _step_checks(s, limits)} for s in steps]
    for r in rows:
        r["meets"] = all(c["passed"] for c in r["checks"].values())
    meeting = [r for r in rows if r["meets"]]
    best = meeting[-1] if meeting else None
    checks = _decisive_checks(best, rows[0] if rows else None, rows, limits)
    if min_qps is not None:
        checks.append(_min_qps_check(best, min_qps))
    passed = best is not None and all(c["passed"] for c in checks)
    below = [r["users"] for r in rows if best and _u(r) < _u(best) and not r["meets"]]
    return {"passed": passed, "best": {"users": best["users"], "qps": best["qps"]} if best else None,
            "limits": given,
            "checks": checks, "steps": rows, "skipped": skipped, "problems": problems,
            "below_best_failed": below, "text": _sla_text(passed, best, checks, rows)}


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{v:.4g}"


def _sla_text(passed: bool, best: SlaStep | None, checks: list[SlaCheck], rows: list[SlaStep]) -> str:
    if not rows:
        return "SLA not checked: no valid step"
    if not checks:
        return "SLA not checked: no limits given"
    failed = [f"{c['name']} {_fmt(c['value'])} (limit {_fmt(c['limit'])})" for c in checks if not c["passed"]]
    if best is None:
        return f"SLA FAILED at every valid step; at the lowest ({rows[0]['users']} users): " + ", ".join(failed)
    head = f"SLA met up to {best['users']} users at {_fmt(best['qps'])} QPS"
    return head if passed else f"SLA FAILED: {head}, but " + ", ".join(failed)


# -- the capacity plan ----------------------------------------------------------------------------
def figure(value: Any, formula: str, computed: str, **inputs: JsonValue) -> Figure:
    """One figure of the plan: the value, its formula in words, the formula with the numbers, the inputs."""
    return {"value": value, "formula": formula, "computed": computed, "inputs": inputs}


def _meeting_steps(summary: Summary, sla_result: SlaResult | None) -> tuple[list[SummaryStep], bool]:
    """(steps meeting the SLA as {users, qps, mean_ms}, whether an SLA was applied)."""
    by_users = {_users(_u(s)): s for s in valid_steps(summary)}
    rows = sla_result.get("steps") if isinstance(sla_result, dict) else None
    if isinstance(sla_result, dict) and isinstance(rows, list) and sla_result.get("checks"):
        keep = [by_users[r["users"]] for r in rows if r.get("meets") and r.get("users") in by_users]
        return keep, True
    return list(by_users.values()), False


def max_stable(steps: list[SummaryStep], sla_applied: bool) -> Figure:
    if not steps:
        return figure(None, "max QPS of the valid steps meeting the SLA", "no such step")
    top = max(steps, key=_q)
    which = "valid steps meeting the SLA" if sla_applied else "valid steps (no SLA given)"
    return figure(_q(top), f"max QPS of the {which}", f"{_fmt(_q(top))} QPS at {_users(_u(top))} users",
                  users=_users(_u(top)), steps=[_users(_u(s)) for s in steps])


def recommended_users(steps: list[SummaryStep], stable_qps: float | None, headroom_min: float) -> Figure:
    """The highest SLA-meeting step whose QPS leaves ≥ ``headroom_min`` of the max stable QPS unused.

    Reading of the digest's "QPS still has ≥ 30 % headroom": headroom = 1 − QPS(step) / max stable
    QPS, the share of the throughput the instance can still deliver within the SLA before it
    saturates.  So the step runs at ≤ 70 % of the max stable QPS, the same load as the safe
    capacity per instance below: the two rules of the digest agree.
    """
    formula = f"highest users meeting the SLA with 1 − QPS/max stable QPS ≥ {headroom_min:.0%}"
    if not steps or not stable_qps:
        return figure(None, formula, "no step meets the SLA", headroom_min=headroom_min)
    ok = [s for s in steps if 1.0 - _q(s) / stable_qps >= headroom_min - 1e-12]
    if not ok:
        return figure(None, formula, f"every SLA-meeting step is within {headroom_min:.0%} of {_fmt(stable_qps)} QPS",
                      headroom_min=headroom_min, max_stable_qps=stable_qps)
    s = ok[-1]
    qps = _q(s)
    return figure(_users(_u(s)), formula,
                  f"{_users(_u(s))} users: 1 − {_fmt(qps)}/{_fmt(stable_qps)} = {1 - qps / stable_qps:.0%} ≥ {headroom_min:.0%}",
                  headroom_min=headroom_min, max_stable_qps=stable_qps, qps=qps, headroom=1 - qps / stable_qps)


def _round(x: float) -> int:
    """Half up (Python's round() rounds 2.5 to 2)."""
    return math.floor(x + 0.5)


def pool_sizes(n: int | float | None) -> tuple[Figure, Figure]:
    """(core threads, max threads) from the recommended concurrency ``n``.

    Core: round(75 % × n) (the middle of the digest's 70–80 %), at least 1; range [round(0.7n), round(0.8n)].
    Max: ⌈1.5 × n⌉ (the lower end of 1.5–2×, at least core + 1 when n ≥ 1); range [⌈1.5n⌉, ⌈2n⌉].
    """
    lo, hi = CORE_FRACTION
    mlo, mhi = MAX_FACTOR
    if n is None:
        return (figure(None, f"{lo:.0%}–{hi:.0%} of the recommended concurrency", "no recommended concurrency"),
                figure(None, f"{mlo:g}–{mhi:g} × the recommended concurrency", "no recommended concurrency"))
    core = max(1, _round(CORE_MIDDLE * n))
    core_fig = figure(core, f"{lo:.0%}–{hi:.0%} of the recommended concurrency (middle: {CORE_MIDDLE:.0%})",
                      f"round({CORE_MIDDLE:.2f} × {n}) = {core}", recommended_users=n,
                      range=[max(1, _round(lo * n)), max(1, _round(hi * n))])
    mx = max(math.ceil(mlo * n), core + 1)
    max_fig = figure(mx, f"{mlo:g}–{mhi:g} × the recommended concurrency (lower end)", f"⌈{mlo:g} × {n}⌉ = {mx}",
                     recommended_users=n, range=[math.ceil(mlo * n), math.ceil(mhi * n)])
    return core_fig, max_fig


def single_inference(summary: Summary) -> Figure:
    """The single-inference time: the mean latency of the valid 1-user step (else the lowest valid step)."""
    steps = [s for s in valid_steps(summary) if num(s.get("mean_ms")) is not None]
    if not steps:
        return figure(None, "mean latency of the 1-user step", "no valid step with a mean latency")
    s = steps[0]
    note = "" if s["users"] == 1 else f" (no valid 1-user step: the lowest valid step, {_users(s['users'])} users)"
    ms = num(s["mean_ms"])
    return figure(ms, "mean latency of the 1-user step" + note, f"{_fmt(ms)} ms", users=_users(s["users"]))


def queue_length(tolerance_ms: float, inference_ms: float | None, threads: int | None) -> Figure:
    """⌊tolerated queueing time / single-inference time × threads⌋: with ``threads`` serving, a
    request at the back of a queue this long waits about ``tolerance_ms``.  ``threads`` is the
    core size: a thread pool fills its queue before it grows past the core (Java's ThreadPoolExecutor)."""
    formula = "tolerated queueing time / single-inference time × core threads"
    if not inference_ms or not threads:
        return figure(None, formula, "no single-inference time or no thread count", tolerance_ms=tolerance_ms)
    per_thread = tolerance_ms / inference_ms
    q = math.floor(per_thread * threads + 1e-9)
    return figure(q, formula, f"{_fmt(tolerance_ms)} ms / {_fmt(inference_ms)} ms × {threads} = {_fmt(per_thread)} × {threads} = {q}",
                  tolerance_ms=tolerance_ms, inference_ms=inference_ms, threads=threads, per_thread=per_thread)


def replicas(peak_qps: float | None, safe_qps: float | None, spare: int) -> tuple[Figure, Figure]:
    """(instances = ⌈peak / safe⌉, replicas = instances + spare)."""
    if peak_qps is None or not safe_qps:
        why = "no [capacity] peak_qps given" if peak_qps is None else "no safe QPS per instance"
        return figure(None, "⌈peak QPS / safe QPS per instance⌉", why), figure(None, "instances + spare", why)
    inst = math.ceil(peak_qps / safe_qps - 1e-9)
    return (figure(inst, "⌈peak QPS / safe QPS per instance⌉", f"⌈{_fmt(peak_qps)} / {_fmt(safe_qps)}⌉ = ⌈{peak_qps / safe_qps:.3g}⌉ = {inst}",
                   peak_qps=peak_qps, safe_qps=safe_qps),
            figure(inst + spare, "instances + failover spare", f"{inst} + {spare} = {inst + spare}", instances=inst, spare=spare))


def _settings(capacity: Any) -> tuple[CapacitySettings, list[str]]:
    """[capacity] values with defaults, and one line per unusable key (``capacity``: the plan's
    [capacity] table as read)."""
    cap = capacity if isinstance(capacity, dict) else {}
    out: dict[str, float | int | None] = {"peak_qps": None, "spare": DEFAULT_SPARE, "queue_tolerance_ms": QUEUE_TOLERANCE_MS,
                                         "headroom": HEADROOM_MIN, "safe_fraction": SAFE_FRACTION}
    problems = []
    for key, raw in cap.items():
        v = num(raw)
        if key not in out:
            problems.append(f"[capacity] {key}: unknown key (known: {', '.join(out)})")
        elif v is None or v < 0 or (key in ("headroom", "safe_fraction") and v > 1) or (key == "spare" and not v.is_integer()):
            problems.append(f"[capacity] {key} = {raw!r}: not a usable value; default {out[key]!r} used")
        else:
            out[key] = int(v) if key == "spare" else v
    return cast(CapacitySettings, out), problems  # its keys: CapacitySettings' (unknown ones were said, not kept)


def capacity_plan(summary: Summary, sla_result: SlaResult | None, capacity: PlanTable | None) -> CapacityResult:
    """The capacity plan of a run; never raises.  Every figure is ``{value, formula, computed, inputs}``.

    ``capacity``: ``{peak_qps, spare, queue_tolerance_ms, headroom, safe_fraction}`` (any subset;
    defaults DEFAULT_SPARE, QUEUE_TOLERANCE_MS, HEADROOM_MIN, SAFE_FRACTION).  ``sla_result``:
    ``sla_check``'s answer; None (or one with no checks) plans over all valid steps.

    Returns ``{max_stable_qps, recommended_users, core_threads, max_threads, single_inference_ms,
    queue_length, safe_qps, instances, replicas, settings, problems[], text[]}``.
    """
    cfg, problems = _settings(capacity)
    steps, applied = _meeting_steps(summary, sla_result)
    stable = max_stable(steps, applied)
    rec = recommended_users(steps, stable["value"], cfg["headroom"])
    core, mx = pool_sizes(rec["value"])
    inference = single_inference(summary)
    queue = queue_length(cfg["queue_tolerance_ms"], inference["value"], cast(int | None, core["value"]))  # pool_sizes: an int
    sv = stable["value"]
    safe = figure(None if sv is None else cfg["safe_fraction"] * sv, f"{cfg['safe_fraction']:g} × max stable QPS",
                  "no max stable QPS" if sv is None else f"{cfg['safe_fraction']:g} × {_fmt(sv)} = {_fmt(cfg['safe_fraction'] * sv)}",
                  max_stable_qps=sv, safe_fraction=cfg["safe_fraction"])
    inst, reps = replicas(cfg["peak_qps"], safe["value"], cfg["spare"])
    plan: CapacityResult = {"max_stable_qps": stable, "recommended_users": rec, "core_threads": core, "max_threads": mx,
                            "single_inference_ms": inference, "queue_length": queue, "safe_qps": safe, "instances": inst,
                            "replicas": reps, "settings": cast(CapacitySettings, cfg), "problems": problems}
    plan["text"] = capacity_lines(plan)
    return plan


CAPACITY_LABELS = (
    ("max_stable_qps", "Max stable QPS"),
    ("recommended_users", "Recommended concurrency"),
    ("core_threads", "Thread pool core size"),
    ("max_threads", "Thread pool max size"),
    ("single_inference_ms", "Single-inference time (ms)"),
    ("queue_length", "Queue length"),
    ("safe_qps", "Safe QPS per instance"),
    ("instances", "Instances for the peak"),
    ("replicas", "Replicas to deploy"),
)


def capacity_lines(plan: CapacityResult) -> list[str]:
    """One line per figure: "label: value — formula: computed" (for the markdown and the report)."""
    lines = []
    for key, label in CAPACITY_LABELS:
        f = cast(Mapping[str, object], plan.get(key) or {})  # key: one of the figures
        v = f.get("value")
        shown = "–" if v is None else (f"{v:,.1f}" if isinstance(v, float) else str(v))
        lines.append(f"{label}: {shown} — {f.get('formula', '')}: {f.get('computed', '')}")
    return lines
