"""The SLA gate and the capacity plan of one analysis (what CI fails on, what to deploy): one entry point.

``add_gates(summary, plan)`` reads the run's resolved plan (plan.toml as a dict,
so that an analysis months later applies the SLA the run was planned with), adds to the summary

* ``sla``: kneeswarm.analysis.models.capacity.sla_check of the ``[sla]`` table plus ``set: true``; without an
  ``[sla]`` table (or an empty one) ``{set: false, passed: null, text, checks: [] ...}``;
* ``capacity``: kneeswarm.analysis.models.capacity.capacity_plan over the steps meeting the SLA (all valid steps
  when no SLA is set) with the ``[capacity]`` table's settings;

and adds the tables' problems (an unknown key, a value that is not a number) to ``warnings``;
``write_junit`` writes report/junit.xml (one test case per SLA check).  ``gate_sections(summary)``
gives the Markdown lines of both as ``[(title, lines)]`` for summary.md and the report.
"""

from __future__ import annotations

import logging
from typing import Any

from kneeswarm.analysis.schema.summary import CapacityResult, PlanTable, SlaCheck, SlaResult, Summary
from kneeswarm.analysis.summary.classes import class_sla

from kneeswarm.analysis.models.capacity import (MIN_QPS_KEY, SLA_STEP_KEYS, capacity_lines, capacity_plan, sla_check)

logger = logging.getLogger(__name__)

SLA_TITLE, CAPACITY_TITLE = "SLA", "Capacity plan"
SLA_KEYS = (*SLA_STEP_KEYS, MIN_QPS_KEY)
NO_SLA_TEXT = f"no SLA set: add an [sla] table to the plan ({', '.join(SLA_KEYS)})"


def _table(plan: Any, name: str) -> PlanTable | None:
    """The plan's ``[name]`` table, or None when absent or not a table."""
    value = plan.get(name) if isinstance(plan, dict) else None
    return value if isinstance(value, dict) else None


def no_sla() -> SlaResult:
    """The ``sla`` of a run planned without an SLA: nothing checked, nothing failed."""
    return {"set": False, "passed": None, "best": None, "limits": {}, "checks": [], "steps": [], "skipped": [],
            "problems": [], "below_best_failed": [], "text": NO_SLA_TEXT}


def evaluate(summary: Summary, plan: Any) -> tuple[SlaResult, CapacityResult]:
    """(sla, capacity) of a summary under a plan dict; never raises on a malformed plan."""
    sla_table = _table(plan, "sla")
    per_class = sla_table.get("classes") if sla_table else None  # a traffic mix's classes' own limits
    sla_table = {k: v for k, v in sla_table.items() if k != "classes"} if sla_table else sla_table
    problems = []
    if isinstance(plan, dict) and "sla" in plan and sla_table is None:
        problems.append(f"plan.toml: [sla] is not a table ({plan['sla']!r}); no SLA checked")
    if sla_table:
        sla: SlaResult = {"set": True, **sla_check(summary, sla_table)}
        sla["problems"] = problems + sla["problems"]
    else:
        sla = no_sla()
        sla["problems"] = problems
    capacity = capacity_plan(summary, sla if sla.get("set") else None, _table(plan, "capacity"))
    if isinstance(per_class, dict) and per_class:  # each class's steps against its own limits (summary/classes.py)
        sla = class_sla(sla, summary, per_class)
    return sla, capacity


def add_gates(summary: Summary, plan: Any) -> Summary:
    """Add ``sla`` and ``capacity`` to ``summary`` (and their problems to ``warnings``); no I/O."""
    sla, capacity = evaluate(summary, plan)
    summary["sla"], summary["capacity"] = sla, capacity
    warnings = list(summary.get("warnings") or [])
    summary["warnings"] = warnings + [p for p in sla["problems"] + capacity["problems"] if p not in warnings]
    return summary




# -- Markdown -------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _check_line(c: SlaCheck) -> str:
    op = "≥" if c.get("bound") == "lower" else "≤"
    users = c.get("users")
    where = f" at {users} user{'' if users == 1 else 's'}" if users is not None else " (no valid step)"
    line = f"`{c['name']}` {op} {_fmt(c['limit'])}: {_fmt(c.get('value'))}{where}: "
    if c.get("passed"):
        return line + "passed"
    alone = c.get("highest_users_alone")
    return line + "**failed**" + (f" (met alone up to {alone} users)" if alone is not None else "")


def sla_lines(sla: Any) -> list[str]:
    """The SLA's verdict, one line per check, skipped limits and problems."""
    if not isinstance(sla, dict):
        return []
    if not sla.get("set"):
        return [f"No SLA set: add an `[sla]` table to the plan ({', '.join(SLA_KEYS)})",
                *(f"problem: {p}" for p in sla.get("problems") or [])]
    head = "**PASSED**" if sla.get("passed") else "**FAILED**"
    lines = [f"{head}: {sla.get('text', '')}", *(_check_line(c) for c in sla.get("checks") or [])]
    lines += [f"`{k}`: not checked, no step carries it" for k in sla.get("skipped") or []]
    if sla.get("below_best_failed"):
        lines.append(f"steps below the best one that failed it: {sla['below_best_failed']} users")
    return lines + [f"problem: {p}" for p in sla.get("problems") or []]


def gate_sections(summary: Summary) -> list[tuple[str, list[str]]]:
    """``[(title, lines)]`` of the SLA and the capacity plan (what summary.md and the report show);
    lines use only ``**bold**`` and ``code``.  Empty when the summary has neither."""
    out = []
    if isinstance(summary.get("sla"), dict):
        out.append((SLA_TITLE, sla_lines(summary["sla"])))
    cap = summary.get("capacity")
    if isinstance(cap, dict):
        out.append((CAPACITY_TITLE, [*capacity_lines(cap), *(f"problem: {p}" for p in cap.get("problems") or [])]))
    return out
