"""One plan run N times, merged (``kneeswarm run --repeat N``, ``[load] repeat``; ``kneeswarm merge``).

``kneeswarm run`` runs the plan N times against the same server (kneeswarm.launch.cli.run_repeat),
each an ordinary run directory, then :func:`write_repeat` reads them into
``<out>/<stamp>-<name>-repeat/``: ``repeat.json`` (:class:`Repetition`), ``repeat.md`` and
``index.html``, as a ``[load] shapes`` sweep does (kneeswarm.analysis.runs.shapes).

What the merge says, over the runs that completed (an interrupted or failed run is listed, not
merged: its missing steps would read as a knee):

* the knee of each run and their spread: median, range, the knee most runs found and how many
  ("knee 4 users in 3 of 3 runs"), and each run's own knee interval where its summary has one;
* each step (matched by users) with its QPS and latency percentiles: per run the value and the
  run's own bootstrap interval over its rows (within), and over the runs the mean with Student's t
  interval (between).  Within says how precisely one run measured the step; between says how far
  the same plan moves from run to run, which no single run can see (on a noisy shared server the
  second is the wider one);
* each finding with how many runs confirmed it and how many found it only marginal, counted apart:
  "3 of 3" repeats, "1 of 3" did not (unstable); the verdict's root causes counted the same way;
* the SLA as met in k of N runs;
* with a traffic mix, each class merged the same way (kneeswarm.analysis.runs.repeat_classes).

A summary written before knee intervals, marginal findings or verdicts existed lacks those keys and
merges all the same (its findings count as confirmed, as they were reported).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Sequence, cast

import numpy as np

from kneeswarm.analysis.measure import bootstrap
from kneeswarm.analysis.reports.repeat_report import repeat_html, repeat_markdown
from kneeswarm.analysis.runs.compare import is_repeat, load_summary, settle_of, steps_by_users, window
from kneeswarm.analysis.schema.summary import Finding, Summary, as_dict, num
from kneeswarm.analysis.schema.repetition import (FIGURES, REPEAT_VERSION, WITHIN_FIGURES, CauseCount, Figure,
                                                  FindingCount, KneeSpread, PeakSpread, RepeatRun, RepeatSla,
                                                  RepeatStep, Repetition)
from kneeswarm.contracts.rundir import (REPEAT_JSON, REPEAT_MD, REPEAT_SUFFIX, REPORT_HTML, RunDir, RunDirError,
                                        safe_name, write_text)

logger = logging.getLogger(__name__)

__all__ = ["merge_runs", "write_repeat", "remerge", "is_repeat", "read_repeat", "member_dirs", "repeat_folder",
           "between_interval"]

CONFIDENCE = bootstrap.CONFIDENCE  # both intervals at the same level, the comparison's
#: bootstrap replicates for each run's own step intervals: a tenth of compare's 1,000.  An interval
#: shown beside others, not a gate: at 100 replicates the 2.5 % / 97.5 % quantiles of a P99 move by
#: a few % between seeds (measured on the knee target's steps of 240-1,600 rows), and the merge of 3
#: runs of 5 steps stays ~1 s where 1,000 took ~8 s on this shared 2-core machine
WITHIN_RESAMPLES = 100
SEVERITY_ORDER = ("info", "warning", "critical")


# -- one run -----------------------------------------------------------------------------------------
def _interval(x: Any) -> list[float | None] | None:
    """A [lo, hi] pair of numbers, hi None where the summary's is (its knee lies at lo or beyond the
    tested range); else None (knee.interval is null when not computed)."""
    if isinstance(x, (list, tuple)) and len(x) == 2 and (lo := num(x[0])) is not None \
            and (x[1] is None or num(x[1]) is not None):
        return [lo, None if x[1] is None else float(x[1])]
    return None


def _ids(findings: Any) -> list[str]:
    return [str(f["id"]) for f in findings if isinstance(f, dict) and f.get("id")] if isinstance(findings, list) else []


def run_facts(index: int, run_dir: Path, summary: Summary | None, why_not: str | None) -> RepeatRun:
    """One repetition's line: its knee, peak, findings and SLA from its summary (``None``: unreadable)."""
    s = summary or {}
    knee, peak, sla = as_dict(s.get("knee")), as_dict(s.get("peak")), as_dict(s.get("sla"))
    complete = s.get("complete") is True
    left_out = why_not or (None if complete else f"incomplete (ended: {s.get('ended') or 'unknown'})")
    return {"index": index, "run_id": str(s.get("run_id") or run_dir.name), "run_dir": str(run_dir),
            "complete": complete, "ended": s.get("ended") if isinstance(s.get("ended"), str) else None,
            "merged": left_out is None, "left_out": left_out,
            "knee_users": num(knee.get("users")), "knee_qps": num(knee.get("qps")),
            "knee_method": knee.get("method") if isinstance(knee.get("method"), str) else None,
            "knee_interval": _interval(knee.get("interval")), "knee_stability": num(knee.get("stability")),
            "peak_users": num(peak.get("users")), "peak_qps": num(peak.get("qps")),
            "findings": _ids(s.get("findings")), "findings_marginal": _ids(s.get("findings_marginal")),
            "causes": [str(c) for c in as_dict(s.get("verdict")).get("causes") or [] if isinstance(c, str)],
            "sla_passed": sla.get("passed") if sla.get("set") and isinstance(sla.get("passed"), bool) else None}


