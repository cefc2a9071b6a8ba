"""A traffic mix in the summary: each class's figures and knees (``mix``), ``class_starved`` and
``adapters_over_capacity`` (kneeswarm.analysis.findings.adapters, judged the same way).

kneeswarm.analysis.measure.classes gives each class's steps; here each class gets its own knees
(find_knee and find_latency_knee of kneeswarm.analysis.models.knee on its own series of the
valid steps: one class's latency may take off while another's holds), the class whose P99 took
off first is named, and the starvation rule of kneeswarm.analysis.findings.mix is judged against
the run's noise: support >= CONFIRM (kneeswarm.analysis.summary.confidence) confirmed, in
``findings``; above NOTICE marginal, in ``findings_marginal``.

Each class's knees carry their interval at the run's own noise, as the whole's do: the class's
answered rows of each step are resampled by the whole's own machinery
(kneeswarm.analysis.measure.resample: the same blocks of the step's window, drawn by the same
``block_picks`` as the whole's step, so a class and the whole move together), its knee rules run
again on each of ``RESAMPLES`` draws, and ``interval`` / ``stability`` are confidence.py's
``knee_interval`` of those knees; the latency knee also gets ``took_off_interval``, the same of
the step where its P99 took off.  A class's QPS is resampled from its blocks' counts (each request
draws its class, so a class's count per block moves with the draws; Little's law, which gives the
whole's QPS in a closed loop, does not split by class: the users are shared).  The class named
first is only said to be first where its took-off interval lies below every other class's
(``first_latency_knee_apart``); where they overlap, the sentence says so.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, cast

import math

import numpy as np
import pandas as pd

from kneeswarm.analysis.findings import adapters
from kneeswarm.analysis.findings.mix import finding, starved_support
from kneeswarm.analysis.measure.classes import (ClassRows, class_figures, class_models, plan_weights, read_class_rows,
                                                server_rates, sla_limits, split, SERVER_COUNTERS)
from kneeswarm.analysis.measure.resample import RESAMPLES, BlockSample, block_picks, client_replicates
from kneeswarm.analysis.models.capacity import sla_check
from kneeswarm.analysis.models.knee import find_knee, find_latency_knee
from kneeswarm.analysis.schema.summary import (ClassFigures, ClassStep, Finding, Knee, MixSummary, PlanTable,
                                              SlaResult, Summary)
from kneeswarm.analysis.summary.confidence import CONFIRM, NOTICE, knee_interval
from kneeswarm.analysis.summary.soak import soak_knees
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


def _bounds(iv: object) -> tuple[float, float]:
    """(lo, hi) users of a took-off interval; [lo, None] reaches past the range, None lies past it."""
    if not isinstance(iv, list) or len(iv) != 2 or not isinstance(iv[0], (int, float)):
        return math.inf, math.inf
    return float(iv[0]), math.inf if iv[1] is None else float(iv[1])


def overlapping(classes: list[ClassFigures], first: str) -> list[str]:
    """The other classes whose took-off interval reaches down to ``first``'s (its P99 may have
    taken off as early at this run's noise)."""
    empty: ClassFigures = {}
    mine = next((c for c in classes if c.get("name") == first), empty)
    hi = _bounds((mine.get("latency_knee") or {}).get("took_off_interval"))[1]
    return [str(c.get("name")) for c in classes if c.get("name") != first
            and _bounds((c.get("latency_knee") or {}).get("took_off_interval"))[0] <= hi]


def _span(iv: object) -> str:
    lo, hi = _bounds(iv)
    if math.isinf(lo):
        return "past the tested range"
    return f"{lo:g} users or past the range" if math.isinf(hi) else (f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}") + " users"


def mix_text(classes: list[ClassFigures], first: str | None, apart: bool | None) -> str:
    """The mix's sentence: which class's P99 took off first, and whether the noise lets it say so."""
    n = f"{len(classes)} request classes"
    if first is None:
        return f"{n}; no class's P99 took off before the others'"
    none: Knee = {}
    lk = next((c.get("latency_knee") or none for c in classes if c.get("name") == first), none)
    took = lk.get("took_off_users")
    if apart is None:  # no intervals (a soak; resampling not run)
        return f"{n}; the P99 of class {first} took off first (at {took} users)"
    if apart:
        return (f"{n}; the P99 of class {first} took off first (at {took} users; {_span(lk.get('took_off_interval'))} "
                "at this run's noise, before every other class's)")
    by = {str(c.get("name")): c.get("latency_knee") or {} for c in classes}
    others = "; ".join(f"class {o}'s {_span(by[o].get('took_off_interval'))}" for o in overlapping(classes, first))
    return (f"{n}; the P99 of class {first} took off at the fewest users ({took}), but not clearly first: at this "
            f"run's noise its took-off interval ({_span(lk.get('took_off_interval'))}) overlaps {others}")


KneeDraws = tuple[list[float | None], list[float | None], list[float | None]]


