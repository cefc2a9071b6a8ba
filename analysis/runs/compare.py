"""Run-to-run comparison: did the new run regress against the base? (a CI gate for each change)

``compare_runs(base_dir, new_dir)`` matches the two runs' steps by users and, for each step valid
in both, gives the QPS and P99 change with a bootstrap confidence interval over the request rows of
the step's steady window (kneeswarm.analysis.measure.bootstrap); then the knee and peak shift, the change of the USL
fit, the findings that appeared or vanished, and a verdict.

A change is **significant** when the interval of new − base excludes 0 AND the relative change is
at least ``MIN_RELATIVE_CHANGE[metric]``: the interval alone would flag a 0.5 % drift that a long
run measures precisely and nobody cares about; the threshold alone would flag the noise of a short
step.  A step **regressed** when its QPS fell or its P99 rose significantly; it **improved** when
one got significantly better and none worse.  The run's verdict: "regressed" when any step valid
in both runs regressed (a gate errs on the side of stopping), else "improved" when any improved,
else "no significant change"; "not comparable" when no step is valid in both.

``compare_markdown`` / ``compare_html`` render a result (kneeswarm.analysis.reports.compare_report);
``write_outputs`` writes them beside compare.json; the command line is ``kneeswarm compare``
(kneeswarm.launch.cli, with the exit codes of kneeswarm.contracts.outcome).
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
import zlib
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np

from kneeswarm.analysis.measure import bootstrap
from kneeswarm.analysis.runs.compare_classes import classes_change
from kneeswarm.analysis.reports.compare_report import compare_html, compare_markdown
from kneeswarm.analysis.findings import Explanation, explain
from kneeswarm.analysis.schema.summary import PlanTable, Summary, SummaryStep, UslFit, num
from kneeswarm.analysis.models.usl import fit_usl
from kneeswarm.analysis.schema.comparison import (COMPARE_VERSION, ClassChange, INTERVAL_BOOTSTRAP, Change, Comparison, RunInfo, Shift,
                                                  FindingsChange, ShiftSide, Side, StepComparison, SummariesComparison, UslChange)
from kneeswarm.contracts.rundir import COMPARE_HTML, COMPARE_JSON, COMPARE_MD, JUNIT_FILE, REPEAT_JSON, RunDir, RunDirError

logger = logging.getLogger(__name__)

__all__ = ["compare_runs", "compare_summaries", "compare_markdown", "compare_html", "write_outputs",
           "MIN_RELATIVE_CHANGE"]

# A change smaller than this share of the base is not significant, however narrow its interval:
# the interval measures the sampling noise within a run, not the drift between two runs of the same
# configuration.  Measured here (tests/test_compare.py, knee-mode demo target run twice on a shared
# 2-core machine, steps 1-8 held 8 s; three such pairs): QPS moved -7 % to +4 %, P99 -37 % to
# +153 % (a P99 of ~140 rows at 1 user is its top 2 rows; those intervals held 0); the target slowed
# by 30 %: QPS -19 % to -25 % at every step, P99 +9 % to +39 %.
MIN_RELATIVE_CHANGE = {"qps": 0.10, "p99_ms": 0.20}
WORSE_WHEN = {"qps": -1, "p99_ms": +1}  # the sign of new − base that is a regression
REGRESSED, IMPROVED, NO_CHANGE, NOT_COMPARABLE = "regressed", "improved", "no significant change", "not comparable"
NOT_COMPARED = "not compared"
USL_KEYS = ("sigma", "kappa", "lambda", "n_star", "peak", "r2")


# -- loading -------------------------------------------------------------------------------------
def is_repeat(path: str | Path) -> bool:
    """A folder holding repeat.json: a repeated run's merged result (kneeswarm.analysis.runs.repeat)."""
    return (Path(path) / REPEAT_JSON).is_file()


