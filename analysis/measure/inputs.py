"""Read everything analysis needs from a run directory, tolerating whatever is missing.

A run that crashed half-way may lack meta.json, plan.toml, steps' ends, request parts,
generator or host files; each missing or unreadable piece is replaced by an empty value so that
the analysis reports what it has instead of failing, and is said in ``RunInputs.warnings``
(one line each) and, where data was lost, counted in ``RunInputs.lost`` ({what: count}); both
reach summary.json and the top of the report.
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from kneeswarm.analysis.measure.rebuild import missing_lines, rebuild_parsed
from kneeswarm.analysis.measure.requestscan import ScanResult, scan_parts
from kneeswarm.analysis.measure.serverstats import combine_thread_samples, thread_samples
from kneeswarm.analysis.schema.summary import PlanTable
from kneeswarm.analysis.measure.target import PROMETHEUS_STREAM, wanted_columns
from kneeswarm.contracts.plan import AnalysisPlan, LoadPlan
from kneeswarm.analysis.measure.trust import clock_error_bounds, is_closed_loop
from kneeswarm.analysis.measure.windows import step_settles
from kneeswarm.contracts.rundir import CLOCKS_FILE, STEP_COLUMNS, Meta, RunDir, UnreadablePart, WarningLog

logger = logging.getLogger(__name__)

HOST_STREAMS = ("vmstat", "process", "threads", "gpu", "cgroup", "fds", "tree")  # tables read from hosts/<host>/<table>[.<collector>].csv
THREAD_CHUNK_ROWS = 262_144  # threads.csv rows read at a time (read_thread_samples): ~30 MB of a 9-column table
GENERATOR_NEEDS = ("t", "cpu_pct")  # a generator CSV without these cannot feed the CPU guard


@dataclass
class Settings:
    """The plan values that change the analysis (defaults from kneeswarm.contracts.plan)."""

    settle: float = LoadPlan().settle
    min_requests: int = AnalysisPlan().min_requests
    generator_cpu_max: float = AnalysisPlan().generator_cpu_max

    def describe(self) -> str:
        """"settle=2.0, min_requests=100, generator_cpu_max=90.0"."""
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))


@dataclass
class RunInputs:
    run_dir: RunDir
    run_id: str
    meta: Meta
    plan: PlanTable
    settings: Settings
    steps: pd.DataFrame
    scan: ScanResult  # the request rows, reduced in one pass: per-step statistics, totals, timeline
    generator: dict[str, pd.DataFrame] = field(default_factory=dict)
    hosts: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    warnings: WarningLog = field(default_factory=WarningLog)  # what analysis itself found wrong
    lost: dict[str, int] = field(default_factory=dict)  # what analysis could not read: {what: count}
    unreadable_parts: list[UnreadablePart] = field(default_factory=list)
    generator_unreadable: dict[str, str] = field(default_factory=dict)  # worker (CSV stem) -> why
    parse: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> parse stats of a rebuild (collectors')
    think_ms: float = 0.0  # the plan's [load] wait_ms: each user's think time between requests
    closed_loop: bool = True  # false for [load] arrivals = "open" (no Little's-law check)
    clock_bounds: dict[str, float] = field(default_factory=dict)  # kneeswarm.analysis.measure.trust.clock_error_bounds


def count_lost(lost: dict[str, int], what: str, n: int = 1) -> None:
    lost[what] = lost.get(what, 0) + n


def read_plan(path: Path, warnings: WarningLog | None = None) -> PlanTable:
    """The resolved plan as a dict; {} when missing or unreadable (never raises; said in warnings)."""
    why = None
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        why = "missing"
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
        why = f"unreadable ({e})"
    line = f"plan.toml {why}: analysis used the default settings {Settings().describe()}"
    logger.warning("%s", line)
    if warnings is not None:
        warnings.add(line)
    return {}


def settings_from_plan(plan: PlanTable, warnings: WarningLog | None = None) -> Settings:
    """The analysis settings of a plan; a bad or missing value falls back to its default, said in
    ``warnings`` (a missing plan is said by :func:`read_plan`)."""
    s = Settings()
    load = got if isinstance(got := plan.get("load"), dict) else {}
    ana = got if isinstance(got := plan.get("analysis"), dict) else {}
    for name, table, cast in (
        ("settle", load, float),
        ("min_requests", ana, int),
        ("generator_cpu_max", ana, float),
    ):
        if name in table:
            try:
                setattr(s, name, cast(table[name]))
                continue
            except (TypeError, ValueError):
                line = (f"plan.toml: {name}={table[name]!r} is not a number; "
                        f"analysis used the default {name}={getattr(s, name)!r}")
        elif plan:
            line = f"plan.toml has no {name}; analysis used the default {name}={getattr(s, name)!r}"
        else:
            continue
        logger.warning("%s", line)
        if warnings is not None:
            warnings.add(line)
    return s


def _read_csv_safe(read: Callable[[], pd.DataFrame | None], what: str, warnings: WarningLog | None = None,
                   lost: dict[str, int] | None = None) -> pd.DataFrame | None:
    """A host CSV sorted by a numeric ``t``; None when empty, without ``t`` or unreadable (said in
    ``warnings``, counted in ``lost["host_csvs"]``)."""
    try:
        df = read()
    except Exception as e:  # a torn or garbled CSV must not stop the analysis
        _unreadable(what, e, warnings, lost)
        return None
    if df is None or df.empty or "t" not in df.columns:
        return None
    return _sorted_by_t(df)


def _unreadable(what: str, e: Exception, warnings: WarningLog | None, lost: dict[str, int] | None) -> None:
    """A host CSV that could not be read: logged, a warning, and counted in ``lost["host_csvs"]``."""
    logger.warning("%s: unreadable, skipped (%s)", what, e)
    if warnings is not None:
        warnings.add(f"{what}: unreadable, skipped ({_one_line(e)})")
    if lost is not None:
        count_lost(lost, "host_csvs")


def _one_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _sorted_by_t(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["t"] = pd.to_numeric(df["t"], errors="coerce")
    return df.dropna(subset=["t"]).sort_values("t", kind="stable").reset_index(drop=True)


def read_generator_csv(path: Path) -> tuple[pd.DataFrame, int]:
    """One worker's generator CSV and the number of malformed lines skipped (e.g. a torn last
    append).  Raises ValueError when it cannot feed the CPU guard (no t or cpu_pct column)."""
    bad: list[list[str]] = []
    df = pd.read_csv(path, engine="python", on_bad_lines=lambda line: bad.append(line))
    missing = [c for c in GENERATOR_NEEDS if c not in df.columns]
    if missing:
        raise ValueError(f"no {', '.join(missing)} column")
    for c in GENERATOR_NEEDS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return _sorted_by_t(df), len(bad)


def read_generator(rd: RunDir, inputs: RunInputs | None = None) -> dict[str, pd.DataFrame]:
    """{worker: samples} from generator/*.csv.  A CSV that cannot be read is named in
    ``inputs.generator_unreadable`` (its steps cannot be trusted: the CPU guard is blind there)."""
    out: dict[str, pd.DataFrame] = {}
    for p in sorted(rd.generator_dir.glob("*.csv")) if rd.generator_dir.is_dir() else []:
        try:
            df, skipped = read_generator_csv(p)
        except Exception as e:  # noqa: BLE001 - any unreadable file becomes a counted loss
            why = _one_line(e) if p.stat().st_size else "empty file"
            logger.warning("%s: unreadable (%s)", p, why)
            if inputs is not None:
                inputs.generator_unreadable[p.stem] = why
                inputs.warnings.add(f"generator/{p.name}: unreadable ({why}): worker {p.stem}'s CPU is "
                                    "unknown, its steps are not valid")
                count_lost(inputs.lost, "generator_csvs")
            continue
        if skipped and inputs is not None:
            inputs.warnings.add(f"generator/{p.name}: {skipped} malformed lines skipped")
        out[p.stem] = df
    return out


def read_thread_samples(path: Path, chunk_rows: int | None = None) -> pd.DataFrame | None:
    """threads.csv reduced to its per-sample figures (kneeswarm.analysis.measure.serverstats.active_threads: t,
    active_threads, top_thread_cpu_pct), read ``chunk_rows`` rows at a time: the table has a row
    per thread per sample (2 h of a 256-thread process sampled each second: 1.8M rows) and the
    analysis needs only these.  The same figures as the whole table read by ``pd.read_csv`` and
    passed to ``active_threads``, and None or an exception exactly where ``_read_csv_safe`` would
    give them: empty or no ``t`` -> None; a table with ``t`` but no ``cpu_pct`` -> no samples."""
    parts, rows, columns = [], 0, []
    with pd.read_csv(path, chunksize=chunk_rows or THREAD_CHUNK_ROWS) as reader:
        for chunk in reader:
            rows, columns = rows + len(chunk), list(chunk.columns)
            if "t" not in chunk.columns or "cpu_pct" not in chunk.columns:
                continue  # read on: a torn line further on makes the table unreadable, as a whole read
            chunk = chunk[["t", "cpu_pct"]].assign(t=pd.to_numeric(chunk["t"], errors="coerce")).dropna(subset=["t"])
            parts.append(thread_samples(chunk))
    if not rows or "t" not in columns:
        return None
    return combine_thread_samples(parts)


def read_host_table(name: str, path: Path, what: str, warnings: WarningLog | None = None,
                    lost: dict[str, int] | None = None) -> pd.DataFrame | None:
    """One host table as read_hosts keeps it: threads as its per-sample figures
    (:func:`read_thread_samples`), the others whole (a row per sample and pid or GPU: small)."""
    if name != "threads":
        return _read_csv_safe(partial(pd.read_csv, path), what, warnings, lost)
    try:
        return read_thread_samples(path)
    except Exception as e:  # a torn or garbled CSV must not stop the analysis
        _unreadable(what, e, warnings, lost)
        return None


def read_prometheus(path: Path, warnings: WarningLog | None = None,
                    lost: dict[str, int] | None = None) -> pd.DataFrame | None:
    """hosts/<host>/prometheus.csv narrowed to the series kneeswarm.analysis.measure.target knows (None if none)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        header = list(pd.read_csv(path, nrows=0).columns)
    except Exception as e:
        _unreadable(f"hosts/{path.parent.name}/{path.name}", e, warnings, lost)
        return None
    cols = wanted_columns(header) if "t" in header else []
    if len(cols) < 2:
        logger.info("%s: no well-known target series (%d columns)", path, len(header))
        return None
    return _read_csv_safe(lambda: pd.read_csv(path, usecols=cols), f"hosts/{path.parent.name}/{path.name}",
                          warnings, lost)


def read_hosts(rd: RunDir, warnings: WarningLog | None = None,
               lost: dict[str, int] | None = None) -> dict[str, dict[str, pd.DataFrame]]:
    """{host: {table: samples}}: each of HOST_STREAMS from its preferred <table>.csv, else from the
    first other collector's <table>.<collector>.csv that reads; the target's series from prometheus.csv.
    ``threads`` holds the thread table's per-sample figures, not its rows (:func:`read_host_table`)."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for host in rd.hosts():
        streams = {}
        tables = rd.host_tables(host)
        for name in HOST_STREAMS:
            for collector in tables.get(name, []):
                path = rd.host_table_path(host, name, collector)
                df = read_host_table(name, path, f"hosts/{host}/{path.name}", warnings, lost)
                if df is not None:
                    streams[name] = df
                    break
        prom = read_prometheus(rd.host_table_path(host, PROMETHEUS_STREAM), warnings, lost)
        if prom is not None:
            streams[PROMETHEUS_STREAM] = prom
        if streams:
            out[host] = streams
    return out


def read_steps(rd: RunDir, warnings: WarningLog | None = None) -> pd.DataFrame:
    """steps.csv with numeric STEP_COLUMNS (NaN where missing); no rows when missing or unreadable."""
    try:
        steps = rd.read_steps()
    except Exception as e:
        logger.warning("%s: unreadable (%s); no steps", rd.steps_path, e)
        if warnings is not None:
            warnings.add(f"steps.csv: unreadable ({_one_line(e)}): no steps")
        steps = pd.DataFrame(columns=list(STEP_COLUMNS))
    for col in STEP_COLUMNS:
        if col not in steps.columns:
            steps[col] = float("nan")
        steps[col] = pd.to_numeric(steps[col], errors="coerce")
    if "t_cut" in steps.columns:
        steps["t_cut"] = pd.to_numeric(steps["t_cut"], errors="coerce")
    return steps.reset_index(drop=True)


def think_time_ms(plan: PlanTable, warnings: WarningLog | None = None) -> float:
    """The plan's ``[load] wait_ms`` (0 when absent; a bad value is said and read as 0)."""
    load = got if isinstance(got := plan.get("load"), dict) else {}
    raw = load.get("wait_ms", 0.0)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if math.isfinite(value) and value >= 0:
        return value
    if warnings is not None:
        warnings.add(f"plan.toml: wait_ms={raw!r} is not a think time in ms; Little's law checked with 0")
    return 0.0


def read_worker_clocks(rd: RunDir, warnings: WarningLog | None = None) -> dict[str, Any]:  # JSON from disk
    """generator/clocks.json ({worker: {offset_s, error_s, ...}}), {} when missing or unreadable."""
    path = rd.generator_dir / CLOCKS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (ValueError, OSError) as e:
        if warnings is not None:
            warnings.add(f"generator/{CLOCKS_FILE}: unreadable ({_one_line(e)}): workers' clock errors unknown")
        return {}
    return data if isinstance(data, dict) else {}


def load_inputs(run_dir: str | Path) -> RunInputs:
    rd = RunDir.open(run_dir)
    meta = rd.read_meta()
    warnings = WarningLog()
    plan = read_plan(rd.plan_path, warnings)
    settings = settings_from_plan(plan, warnings)
    steps = read_steps(rd, warnings)
    settle = step_settles(plan.get("load") or {}, len(steps), settings.settle)  # a soak: its first window only
    scan = scan_parts(rd, steps, settle, plan.get("sla"))  # [sla]: goodput is judged per request
    inputs = RunInputs(
        run_dir=rd,
        run_id=str(meta.get("run_id") or rd.path.name),
        meta=meta,
        plan=plan,
        settings=settings,
        steps=steps,
        scan=scan,
        warnings=warnings,
        unreadable_parts=scan.unreadable,
        think_ms=think_time_ms(plan, warnings),
        closed_loop=is_closed_loop(plan),
        clock_bounds=clock_error_bounds(meta, read_worker_clocks(rd, warnings)),
    )
    for part in scan.unreadable:
        warnings.add(part.line())
    if scan.unreadable:
        count_lost(inputs.lost, "request_parts", len(scan.unreadable))
    for aside in rd.corrupt_meta_copies():
        warnings.add(f"{aside.name}: meta.json was unreadable once and was kept aside; what it held is "
                     "missing from this report")
        count_lost(inputs.lost, "meta_json")
    inputs.generator = read_generator(rd, inputs)
    inputs.parse = rebuild_parsed(rd, meta, warnings)
    inputs.hosts = read_hosts(rd, warnings, inputs.lost)
    for line in missing_lines(rd, meta, inputs.steps, set(inputs.hosts)):
        warnings.add(line)
    return inputs
