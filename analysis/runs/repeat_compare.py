"""A comparison where a side is a repeated run (kneeswarm.analysis.runs.repeat): one point with its interval.

``kneeswarm compare BASE NEW`` takes a ``<stamp>-<name>-repeat`` folder on either side, or both.  A
repeated run enters as one point per step, the mean of its runs' values, and the interval of a
change comes from how far the runs moved between each other (Student's t), not from resampling one
run's rows: that is the noise a gate must clear, the one a single run cannot see.

* both sides repeated: Welch's interval of the difference of two means (its degrees of freedom by
  Welch–Satterthwaite);
* one side a single run: that run is taken to move from run to run as much as the repeated side's
  runs do, so the difference of its value and the mean has the standard error sd·√(1 + 1/n), with
  n − 1 degrees of freedom (a prediction interval for one more run);
* a step of a repeated run is compared where it was valid in at least 2 of its runs and in at least
  half of those that ran it (its mean and spread then rest on valid steps);
* the significance rule, the step and run verdicts and the pages are compare's own (a change is
  significant when its interval excludes 0 and it is at least ``MIN_RELATIVE_CHANGE``);
* findings: a repeated side's are those confirmed in more than half its runs, each with its count.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kneeswarm.analysis.findings import Explanation, explain
from kneeswarm.analysis.measure import bootstrap
from kneeswarm.analysis.runs.compare import (MIN_RELATIVE_CHANGE, NOT_COMPARED, findings_change, is_repeat, load_plan,
                                             load_summary, metric_change, run_verdict, step_verdict, steps_by_users,
                                             shift_of, usl_change, usl_of)
from kneeswarm.analysis.runs.repeat import read_repeat
from kneeswarm.analysis.schema.repetition import RepeatStep
from kneeswarm.analysis.schema.summary import Finding, Summary, SummaryStep, num
from kneeswarm.analysis.schema.comparison import (COMPARE_VERSION, INTERVAL_BETWEEN_RUNS, Change, Comparison, RunInfo,
                                                  ShiftSide, Side, StepComparison)
from kneeswarm.contracts.rundir import RunDir

logger = logging.getLogger(__name__)

METRICS = ("qps", "p99_ms")


@dataclass
class View:
    """One side as the comparison reads it: per step the point, its spread over runs, how many."""
    info: RunInfo
    summary: Summary  # summary-shaped: steps (users, valid, requests, qps, p99_ms), knee, peak
    spread: dict[float, dict[str, tuple[float | None, int]]] = field(default_factory=dict)  # users -> metric -> (sd, n)
    findings: list[Finding] = field(default_factory=list)
    knee_spread: ShiftSide = field(default_factory=lambda: ShiftSide())  # a repeated side's knee over its runs
    warnings: list[str] = field(default_factory=list)

    @property
    def repeated(self) -> bool:
        return "runs" in self.info


def _explained(found: list[Finding]) -> Explanation:
    """A side's findings as findings_change reads them (a merged side has no rule errors of its own)."""
    return {"findings": found, "usl": {}, "littles_law": [], "unchecked": [], "rule_errors": []}


def single_view(path: str | Path) -> View:
    run = RunDir.open(path)
    plan = load_plan(run)
    summary = load_summary(run)
    info: RunInfo = {"run_id": summary.get("run_id") or run.path.name, "path": str(run.path),
                     "complete": summary.get("complete")}
    warnings = [] if plan is not None else [f"{run.path.name} has no plan.toml: its findings used the default settings"]
    return View(info, summary, findings=explain(summary, plan)["findings"], warnings=warnings)


def _compared(step: RepeatStep) -> bool:
    """A merged step stands for its run's figures where valid in >= 2 runs and in at least half of those that ran it."""
    return step["valid"] >= 2 and 2 * step["valid"] >= step["ran"]


def repeat_view(path: str | Path) -> View:
    rep = read_repeat(path)
    steps: list[SummaryStep] = []
    spread = {}
    for s in rep["steps"]:
        u = float(s["users"])
        steps.append(cast(SummaryStep, {"users": s["users"], "valid": _compared(s), "requests": s["requests"],
                                         "qps": s["qps"]["mean"], "p99_ms": s["p99_ms"]["mean"]}))  # requests: None
        #                                                     where no run had the step; qps, p99_ms: METRICS' means
        spread[u] = {m: (s[m]["sd"], s[m]["n"]) for m in METRICS}  # type: ignore[literal-required]
    knee, n = rep["knee"], rep["merged"]
    qps = [r["knee_qps"] for r in rep["runs"] if r["merged"] and r["knee_qps"] is not None]
    summary: Summary = {"steps": steps, "complete": rep["complete"],
               "knee": {"users": knee["median"], "qps": sum(qps) / len(qps) if qps else None},
               "peak": {"users": _median([u for u in rep["peak"]["users"] if u is not None]),
                        "qps": rep["peak"]["qps"]["mean"]}}
    found = [cast(Finding, {"id": c["id"], "severity": c["severity"],  # as merged: its severity may be unknown
                            "text": f"{c['text']} (confirmed in {c['label']} runs)"})
             for c in rep["findings"] if 2 * c["confirmed"] > c["runs"]]
    info: RunInfo = {"run_id": Path(path).name, "path": str(Path(path)), "complete": rep["complete"], "runs": n}
    spread_of_knee: ShiftSide = {"lo": knee["lo"], "hi": knee["hi"], "runs": n, "found": knee["found"], "text": knee["text"]}
    return View(info, summary, spread, found, spread_of_knee, list(rep["warnings"]))


