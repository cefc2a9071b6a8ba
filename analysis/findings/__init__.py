"""Findings: why the service stopped scaling, with the numbers that say so (no graph to read).

``explain(summary, plan=None)`` takes a summary dict as ``analysis.summarize`` returns it and
returns ``{"findings": [...], "usl": {...}, "littles_law": [...], "rule_errors": [...], "unchecked": [...]}``:

* ``findings``: ``{id, severity, steps, evidence, text, advice}`` from the rules below, in the
  order of ``RULES`` (ids: ``FINDING_IDS``; thresholds: the UPPER_CASE constants of each rule
  module, each with its source).  Rules look at the valid steps at or after the knee unless
  their module says otherwise; a missing metric means a rule does not fire.  Beyond the ids first
  specified: ``host_contended`` (the host was full, but mostly with other processes' work).
* ``usl``: ``fit_usl`` over the valid steps' (users, qps), plus ``curve`` (the fitted curve from 1
  to the highest users tested) and ``text`` (σ read as contention, κ as coherency cost).
* ``littles_law``: ``{users, reason}`` for each step where users ≠ QPS × (mean latency + think
  time) within 10 % (think time: ``plan["load"]["wait_ms"]``).
* ``rule_errors``: one line per rule that raised (the others still ran); empty normally.
* ``unchecked``: one line per LLM-engine rule a streaming run's server metrics could not feed
  (llm_engine.unchecked): what could not be checked, not a finding.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, TypedDict

from kneeswarm.analysis.findings import cgroup, cpu, engine, llm_engine, load, memory_gpu, scaling
from kneeswarm.analysis.findings.context import Context, as_dict
from kneeswarm.analysis.schema.summary import Finding, PlanTable, Summary, UslFit, num
from kneeswarm.analysis.findings.finding import FINDING_IDS, SEVERITY
from kneeswarm.analysis.measure.validity import littles_law_reason, step_littles_law
from kneeswarm.analysis.models.usl import describe, fit_usl, usl_curve

logger = logging.getLogger(__name__)

__all__ = ["explain", "FINDING_IDS", "SEVERITY", "RULES", "littles_law_reason", "step_littles_law"]

class LittleCheck(TypedDict):
    """A step whose users, throughput and latency disagree with Little's law, and why."""

    users: int | float | None
    reason: str


class Explanation(TypedDict):
    """What :func:`explain` finds in a summary."""

    findings: list[Finding]
    usl: UslFit
    littles_law: list[LittleCheck]
    unchecked: list[str]
    rule_errors: list[str]


Rule = Callable[[Context], list[Finding]]
RULES: tuple[Rule, ...] = (
    load.generator_bound,
    load.retrograde,
    cpu.cpu_saturated,
    cpu.run_queue_over_cores,
    cpu.host_contended,
    cpu.threads_over_cores,
    cpu.single_thread_bound,
    cpu.kernel_time_high,
    cpu.switch_storm,
    cpu.migrations_high,
    cpu.io_wait,
    cgroup.cpu_throttled,
    cgroup.memory_limit_near,
    scaling.efficiency_falling,
    scaling.latency_swinging,
    memory_gpu.model_copies,
    memory_gpu.gpu_serialized,
    memory_gpu.gpu_memory_creep,
    load.queue_pushback,
    load.unbounded_queue,
    engine.engine_oversubscribed,
    llm_engine.kv_cache_full,
    llm_engine.preemption,
    llm_engine.queue_growing,
    llm_engine.prefill_bound,
    llm_engine.decode_bound,
    llm_engine.prefix_cache_cold,
)
# Rules that name a cause only when the others found none: they get the ids found so far.
RESIDUAL_RULES = (load.waiting_not_computing,)


def _run(rule: Callable[..., list[Any]], errors: list[str], *args: Any) -> list[Any]:
    try:
        return list(rule(*args))
    except Exception as exc:  # noqa: BLE001 — one broken rule must not hide the others' findings
        logger.warning("finding rule %s failed: %s", rule.__name__, exc, exc_info=True)
        errors.append(f"rule {rule.__name__} failed: {type(exc).__name__}: {exc}")
        return []


def findings(ctx: Context, errors: list[str]) -> list[Finding]:
    out: list[Finding] = []
    for rule in RULES:
        out += _run(rule, errors, ctx)
    found = {f["id"] for f in out}
    for residual in RESIDUAL_RULES:
        out += _run(residual, errors, ctx, found)
    return out


def usl_section(ctx: Context) -> UslFit:
    points = [(u, num(s.get("qps"))) for s in ctx.valid if (u := num(s.get("users"))) is not None]  # all (Context)
    fit = fit_usl([u for u, _ in points], [math.nan if x is None else x for _, x in points])  # NaN: left out
    fit["curve"] = usl_curve(fit, max((u for u, _ in points), default=0))
    fit["text"] = describe(fit)
    return fit


def usl_rule(ctx: Context) -> list[UslFit]:
    return [usl_section(ctx)]


def littles_law(ctx: Context) -> list[LittleCheck]:
    think = num(as_dict(ctx.plan.get("load")).get("wait_ms")) or 0.0
    return [{"users": s.get("users"), "reason": r} for s in ctx.steps if (r := step_littles_law(s, think)) is not None]


def explain(summary: Summary | dict[str, Any], plan: PlanTable | None = None) -> Explanation:  # a summary read back too
    """Findings, the USL fit and Little's-law checks of a summary dict; never raises.

    ``plan``: ``Plan.to_dict()`` (or the Plan itself); read: ``load.wait_ms`` (think time) and the
    engine knobs of analysis/findings/engine.py.
    """
    errors: list[str] = []
    try:
        ctx = Context.from_summary(summary, plan)
    except Exception as exc:  # noqa: BLE001 — a summary too broken to read still gets an answer
        logger.warning("explain: unreadable summary: %s", exc)
        return {"findings": [], "usl": fit_usl([], []), "littles_law": [], "unchecked": [],
                "rule_errors": [f"summary unreadable: {type(exc).__name__}: {exc}"]}
    usl = _run(usl_rule, errors, ctx)
    return {"findings": findings(ctx, errors), "usl": usl[0] if usl else fit_usl([], []),
            "littles_law": _run(littles_law, errors, ctx), "unchecked": _run(llm_engine.unchecked, errors, ctx),
            "rule_errors": errors}
