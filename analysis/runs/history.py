"""The run history (slow drifts show over runs): every run below some folders indexed into one SQLite table
next to them, and the trend of each figure over the runs of a plan and target.

``update_index(paths, db)``: finds the run directories below ``paths`` (a folder holding meta.json
is a run; its insides are not searched further), reads each one's meta.json, plan.toml,
report/summary.json and the ``tokens_in`` column of its request parts into one row of the ``runs``
table of ``db``.  Incremental: a run whose three files have the same size and modification time as
when it was indexed is not read again.  A run without a readable summary is indexed as *skipped*
with the reason (``kneeswarm analyze RUN_DIR`` writes it), never dropped silently.

A soak (``[load] mode = "soak"``) is indexed as one step of the load it held: each percentile and
the QPS are the median over its valid windows (so a slow first or last window moves it little), the
requests those of its smallest valid window (a window's percentile rests on that window's rows),
and beside them its windows' trends and soak findings (column ``soak``).  Its windows are not
steps of rising users: read as steps, "P99 at 16 users" would be its last window's.

A repeated run (``kneeswarm run --repeat N``: a ``<stamp>-<name>-repeat`` folder holding repeat.json,
kneeswarm.analysis.runs.repeat) is indexed as one point: each figure is the mean over its runs, with
the interval between them beside it (series ``intervals``), its knee the median of its runs' knees,
and its runs are not indexed again one by one (they would count N times in the drift test).  Its
plan, target, start, versions and host facts are its first run's.

``history(db, since, plan, last)``: the indexed runs grouped by (plan name, target, and whether they
are soaks: a soak's window medians and a sweep's steps are not one series) in start order;
for each group the series of P50/P95/P99/P999 at each step's users value and at the SLA boundary,
and of the peak QPS, over the last ``last`` runs; each series with the drift test and the change
point of kneeswarm.analysis.models.trend, and beside the change point what changed between the runs on either side
(versions, host facts, plan keys, input length: ``changes``).  A run with a traffic mix keeps each
class's figures (column ``classes``; a soak's and a repeated run's as their whole's), and its group
gets each class's own series by the same rule (kneeswarm.analysis.runs.history_classes).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import sqlite3
import time
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping, cast

from kneeswarm.analysis.runs.history_classes import (class_drift_worse, class_entries, class_history,
                                                     repeated_class_entries, soak_class_entries)
from kneeswarm.analysis.schema.history import (HistoryGroup, HistoryResult, HistoryRow, HistorySeries, HistoryStep,
                                               IndexUpdate, InputTokens, LeftOut, Skipped)
from kneeswarm.analysis.schema.summary import JsonValue, RunChange, Summary, Trend, num
from kneeswarm.contracts.rundir import META_FILE, PLAN_FILE, REPEAT_JSON, SUMMARY_JSON, Meta, RunDir

logger = logging.getLogger(__name__)

__all__ = ["update_index", "history", "changes", "HistoryError", "INDEX_NAME", "DRIFT_WINDOW"]

INDEX_NAME = "kneeswarm-history.sqlite"  # the index file, next to the runs
DRIFT_WINDOW = 20  # the drift test looks at the last this-many runs of a group (--last)
PERCENTILES = ("p50_ms", "p95_ms", "p99_ms", "p999_ms")
FIGURES = (*PERCENTILES, "peak_qps")  # what --figures may choose (all by default)
TAIL_SHARE = {"p50_ms": 0.5, "p95_ms": 0.05, "p99_ms": 0.01, "p999_ms": 0.001}
# A percentile enters the drift test only where the step had at least this many requests beyond it
# (P99: 1,000 requests; P99.9: 10,000): below that it is the largest of a handful of rows, and on a
# shared machine those rose together with the load of the other runs (measured here: the P99.9 of
# 2-user steps of ~200 requests against an unchanged target "drifted" +35 % over 5 runs, p 0.017).
MIN_TAIL_ROWS = 10
# Input length changed between two runs when its mean, median or P95 moved by this share or more:
# a synthetic prompt's length is exact, and a drawn one's mean over 100+ requests moves far less.
INPUT_LENGTH_CHANGE = 0.10
# Host facts that change every run without meaning anything changed (when, which pid, what the
# agent found to run): left out of the index and of "what changed".
VOLATILE_FACTS = ("time", "agent_version", "collectors", "tools", "nvml", "procfs", "process.pid",
                  "process.candidates")
VOLATILE_PLAN_LEAVES = ("pid",)  # [[hosts]] pid: the process of this run
WATCHED_FILES = (META_FILE, PLAN_FILE, f"report/{SUMMARY_JSON}")
COLUMNS = {"path": "TEXT PRIMARY KEY", "fingerprint": "TEXT", "status": "TEXT", "reason": "TEXT", "run_id": "TEXT",
           "started": "REAL", "plan": "TEXT", "target": "TEXT", "complete": "INTEGER", "knee_users": "REAL",
           "knee_qps": "REAL", "peak_users": "REAL", "peak_qps": "REAL", "sla_users": "REAL", "sla_qps": "REAL",
           "input_tokens": "TEXT", "steps": "TEXT", "versions": "TEXT", "hosts": "TEXT", "plan_keys": "TEXT",
           "indexed_at": "REAL", "mode": "TEXT", "soak": "TEXT", "repeat": "TEXT", "knee_interval": "TEXT",
           "classes": "TEXT"}
JSON_COLUMNS = ("input_tokens", "steps", "versions", "hosts", "plan_keys", "soak", "repeat", "knee_interval", "classes")
SOAK_TRENDS = ("qps", "p50_ms", "p99_ms")  # the client series whose trend a soak's index row keeps


class HistoryError(ValueError):
    """Bad input to the history: one line for the user (exit 2)."""


# -- finding runs ---------------------------------------------------------------------------------
def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run directory and repeated run at or below ``paths`` (resolved, sorted, each once); the
    runs a repeated run found here merges are left out (it stands for them)."""
    from kneeswarm.analysis.runs.repeat import merged_members

    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise HistoryError(f"{p}: not a directory")
        if (p / META_FILE).exists() or (p / REPEAT_JSON).exists():
            found.add(p.resolve())
            continue
        for root, dirs, files in os.walk(p):
            if META_FILE in files or REPEAT_JSON in files:
                found.add(Path(root).resolve())
                dirs[:] = []  # a run's insides hold no runs
            else:
                dirs.sort()
    members = {m for r in found if (r / REPEAT_JSON).exists() for m in merged_members(r)}
    return sorted(found - members)