def _read(run_dir: Path) -> tuple[Summary | None, str | None]:
    """(summary, None), or (None, why it could not be read)."""
    try:
        return load_summary(RunDir.open(run_dir)), None
    except RunDirError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one unreadable run is left out of the merge, said, never fatal
        return None, f"no summary ({type(exc).__name__}: {' '.join(str(exc).split())})"


# -- the figures -------------------------------------------------------------------------------------
def between_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> list[float] | None:
    """Student's t interval [lo, hi] of the mean of ``values`` (the runs' figures); None with fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    from scipy import stats  # heavy: only where runs are merged

    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def figure(values: list[float | None], within: list[list[float] | None] | None = None) -> Figure:
    """One figure over the runs.  Its between-run interval stops at 0: every figure merged is a rate
    or a time, and t's symmetric interval over 2 or 3 runs that moved a lot reaches below it."""
    known = [v for v in values if v is not None]
    mean = float(np.mean(known)) if known else None
    between = between_interval(known)
    return {"values": values, "within": within if within is not None else [None] * len(values), "n": len(known),
            "mean": mean, "sd": float(np.std(known, ddof=1)) if len(known) > 1 else None,
            "between": [max(0.0, between[0]), between[1]] if between else None,
            "spread": (max(known) - min(known)) / mean if len(known) > 1 and mean else None}


def quantile_deviations(sample: bootstrap.StepSample, rng: np.random.Generator, q: float,
                        resamples: int) -> np.ndarray | None:
    """Q* − Q of the latency quantile ``q`` (percent) over ``resamples`` resamplings of the step's
    rows, scaled by √(m/n) as kneeswarm.analysis.measure.bootstrap.p99_deviations does (the P50's
    twin of that function; None with fewer than bootstrap.MIN_ROWS_P99 rows)."""
    lat, m = sample.latencies, sample.latencies.size
    if m < bootstrap.MIN_ROWS_P99:
        return None
    out = np.percentile(lat[rng.integers(0, m, size=(resamples, m))], q, axis=1)
    return (out - float(np.percentile(lat, q))) * math.sqrt(m / max(sample.n_latencies, m))


def _within(value: float | None, dev: np.ndarray | None, confidence: float = CONFIDENCE) -> list[float] | None:
    """value + the (α/2, 1 − α/2) quantiles of its deviations (bootstrap.diff_interval's convention)."""
    if value is None or dev is None:
        return None
    alpha = 1.0 - confidence
    lo, hi = np.quantile(dev, [alpha / 2, 1 - alpha / 2])
    return [float(value + lo), float(value + hi)]


