"""Raw -> parsed: a host's raw collector files into hosts/<host>/<table>.csv on the master's clock.

Both the agents (right after the final fetch) and analysis (``kneeswarm analyze`` on a run that
crashed before its files were parsed) call :func:`write_parsed_csvs`; the clock correction comes
from the agent or from meta.json.

During the run the live view wants the CSVs after every fetch (every 5 s): parsing the whole raw
files each time would cost ever more over a long run (2 h of a 256-thread process: 293 MB of
pidstat text, 1440 fetches).  :class:`LiveParse` keeps them current instead: the file that gives
the process and thread tables (the /proc sampler's procfs.jsonl, the default, or pidstat's text on a
shell-agent host), a row per thread per sample, is read on from where the last fetch stopped and
its new rows are appended; the other collectors' files (a line or a few per sample) are parsed
again whole.
"""

from __future__ import annotations

import copy
import csv
import io
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from kneeswarm.contracts.rundir import RunDir, write_csv

from kneeswarm.collectors import COLLECTORS, parse_raw_file
from kneeswarm.collectors.pidstat import COLLECTOR as PIDSTAT, PidstatStream
from kneeswarm.collectors.procfs import COLLECTOR as PROCFS, ProcfsStream
from kneeswarm.collectors.correction import ClockCorrection, ClockOffset

#: Which collector's table becomes <table>.csv when several give it (the others: <table>.<name>.csv).
TABLE_PREFERENCE = {
    "process": ("pidstat", "procfs"),
    "threads": ("pidstat", "procfs"),
    "tree": ("pidstat", "procfs"),
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
    correction = _correction(run, host, correction)
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
        parsed = parse_raw_file(name, path, interval=interval)
        stats[name] = {"lines": parsed.lines, "skipped": parsed.skipped, "error": parsed.error,
                       "tables": {t: len(df) for t, df in parsed.frames.items()}}
        for table, df in parsed.frames.items():
            by_table.setdefault(table, []).append((name, df))
    for table, items in by_table.items():
        pref = TABLE_PREFERENCE.get(table, ())
        items.sort(key=lambda it: (len(it[1]) == 0, pref.index(it[0]) if it[0] in pref else len(pref)))
        for i, (name, df) in enumerate(items):
            df = on_master_clock(df, correction)
            path = run.host_table_path(host, table, None if i == 0 else name)
            write_csv(path, list(df.columns), df.itertuples(index=False, name=None))
    return stats


def _correction(run: RunDir, host: str, correction: ClockCorrection | float | None) -> ClockCorrection:
    """A ClockCorrection from what write_parsed_csvs takes (None: meta.json's; a number: a constant offset)."""
    if correction is None:
        meta_clock = ((run.read_meta().get("hosts") or {}).get(host) or {}).get("clock")
        return ClockCorrection.from_dict(meta_clock)
    if isinstance(correction, (int, float)):
        off = float(correction)
        return ClockCorrection(before=ClockOffset(off, 0.0, 0.0, 0.0, 0, 0, 0.0))
    return correction


def on_master_clock(df: pd.DataFrame, correction: ClockCorrection) -> pd.DataFrame:
    """``df`` with its ``t`` on the master's clock, rounded to T_DECIMALS (a new frame when changed;
    its other columns are not copied: 2 h of a 256-thread process's table is 140 MB a copy)."""
    if "t" in df.columns and len(df):
        df = df.assign(t=np.round(correction.to_master(df["t"].to_numpy(dtype=float)), T_DECIMALS))
    return df


def _stream_of(name: str, interval: float) -> PidstatStream | ProcfsStream:
    """A fresh stream parser for a collector LiveParse reads a fetch at a time (STREAMED)."""
    return PidstatStream(PIDSTAT.output_tz, max(1, round(interval))) if name == PIDSTAT.name else ProcfsStream()


STREAMED = (PIDSTAT.name, PROCFS.name)  # the collectors whose files LiveParse reads on from where it stopped


class LiveParse:
    """One host's parsed CSVs kept current during the run, a fetch at a time (see the module's text).

    ``update`` gives the stats write_parsed_csvs gives.  The one collector of STREAMED whose raw file
    is there (procfs or pidstat: both give the process and threads tables) is fed to its stream
    parser (kneeswarm.collectors.procfs.ProcfsStream, kneeswarm.collectors.pidstat.PidstatStream) up to its last whole
    line (``offset``: the bytes fed so far; ``bytes_read``: what the last update read); the rows it
    closed are appended to process.csv and threads.csv, what is still being read waits for the next
    fetch.  It starts again from the file's first byte, the CSVs written anew, when the clock
    correction changes or the file shrank (fetched again whole), and leaves the tables to
    write_parsed_csvs when both files are there (which one wins is write_parsed_csvs's rule).  The
    parse after the final fetch replaces all of it.
    """

    def __init__(self, run: RunDir, host: str, interval: float = 1.0) -> None:
        self.run, self.host, self.interval = run, host, interval
        self.stream: PidstatStream | ProcfsStream | None = None
        self.streamed: str | None = None  # the collector being streamed
        self.offset = 0
        self.bytes_read = 0
        self.rows: dict[str, int] = {}  # rows written to each table's CSV so far
        self._correction: ClockCorrection | None = None

    def update(self, correction: ClockCorrection | float | None = None,
               collectors: Iterable[str] | None = None) -> dict[str, Any]:
        correction = _correction(self.run, self.host, correction)
        wanted = list(collectors) if collectors is not None else list(COLLECTORS)
        raw = self.run.raw_dir(self.host)
        givers = [n for n in wanted if set(COLLECTORS[n].tables) & set(PIDSTAT.tables)
                  and (raw / COLLECTORS[n].raw_file).exists()]
        alone = givers[0] if len(givers) == 1 and givers[0] in STREAMED else None
        others = [n for n in wanted if n != alone]
        stats = write_parsed_csvs(self.run, self.host, correction, others, self.interval) if others else {}
        if alone is not None:
            stats[alone] = self._stream(alone, raw / COLLECTORS[alone].raw_file, correction)
        return stats

    def _stream(self, name: str, path: Path, correction: ClockCorrection) -> dict[str, Any]:
        size = path.stat().st_size
        fresh = self.stream is None or name != self.streamed or size < self.offset or correction != self._correction
        if fresh:
            self.stream, self.streamed = _stream_of(name, self.interval), name
            self.offset, self.rows, self._correction = 0, {}, copy.deepcopy(correction)
        assert self.stream is not None
        with path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.bytes_read = len(data)
        data = data[:data.rfind(b"\n") + 1]  # whole lines: the rest is read again next time
        self.offset += len(data)
        self.stream.feed_text(data.decode("utf-8", "replace"))  # a cut after a newline cuts no UTF-8 character
        parsed = self.stream.take(final=False)
        for table, df in parsed.frames.items():
            self._append(table, on_master_clock(df, correction), fresh)
            self.rows[table] = self.rows.get(table, 0) + len(df)
        return {"lines": parsed.lines, "skipped": parsed.skipped, "error": parsed.error, "tables": dict(self.rows)}

    def _append(self, table: str, df: pd.DataFrame, fresh: bool) -> None:
        """The rows of ``df`` at the end of hosts/<host>/<table>.csv, in one write (a new file when ``fresh``)."""
        path = self.run.host_table_path(self.host, table, None)
        if fresh or not path.exists():
            write_csv(path, list(df.columns), df.itertuples(index=False, name=None))
            return
        buf = io.StringIO(newline="")
        csv.writer(buf).writerows(df.itertuples(index=False, name=None))
        with path.open("a", newline="") as f:
            f.write(buf.getvalue())