def default_index(paths: list[str | Path]) -> Path:
    """The index next to the runs: in the folder given, or beside the first run directory given."""
    first = Path(paths[0])
    return (first.parent if (first / META_FILE).exists() else first) / INDEX_NAME


def fingerprint(run: Path) -> str:
    parts = []
    for name in (REPEAT_JSON,) if (run / REPEAT_JSON).exists() else WATCHED_FILES:
        try:
            st = (run / name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return "|".join(parts)


# -- reading one run --------------------------------------------------------------------------------
def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:  # obj: untyped JSON or TOML (meta.json, plan.toml)
    """{"a.b.c": leaf} of nested dicts; lists of tables as a.0.b; other lists as one JSON value."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: json.dumps(obj) if isinstance(obj, list) else obj}


def _volatile(key: str, volatile: tuple[str, ...]) -> bool:
    return any(key == v or key.startswith(v + ".") or key.endswith("." + v) for v in volatile)


def host_facts(meta: Meta) -> dict[str, JsonValue]:
    """{"host.fact": value} of every host's facts in meta.json, less VOLATILE_FACTS."""
    out = {}
    for host, h in sorted(meta.get("hosts", {}).items()):
        facts = h.get("facts") if isinstance(h, dict) and isinstance(h.get("facts"), dict) else {}
        out.update({f"{host}.{k}": v for k, v in flatten(facts).items() if not _volatile(k, VOLATILE_FACTS)})
    return out


def input_tokens(run: Path) -> InputTokens:
    """{n, mean, p50, p95, min, max} of the request rows' tokens_in ({"n": 0} when none has one)."""
    import numpy as np
    import pyarrow.parquet as pq

    values = []
    for part in sorted((run / "requests").glob("part-*.parquet")):
        try:
            if "tokens_in" in pq.read_schema(part).names:
                values.append(pq.read_table(part, columns=["tokens_in"]).column("tokens_in").drop_null().to_numpy())
        except (OSError, ValueError) as exc:  # a torn part: the summary already says what was lost
            logger.warning("%s: %s", part, exc)
    x = np.concatenate(values).astype(float) if values else np.array([])
    if not len(x):
        return {"n": 0}
    return {"n": int(len(x)), "mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p95": float(np.percentile(x, 95)), "min": float(x.min()), "max": float(x.max())}


def _read_json(path: Path) -> Summary | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return cast(Summary, obj) if isinstance(obj, dict) else None  # summary.json as written, its keys read with .get


def _steps(summary: Summary) -> list[HistoryStep]:
    keys = ("users", "requests", "qps", *PERCENTILES)
    return [cast(HistoryStep, {**{k: num(s.get(k)) for k in keys}, "valid": bool(s.get("valid"))})
            for s in summary.get("steps") or [] if isinstance(s, dict) and num(s.get("users")) is not None]


def read_run(run: Path) -> HistoryRow:
    """One row of the index (JSON columns as Python objects)."""
    if (run / REPEAT_JSON).exists():
        return read_repeated(run)
    row: HistoryRow = {"path": str(run), "fingerprint": fingerprint(run), "indexed_at": time.time()}
    meta = RunDir(run).read_meta()  # {} when missing; no "started" when unreadable (it says why in the log)
    try:
        plan = tomllib.loads((run / PLAN_FILE).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        plan = {}
    row.update({"run_id": meta.get("run_id") or run.name, "started": num(meta.get("started")),
                "plan": plan.get("name"), "target": plan.get("target") or meta.get("target"),
                "versions": meta.get("versions", {}), "hosts": host_facts(meta),
                "plan_keys": {k: v for k, v in flatten(plan).items() if not _volatile(k, VOLATILE_PLAN_LEAVES)}})
    summary = _read_json(run / "report" / SUMMARY_JSON)
    if row["started"] is None:  # every run writes it first: without it the run has no place in start order
        return {**row, "status": "skipped", "reason": "meta.json missing or unreadable"}
    if summary is None:
        return {**row, "status": "skipped",
                "reason": f"no readable report/summary.json (run `kneeswarm analyze {run}`)"}
    figures = _soak_figures(summary) if isinstance(summary.get("soak"), dict) else _figures(summary)
    mode = "soak" if isinstance(summary.get("soak"), dict) else str((plan.get("load") or {}).get("mode") or "grid")
    return {**row, **figures, "mode": mode, "status": "indexed", "reason": None,
            "complete": bool(summary.get("complete")), "input_tokens": input_tokens(run)}


def _figures(summary: Summary) -> HistoryRow:
    knee, peak = summary.get("knee") or {}, summary.get("peak") or {}
    sla = summary.get("sla")
    best: Mapping[str, object] = (sla.get("best") if sla else None) or {}
    interval = knee.get("interval")  # the knee over resamples of the run's steps (summary.confidence)
    return {"knee_users": num(knee.get("users")), "knee_qps": num(knee.get("qps")),
            "knee_interval": interval if isinstance(interval, list) else None,
            "peak_users": num(peak.get("users")), "peak_qps": num(peak.get("qps")),
            "sla_users": num(best.get("users")), "sla_qps": num(best.get("qps")), "steps": _steps(summary),
            "classes": class_entries(summary)}


def read_repeated(folder: Path) -> HistoryRow:
    """A repeated run's row: its first run's facts, each figure the mean over its runs with the interval
    between them (``steps[].ci``, ``repeat.peak_qps``), its knee and SLA boundary the median of its runs'."""
    from kneeswarm.analysis.runs.repeat import member_dirs, read_repeat
    from kneeswarm.contracts.rundir import RunDirError

    base: HistoryRow = {"path": str(folder), "fingerprint": fingerprint(folder), "indexed_at": time.time(), "run_id": folder.name}
    try:
        rep = read_repeat(folder)
    except RunDirError as exc:
        return {**base, "status": "skipped", "reason": str(exc)}
    members = [read_run(d) for d, r in zip(member_dirs(folder, rep), rep["runs"]) if r["merged"] and d.is_dir()]
    members = [m for m in members if m["status"] == "indexed"]
    if not members:
        return {**base, "status": "skipped", "reason": "none of its runs could be read"}
    first = members[0]
    steps = [cast(HistoryStep, {"users": float(s["users"]), "requests": num(s["requests"]),
              **{k: s[k]["mean"] for k in ("qps", *PERCENTILES)},  # type: ignore[literal-required]
              "valid": s["valid"] >= 2 and 2 * s["valid"] >= s["ran"],
              "ci": {k: s[k]["between"] for k in ("qps", *PERCENTILES)}}) for s in rep["steps"]]  # type: ignore[literal-required]
    knee = rep["knee"]
    return {**first, **base, "status": "indexed", "reason": None, "complete": bool(rep["complete"]), "steps": steps,
            "knee_users": knee["median"],
            "knee_interval": None,  # the first run's own; the series' spread is repeat.knee (lo, hi over its runs)
            "knee_qps": _median([m.get("knee_qps") for m in members]),
            "peak_users": _median([m.get("peak_users") for m in members]), "peak_qps": rep["peak"]["qps"]["mean"],
            "sla_users": _median([m.get("sla_users") for m in members]),
            "sla_qps": _median([m.get("sla_qps") for m in members]), "classes": repeated_class_entries(rep),
            "repeat": {"runs": rep["merged"], "planned": rep["planned"], "members": [m["run_id"] for m in members],
                       "knee": {k: knee[k] for k in ("lo", "hi", "median", "mode", "mode_runs", "text")},
                       "peak_qps": rep["peak"]["qps"]["between"],
                       "findings": [{"id": c["id"], "label": c["label"], "stable": c["stable"]} for c in rep["findings"]]}}


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    mid = len(known) // 2
    return known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2.0


def _soak_figures(summary: Summary) -> HistoryRow:
    """A soak's index figures (see the module's text): one step at its users, each figure the median
    over its valid windows; no knee, SLA boundary or peak (one load held); its trends and findings."""
    from kneeswarm.analysis.summary.soak import SOAK_IDS

    soak = summary["soak"]
    windows = _steps(summary)
    valid = [w for w in windows if w["valid"]]
    step = cast(HistoryStep, {"users": valid[0].get("users"), "requests": min(w.get("requests") or 0.0 for w in valid),
                              **{k: _median([_at(w, k) for w in valid]) for k in ("qps", *PERCENTILES)},
                              "valid": True}) if valid else None
    client = (soak.get("trends") or {}).get("client") or {}
    trends = {k: cast(Trend, {f: client[k].get(f) for f in ("slope", "p", "direction", "drifting", "change", "median")})
              for k in SOAK_TRENDS if isinstance(client.get(k), dict)}
    found = [{"id": f.get("id"), "host": (f.get("evidence") or {}).get("host")}
             for f in summary.get("findings") or [] if isinstance(f, dict) and f.get("id") in SOAK_IDS]
    return {"knee_users": None, "knee_qps": None, "peak_users": None, "peak_qps": step.get("qps") if step else None,
            "sla_users": None, "sla_qps": None, "steps": [step] if step else [], "classes": soak_class_entries(summary),
            "soak": {"windows": len(windows), "valid_windows": len(valid), "window_s": num(soak.get("window_s")),
                     "duration_s": num(soak.get("duration_s")), "users": num(soak.get("users")),
                     "rate": num(soak.get("rate")), "trends": trends, "findings": found}}


# -- the index --------------------------------------------------------------------------------------
def _connect(db: Path) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(db)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise HistoryError(f"{db}: not a usable SQLite index ({exc})") from None
    have = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    if have and have != list(COLUMNS):  # an index of another version: it is a cache, rebuilt
        logger.warning("%s: columns %s differ from this version's; rebuilding the index", db, have)
        con.execute("DROP TABLE runs")
    cols = ", ".join(f"{k} {t}" for k, t in COLUMNS.items())
    con.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
    return con


def update_index(paths: list[str | Path], db: Path) -> IndexUpdate:
    """Index the runs below ``paths`` into ``db``; {runs, read, unchanged, skipped[{path, reason}]}."""
    runs = find_runs(paths)
    if not runs:
        raise HistoryError(f"no run directory (a folder with meta.json) below {', '.join(map(str, paths))}")
    con = _connect(db)
    try:
        return _update(con, runs, db)
    except sqlite3.OperationalError as exc:  # the disk, not the input: exit 1 (cli's OSError)
        raise OSError(f"{db}: cannot write the index: {exc}") from None
    finally:
        con.close()


def _update(con: sqlite3.Connection, runs: list[Path], db: Path) -> IndexUpdate:
    """Read the runs whose fingerprint changed into ``con``; the counts and the skipped runs."""
    known = dict(con.execute("SELECT path, fingerprint FROM runs").fetchall())
    read = 0
    for run in runs:
        if known.get(str(run)) == fingerprint(run):
            continue
        row = read_run(run)
        values = [json.dumps(row.get(k)) if k in JSON_COLUMNS else row.get(k) for k in COLUMNS]
        con.execute(f"INSERT OR REPLACE INTO runs VALUES ({', '.join('?' * len(COLUMNS))})", values)
        read += 1
    con.commit()
    wanted = {str(r) for r in runs}
    skipped: list[Skipped] = [{"path": p, "reason": r} for p, r in
                              con.execute("SELECT path, reason FROM runs WHERE status = 'skipped' ORDER BY path") if p in wanted]
    logger.debug("%s: %d runs, %d read", db, len(runs), read)
    return {"runs": len(runs), "read": read, "unchanged": len(runs) - read, "skipped": skipped,
            "paths": [str(r) for r in runs]}


def load_index(db: Path, paths: list[str] | None = None) -> list[HistoryRow]:
    """The indexed rows (of ``paths`` only, when given), JSON columns decoded, in start order."""
    con = _connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY started, path")]
    finally:
        con.close()
    wanted = set(paths) if paths is not None else None
    for r in rows:
        r.update({k: json.loads(r[k]) if r[k] is not None else None for k in JSON_COLUMNS})
    return [cast(HistoryRow, r) for r in rows if wanted is None or r["path"] in wanted]  # this version's columns


# -- what changed -----------------------------------------------------------------------------------
def _dict_changes(what: str, a: Mapping[str, JsonValue], b: Mapping[str, JsonValue]) -> list[RunChange]:
    return [{"what": what, "key": k, "before": a.get(k), "after": b.get(k)}
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _input_changes(a_in: InputTokens | None, b_in: InputTokens | None) -> list[RunChange]:
    a, b = cast(dict[str, float], a_in or {"n": 0}), cast(dict[str, float], b_in or {"n": 0})
    if not a.get("n") and not b.get("n"):
        return []
    moved = [k for k in ("mean", "p50", "p95") if a.get(k) is None or b.get(k) is None
             or abs(b[k] - a[k]) >= INPUT_LENGTH_CHANGE * max(abs(a[k]), 1e-9)]
    if not moved:
        return []
    return [{"what": "input length", "key": f"tokens_in {k}", "before": a.get(k), "after": b.get(k)}
            for k in ("mean", "p50", "p95")]


def changes(before: HistoryRow, after: HistoryRow) -> list[RunChange]:
    """What differs between two indexed runs: [{what, key, before, after}], ``what`` one of
    "input length", "versions", "host facts", "plan keys"."""
    return (_input_changes(before.get("input_tokens"), after.get("input_tokens"))
            + _dict_changes("versions", before.get("versions") or {}, after.get("versions") or {})
            + _dict_changes("host facts", before.get("hosts") or {}, after.get("hosts") or {})
            + _dict_changes("plan keys", before.get("plan_keys") or {}, after.get("plan_keys") or {}))


# -- the trend of each figure -----------------------------------------------------------------------
def _step_at(row: HistoryRow, users: float | None) -> HistoryStep | None:
    """The valid step of ``row`` with ``users`` (the last one if a run repeated it)."""
    found = [s for s in row.get("steps") or [] if s.get("valid") and users is not None and s.get("users") == users]
    return found[-1] if found else None


def _series_specs(rows: list[HistoryRow]) -> list[tuple[str, float | None, str, int]]:
    """(figure, users, metric, worse) of every series: percentiles at each users value, at the SLA
    boundary, and the peak QPS; of soaks (a group is all soaks or none): the windows' medians."""
    soaks = bool(rows) and all(r.get("mode") == "soak" for r in rows)
    users = sorted({u for r in rows for s in r.get("steps") or [] if s.get("valid") and (u := s.get("users")) is not None})
    held = " (windows' median)" if soaks else ""
    specs: list[tuple[str, float | None, str, int]] = [(f"{m} at {u:g} users{held}", u, m, +1) for u in users
                                                       for m in PERCENTILES]
    if any(r.get("sla_users") is not None for r in rows):
        specs += [(f"{m} at the SLA boundary", None, m, +1) for m in PERCENTILES]
    return specs + [("QPS (windows' median)" if soaks else "peak QPS", None, "peak_qps", -1)]


def _at(step: HistoryStep, metric: str) -> float | None:
    """A step's figure by name (users, requests, qps or a percentile)."""
    return cast(float | None, step.get(metric))


def _value(row: HistoryRow, users: float | None, metric: str, figure: str) -> float | None:
    if metric == "peak_qps":
        return row.get("peak_qps")
    step = _step_at(row, row.get("sla_users") if figure.endswith("SLA boundary") else users)
    return _at(step, metric) if step else None


def measured(row: HistoryRow, users: float | None, metric: str, figure: str) -> bool:
    """Whether the value rests on at least MIN_TAIL_ROWS requests beyond the percentile."""
    if metric not in TAIL_SHARE:
        return True
    step = _step_at(row, row.get("sla_users") if figure.endswith("SLA boundary") else users)
    return step is not None and (step.get("requests") or 0) * TAIL_SHARE[metric] >= MIN_TAIL_ROWS


def series(rows: list[HistoryRow], figures: tuple[str, ...] = FIGURES) -> list[HistorySeries]:
    """One entry per figure: values in run order, the drift test, the change point and what changed
    between the runs on either side of it."""
    from kneeswarm.analysis.models import trend  # numpy and scipy: not for `kneeswarm --help`

    out: list[HistorySeries] = []
    for figure, users, metric, worse in _series_specs(rows):
        if metric not in figures:
            continue
        values = [_value(r, users, metric, figure) for r in rows]
        if sum(v is not None for v in values) == 0:
            continue
        tested = [v if measured(r, users, metric, figure) else None for v, r in zip(values, rows)]
        cp = trend.change_point(tested)
        if cp is not None:
            before = max(i for i in range(cp["index"]) if tested[i] is not None)
            cp.update({"run": rows[cp["index"]]["run_id"], "previous_run": rows[before]["run_id"],
                       "changes": changes(rows[before], rows[cp["index"]])})
        d = trend.drift(tested, worse)
        if sum(v is not None for v in tested) < sum(v is not None for v in values):
            d["unmeasured"] = sum(v is not None for v in values) - sum(v is not None for v in tested)
            left = f"{d['unmeasured']} runs had < {MIN_TAIL_ROWS} requests beyond this percentile"
            d["reason"] = f"{left}; {d['reason']}" if d["reason"] else left
        out.append({"figure": figure, "users": users, "metric": metric, "values": values, "drift": d, "change_point": cp,
                    "intervals": [interval(r, users, metric, figure) for r in rows]})
    return out


def interval(row: HistoryRow, users: float | None, metric: str, figure: str) -> list[float] | None:
    """A repeated run's interval between its runs of the figure's value; None for a single run."""
    rep = row.get("repeat")
    if not rep:
        return None
    if metric == "peak_qps":
        return rep.get("peak_qps")
    step = _step_at(row, row.get("sla_users") if figure.endswith("SLA boundary") else users)
    return ((step or {}).get("ci") or {}).get(metric)


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise HistoryError(f"--since {text!r}: not an ISO date or time (e.g. 2026-11-01 or 2026-11-01T12:00)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _figures_chosen(text: str | None) -> tuple[str, ...]:
    if not text:
        return FIGURES
    chosen = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in chosen if x not in FIGURES]
    if unknown or not chosen:
        raise HistoryError(f"--figures {text!r}: choose from {', '.join(FIGURES)}")
    return chosen


def history(rows: list[HistoryRow], since: str | None = None, plan: str | None = None,
            last: int = DRIFT_WINDOW, figures: str | None = None) -> HistoryResult:
    """{groups[{plan, target, soak, runs[], left_out[], series[], [classes[]]}], drift_worse[], skipped[]}
    of the indexed ``rows``; groups by (plan name, target, soak or not), each over its last ``last``
    complete runs (a soak's runs carry their ``soak`` entry: windows, trends, findings; a group with a
    traffic mix its classes' series: kneeswarm.analysis.runs.history_classes)."""
    from kneeswarm.analysis.models import trend

    t0, chosen_figures = _since(since), _figures_chosen(figures)
    if last < trend.MIN_RUNS:
        raise HistoryError(f"--last {last}: the trend test needs at least {trend.MIN_RUNS} runs")
    chosen = [r for r in rows if (t0 is None or (r.get("started") or 0) >= t0) and (plan is None or r.get("plan") == plan)]
    if plan is not None and not chosen:
        raise HistoryError(f"--plan {plan!r}: no indexed run has that plan name")
    groups: dict[tuple[str, str, bool], list[HistoryRow]] = {}
    for r in chosen:
        if r["status"] == "indexed":
            groups.setdefault((str(r.get("plan")), str(r.get("target")), r.get("mode") == "soak"), []).append(r)
    out: list[HistoryGroup] = []
    for (name, target, soak), members in sorted(groups.items()):
        complete = [r for r in members if r.get("complete")][-last:]
        left: list[LeftOut] = [{"run": r["run_id"], "reason": "incomplete run"} for r in members if not r.get("complete")]
        group: HistoryGroup = {"plan": name, "target": target, "soak": soak, "left_out": left,
                    "series": series(complete, chosen_figures),
                    "runs": [{"run_id": r["run_id"], "started": r["started"], "path": r["path"],
                              **({"soak": r.get("soak")} if soak else {}),
                              **({"repeat": r["repeat"]} if r.get("repeat") else {}),
                              **({"knee_users": r.get("knee_users"), "knee_interval": r["knee_interval"]}
                                 if r.get("knee_interval") else {})} for r in complete]}
        if classes := class_history(complete, chosen_figures):  # a mix's classes: the key only where one ran
            group["classes"] = classes
        out.append(group)
    worse = [entry for g in out for entry in
             [{"plan": g["plan"], "target": g["target"], "soak": g["soak"], "figure": s["figure"], **s["drift"]}
              for s in g["series"] if s["drift"]["direction"] == "worse"] + class_drift_worse(g)]
    skipped: list[Skipped] = [{"path": r["path"], "reason": r["reason"]} for r in chosen if r["status"] == "skipped"]
    return {"groups": out, "drift_worse": worse, "skipped": skipped, "window": last, "figures": list(chosen_figures),
            "thresholds": {"alpha": trend.DRIFT_ALPHA, "min_relative_drift": trend.MIN_RELATIVE_DRIFT,
                           "min_runs": trend.MIN_RUNS, "input_length_change": INPUT_LENGTH_CHANGE,
                           "min_tail_rows": MIN_TAIL_ROWS}}


def write_outputs(result: HistoryResult, out: Path) -> Path:
    """history.md, history.html and history.json into ``out``; the HTML's path."""
    from kneeswarm.analysis.reports.history_report import history_html, history_markdown
    from kneeswarm.contracts.rundir import write_json, write_text

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "history.md", history_markdown(result))
    write_json(out / "history.json", result)
    write_text(out / "history.html", history_html(result))
    return out / "history.html"


def run_history(paths: list[str | Path], index: str | None = None, out: str | None = None, since: str | None = None,
                plan: str | None = None, last: int | None = None,
                figures: str | None = None) -> tuple[HistoryResult, Path]:
    """``kneeswarm history``: index, trend, report; (result, path of history.html)."""
    last = DRIFT_WINDOW if last is None else last
    db = Path(index) if index else default_index(paths)
    indexed = update_index(paths, db)
    result = history(load_index(db, indexed["paths"]), since, plan, last, figures)
    result["index"] = {"path": str(db), **{k: indexed[k] for k in ("runs", "read", "unchanged")}}
    return result, write_outputs(result, Path(out) if out else db.parent / "history")
