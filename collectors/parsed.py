"""Raw -> parsed: a host's raw collector files into hosts/<host>/<table>.csv on the master's clock.

Both the agents (right after the final fetch) and analysis (``kneeswarm analyze`` on a run that
crashed before its files were parsed) call :func:`write_parsed_csvs`; the clock correction comes
from the agent or from meta.json.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from kneeswarm.rundir import RunDir, write_csv

from collectors import COLLECTORS, parse_raw
from collectors.correction import ClockCorrection, ClockOffset

#: Which collector's table becomes <table>.csv when several give it (the others: <table>.<name>.csv).
TABLE_PREFERENCE = {
    "process": ("pidstat", "procfs"),
    "threads": ("pidstat", "procfs"),
    "gpu": ("nvml", "dmon", "query_gpu"),
    "gpu_procs": ("nvml",),
}
T_DECIMALS = 6  # parsed host times are rounded to the microsecond after the clock correction


def write_parsed_csvs(run: RunDir, host: str, correction: ClockCorrection | float | None = None,
                      collectors: Iterable[str] | None = None, interval: float = 1.0) -> dict[str, Any]:
    """Parse hosts/<host>/raw/* into hosts/<host>/<table>.csv with ``t`` on the master's clock.

    ``correction``: a ClockCorrection, a constant offset (host minus master, seconds) or None to
    read meta.json["hosts"][host]["clock"] (no correction if absent).  Works on any run dir, so
    analysis can be re-run.  Returns {collector: {"lines", "skipped", "error", "tables": {table: rows}}}:
    ``error`` is None, or the one-line error of a parser that raised (its tables are then empty).
    """
    if correction is None:
        meta_clock = ((run.read_meta().get("hosts") or {}).get(host) or {}).get("clock")
        correction = ClockCorrection.from_dict(meta_clock)
    elif isinstance(correction, (int, float)):
        off = float(correction)
        correction = ClockCorrection(before=ClockOffset(off, 0.0, 0.0, 0.0, 0, 0, 0.0))
    raw = run.raw_dir(host)
    wanted = set(collectors) if collectors is not None else None
    stats: dict[str, Any] = {}
    by_table: dict[str, list[tuple[str, Any]]] = {}
    for name, c in COLLECTORS.items():
        if wanted is not None and name not in wanted:
            continue
        path = raw / c.raw_file
        if not path.exists():
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        parsed = parse_raw(name, text, interval=interval)
        stats[name] = {"lines": parsed.lines, "skipped": parsed.skipped, "error": parsed.error,
                       "tables": {t: len(df) for t, df in parsed.frames.items()}}
        for table, df in parsed.frames.items():
            by_table.setdefault(table, []).append((name, df))
    for table, items in by_table.items():
        pref = TABLE_PREFERENCE.get(table, ())
        items.sort(key=lambda it: (len(it[1]) == 0, pref.index(it[0]) if it[0] in pref else len(pref)))
        for i, (name, df) in enumerate(items):
            if "t" in df.columns and len(df):
                df = df.copy()
                df["t"] = np.round(correction.to_master(df["t"].to_numpy(dtype=float)), T_DECIMALS)
            path = run.host_table_path(host, table, None if i == 0 else name)
            write_csv(path, list(df.columns), df.itertuples(index=False, name=None))
    return stats