def load_summary(run: RunDir) -> Summary:
    """report/summary.json, or, when the run was never analysed, the summary computed now.  One
    written by an older kneeswarm may lack keys, or hold an older shape of one: every reader of it
    gets a key with ``.get`` and tests the value's type."""
    path = run.summary_path
    if path.exists():
        try:
            return cast(Summary, json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            logger.warning("%s: unreadable (%s); analysing the run again", path, exc)
    from kneeswarm.analysis import summarize  # the analysis' own entry point (lazy: heavy, and restructured often)
    from kneeswarm.analysis.measure.inputs import load_inputs

    return summarize(load_inputs(run.path))


def load_plan(run: RunDir) -> PlanTable | None:
    """The run's plan.toml; None when the run has none (its findings use the default settings).
    One that is there but cannot be read is bad input (RunDirError, one line): comparing with
    the defaults in its place would judge the run by limits it did not set."""
    try:
        return tomllib.loads(run.plan_path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise RunDirError(f"{run.plan_path}: unreadable ({why})") from None


def _key(users: Any) -> float | None:
    return num(users)


def steps_by_users(summary: Summary) -> dict[float, SummaryStep]:
    """The summary's steps keyed by users (the last one wins if a run repeated a step)."""
    steps = got if isinstance(got := summary.get("steps"), list) else []
    return {k: s for s in steps if isinstance(s, dict) and (k := _key(s.get("users"))) is not None}


def window(step: SummaryStep, settle: float) -> tuple[float | None, float | None]:
    """The steady window the summary used: t_lo/t_hi, else t_steady + settle to t_end."""
    lo, hi, steady = num(step.get("t_lo")), num(step.get("t_hi")), num(step.get("t_steady"))
    if lo is None and steady is not None:
        lo = steady + settle
    return lo, (hi if hi is not None else num(step.get("t_end")))


def settle_of(summary: Summary) -> float:
    """The settle the summary's windows used (its ``analysis.settle``; 0 when it does not say)."""
    ana = summary.get("analysis")
    return (num(ana.get("settle")) if isinstance(ana, dict) else None) or 0.0


# -- per step ------------------------------------------------------------------------------------
def metric_change(metric: str, base: float | None, new: float | None, ci: list[float] | None) -> Change:
    """{base, new, delta, rel, ci, significant, direction} of one metric at one step."""
    delta = None if base is None or new is None else new - base
    rel = None if delta is None or not base else delta / base
    significant = bool(ci is not None and rel is not None and (ci[0] > 0 or ci[1] < 0)
                       and abs(rel) >= MIN_RELATIVE_CHANGE[metric])
    direction = None
    if significant and delta is not None:  # significant: rel, hence delta, is known
        direction = "worse" if math.copysign(1, delta) == WORSE_WHEN[metric] else "better"
    return {"base": base, "new": new, "delta": delta, "rel": rel, "ci": ci, "significant": significant,
            "direction": direction, "min_relative_change": MIN_RELATIVE_CHANGE[metric]}


def step_verdict(changes: list[Change]) -> str:
    if any(c["direction"] == "worse" for c in changes):
        return REGRESSED
    if any(c["direction"] == "better" for c in changes):
        return IMPROVED
    return NO_CHANGE


def _point(step: SummaryStep, key: str, sample: bootstrap.StepSample | None) -> float | None:
    """The summary's value (computed from every row), else the sample's."""
    v = num(step.get(key))
    if v is None and sample is not None:
        v = sample.qps() if key == "qps" else sample.p99()
    return v


def _side(step: SummaryStep, sample: bootstrap.StepSample | None) -> Side:
    return {"valid": step.get("valid") is True, "requests": step.get("requests"), "qps": num(step.get("qps")),
            "p99_ms": num(step.get("p99_ms")), "error_rate": num(step.get("error_rate")),
            "rows_resampled": int(sample.latencies.size) if sample else 0,
            "rows": int(sample.n_latencies) if sample else 0}


def compare_step(i: int, users: Any, b: SummaryStep, n: SummaryStep, sb: bootstrap.StepSample | None,
                 sn: bootstrap.StepSample | None, seed: int, resamples: int) -> StepComparison:
    """One matched step: both sides, the QPS and P99 change with intervals, the step's verdict."""
    base, new = _side(b, sb), _side(n, sn)
    if not (base["valid"] and new["valid"]):
        return {"users": users, "base": base, "new": new, "qps": None, "p99_ms": None, "verdict": NOT_COMPARED,
                "note": "not valid in both runs"}
    out: dict[str, Change] = {}
    for metric, deviations in (("qps", bootstrap.qps_deviations), ("p99_ms", bootstrap.p99_deviations)):
        base_v, new_v = _point(b, metric, sb), _point(n, metric, sn)
        devs = [None if s is None else deviations(s, np.random.default_rng([seed, i, k, len(metric)]), resamples)
                for k, s in ((1, sb), (2, sn))]
        point = None if base_v is None or new_v is None else new_v - base_v
        out[metric] = metric_change(metric, base_v, new_v, bootstrap.diff_interval(devs[0], devs[1], point))
    return {"users": users, "base": base, "new": new, "qps": out["qps"], "p99_ms": out["p99_ms"],
            "verdict": step_verdict([out["qps"], out["p99_ms"]]), "note": None}


# -- whole runs ----------------------------------------------------------------------------------
def shift_of(base: Any, new: Any) -> Shift:
    """{base {users, qps}, new {users, qps}, users_ratio, qps_rel} of a knee or peak."""
    b = base if isinstance(base, dict) else {}
    n = new if isinstance(new, dict) else {}
    bu, nu, bq, nq = (num(b.get("users")), num(n.get("users")), num(b.get("qps")), num(n.get("qps")))
    side = lambda k, q: cast(ShiftSide, {"users": k.get("users"), "qps": q,  # noqa: E731
                                         **({"interval": k["interval"]} if isinstance(k.get("interval"), list) else {})})
    return {"base": side(b, bq), "new": side(n, nq),
            "users_ratio": nu / bu if bu and nu is not None else None,
            "qps_rel": (nq - bq) / bq if bq and nq is not None else None}


def usl_of(summary: Summary) -> UslFit:
    valid = [(u, x) for u, s in steps_by_users(summary).items()
             if s.get("valid") is True and (x := num(s.get("qps"))) is not None]
    return fit_usl([u for u, _ in valid], [x for _, x in valid])


def usl_change(base: UslFit, new: UslFit) -> UslChange:
    change = {k: (b1 - b0 if (b0 := num(base.get(k))) is not None and (b1 := num(new.get(k))) is not None else None)
              for k in USL_KEYS}
    return {"base": base, "new": new, "change": change}


def findings_change(base: Explanation, new: Explanation) -> FindingsChange:
    """Findings (by id) that appeared in the new run, vanished from the base, or stayed."""
    b = {f["id"]: f for f in base.get("findings", [])}
    n = {f["id"]: f for f in new.get("findings", [])}
    return {"appeared": [n[k] for k in n if k not in b], "vanished": [b[k] for k in b if k not in n],
            "persisted": [k for k in n if k in b], "rule_errors": base.get("rule_errors", []) + new.get("rule_errors", [])}


def compare_summaries(base: Summary, new: Summary, base_plan: Any = None,
                      new_plan: Any = None) -> SummariesComparison:
    """The parts of a comparison that need only the two summaries: knee, peak, USL, findings."""
    return {"knee": shift_of(base.get("knee"), new.get("knee")), "peak": shift_of(base.get("peak"), new.get("peak")),
            "usl": usl_change(usl_of(base), usl_of(new)),
            "findings": findings_change(explain(base, base_plan), explain(new, new_plan))}


def _reason(where: str, metric: str, c: Change | None) -> str | None:
    """"4 users: p99_ms 120 → 180 (+50.0%, 95% CI of the change [+41, +77]): worse", for a significant change."""
    ci = None if c is None else c["ci"]
    if c is None or ci is None or not c["significant"]:  # significant: its CI is known
        return None
    return (f"{where}: {metric} {c['base']:.4g} → {c['new']:.4g} ({c['rel']:+.1%}, "
            f"{bootstrap.CONFIDENCE:.0%} CI of the change [{ci[0]:+.4g}, {ci[1]:+.4g}]): {c['direction']}")


def run_verdict(steps: list[StepComparison], classes: list[ClassChange] | None = None) -> tuple[str, list[str]]:
    """The run's verdict and the one-line reasons behind it (each significant change): of the whole's
    steps and, in a traffic mix, of each class's (a class that regressed while the whole held is a
    regression: its requests are someone's)."""
    compared = [s for s in steps if s["verdict"] != NOT_COMPARED]
    if not compared:
        return NOT_COMPARABLE, ["no step is valid in both runs"]
    reasons = [r for s in compared for metric in ("qps", "p99_ms") if (r := _reason(f"{s['users']} users", metric, s[metric]))]
    verdicts = {s["verdict"] for s in compared}
    for c in classes or []:
        for cs in c["steps"]:
            if "verdict" in cs:
                verdicts.add(cs["verdict"])
                where = f"class {c['name']}, {cs['users']:g} users"
                reasons += [r for metric, change in (("qps", cs.get("qps_change")), ("p99_ms", cs.get("p99_change")))
                            if (r := _reason(where, metric, change))]
    verdict = REGRESSED if REGRESSED in verdicts else IMPROVED if IMPROVED in verdicts else NO_CHANGE
    return verdict, reasons


def _class_p99_deviations(sample: bootstrap.StepSample, rng: np.random.Generator, resamples: int) -> np.ndarray | None:
    """A class's P99 deviations, where it has rows enough above its P99 (bootstrap.MIN_ROWS_CLASS_P99)."""
    return bootstrap.p99_deviations(sample, rng, resamples, min_rows=bootstrap.MIN_ROWS_CLASS_P99)


def class_step_changes(classes: list[ClassChange], common: list[float], samples: list[dict[str, list[bootstrap.StepSample | None]]],
                       seed: int, resamples: int) -> None:
    """Each class's step changes of a traffic mix, by the whole's intervals and rule with two more
    guards (a P99 only from bootstrap.MIN_ROWS_CLASS_P99 rows; Holm, below): ``qps_change`` and ``p99_change`` (a ``Change``: the bootstrap interval over the class's
    own rows of the step's window) and the step's ``verdict``; each class's ``verdict``.

    A mix tests classes x steps x 2 changes, each on fewer rows than the whole's: at 95 % each,
    two of eight comparisons of one configuration with itself found a class "regressed"
    (tests/test_mix_compare.py).  So a class's change is significant only where its Holm-adjusted
    bootstrap p-value (``p_holm``, over every class change of the comparison) is under 1 − CONFIDENCE
    as well: the chance that any class is called changed when none changed stays under 5 %."""
    at = {u: i for i, u in enumerate(common)}
    tested: list[tuple[Change, float]] = []
    for c in classes:
        name, key = c["name"], zlib.crc32(c["name"].encode())
        sides = [s.get(name) or [None] * len(common) for s in samples]
        for cs in c["steps"]:
            i = at.get(float(cs["users"]))
            if i is None:
                continue
            sb, sn = sides[0][i], sides[1][i]
            changes: list[Change] = []
            for metric, (b, n), deviations in (("qps", cs["qps"], bootstrap.qps_deviations),
                                                ("p99_ms", cs["p99_ms"], _class_p99_deviations)):
                devs = [None if x is None else deviations(x, np.random.default_rng([seed, i, k, len(metric), key]), resamples)
                        for k, x in ((1, sb), (2, sn))]
                point = None if b is None or n is None else n - b
                changes.append(metric_change(metric, b, n, bootstrap.diff_interval(devs[0], devs[1], point)))
                if (p := bootstrap.diff_p_value(devs[0], devs[1], point)) is not None:
                    tested.append((changes[-1], p))
            cs["qps_change"], cs["p99_change"] = changes
    for (change, _), p_holm in zip(tested, bootstrap.holm([p for _, p in tested])):
        change["p_holm"] = p_holm
    for c in classes:
        for cs in c["steps"]:
            if "qps_change" not in cs:
                continue
            for change in (cs["qps_change"], cs["p99_change"]):
                if change["significant"] and not change.get("p_holm", 1.0) < 1.0 - bootstrap.CONFIDENCE:
                    change["significant"], change["direction"] = False, None
            cs["verdict"] = step_verdict([cs["qps_change"], cs["p99_change"]])
        got = {cs["verdict"] for cs in c["steps"] if "verdict" in cs}
        if got:
            c["verdict"] = REGRESSED if REGRESSED in got else IMPROVED if IMPROVED in got else NO_CHANGE


def _run_info(run: RunDir, summary: Summary) -> RunInfo:
    return {"run_id": summary.get("run_id") or run.path.name, "path": str(run.path), "complete": summary.get("complete")}


def compare_runs(base_dir: str | Path, new_dir: str | Path, *, resamples: int = bootstrap.RESAMPLES,
                 seed: int = bootstrap.SEED, max_rows: int = bootstrap.MAX_ROWS_PER_STEP) -> Comparison:
    """Compare two run directories; raises RunDirError (one line) when one is not a run directory
    or its plan.toml is unreadable.

    Returns compare.json's ``Comparison`` (declared above: per matched step a ``StepComparison``
    whose ``qps``/``p99_ms`` are ``Change``s).
    """
    if is_repeat(base_dir) or is_repeat(new_dir):  # a repeated run on a side: one point with its interval
        from kneeswarm.analysis.runs.repeat_compare import compare_repeated

        return compare_repeated(base_dir, new_dir)
    runs = [RunDir.open(base_dir), RunDir.open(new_dir)]
    plans = [load_plan(r) for r in runs]  # before any work: an unreadable plan is bad input
    summaries = [load_summary(r) for r in runs]
    by = [steps_by_users(s) for s in summaries]
    common = sorted(set(by[0]) & set(by[1]))
    classes = classes_change(summaries[0], summaries[1])  # traffic mixes: each class's changes
    warnings: list[str] = []
    samples, class_samples = [], []
    for k, (run, summary) in enumerate(zip(runs, summaries)):
        wins = [(u, *window(by[k][u], settle_of(summary))) for u in common]
        got, per_class, warn = bootstrap.step_and_class_samples(run, wins, seed + k, max_rows, classes=bool(classes))
        samples.append(got)
        class_samples.append(per_class)
        warnings += warn
    steps = [compare_step(i, by[0][u].get("users"), by[0][u], by[1][u], samples[0][i], samples[1][i], seed, resamples)
             for i, u in enumerate(common)]
    class_step_changes(classes, common, class_samples, seed, resamples)
    verdict, reasons = run_verdict(steps, classes)
    result: Comparison = {"version": COMPARE_VERSION, "base": _run_info(runs[0], summaries[0]), "new": _run_info(runs[1], summaries[1]),
              "settings": {"resamples": resamples, "seed": seed, "confidence": bootstrap.CONFIDENCE,
                           "max_rows_per_step": max_rows, "min_relative_change": dict(MIN_RELATIVE_CHANGE),
                           "interval": INTERVAL_BOOTSTRAP},
              "steps": steps, "unmatched": {"base_only": [by[0][u].get("users") for u in sorted(set(by[0]) - set(by[1]))],
                                            "new_only": [by[1][u].get("users") for u in sorted(set(by[1]) - set(by[0]))]},
              **compare_summaries(summaries[0], summaries[1], plans[0], plans[1]),
              "verdict": verdict, "reasons": reasons, "warnings": warnings}
    if classes:
        result["classes"] = classes
    for which, run, plan in (("base", runs[0], plans[0]), ("new", runs[1], plans[1])):
        if plan is None:
            warnings.append(f"the {which} run has no plan.toml ({run.plan_path}): its findings used the default settings")
    for which, s in (("base", summaries[0]), ("new", summaries[1])):
        if s.get("complete") is False:
            lost = ", ".join(f"{k}={v}" for k, v in sorted((s.get("lost") or {}).items()))
            why = f"lost: {lost}" if lost else (s.get("ended") or "no record of how it ended")
            warnings.append(f"the {which} run is incomplete ({why})")
    return result


def plain(x: Any) -> Any:
    """JSON-ready: NaN and infinities -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _write(path: Path, text: str) -> None:
    """Write a whole file atomically (temporary name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_outputs(result: Comparison, out: Path) -> None:
    """compare.json, compare.md, compare.html and junit.xml in ``out``."""
    from kneeswarm.analysis.reports.junit import junit_xml

    _write(out / COMPARE_JSON, json.dumps(plain(result), indent=2, default=str, allow_nan=False) + "\n")
    _write(out / COMPARE_MD, compare_markdown(result))
    _write(out / COMPARE_HTML, compare_html(result))
    _write(out / JUNIT_FILE, junit_xml(None, result))
