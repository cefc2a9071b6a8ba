"""Is each step's number trustworthy?  The checks that need more than the step's own rows (else: invalid).

* **Little's law** (closed loop only): N users each either wait for a response or think, so
  N ≈ X·(R + Z) within 10 % (kneeswarm.analysis.measure.validity); a step that misses it did not hold the
  load it claims.  Open-loop steps (``[load] arrivals = "open"``) have no fixed N and are not checked.
* **Clock offsets**: every clock but the master's is corrected by a measured offset whose error
  bound is known (meta.json ``hosts[label].clock.before/after.error``, ``worker_clocks[w].error_s``
  and generator/clocks.json).  When a bound is above a tenth of a step's P50
  (``CLOCK_ERROR_SHARE_OF_P50``), aligning that step's samples and requests is not trustworthy.

A step that fails a check gets a reason in ``steps[].reasons`` and is not valid: it is left out
of the knee and the USL fit.  A note (``add_reasons(..., invalid=False)``: a search probe that ended
once its scaling was certain) is said there too and leaves the step valid.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd

from kneeswarm.analysis.schema.summary import PlanTable, as_dict
from kneeswarm.analysis.measure.validity import step_littles_law
from kneeswarm.contracts.plan import arrivals_of
from kneeswarm.contracts.rundir import Meta

logger = logging.getLogger(__name__)

CLOCK_ERROR_SHARE_OF_P50 = 0.10  # chosen, no published figure: an error bound above P50 / 10 makes a step invalid


def _num(x: Any) -> float | None:
    """A finite float of an untyped JSON value (meta.json's clock bounds, plan.toml's values may be
    numbers written as text), or None; bools are not numbers."""
    if isinstance(x, bool):
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def clock_error_bounds(meta: Meta, worker_clocks: dict[str, Any] | None = None) -> dict[str, float]:  # JSON read
    """{"host <label>" | "worker <name>": error bound in seconds} of every measured clock offset.

    A host's bound is the larger of its before/after measurements; workers from meta.json
    ``worker_clocks`` and from generator/clocks.json (``worker_clocks``), the larger where both say.
    """
    out: dict[str, float] = {}
    for label, host in sorted(meta.get("hosts", {}).items()):
        clock = as_dict(as_dict(host).get("clock"))
        errs = [e for side in ("before", "after") if (e := _num(as_dict(clock.get(side)).get("error"))) is not None]
        if errs:
            out[f"host {label}"] = max(errs)
    for source in (meta.get("worker_clocks", {}), worker_clocks or {}):
        for worker, clock in source.items():
            e = _num(as_dict(clock).get("error_s"))
            if e is not None:
                key = f"worker {worker}"
                out[key] = max(e, out.get(key, e))
    return out


def clock_reason(p50_ms: Any, bounds: dict[str, float]) -> str | None:
    """A reason when the largest clock error bound is above CLOCK_ERROR_SHARE_OF_P50 x the step's P50."""
    p50 = _num(p50_ms)
    if p50 is None or not bounds:
        return None
    source, err_s = max(bounds.items(), key=lambda kv: kv[1])
    limit_ms = CLOCK_ERROR_SHARE_OF_P50 * p50
    if err_s * 1000.0 <= limit_ms:
        return None
    return (f"clock offset error bound {err_s * 1000.0:,.2f} ms ({source}) > {CLOCK_ERROR_SHARE_OF_P50:.0%} of "
            f"P50 {p50:,.2f} ms: samples and requests cannot be aligned that finely")


def is_closed_loop(plan: PlanTable) -> bool:
    """True unless the plan's ``[load] arrivals`` (or the older ``mode = "open"``) says the load
    was open loop (arrival rates)."""
    return arrivals_of(as_dict(plan.get("load"))) == "closed"


def sla_error_rate(plan: PlanTable) -> float | None:
    """The plan's ``[sla] error_rate`` (a share, 0..1), or None when it sets none."""
    return _num(as_dict(plan.get("sla")).get("error_rate"))


def error_reason(error_rate: Any, limit: float | None) -> str | None:
    """A step whose failed share is above the SLA's: its QPS is not service the SLA accepts."""
    rate = _num(error_rate)
    if limit is None or rate is None or rate <= limit:
        return None
    return f"errors {rate:.1%} above the SLA's error_rate {limit:.1%}"


def trust_reasons(stats: pd.DataFrame, think_ms: float, closed_loop: bool,
                  bounds: dict[str, float], error_limit: float | None = None) -> list[list[str]]:
    """Per step (rows of loadstats.step_stats): the Little's-law, clock and SLA-error reasons."""
    out = []
    for step in stats.to_dict("records"):
        why = []
        if closed_loop and (r := step_littles_law(step, think_ms)) is not None:
            why.append(r)
        if (r := clock_reason(step.get("p50_ms"), bounds)) is not None:
            why.append(r)
        if (r := error_reason(step.get("error_rate"), error_limit)) is not None:
            why.append(r)
        out.append(why)
    return out


def add_reasons(stats: pd.DataFrame, extra: list[list[str]], invalid: bool = True) -> pd.DataFrame:
    """``stats`` with ``extra`` reasons appended per step; a step with any reason is not valid
    (``invalid`` False: notes, which leave its validity as it is)."""
    out = stats.copy()
    out["reasons"] = [list(r) + list(e) for r, e in zip(out["reasons"], extra)]
    if invalid:
        out["valid"] = out["valid"].to_numpy(dtype=bool) & np.asarray([not e for e in extra], dtype=bool)
    return out
