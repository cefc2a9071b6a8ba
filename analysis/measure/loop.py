"""Which load produced each step's numbers (the report names it): closed loop (users) or open loop
(arrival rates), and how many items a request carried (tensor protocols' ``[request] batch``).

* Open loop (``[load] arrivals = "open"``): steps.csv's ``users`` are arrival sources of
  ``source_rate`` requests/s each (kneeswarm.contracts.plan), so a step's offered rate is
  ``rate = users × source_rate`` requests/s (``steps[].rate`` in summary.json).
* ``batch`` > 1: ``items_s = qps × batch`` (successful requests/s times the inputs each carried).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from kneeswarm.analysis.schema.summary import LoadFacts, PlanTable, SummaryStep
from kneeswarm.contracts.plan import LoadPlan, RequestPlan, arrivals_of

logger = logging.getLogger(__name__)

OPEN = "open"


def _table(plan: Any, name: str) -> PlanTable:
    t = plan.get(name) if isinstance(plan, dict) else None
    return t if isinstance(t, dict) else {}


def _positive(v: Any, default: float) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else default


def load_facts(plan: Any) -> LoadFacts:
    """{loop: "closed" | "open", batch, and for open loop arrival and source_rate} of a plan dict."""
    load, request = _table(plan, "load"), _table(plan, "request")
    facts: LoadFacts = {"loop": arrivals_of(load)}
    if facts["loop"] == OPEN:
        facts["arrival"] = str(load.get("arrival", LoadPlan().arrival))
        facts["source_rate"] = _positive(load.get("source_rate"), LoadPlan().source_rate)
    batch = request.get("batch", RequestPlan().batch)
    facts["batch"] = int(batch) if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1 else 1
    return facts


def step_load_keys(users: Any, qps: Any, facts: LoadFacts) -> SummaryStep:
    """``rate`` (open loop) and ``items_s`` (batch > 1) of one step."""
    out: SummaryStep = {}
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    if facts.get("loop") == OPEN and num(users):
        out["rate"] = users * facts["source_rate"]
    if facts.get("batch", 1) > 1:
        out["items_s"] = qps * facts["batch"] if num(qps) else None
    return out


def loop_line(facts: LoadFacts) -> str:
    """One Markdown line saying which loop produced the numbers."""
    if facts.get("loop") == OPEN:
        text = (f"**Load:** open loop: each step offered `rate` requests/s ({facts.get('arrival')} arrivals, "
                f"{facts.get('source_rate'):g} req/s per source; `users` = sources); latency from the intended send time")
    else:
        text = "**Load:** closed loop: each step ran `users` users, each waiting for its answer before the next request"
    if facts.get("batch", 1) > 1:
        text += f"; {facts['batch']} items per request (items/s = QPS × {facts['batch']})"
    return text