def within_intervals(run: RunDir, summary: Summary, users: list[float], k: int, seed: int, resamples: int,
                     max_rows: int) -> tuple[dict[float, dict[str, list[float] | None]], list[str]]:
    """{users: {figure: [lo, hi]}} of one run's valid steps at ``users`` (its own rows resampled),
    and a warning per unreadable request part."""
    by = steps_by_users(summary)
    wanted = [u for u in users if u in by and by[u].get("valid") is True]
    wins = [(u, *window(by[u], settle_of(summary))) for u in wanted]
    samples, warnings = bootstrap.step_samples(run, wins, seed + k, max_rows)
    out: dict[float, dict[str, list[float] | None]] = {}
    for i, (u, sample) in enumerate(zip(wanted, samples)):
        step, got = by[u], {}
        for j, name in enumerate(WITHIN_FIGURES):
            rng = np.random.default_rng([seed, k, i, j])
            dev = None
            if sample is not None:
                dev = (bootstrap.qps_deviations(sample, rng, resamples) if name == "qps"
                       else bootstrap.p99_deviations(sample, rng, resamples) if name == "p99_ms"
                       else quantile_deviations(sample, rng, 50.0, resamples))
            got[name] = _within(num(step.get(name)), dev)
        out[u] = got
    return out, [f"{run.path.name}: {w}" for w in warnings]


def merge_steps(summaries: list[Summary], within: list[dict[float, dict[str, list[float] | None]]]) -> list[RepeatStep]:
    """Each users value any merged run has, its figures over the runs (valid steps only)."""
    by = [steps_by_users(s) for s in summaries]
    out: list[RepeatStep] = []
    for u in sorted({u for b in by for u in b}):
        valid = [b.get(u) if (b.get(u) or {}).get("valid") is True else None for b in by]
        figs: dict[str, Figure] = {}
        for name in FIGURES:
            values = [None if s is None else num(s.get(name)) for s in valid]
            inner = [(w.get(u) or {}).get(name) if s is not None else None for w, s in zip(within, valid)] \
                if name in WITHIN_FIGURES else None
            figs[name] = figure(values, inner)
        requests = [int(r) for s in valid if s is not None and (r := num(s.get("requests"))) is not None]
        out.append({"users": int(u) if float(u).is_integer() else u, "ran": sum(u in b for b in by), "valid": sum(s is not None for s in valid),
                    "requests": min(requests) if requests else None, "qps": figs["qps"], "p50_ms": figs["p50_ms"],
                    "p95_ms": figs["p95_ms"], "p99_ms": figs["p99_ms"], "p999_ms": figs["p999_ms"]})
    return out


# -- the knee, the findings, the SLA -------------------------------------------------------------------
def _users_text(u: float | None) -> str:
    return "–" if u is None else f"{u:g}"


def knee_spread(runs: list[RepeatRun]) -> KneeSpread:
    return spread([r["knee_users"] for r in runs], [r["knee_interval"] for r in runs])


def spread(knees: list[float | None], intervals: list[list[float | None] | None], said: str = "knee",
           none: str = "no knee in any of {n} runs") -> KneeSpread:
    """A knee over the runs (each run's users, None: found none; each run's interval at its own
    noise): the one most runs found, their range and median, the users every interval holds;
    ``said``/``none``: the text's words ("knee 4 users in 3 of 3 runs")."""
    found = sorted(k for k in knees if k is not None)
    counts: dict[float, int] = {}
    for k in found:
        counts[k] = counts.get(k, 0) + 1
    mode = min(counts, key=lambda k: (-counts[k], k)) if counts else None
    known = [iv for iv in intervals if iv is not None]
    overlap: list[float | None] | None = None
    if known and len(known) == len(knees):  # an interval open above (hi None) holds every count from lo up
        lo = max(float(iv[0] or 0.0) for iv in known)
        hi = min(math.inf if iv[1] is None else iv[1] for iv in known)
        overlap = [lo, None if math.isinf(hi) else hi] if lo <= hi else None
    n = len(knees)
    if mode is None:
        text = none.format(n=n)
    else:
        text = f"{said} {_users_text(mode)} users in {counts[mode]} of {n} runs"
        if found[0] != found[-1]:
            text += f" ({_users_text(found[0])}-{_users_text(found[-1])} over the runs, median {_users_text(float(np.median(found)))})"
        if len(found) < n:
            text += f"; {n - len(found)} found none"
    return {"users": knees, "found": len(found), "runs": n, "median": float(np.median(found)) if found else None,
            "lo": found[0] if found else None, "hi": found[-1] if found else None, "mode": mode,
            "mode_runs": counts.get(mode, 0) if mode is not None else 0, "intervals": intervals, "overlap": overlap,
            "text": text}