def resampled_knees(rows: list[ClassRows], steps: list[ClassStep], windows: list[tuple[float, float]],
                    resamples: int = RESAMPLES) -> KneeDraws:
    """(throughput knee, latency knee, took-off) users of the class on each of ``resamples`` draws
    of its answered rows: each valid step's rows cut into the blocks of its window and drawn by the
    whole's ``block_picks`` (seeded by the step's position), its QPS and P99 resampled by
    ``client_replicates`` (its percentiles' deviations between numpy's linear percentiles, the point
    figure's own definition: a class step may have under a hundred rows); a step too thin to
    resample keeps its own figures."""
    valid = [i for i, s in enumerate(steps) if s.get("valid") and isinstance(s.get("users"), (int, float))]
    users = [float(steps[i]["users"]) for i in valid]
    qps = np.full((resamples, len(valid)), np.nan)
    p99 = np.full((resamples, len(valid)), np.nan)
    for j, i in enumerate(valid):
        step = steps[i]
        point = {k: v for k in ("qps", "p50_ms", "p95_ms", "p99_ms") if isinstance(v := step.get(k), (int, float))}
        qps[:, j], p99[:, j] = point.get("qps", np.nan), point.get("p99_ms", np.nan)
        sample = BlockSample.of(rows[i].t_ok, rows[i].latency_ok, *windows[i], seed=i) if i < len(rows) else None
        if sample is None or not point:
            continue
        drawn = client_replicates(sample, point, block_picks(sample.k, i, resamples), None, 0.0, closed_loop=False,
                                  linear=True)
        qps[:, j] = drawn.get("qps", qps[:, j])
        p99[:, j] = drawn.get("p99_ms", p99[:, j])
    knees: list[float | None] = []
    latency: list[float | None] = []
    took: list[float | None] = []
    for b in range(resamples):
        knees.append(find_knee(users, list(qps[b]))["users"])
        lk = find_latency_knee(users, list(p99[b]))
        latency.append(lk["users"])
        took.append(lk["took_off_users"])
    return knees, latency, took


def add_intervals(c: ClassFigures, draws: KneeDraws) -> None:
    """A class's knees given their intervals from ``draws`` (resampled_knees), in place."""
    knees, latency, took = draws
    k, lk = c["knee"], c["latency_knee"]
    k["interval"], stability = knee_interval(k.get("users"), knees)
    k["stability"] = round(stability, 3)
    lk["interval"], stability = knee_interval(lk.get("users"), latency)
    lk["stability"] = round(stability, 3)
    lk["took_off_interval"] = knee_interval(lk.get("took_off_users"), took)[0]


def mix_section(classes: list[ClassFigures], by_class: dict[str, list[ClassRows]] | None = None,
                windows: list[tuple[float, float]] | None = None, resamples: int = RESAMPLES,
                soak: bool = False) -> MixSummary:
    """``mix``: each class's knees (with their intervals where its rows and the steps' windows are
    given), the class whose P99 took off first, and the sentence.  A soak's classes have no knee,
    as its whole has none (its windows hold one load: read as steps, one window's P99 1.5 x the
    first's would read as "took off at" the load held)."""
    if soak:
        for c in classes:
            c["knee"], c["latency_knee"] = (_knee(k) for k in soak_knees().values())
        return {"classes": classes, "first_latency_knee": None,
                "text": f"{len(classes)} request classes; a soak holds one load: no class has a knee (its windows "
                        "are each class's series)"}
    for c in classes:
        steps = c.get("steps") or []
        c["knee"] = _knee(find_knee(*_series(steps, "qps")))
        c["latency_knee"] = _knee(find_latency_knee(*_series(steps, "p99_ms")))
        if by_class is not None and windows is not None and c.get("name") in by_class:
            add_intervals(c, resampled_knees(by_class[c.get("name", "")], steps, windows, resamples))
    first = first_latency_knee(classes)
    resampled = by_class is not None and windows is not None
    apart = (not overlapping(classes, first)) if first is not None and resampled else None
    out: MixSummary = {"classes": classes, "first_latency_knee": first, "text": mix_text(classes, first, apart)}
    if apart is not None:
        out["first_latency_knee_apart"] = apart
    return out


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
            prometheus: pd.DataFrame | None = None, soak: bool = False) -> None:
    """``mix`` and the mix's findings into ``summary`` (in place), when the rows record classes;
    ``prometheus``: the target's scraped /metrics, whose per-model counters give each class's
    ``server_rps``; ``soak``: one load held, its classes have no knee (else their knees get their
    intervals at the run's noise)."""
    rows = read_class_rows(run)
    if rows is None or rows.empty:
        return
    by_class = split(rows, stats)
    classes = class_figures(by_class, stats, plan_weights(plan), sla_limits(plan))
    rates = server_rates(prometheus, class_models(plan), stats)
    for c in classes:
        for step, rate in zip(c.get("steps") or [], rates.get(c.get("name", ""), [])):
            step["server_rps"] = rate
    windows = list(zip(stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)))
    mix = mix_section(classes, by_class, windows, soak=soak)
    confirmed, marginal = judged(by_class, mix, [bool(v) for v in stats["valid"]])
    over = adapters.over_capacity_support(rows, stats, plan, prometheus)  # an adapter set larger than the server keeps
    if over is not None and over[0] > NOTICE:
        f = adapters.finding(*over)
        if over[0] >= CONFIRM and over[1]:
            confirmed.append(f)
        else:
            f["at_point"] = bool(over[1])
            marginal.append(f)
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
        return pd.read_csv(path, usecols=lambda c: c == "t" or SERVER_COUNTERS.match(str(c)) is not None
                           or adapters.LORA_INFO.match(str(c)) is not None)  # vLLM's adapter gauge too
    except (OSError, ValueError) as e:  # a torn or empty file: the class figures go without the server's counts
        logger.warning("mix: %s unreadable (%s); no per-class server counts", path, e)
        return None