def _median(values: list[float]) -> float | None:
    v = sorted(values)
    return None if not v else v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def change_interval(delta: float, base: tuple[float | None, int] | None, new: tuple[float | None, int] | None,
                    confidence: float = bootstrap.CONFIDENCE) -> list[float] | None:
    """[lo, hi] of new − base from the runs' spread (see the module's text); None when neither side
    has a spread (fewer than 2 runs)."""
    from scipy import stats  # heavy: only here

    sides = [s for s in (base, new) if s is not None and s[0] is not None and s[1] >= 2]
    if not sides:
        return None
    if len(sides) == 2:  # Welch
        v = [sd * sd / n for sd, n in sides]  # type: ignore[operator]
        se = math.sqrt(sum(v))
        df = sum(v) ** 2 / sum(x * x / (n - 1) for x, (_, n) in zip(v, sides)) if se > 0 else sides[0][1] - 1
    else:  # one repeated side; the single run moves as much as its runs do
        sd, n = sides[0]
        se, df = sd * math.sqrt(1 + 1 / n), n - 1  # type: ignore[operator]
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    return [delta - half, delta + half]


def _side(view: View, step: SummaryStep) -> Side:
    side: Side = {"valid": step.get("valid") is True, "requests": step.get("requests"), "qps": step.get("qps"),
                  "p99_ms": step.get("p99_ms"), "error_rate": step.get("error_rate"), "rows_resampled": 0, "rows": 0}
    got = view.spread.get(float(step.get("users") or 0))  # steps_by_users: each with numeric users
    if view.repeated and got is not None:
        side["runs"] = min(n for _, n in got.values())
        side["sd"] = {m: got[m][0] for m in METRICS}
    return side


def compare_step(base: View, new: View, users: float) -> StepComparison:
    b, n = steps_by_users(base.summary)[users], steps_by_users(new.summary)[users]
    sb, sn = _side(base, b), _side(new, n)
    if not (sb["valid"] and sn["valid"]):
        return {"users": b.get("users"), "base": sb, "new": sn, "qps": None, "p99_ms": None, "verdict": NOT_COMPARED,
                "note": "not valid in both (a repeated run: valid in fewer than 2, or half, of its runs)"}
    out: dict[str, Change] = {}
    for m in METRICS:
        bv, nv = num(b.get(m)), num(n.get(m))  # m: one of METRICS
        ci = None
        if bv is not None and nv is not None:
            ci = change_interval(nv - bv, base.spread.get(users, {}).get(m), new.spread.get(users, {}).get(m))
        out[m] = metric_change(m, bv, nv, ci)
    return {"users": b.get("users"), "base": sb, "new": sn, "qps": out["qps"], "p99_ms": out["p99_ms"],
            "verdict": step_verdict([out["qps"], out["p99_ms"]]), "note": None}


def compare_repeated(base_dir: str | Path, new_dir: str | Path) -> Comparison:
    """compare.json's Comparison where either side (or both) is a repeated run; RunDirError (one
    line) when a side is neither a run directory nor a readable repeat.json."""
    views = [repeat_view(p) if is_repeat(p) else single_view(p) for p in (base_dir, new_dir)]
    by = [steps_by_users(v.summary) for v in views]
    common = sorted(set(by[0]) & set(by[1]))
    steps = [compare_step(views[0], views[1], u) for u in common]
    verdict, reasons = run_verdict(steps)
    knee, peak = shift_of(views[0].summary.get("knee"), views[1].summary.get("knee")), \
        shift_of(views[0].summary.get("peak"), views[1].summary.get("peak"))
    for which, v in (("base", views[0]), ("new", views[1])):
        knee[which].update(v.knee_spread)  # type: ignore[literal-required]  # which: "base" or "new"
    warnings = [f"{which}: {w}" for which, v in (("base", views[0]), ("new", views[1])) for w in v.warnings]
    warnings += [f"the {which} run is incomplete" for which, v in (("base", views[0]), ("new", views[1]))
                 if v.info.get("complete") is False]
    return {"version": COMPARE_VERSION, "base": views[0].info, "new": views[1].info,
            "settings": {"confidence": bootstrap.CONFIDENCE, "min_relative_change": dict(MIN_RELATIVE_CHANGE),
                         "interval": INTERVAL_BETWEEN_RUNS, "runs": [v.info.get("runs", 1) for v in views]},
            "steps": steps, "unmatched": {"base_only": [by[0][u].get("users") for u in sorted(set(by[0]) - set(by[1]))],
                                          "new_only": [by[1][u].get("users") for u in sorted(set(by[1]) - set(by[0]))]},
            "knee": knee, "peak": peak, "usl": usl_change(usl_of(views[0].summary), usl_of(views[1].summary)),
            "findings": findings_change(_explained(views[0].findings), _explained(views[1].findings)),
            "verdict": verdict, "reasons": reasons, "warnings": warnings}