def _severity(a: str | None, b: Any) -> str | None:
    if not isinstance(b, str) or b not in SEVERITY_ORDER:
        return a
    return b if a is None or SEVERITY_ORDER.index(b) > SEVERITY_ORDER.index(a) else a


def count_findings(runs: list[RepeatRun], summaries: list[Summary]) -> list[FindingCount]:
    """Each finding id over the merged runs (confirmed and marginal apart), most often confirmed first."""
    n = len(runs)
    acc: dict[str, FindingCount] = {}
    for run, s in zip(runs, summaries):
        for kind in ("findings", "findings_marginal"):
            for f in cast(list[Finding], s.get(kind) or []):  # kind: one of the two lists
                if not isinstance(f, dict) or not f.get("id"):
                    continue
                c = acc.setdefault(str(f["id"]), {
                    "id": str(f["id"]), "severity": None, "runs": n, "confirmed": 0, "marginal": 0,
                    "confirmed_in": [], "marginal_in": [], "label": "", "stable": False, "support": [],
                    "explained_by": [], "text": ""})
                where = c["confirmed_in"] if kind == "findings" else c["marginal_in"]
                if run["index"] in where:  # a rule that fires per host: one count per run
                    continue
                where.append(run["index"])
                if kind == "findings":
                    c["severity"] = _severity(c["severity"], f.get("severity"))
                if (sup := num(f.get("support"))) is not None:
                    c["support"].append(sup)
                if isinstance(f.get("explained_by"), str) and f["explained_by"] not in c["explained_by"]:
                    c["explained_by"].append(f["explained_by"])
                c["text"] = str(f.get("text") or c["text"])
    for c in acc.values():
        c["confirmed"], c["marginal"] = len(c["confirmed_in"]), len(c["marginal_in"])
        c["stable"] = c["confirmed"] == n
        c["label"] = f"{c['confirmed']} of {n}"
    return sorted(acc.values(), key=lambda c: (-c["confirmed"], -c["marginal"], c["id"]))


def count_causes(runs: list[RepeatRun]) -> list[CauseCount]:
    n, counts = len(runs), dict[str, int]()
    for r in runs:
        for c in dict.fromkeys(r["causes"]):
            counts[c] = counts.get(c, 0) + 1
    return [{"id": c, "runs": k, "label": f"{k} of {n}"} for c, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def sla_over(runs: list[RepeatRun], summaries: list[Summary]) -> RepeatSla:
    """Met in every merged run, or not: each run is a whole measurement of the same plan, and a
    service that misses its SLA in one of N identical runs misses it that often (a gate errs on the
    side of stopping, as compare's does)."""
    is_set = any(as_dict(s.get("sla")).get("set") for s in summaries)
    if not is_set or not runs:
        return {"set": is_set, "passed": None, "passed_runs": 0, "runs": len(runs),
                "text": "no SLA set" if not is_set else "no run merged"}
    passed = sum(r["sla_passed"] is True for r in runs)
    failed = [str(r["index"]) for r in runs if r["sla_passed"] is not True]
    text = f"met in {passed} of {len(runs)} runs" + (f" (not in run {', '.join(failed)})" if failed else "")
    return {"set": True, "passed": passed == len(runs), "passed_runs": passed, "runs": len(runs), "text": text}


# -- the whole -------------------------------------------------------------------------------------
def merge_runs(run_dirs: Iterable[str | Path], name: str, planned: int | None = None, *,
               resamples: int = WITHIN_RESAMPLES, seed: int = bootstrap.SEED,
               max_rows: int = bootstrap.MAX_ROWS_PER_STEP) -> Repetition:
    """The merged result of the runs (in run order); ``planned``: runs asked for (default: as many
    as given).  Never raises on a run it cannot read: that run is listed, left out, and said."""
    dirs = [Path(d) for d in run_dirs]
    planned = len(dirs) if planned is None else planned
    runs, summaries, warnings = [], [], []
    for i, d in enumerate(dirs, 1):
        summary, why = _read(d)
        runs.append(run_facts(i, d, summary, why))
        summaries.append(summary or {})
    merged = [(r, s) for r, s in zip(runs, summaries) if r["merged"]]
    warnings += [f"run {r['index']} ({r['run_id']}) left out of the merge: {r['left_out']}" for r in runs if not r["merged"]]
    if len(dirs) < planned:
        warnings.append(f"{planned - len(dirs)} of the {planned} planned runs did not run")
    m_runs, m_sums = [r for r, _ in merged], [s for _, s in merged]
    users = sorted({u for s in m_sums for u in steps_by_users(s)})
    within = []
    for k, (r, s) in enumerate(merged):
        got, warn = within_intervals(RunDir(r["run_dir"]), s, users, k, seed, resamples, max_rows)
        within.append(got)
        warnings += warn
    peaks = [r["peak_qps"] for r in m_runs]
    from kneeswarm.analysis.runs.repeat_classes import merge_classes  # it reads this module's figure and spread

    classes = merge_classes(m_sums)
    out: Repetition = {"version": REPEAT_VERSION, "name": name, "planned": planned,
            "complete": len(dirs) == planned and len(m_runs) == planned, "merged": len(m_runs), "runs": runs,
            "knee": knee_spread(m_runs), "peak": {"users": [r["peak_users"] for r in m_runs], "qps": figure(peaks)},
            "steps": merge_steps(m_sums, within), "findings": count_findings(m_runs, m_sums),
            "causes": count_causes(m_runs), "sla": sla_over(m_runs, m_sums),
            "settings": {"confidence": CONFIDENCE, "resamples": resamples, "seed": seed, "max_rows_per_step": max_rows},
            "warnings": warnings}
    if classes:  # a traffic mix: each class merged over the runs (absent without one: repeat.json as before)
        out["classes"] = classes
    return out


def repeat_folder(out: str | Path, name: str, now: dt.datetime | None = None) -> Path:
    """``<out>/<stamp>-<name>-repeat``, a new folder's path (a number added if it exists)."""
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = Path(out) / f"{stamp}-{safe_name(name)}{REPEAT_SUFFIX}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}.{n}")
    return path


