"""Read everything analysis needs from a run directory, tolerating whatever is missing.

A run that crashed half-way may lack meta.json, plan.toml, steps' ends, request parts,
generator or host files; each missing piece is logged and replaced by an empty value so
that the analysis reports what it has instead of failing.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.target import PROMETHEUS_STREAM, wanted_columns
from kneeswarm.plan import AnalysisPlan, LoadPlan
from kneeswarm.rundir import RunDir

logger = logging.getLogger(__name__)

HOST_STREAMS = ("vmstat", "process", "threads", "gpu")
# where the preferred file of a stream is missing, these are read instead (procfs sampler's tables)
STREAM_FALLBACKS = {"process": ("process.procfs",), "threads": ("threads.procfs",)}


@dataclass
class Settings:
    """The plan values that change the analysis (defaults from kneeswarm.plan)."""

    settle: float = LoadPlan().settle
    min_requests: int = AnalysisPlan().min_requests
    generator_cpu_max: float = AnalysisPlan().generator_cpu_max


@dataclass
class RunInputs:
    run_dir: RunDir
    run_id: str
    meta: dict[str, Any]
    plan: dict[str, Any]
    settings: Settings
    steps: pd.DataFrame
    requests: pd.DataFrame
    generator: dict[str, pd.DataFrame] = field(default_factory=dict)
    hosts: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)


def read_plan(path: Path) -> dict[str, Any]:
    """The resolved plan as a dict; {} when missing or unreadable (never raises)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        logger.warning("%s: missing; using default analysis settings", path)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        logger.warning("%s: unreadable (%s); using default analysis settings", path, e)
    return {}


def settings_from_plan(plan: dict[str, Any]) -> Settings:
    s = Settings()
    load = plan.get("load") if isinstance(plan.get("load"), dict) else {}
    ana = plan.get("analysis") if isinstance(plan.get("analysis"), dict) else {}
    for name, table, cast in (
        ("settle", load, float),
        ("min_requests", ana, int),
        ("generator_cpu_max", ana, float),
    ):
        if name in table:
            try:
                setattr(s, name, cast(table[name]))
            except (TypeError, ValueError):
                logger.warning("plan.toml: %s=%r is not a number; using %r", name, table[name], getattr(s, name))
    return s


def _read_csv_safe(read, what: str) -> pd.DataFrame | None:
    try:
        df = read()
    except Exception as e:  # a torn or garbled CSV must not stop the analysis
        logger.warning("%s: unreadable, skipped (%s)", what, e)
        return None
    if df is None or df.empty or "t" not in df.columns:
        return None
    df = df.copy()
    df["t"] = pd.to_numeric(df["t"], errors="coerce")
    return df.dropna(subset=["t"]).sort_values("t", kind="stable").reset_index(drop=True)


def read_generator(rd: RunDir) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for p in sorted(rd.generator_dir.glob("*.csv")) if rd.generator_dir.is_dir() else []:
        if p.stat().st_size == 0:
            continue
        df = _read_csv_safe(lambda p=p: pd.read_csv(p), str(p))
        if df is not None:
            out[p.stem] = df
    return out


def read_prometheus(path: Path) -> pd.DataFrame | None:
    """hosts/<host>/prometheus.csv narrowed to the series analysis.target knows (None if none)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        header = list(pd.read_csv(path, nrows=0).columns)
    except Exception as e:
        logger.warning("%s: unreadable, skipped (%s)", path, e)
        return None
    cols = wanted_columns(header) if "t" in header else []
    if len(cols) < 2:
        logger.info("%s: no well-known target series (%d columns)", path, len(header))
        return None
    return _read_csv_safe(lambda: pd.read_csv(path, usecols=cols), str(path))


def read_hosts(rd: RunDir) -> dict[str, dict[str, pd.DataFrame]]:
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for host in rd.hosts():
        streams = {}
        for name in HOST_STREAMS:
            for file in (name, *STREAM_FALLBACKS.get(name, ())):
                df = _read_csv_safe(lambda h=host, n=file: rd.read_host_csv(h, n), f"{rd.host_dir(host)}/{file}.csv")
                if df is not None:
                    streams[name] = df
                    break
        prom = read_prometheus(rd.host_dir(host) / f"{PROMETHEUS_STREAM}.csv")
        if prom is not None:
            streams[PROMETHEUS_STREAM] = prom
        if streams:
            out[host] = streams
    return out


def read_steps(rd: RunDir) -> pd.DataFrame:
    try:
        steps = rd.read_steps()
    except Exception as e:
        logger.warning("%s: unreadable (%s); no steps", rd.steps_path, e)
        steps = pd.DataFrame(columns=["index", "users", "t_ramp", "t_steady", "t_end"])
    for col in ("index", "users", "t_ramp", "t_steady", "t_end"):
        if col not in steps.columns:
            steps[col] = float("nan")
        steps[col] = pd.to_numeric(steps[col], errors="coerce")
    return steps.reset_index(drop=True)


def load_inputs(run_dir: str | Path) -> RunInputs:
    rd = RunDir.open(run_dir)
    meta = rd.read_meta()
    plan = read_plan(rd.plan_path)
    return RunInputs(
        run_dir=rd,
        run_id=str(meta.get("run_id") or rd.path.name),
        meta=meta,
        plan=plan,
        settings=settings_from_plan(plan),
        steps=read_steps(rd),
        requests=rd.read_requests(),
        generator=read_generator(rd),
        hosts=read_hosts(rd),
    )
