"""Rebuild what can be derived from disk, and say what cannot be.

A controller killed before its hosts were parsed leaves ``hosts/<host>/raw/*`` without the parsed
``hosts/<host>/*.csv``: :func:`rebuild_parsed` parses them again (kneeswarm.collectors.parsed, with the
clock offsets recorded in meta.json; a host without a measured offset is parsed as it is, with
an "uncorrected clock" warning).  :func:`missing_lines` names what is missing and cannot be
rebuilt: steps.csv, a step's end, request parts, a monitored host's data.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pandas as pd

from kneeswarm.collectors import by_raw_file
from kneeswarm.collectors.correction import ClockCorrection
from kneeswarm.collectors.parsed import write_parsed_csvs
from kneeswarm.contracts.rundir import Meta, RunDir, WarningLog, safe_name

logger = logging.getLogger(__name__)


def _host_meta(meta: Meta, host: str) -> dict[str, Any]:  # meta.json's host entry: untyped JSON
    """meta.json["hosts"][label] of the host whose directory is ``host`` ({} if none)."""
    for label, entry in meta.get("hosts", {}).items():
        if safe_name(str(label)) == host and isinstance(entry, dict):
            return entry
    return {}


def clock_correction(meta: Meta, host: str) -> tuple[ClockCorrection, str | None]:
    """The host's clock correction from meta.json, and why it is missing (None when measured)."""
    clock = _host_meta(meta, host).get("clock")
    try:
        correction = ClockCorrection.from_dict(clock if isinstance(clock, dict) else None)
    except (KeyError, TypeError, ValueError) as e:
        return ClockCorrection(), f"its clock offset in meta.json is unreadable ({type(e).__name__}: {e})"
    if correction.before is None and correction.after is None:
        return correction, "no measured clock offset in meta.json"
    return correction, None


def needs_parsing(rd: RunDir, host: str) -> bool:
    """True when hosts/<host>/raw/ holds a collector's raw file and no parsed CSV is there."""
    raw = rd.raw_dir(host)
    if not raw.is_dir() or any(rd.host_dir(host).glob("*.csv")):
        return False
    return any(by_raw_file(p.name) is not None and p.stat().st_size for p in raw.iterdir() if p.is_file())


def rebuild_parsed(rd: RunDir, meta: Meta, warnings: WarningLog) -> dict[str, dict[str, Any]]:  # collectors' stats
    """Parse raw/ of every host that has no parsed CSVs; {host: parse stats} of those parsed."""
    out: dict[str, dict[str, Any]] = {}
    for host in rd.hosts():
        if not needs_parsing(rd, host):
            continue
        correction, why = clock_correction(meta, host)
        if why:
            warnings.add(f"{host}: uncorrected clock: {why}; its samples keep the host's own times")
        try:
            out[host] = write_parsed_csvs(rd, host, correction)
        except Exception as e:  # noqa: BLE001 - one host's bad raw files must not stop the report
            logger.warning("%s: parsing raw/ failed: %s", host, e)
            warnings.add(f"{host}: its raw files could not be parsed ({type(e).__name__}: {e})")
            continue
        warnings.add(f"{host}: parsed CSVs were missing; analysis rebuilt them from raw/")
        for name, st in out[host].items():
            if st.get("skipped"):
                warnings.add(f"{host}: {name}: {st['skipped']:,} of {st['lines']:,} raw lines skipped as malformed")
    return out


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def missing_lines(rd: RunDir, meta: Meta, steps: pd.DataFrame, data_hosts: set[str]) -> list[str]:
    """One line for each thing a complete run has and this one lacks."""
    lines = []
    if not rd.steps_path.exists():
        lines.append("steps.csv is missing: no step was recorded")
    for row in steps.to_dict("records"):
        if not _finite(row["t_end"]):
            index = int(row["index"]) if _finite(row["index"]) else "?"
            users = int(row["users"]) if _finite(row["users"]) else "?"
            lines.append(f"step {index} ({users} users) has no recorded end: its window was cut "
                         "where the next step began or at the last request's completion")
    if not rd.request_parts():
        lines.append("no request parts (requests/part-*.parquet): no request was recorded")
    for label in sorted(meta.get("hosts", {}), key=str):
        if safe_name(str(label)) not in data_hosts:
            lines.append(f"{label}: no host data (no parsed CSVs under hosts/{safe_name(str(label))}/)")
    return lines