def write_repeat(out_dir: str | Path, name: str, run_dirs: Iterable[str | Path], planned: int | None = None,
                 **kw: Any) -> Repetition:
    """``out_dir``/repeat.json, repeat.md and index.html of the runs; the merged result."""
    out = Path(out_dir)
    rep = merge_runs(run_dirs, name, planned, **kw)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / REPEAT_JSON, json.dumps(rep, indent=2, allow_nan=False) + "\n")
    write_text(out / REPEAT_MD, repeat_markdown(rep))
    write_text(out / REPORT_HTML, repeat_html(rep))
    return rep


# -- reading one back ----------------------------------------------------------------------------------
def read_repeat(path: str | Path) -> Repetition:
    """repeat.json of a merged result; RunDirError (one line) when it is missing or unreadable."""
    p = Path(path) / REPEAT_JSON
    try:
        rep = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{p}: unreadable ({' '.join(str(exc).split()) or type(exc).__name__})") from None
    if not isinstance(rep, dict) or not isinstance(rep.get("runs"), list) or not isinstance(rep.get("steps"), list):
        raise RunDirError(f"{p}: not a kneeswarm repeat.json (no runs[] and steps[])")
    return rep  # type: ignore[return-value]  # JSON from disk, checked for the keys its readers need


def member_dirs(folder: str | Path, rep: Repetition) -> list[Path]:
    """The run directories of a merged result: as recorded, else beside the folder (moved together)."""
    out = []
    for r in rep["runs"]:
        recorded = Path(str(r.get("run_dir") or ""))
        beside = Path(folder).parent / recorded.name
        out.append(recorded if recorded.is_dir() else beside)
    return out


def remerge(folder: str | Path) -> Repetition:
    """A merged result written again from its runs (``kneeswarm analyze FOLDER``, after `analyze`
    rewrote one of them, or with this version's merge)."""
    rep = read_repeat(folder)
    return write_repeat(folder, str(rep.get("name") or Path(folder).name), member_dirs(folder, rep),
                        int(rep.get("planned") or len(rep["runs"])))


def merged_members(folder: str | Path) -> list[Path]:
    """The resolved run directories a merged result names (for the history: one point, not N)."""
    try:
        rep = read_repeat(folder)
    except RunDirError:
        return []
    return [d.resolve() for d in member_dirs(folder, rep)]
