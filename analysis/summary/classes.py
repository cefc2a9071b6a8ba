"""A traffic mix in the summary: each class's figures and knees (``mix``) and ``class_starved``.

kneeswarm.analysis.measure.classes gives each class's steps; here each class gets its own knees
(find_knee and find_latency_knee of kneeswarm.analysis.models.knee on its own series of the
valid steps: one class's latency may take off while another's holds), the class whose P99 took
off first is named, and the starvation rule of kneeswarm.analysis.findings.mix is judged against
the run's noise: support >= CONFIRM (kneeswarm.analysis.summary.confidence) confirmed, in
``findings``; above NOTICE marginal, in ``findings_marginal``.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, cast

import pandas as pd

from kneeswarm.analysis.findings.mix import finding, starved_support
from kneeswarm.analysis.measure.classes import (ClassRows, class_figures, class_models, plan_weights, read_class_rows,
                                                server_rates, sla_limits, split, SERVER_COUNTERS)
from kneeswarm.analysis.models.capacity import sla_check
from kneeswarm.analysis.models.knee import find_knee, find_latency_knee
from kneeswarm.analysis.schema.summary import (ClassFigures, ClassStep, Finding, Knee, MixSummary, PlanTable,
                                              SlaResult, Summary)
from kneeswarm.analysis.summary.confidence import CONFIRM, NOTICE
from kneeswarm.analysis.measure.target import PROMETHEUS_STREAM
from kneeswarm.contracts.rundir import TARGET_HOST, RunDir

logger = logging.getLogger(__name__)


def _series(steps: list[ClassStep], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(s.get("users", 0)), float(v)) for s in steps
           if s.get("valid") and isinstance(v := s.get(key), (int, float))]
    return [u for u, _ in pts], [v for _, v in pts]


def _knee(k: Mapping[str, Any]) -> Knee:
    return {key: v for key, v in k.items() if key in Knee.__optional_keys__}  # type: ignore[return-value]


def first_latency_knee(classes: list[ClassFigures]) -> str | None:
    """The class whose P99 took off at fewer users than every other class's (one whose P99 never
    took off comes after all that did); None when none took off, or two share the first."""
    inf = float("inf")
    at = sorted((float(k) if isinstance(k := (c.get("latency_knee") or {}).get("took_off_users"), (int, float))
                 else inf, c.get("name", "")) for c in classes)
    if not at or at[0][0] == inf or (len(at) > 1 and at[1][0] == at[0][0]):
        return None
    return at[0][1]


def mix_section(classes: list[ClassFigures]) -> MixSummary:
    for c in classes:
        steps = c.get("steps") or []
        c["knee"] = _knee(find_knee(*_series(steps, "qps")))
        c["latency_knee"] = _knee(find_latency_knee(*_series(steps, "p99_ms")))
    first = first_latency_knee(classes)
    took = next((c["latency_knee"].get("took_off_users") for c in classes if c.get("name") == first), None)
    text = (f"{len(classes)} request classes; the P99 of class {first} took off first (at {took} users)" if first else
            f"{len(classes)} request classes; no class's P99 took off before the others'")
    return {"classes": classes, "first_latency_knee": first, "text": text}


def judged(by_class: dict[str, list[ClassRows]], mix: MixSummary, valid: list[bool]) -> tuple[list[Finding], list[Finding]]:
    """(confirmed, marginal) ``class_starved`` findings."""
    steps_of = {c.get("name", ""): c.get("steps") or [] for c in mix.get("classes") or []}
    confirmed: list[Finding] = []
    marginal: list[Finding] = []
    for c, (support, at) in starved_support(by_class, valid).items():
        if support <= NOTICE:
            continue
        f = finding(c, at, steps_of, support)
        if support >= CONFIRM and at:
            confirmed.append(f)
        else:
            f["at_point"] = bool(at)
            marginal.append(f)
    return confirmed, marginal


def add_mix(summary: Summary, run: RunDir, stats: pd.DataFrame, plan: PlanTable,
            prometheus: pd.DataFrame | None = None) -> None:
    """``mix`` and the mix's findings into ``summary`` (in place), when the rows record classes;
    ``prometheus``: the target's scraped /metrics, whose per-model counters give each class's
    ``server_rps``."""
    rows = read_class_rows(run)
    if rows is None or rows.empty:
        return
    by_class = split(rows, stats)
    classes = class_figures(by_class, stats, plan_weights(plan), sla_limits(plan))
    rates = server_rates(prometheus, class_models(plan), stats)
    for c in classes:
        for step, rate in zip(c.get("steps") or [], rates.get(c.get("name", ""), [])):
            step["server_rps"] = rate
    mix = mix_section(classes)
    confirmed, marginal = judged(by_class, mix, [bool(v) for v in stats["valid"]])
    summary["mix"] = mix
    summary["findings"] = list(summary.get("findings") or []) + confirmed
    if marginal:
        summary["findings_marginal"] = list(summary.get("findings_marginal") or []) + marginal


def class_sla(sla: SlaResult, summary: Summary, per_class: PlanTable) -> SlaResult:
    """``sla`` with ``classes``: each class's steps checked against its own ``[sla.classes.NAME]``
    limits by the whole's own check (kneeswarm.analysis.models.capacity.sla_check); the run passes
    only when the whole (where it has limits) and every class with limits pass."""
    mix = summary.get("mix")
    steps_of = {c.get("name"): c.get("steps") or [] for c in (mix.get("classes") or [])} if isinstance(mix, dict) else {}
    results: dict[str, SlaResult] = {}
    for name, limits in per_class.items():
        if name not in steps_of:
            results[name] = {"passed": False, "best": None, "text": f"class {name}: no rows of this class"}
            continue
        # a class's steps carry the keys sla_check reads (users, valid, qps, the latencies)
        results[name] = sla_check(cast(Summary, {"steps": steps_of[name]}), limits if isinstance(limits, dict) else {})
    whole = sla.get("passed") if sla.get("set") else True
    failed = [n for n, r in results.items() if r.get("passed") is not True]
    text = "; ".join(f"class {n}: {'FAILED' if n in failed else 'passed'}" for n in results)
    return {**sla, "set": True, "passed": bool(whole) and not failed, "classes": results,
            "text": f"{sla['text']}; {text}" if sla.get("set") else text}



def target_prometheus(run: RunDir) -> pd.DataFrame | None:
    """The per-model request counters of the target's scraped /metrics (hosts/target/prometheus.csv:
    t and those columns; the loaded inputs keep only the series the whole's figures read), or None."""
    path = run.host_table_path(TARGET_HOST, PROMETHEUS_STREAM)
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path, usecols=lambda c: c == "t" or SERVER_COUNTERS.match(str(c)) is not None)
    except (OSError, ValueError) as e:  # a torn or empty file: the class figures go without the server's counts
        logger.warning("mix: %s unreadable (%s); no per-class server counts", path, e)
        return None
